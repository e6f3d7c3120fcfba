# The least memory over any config at no measured cost in loss (docs/lowmem.md): python train.py
# config/train_shakespeare_char_cpu.py config/low_memory.py bfloat16 weights (and gradients) updated
# with stochastic rounding, no float32 copy; AdamW's moments in 8 bits (torchao's AdamW8bit); Muon's
# momentum in bfloat16 (not applied under AdamW). 16 -> 6 bytes of training state per parameter with
# AdamW. Needs torchao: pip install -e ".[lowmem]". Quality (lab/time_to_loss.py's 'lowmem'
# set, 300 iterations of the CPU demo): within the float32 baseline's seed range on Shakespeare and
# the King James Bible by characters (3 seeds), and on GPT-2 tokens at AdamW's tuned epsilon (8
# seeds: its median 0.13 below the baseline's, 7 of 8 runs reaching the baseline's median loss
# against 4). state_bits = 4 keeps a byte per parameter less, at no measured cost either, but its
# peak rise is higher on a CPU. Less still where a run can go without clipping and accumulation:
# in_backward = True with grad_clip = 0.0 and gradient_accumulation_steps = 1 (no gradient buffer: 4
# bytes per parameter), which changes the training itself.
weights_dtype = "bfloat16"
state_bits = 8
muon_momentum_dtype = "bfloat16"
