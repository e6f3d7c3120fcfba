# The draft beside the CPU demo's model (config/train_shakespeare_char_cpu.py), for speculative
# decoding (sample.py --draft=OUT_DIR): the same data and characters, one layer, half the width.
# Over the demo's config: python train.py config/train_shakespeare_char_cpu.py
# config/draft_shakespeare_char_cpu.py
out_dir = "out-shakespeare-char-cpu-draft"
n_layer = 1
n_head = 2
n_embd = 64
