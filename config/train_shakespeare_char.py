# nanoGPT's baby GPT on character-level Shakespeare: about 3 minutes on one A100, val loss ~1.47 on
# Tiny Shakespeare.
out_dir = "out-shakespeare-char"
eval_interval = 250  # it overfits quickly, so evaluate often
eval_iters = 200
log_interval = 10
always_save_checkpoint = False  # keep only the best checkpoint by val loss

wandb_log = False
wandb_project = "shakespeare-char"
wandb_run_name = "mini-gpt"

dataset = "shakespeare_char"
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256  # 256 characters of context

n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2

learning_rate = 1e-3  # a small model can take a larger learning rate
max_iters = 5000
lr_decay_iters = 5000
min_lr = 1e-4
beta2 = 0.99  # a little larger, since there are few tokens per iteration
warmup_iters = 100
