# Evaluate OpenAI's GPT-2 XL (1558M: 48 layers, 25 heads, 1600 wide) on OpenWebText's validation
# shard
batch_size = 8
eval_iters = 500  # more batches for a steadier estimate
eval_only = True
wandb_log = False
init_from = "gpt2-xl"
