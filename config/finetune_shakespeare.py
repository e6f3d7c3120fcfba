# Fine-tune pretrained GPT-2 on GPT-2-tokenised Shakespeare: a few minutes on one GPU.
out_dir = "out-shakespeare"
eval_interval = 5
eval_iters = 40
wandb_log = False
wandb_project = "shakespeare"
wandb_run_name = "ft-gpt2"

dataset = "shakespeare"
init_from = "gpt2-xl"  # the largest GPT-2: 1.5B parameters
always_save_checkpoint = False  # keep only the best by val loss

# 1 x 32 x 1024 = 32,768 tokens per step; Shakespeare has ~300K tokens, so one epoch is ~9 steps
batch_size = 1
gradient_accumulation_steps = 32
max_iters = 20

learning_rate = 3e-5  # fine-tune with a small, constant learning rate
decay_lr = False
