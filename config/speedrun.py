# The modern GPT recipe, over any other config (config files apply in order, a later one wins):
# python train.py config/train_shakespeare_char_cpu.py config/speedrun.py Muon for the blocks'
# matrices and AdamW for the rest, a warmup-stable-decay schedule, rotary positions, RMSNorm,
# QK-norm, ReLU^2, an untied head and zero-initialised output projections: the changes that cut the
# tokens the GPT-2 speedrun needs. It leaves the model's size, the data and the horizon to the
# config before it. Tuned on the CPU demo (docs/time-to-loss.md has the sweeps and the ablation).
optimizer = "muon"
muon_lr = 0.01  # the CPU demo: 0.005 and 0.01 alike, 0.02 and 0.04 worse (docs/time-to-loss.md)
# torch.optim.Muon's 5 cost a CPU a fifth more time per step and gained nothing measurable here
muon_ns_steps = 4
lr_schedule = "wsd"
# the last 80% of the run decays: the crossings of a baseline's loss fall mid-run, where a flat
# learning rate had stalled (char at 2,000 iterations: 0.8 needed 863k tokens to the baseline's
# loss, 0.6 993k, 0.4 1.06M; the final losses alike, 1.599, 1.602 and 1.597; docs/time-to-loss.md)
cooldown_frac = 0.8

rotary = True
rmsnorm = True
qk_norm = True
relu2 = True
untied_head = True
# logit_softcap = 15.0: the speedrun's, left out here. On the CPU demo it saved no tokens (193k to
# the baseline's loss with it and without), and on a CPU, where nothing fuses it, it costs passes
# over the whole (B*T, vocab) logits: the recipe's step at GPT-2's vocabulary took 1.84x the
# baseline's with it (docs/time-to-loss.md). Add it over this config where a compiled GPU step fuses
# it.
zero_init_proj = True
