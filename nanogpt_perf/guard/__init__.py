"""The guard: every check a run makes before its first write, and the forensics on files that come
from elsewhere (checkpoints, datasets, GPT-2's weights, an out_dir another run may hold), and the
out_dir's lock. It only checks: its modules import the basic ones (errors, files, config) and
model.py's shape, never a module that does the work; those call down into it, and trust what passed.
Each check raises one UserError (or, as a setting's check=, a ValueError) naming the problem and
what would be valid. This file imports nothing: the data preparers' worker processes import
paths.py, which imports no torch."""
