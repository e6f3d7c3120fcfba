# GPT-2 (124M) on OpenWebText with every performance switch on, as nanoGPT trains it (to a loss of about 2.85 on
# 8x A100 40GB in about 5 days). Prepare the data first (about 9B tokens, 18 GB of shards):
#   python data/openwebtext/prepare.py
#   torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py
dataset = "openwebtext"
out_dir = "out-gpt2"

wandb_log = False
wandb_project = "owt"
wandb_run_name = "gpt2-124M"

# tokens per optimizer step: 12 sequences x 1024 tokens x 40 micro-batches (5 per rank on 8 GPUs, 40 on one)
# = 491,520, about 0.5M as in GPT-3's table for this size
batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8

# 600,000 steps x 491,520 tokens = 295B tokens: about 33 epochs of OpenWebText's 9B
max_iters = 600000
lr_decay_iters = 600000

eval_interval = 1000
eval_iters = 200  # x 12 x 1024 = 2.5M validation tokens per estimate (per rank)
log_interval = 10

weight_decay = 1e-1
compile = True
