"""--profile_steps: a TensorBoard profile of chosen training steps.

TPU users tune input-bound steps in TensorBoard's Profile tab (trace viewer,
input-pipeline analysis). Host loops end at the range's edges (`loop_limit`,
whatever --steps_per_loop is: the shipped flagfiles run 1,251 steps a loop),
the profiler starts before the loop that runs the range's first step and
stops after the loop that runs its last, so it records exactly those steps.
It writes `<model_dir>/plugins/profile/<date>/<host>.xplane.pb`, which
`tensorboard --logdir <model_dir>` shows with tensorboard-plugin-profile.
The engine's profiler is an argument: tf.profiler on TensorFlow (the
default), jax.profiler on JAX (engines/jax/engine.py), both writing that file.
"""
from typing import Callable

from absl import logging


def _tensorflow_start(logdir: str) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.profiler.experimental.start(logdir)


def _tensorflow_stop() -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.profiler.experimental.stop()


class StepProfiler:
  """Starts and stops a profiler around the host loops of a step range."""

  def __init__(self, steps: tuple[int, int] | None, logdir: str,
               start: Callable[[str], None] = _tensorflow_start,
               stop: Callable[[], None] = _tensorflow_stop):
    """`start(logdir)` and `stop()`: the engine's profiler."""
    self.steps, self.logdir = steps, logdir
    self._start, self._stop = start, stop
    self.running = False

  def loop_limit(self, step: int) -> int | None:
    """The most steps the host loop after `step` may run so that it ends
    at an edge of the range (before its first step, at its last); None
    past the range or without one."""
    if not self.steps:
      return None
    edges = [e for e in (self.steps[0] - 1, self.steps[1]) if e > step]
    return min(edges) - step if edges else None

  def before_loop(self, step: int, num_steps: int) -> None:
    """Called before a host loop running steps step+1 .. step+num_steps."""
    if (self.steps and not self.running and
        step < self.steps[1] and step + num_steps >= self.steps[0]):
      self._start(self.logdir)
      self.running = True
      logging.info("Profiling from step %d (--profile_steps=%d,%d) into %s",
                   step + 1, *self.steps, self.logdir)

  def after_loop(self, step: int) -> None:
    """Called after a host loop that ended at `step`."""
    if self.running and step >= self.steps[1]:
      self.stop()
      logging.info("Profile written up to step %d; open it with "
                   "`tensorboard --logdir %s` (Profile tab).", step,
                   self.logdir)

  def stop(self) -> None:
    if self.running:
      self._stop()
      self.running = False
