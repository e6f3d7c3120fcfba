"""The guard room: every check a run makes before its first write, and the forensics on files that come from
elsewhere (checkpoints, datasets, GPT-2's weights, an out_dir another run may hold). Each check raises one
UserError (or, as a setting's check=, a ValueError) naming the problem and what would be valid; the rooms below
(the loader, checkpoint saving, the model) trust what passed. train.py enters it through admission.py;
the other scripts call the one check they need. This file imports nothing: the data preparers' worker processes
import paths.py, which imports no torch."""
