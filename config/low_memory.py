# The least memory over any config (docs/lowmem.md):
#   python train.py config/finetune_shakespeare.py config/low_memory.py
# Quality, measured (benchmarks/time_to_loss.py's 'lowmem' set, 3 seeds, 300 iterations), at AdamW's default
# epsilon: 8-bit AdamW costs no tokens measurable on char, kjv_char or bpe; with bfloat16 weights too, kjv_char
# reaches the float32 baseline's loss in 0.98x the tokens, char and bpe end within the baseline's seed range (0.011
# and 0.031 above its median). Paired by seed, the bfloat16 weights add a little to 8-bit alone (median +0.017 char,
# +0.001 kjv_char, +0.028 bpe). Not free on bpe with AdamW's epsilon tuned (adam_eps=1e-6, whose float32 baseline's
# seeds end within 0.064 of each other): 8-bit alone ends 0.161 above it (median), this config +0.147 and
# +0.226 at the two seeds run (docs/lowmem.md).
# bfloat16 weights (and gradients) updated with stochastic rounding, no float32 copy; AdamW's moments in 8 bits
# (torchao's AdamW8bit); Muon's momentum in bfloat16 (not applied under AdamW). 16 -> 6 bytes of training state per
# parameter with AdamW. Needs torchao: pip install -e ".[lowmem]".
# Less still where a run can go without clipping and accumulation: in_backward = True with grad_clip = 0.0 and
# gradient_accumulation_steps = 1 (no gradient buffer: 4 bytes per parameter), which changes the training itself.
weights_dtype = "bfloat16"
state_bits = 8
muon_momentum_dtype = "bfloat16"
