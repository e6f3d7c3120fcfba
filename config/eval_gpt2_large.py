# Evaluate OpenAI's GPT-2 large (774M: 36 layers, 20 heads, 1280 wide) on OpenWebText's validation
# shard
batch_size = 8
eval_iters = 500  # more batches for a steadier estimate
eval_only = True
wandb_log = False
init_from = "gpt2-large"
