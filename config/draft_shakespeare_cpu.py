# The draft beside config/train_shakespeare_cpu.py's model, for speculative decoding (sample.py
# --draft=OUT_DIR): the same data and tokenizer, a quarter of the layers, half the width. Over that
# config: python train.py config/train_shakespeare_cpu.py config/draft_shakespeare_cpu.py
out_dir = "out-shakespeare-cpu-draft"
n_layer = 1
n_head = 2
n_embd = 128
