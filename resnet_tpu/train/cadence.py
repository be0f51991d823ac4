"""Checkpoints on a wall-clock cadence, agreed by every worker.

Step cadences alone leave a long run unprotected: with the default flags
(`--checkpoint_every_steps=0`: at each eval; `--eval_every_steps=0`: at the
end) nothing is saved until the run ends, and a hard kill (OOM killer,
`kill -9`, a host failure: no SIGTERM for preemption.py) loses all of it.
tf.estimator's RunConfig saved every 600 s by default; so does
`--checkpoint_every_minutes=10` here, besides the step cadences. A hard kill
then costs at most that interval plus the host loop in flight.

Each worker reads its own clock; one scalar all-reduce after each host loop
makes them all save after the same loop when any one is due (a
MultiWorkerMirroredStrategy save needs every worker). No eval is needed.
"""
import time
from typing import Callable

import tensorflow as tf


def any_worker(strategy: tf.distribute.Strategy, flag: bool) -> bool:
  """Whether `flag` is set on any worker; every worker must call this
  together on multi-worker strategies (one scalar all-reduce)."""
  if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return flag
  value = tf.constant(1.0 if flag else 0.0)
  per_replica = strategy.experimental_distribute_values_from_function(
      lambda _: value)
  total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
  return float(total) > 0


class SaveTimer:
  """Says when `minutes` have passed since the last save (0: never)."""

  def __init__(self, minutes: float,
               now: Callable[[], float] = time.monotonic):
    self._seconds = minutes * 60.0
    self._now = now
    self._last = now()

  def restart(self) -> None:
    """A checkpoint was just written (or training starts)."""
    self._last = self._now()

  def due(self, strategy: tf.distribute.Strategy) -> bool:
    """Whether any worker's interval has passed: call on every worker."""
    if not self._seconds:
      return False  # the same flag on every worker: no all-reduce needed
    return any_worker(strategy, self._now() - self._last >= self._seconds)
