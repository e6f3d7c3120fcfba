# The configurations of lab/time_to_loss.py: each is a name and train.py's arguments (config files
# and --key=value flags, applied in order, a later one winning). A run's command is its task's
# arguments, its configuration's, --train_args, then the benchmark's own (its owned() settings: a
# --flag here for one of them is refused, a config file's value overridden). The first
# configuration of a set is its baseline.

# nanoGPT's CPU shape: 4 x 128, block 64, batch 16 (1,024 tokens/it)
DEMO = ["config/train_shakespeare_char_cpu.py"]
# AdamW's best learning rate on char (the sweeps in docs/time-to-loss.md), for every AdamW group:
# the baseline's and the recipe's embeddings and head (the recipe's loss moved by 0.001 between 2e-3
# and 8e-3)
CHAR_LR = "--learning_rate=6e-3"
# GPT-2 tokens on the same shape, batch 8 x 64 = 512 tokens/it: its 50,304 x 128 embedding, tied to
# the head, is most of its 7.2M parameters and the head most of the step (AdamW's learning rate:
# 3e-3 beat 1e-3 at 300 iterations, docs/time-to-loss.md; its epsilon is torch's 1e-8, which 1e-6
# beats: --train_args=--adam_eps=1e-6, docs/lowmem.md)
BPE = ["--batch_size=8", "--learning_rate=3e-3", "--min_lr=1e-4"]

# a task: the data and the model's shape that every configuration of a set starts from
TASKS = {
    "char": [*DEMO, CHAR_LR],  # character-level Shakespeare (offline: the 38 plays)
    "kjv_char": [*DEMO, CHAR_LR, "--dataset=kjv_char"],  # the King James Bible: never tuned on
    "bpe": [*DEMO, "--dataset=shakespeare", *BPE],
    "kjv_bpe": [*DEMO, "--dataset=kjv_bpe", *BPE],
    # the GPU scale: GPT-2 (124M) on FineWeb-Edu shards (data/fineweb/prepare.py), 524,288 tokens a
    # step, compiled; not run yet (no GPU here): e.g. --max_iters=2000 --eval_interval=100, about 1B
    # tokens a run
    "gpt2_fineweb": ["config/train_gpt2_fineweb.py"],
}

SPEEDRUN = ["config/speedrun.py"]  # the recipe, switched on over any task
# each change of the recipe and the flag that leaves it out (after SPEEDRUN); align with
# config/speedrun.py
LEAVE_OUT = {
    "muon": "--optimizer=adamw",
    "rotary": "--rotary=False",
    "rmsnorm": "--rmsnorm=False",
    "qk_norm": "--qk_norm=False",
    "relu2": "--relu2=False",
    "untied_head": "--untied_head=False",
    "zero_init_proj": "--zero_init_proj=False",
}
# and one change config/speedrun.py leaves out, added: the speedrun's softcap
ADD = {"logit_softcap": "--logit_softcap=15"}

SETS = {
    # the baseline alone: sweep its learning rate with --sweep=learning_rate=3e-3,2e-3,1e-3
    "adamw": {"adamw": []},
    # the baseline (at its best learning rate: set it here), the recipe, and the recipe with each
    # change left out
    "recipe": {
        "adamw": [],
        "recipe": SPEEDRUN,
        **{f"recipe-no-{change}": [*SPEEDRUN, flag] for change, flag in LEAVE_OUT.items()},
        **{f"recipe-with-{change}": [*SPEEDRUN, flag] for change, flag in ADD.items()},
    },
    # the memory savers (docs/lowmem.md), each against float32 AdamW: does a saver cost tokens to
    # the same loss?
    "lowmem": {
        "adamw": [],
        "8bit": ["--state_bits=8"],
        "4bit": ["--state_bits=4"],
        "bf16": ["--weights_dtype=bfloat16"],
        "low_memory": ["config/low_memory.py"],
        "4bit-bf16": ["--state_bits=4", "--weights_dtype=bfloat16"],  # 5.06 B/param
        "adamw-noclip": ["--grad_clip=0.0"],  # in_backward's own baseline: the same run unclipped
        # the step inside backward cannot clip
        "8bit-in_backward": ["--state_bits=8", "--in_backward=True", "--grad_clip=0.0"],
        "muon": SPEEDRUN,
        "muon-low_memory": [*SPEEDRUN, "config/low_memory.py"],
        "muon-8bit-momentum": [*SPEEDRUN, "--muon_momentum_dtype=8bit", "--state_bits=8"],
        "muon-bf16-momentum": [*SPEEDRUN, "--muon_momentum_dtype=bfloat16"],
    },
}
