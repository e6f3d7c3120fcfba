# Evaluate OpenAI's GPT-2 medium (350M: 24 layers, 16 heads, 1024 wide) on OpenWebText's validation
# shard
batch_size = 8
eval_iters = 500  # more batches for a steadier estimate
eval_only = True
wandb_log = False
init_from = "gpt2-medium"
