"""Host loops: many replica steps per host call (Ying et al. 2018 §3).

On a TPU the host must not be on the critical path: each call of a loop here
runs `num_steps` steps inside one tf.function (`--steps_per_loop`, the TPU
"host loop"), and only the sums of the loop come back to the host. Each loop
ends by averaging the replicas' BN moving statistics (moving_statistics.py),
so they are equal everywhere at every evaluation and checkpoint. The
accumulating loop is Mikami et al. 2018's batch-size control: a larger
global batch as several micro-batches per optimizer step.
"""
from typing import Iterator, NamedTuple

import tensorflow as tf

from resnet_tpu.engines.tensorflow.step import ReplicaStep
from resnet_tpu.engines.tensorflow.step import StepSums


class LoopSums(NamedTuple):
  """What a training loop returns: the StepSums of its finite steps (a
  non-finite step adds nothing: its loss is NaN), the number of non-finite
  steps and the loop index of the first one (-1: none)."""
  steps: StepSums
  nonfinite_steps: tf.Tensor
  first_nonfinite: tf.Tensor

  @classmethod
  def empty(cls, num_sources: int) -> "LoopSums":
    return cls(StepSums.zeros(num_sources), tf.zeros([]), tf.constant(-1.0))

  def add(self, step: StepSums, index: tf.Tensor) -> "LoopSums":
    nonfinite = step.nonfinite > 0
    kept = tf.nest.map_structure(
        lambda v: tf.where(nonfinite, tf.zeros_like(v), v),
        step._replace(nonfinite=tf.zeros([])))
    first = tf.where(nonfinite & (self.first_nonfinite < 0),
                     tf.cast(index, tf.float32), self.first_nonfinite)
    return LoopSums(self.steps + kept,
                    self.nonfinite_steps + tf.cast(nonfinite, tf.float32),
                    first)


class HostLoops:
  """The tf.function loops over a strategy's replicas of `step`."""

  def __init__(self, strategy: tf.distribute.Strategy, step: ReplicaStep):
    self.strategy = strategy
    self.step = step

  def _sum(self, per_replica: tf.Tensor) -> tf.Tensor:
    return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                                axis=None)

  def _run(self, step_fn, args) -> StepSums:
    """`step_fn` on every replica, its StepSums summed over replicas."""
    per_replica = self.strategy.run(lambda *a: step_fn(*a).packed(),
                                    args=args)
    return StepSums.unpacked(self._sum(per_replica))

  @tf.function
  def train(self, iterator: Iterator, num_steps: tf.Tensor) -> LoopSums:
    """Runs `num_steps` training steps in one call."""
    sums = LoopSums.empty(self.step.num_sources)
    for i in tf.range(num_steps):
      sums = sums.add(self._run(self.step.train, next(iterator)), i)
    self.strategy.run(self.step.average_moving_statistics)
    return sums

  @tf.function
  def accumulating_train(self, iterator: Iterator, num_steps: tf.Tensor,
                         micro_batches: tf.Tensor) -> LoopSums:
    """Like `train`, each step summing `micro_batches` micro-batches.

    Batch-size control (Mikami et al. 2018) without new shapes: the input
    batch stays fixed and a larger global batch is `micro_batches` of them,
    BN statistics still per micro-batch. `micro_batches` is a tensor, so a
    batch-size change does not retrace.
    """
    sums = LoopSums.empty(self.step.num_sources)
    step = StepSums.zeros(self.step.num_sources)
    # One flat loop: nested while loops here trip Grappler's arithmetic
    # optimizer (AlreadyExists on an AddOpsRewrite TemporaryVariable) from
    # the second call on.
    for micro in tf.range(num_steps * micro_batches):
      step += self._run(self.step.accumulate,
                        next(iterator) + (micro_batches,))
      if (micro + 1) % micro_batches == 0:
        nonfinite = self._sum(self.strategy.run(self.step.apply_accumulated))
        sums = sums.add(step._replace(nonfinite=nonfinite),
                        micro // micro_batches)
        step = StepSums.zeros(self.step.num_sources)
    self.strategy.run(self.step.average_moving_statistics)
    return sums

  @tf.function
  def eval(self, iterator: Iterator, num_steps: tf.Tensor) -> StepSums:
    """Sums `num_steps` eval batches."""
    sums = StepSums.zeros(self.step.num_sources)
    for _ in tf.range(num_steps):
      sums += self._run(self.step.eval, next(iterator))
    return sums
