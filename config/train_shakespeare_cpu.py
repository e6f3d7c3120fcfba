# A GPT on Shakespeare in GPT-2's BPE, sized for a CPU (2 cores, about 20 minutes): the checkpoint
# that generation's figures are measured on (docs/sample.md: int8 and int4 against float32,
# speculative decoding), with its draft beside it (config/draft_shakespeare_cpu.py).
out_dir = "out-shakespeare-cpu"
eval_interval = 250
eval_iters = 20
log_interval = 50
always_save_checkpoint = False

dataset = "shakespeare"
gradient_accumulation_steps = 1
batch_size = 8
block_size = 256

n_layer = 4
n_head = 4
n_embd = 256
dropout = 0.1

learning_rate = 1e-3
max_iters = 1000
lr_decay_iters = 1000
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 50

device = "cpu"
compile = False
