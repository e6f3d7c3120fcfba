# GPT-2 (124M) with every performance switch on. nanoGPT trains this on OpenWebText (~9B tokens) to a loss of
# ~2.85 on 8x A100 40GB in about 5 days:
#   torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py
# The default dataset here is the GPT-2-tokenised Shakespeare (prepared on first use): point `dataset` at a larger
# corpus prepared into data/<name>/{train,val}.bin for a real run.
dataset = "shakespeare"
out_dir = "out-gpt2"

wandb_log = False
wandb_project = "owt"
wandb_run_name = "gpt2-124M"

# 12 sequences of 1024 tokens x 40 micro-batches (across all ranks) = ~491K tokens per step
batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8

# 600K steps x ~491K tokens = ~300B tokens
max_iters = 600000
lr_decay_iters = 600000

eval_interval = 1000
eval_iters = 200
log_interval = 10

weight_decay = 1e-1
compile = True
