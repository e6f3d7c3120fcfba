# The least memory at no loss in quality measured so far, over any config (docs/lowmem.md: the savers' tolerances
# against float32 in tests/test_lowmem.py; their time-to-loss set, benchmarks/ttl_configs.py's 'lowmem', to run):
#   python train.py config/finetune_shakespeare.py config/low_memory.py
# bfloat16 weights (and gradients) updated with stochastic rounding, no float32 copy; AdamW's moments in 8 bits
# (torchao's AdamW8bit); Muon's momentum in bfloat16 (not applied under AdamW). 16 -> 6 bytes of training state per
# parameter with AdamW. Needs torchao: pip install -e ".[lowmem]".
# Less still where a run can go without clipping and accumulation: in_backward = True with grad_clip = 0.0 and
# gradient_accumulation_steps = 1 (no gradient buffer: 4 bytes per parameter), which changes the training itself.
weights_dtype = "bfloat16"
state_bits = 8
muon_momentum_dtype = "bfloat16"
