"""The training loop: step math, host loops, cadence, checkpoints, logs.

train_step.py is the per-replica step, host_loops.py runs many of them per
host call, trainer.py keeps the cadence of loops, evals and checkpoints;
loop_report.py, metrics_log.py, checkpointing.py and preemption.py are what
it reports, writes, saves and stops on. On JAX the step is jax_step.py, the
trainer jax_trainer.py (the same cadence, reports and stops), the
checkpoints checkpoints_jax.py or checkpoints_npz.py, and watchdog.py bounds
a multi-host run's waits.
"""
