# GPT-2 (124M) on FineWeb-Edu (sample-10BT), llm.c's recipe for this size: one epoch of 10B tokens. Prepare first
# (about 10B tokens, 20 GB of shards):
#   python data/fineweb/prepare.py
#   torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_fineweb.py
dataset = "fineweb"
out_dir = "out-gpt2-fineweb"
data_order = "epochs"  # each window once: 10B tokens are read once, not sampled with replacement

# tokens per optimizer step: 16 sequences x 1024 tokens x 32 micro-batches (4 per rank on 8 GPUs, 32 on one)
# = 524,288 (2**19), as llm.c
batch_size = 16
block_size = 1024
gradient_accumulation_steps = 4 * 8

# 19,073 steps x 524,288 tokens = 10.0B tokens, one epoch of sample-10BT; llm.c's schedule: a short warmup, a
# higher peak learning rate, cosine decay to zero
max_iters = 19073
lr_decay_iters = 19073
warmup_iters = 700
learning_rate = 6e-4 * 3
min_lr = 0.0

eval_interval = 250
eval_iters = 20  # x 16 x 1024 = 0.3M validation tokens per estimate (per rank)
log_interval = 10

weight_decay = 1e-1
compile = True
