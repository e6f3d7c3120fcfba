# Evaluate OpenAI's GPT-2 (124M: 12 layers, 12 heads, 768 wide) on OpenWebText's validation shard
batch_size = 8
eval_iters = 500  # more batches for a steadier estimate
eval_only = True
wandb_log = False
init_from = "gpt2"
