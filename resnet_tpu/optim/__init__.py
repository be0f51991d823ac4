"""What turns gradients into updates: the optimizers, LARS, RMSprop warm-up and
the learning-rate schedules, all in epochs."""
