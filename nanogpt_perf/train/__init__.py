"""Training: the step, data parallelism, checkpoints, exact resumption, preemption, the progress of
a run."""
