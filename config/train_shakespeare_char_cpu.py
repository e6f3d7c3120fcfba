# The baby GPT shrunk to train on a laptop CPU (2 cores) in about a minute, then sample from it.
out_dir = "out-shakespeare-char-cpu"
eval_interval = 200
eval_iters = 20
log_interval = 50
always_save_checkpoint = False

dataset = "shakespeare_char"
gradient_accumulation_steps = 1
batch_size = 16
block_size = 64

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0

learning_rate = 2e-3
max_iters = 1200
lr_decay_iters = 1200
min_lr = 2e-4
beta2 = 0.99
warmup_iters = 50

device = "cpu"
compile = False  # compiling takes longer than this whole run saves
