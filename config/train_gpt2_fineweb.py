# GPT-2 (124M) on FineWeb-Edu (sample-10BT), llm.c's recipe for this size: one epoch of 10B tokens.
# Prepare first (about 10B tokens, 20 GB of shards): python data/fineweb/prepare.py torchrun
# --standalone --nproc_per_node=8 train.py config/train_gpt2_fineweb.py
dataset = "fineweb"
out_dir = "out-gpt2-fineweb"
data_order = "epochs"  # each window once: 10B tokens are read once, not sampled with replacement

# tokens per optimizer step: 524,288 (2**19, 512 sequences of 1024 tokens), as llm.c; the
# micro-batch is the largest divisor of a rank's share that fits the device, gradient accumulation
# follows: on H100s of 80 GB about 64 x 8 micro-batches on one GPU and 64 x 1 on each of 8 (see
# config/train_gpt2.py)
tokens_per_iter = 524288
batch_size = "auto"
block_size = 1024

# 19,073 steps x 524,288 tokens = 10.0B tokens, one epoch of sample-10BT; llm.c's schedule: a short
# warmup, a higher peak learning rate, cosine decay to zero
max_iters = 19073
lr_decay_iters = 19073
warmup_iters = 700
learning_rate = 6e-4 * 3
min_lr = 0.0

eval_interval = 250
eval_iters = 20  # batches of the micro-batch size per rank and estimate
log_interval = 10

weight_decay = 1e-1
compile = True
