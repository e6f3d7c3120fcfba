# GPT-2 (124M) on OpenWebText with every performance switch on, as nanoGPT trains it (to a loss of
# about 2.85 on 8x A100 40GB in about 5 days). Prepare the data first (about 9B tokens, 18 GB of
# shards): python data/openwebtext/prepare.py torchrun --standalone --nproc_per_node=8 train.py
# config/train_gpt2.py
dataset = "openwebtext"
out_dir = "out-gpt2"

wandb_log = False
wandb_project = "owt"
wandb_run_name = "gpt2-124M"

# tokens per optimizer step: 491,520 (nanoGPT's 12 sequences x 1024 tokens x 40 micro-batches),
# about 0.5M as in GPT-3's table for this size. The micro-batch is chosen for the device: the
# largest divisor of a rank's share of the 480 sequences whose step fits
# (nanogpt_perf/train/autobatch.py); gradient accumulation follows. On H100s of 80 GB (a compiled
# step at 32 x 1024 peaks at 22.3 GB, about 0.63 GB a sequence) that is 96 x 5 micro-batches on one
# GPU and 60 x 1 on each of 8 (an estimate until measured). nanoGPT's own split: --batch_size=12
# (then 40 micro-batches)
tokens_per_iter = 491520
batch_size = "auto"
block_size = 1024

# 600,000 steps x 491,520 tokens = 295B tokens: about 33 epochs of OpenWebText's 9B
max_iters = 600000
lr_decay_iters = 600000

eval_interval = 1000
eval_iters = 200  # batches of the micro-batch size per rank and estimate
log_interval = 10

weight_decay = 1e-1
compile = True
