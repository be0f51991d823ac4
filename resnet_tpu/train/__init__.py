"""The training loop: the replica step, host loops and their reports, the
trainer's cadence, checkpoints, metrics and preemption."""
