"""The per-replica step math: loss, gradients, update, eval (Ying et al. §3).

Synchronous data parallelism: every replica takes `global_batch / replicas`
images; the loss is scaled by the GLOBAL batch because the optimizer sums
gradients over replicas once (Keras 3 in apply_gradients, or
gradient_all_reduce.py). Examples with a negative label (unusable or lost
records, record_guards.py) weigh 0 and are counted per source file.
Everything here runs inside `strategy.run`; the host loops (host_loops.py)
call it and sum the `StepSums` over replicas.
"""
from typing import NamedTuple

import keras
import tensorflow as tf

from resnet_tpu.runtime import compat
from resnet_tpu.inputs import record_guards
from resnet_tpu.engines.tensorflow import moving_statistics
from resnet_tpu.train.loss import losses_and_hits
from resnet_tpu.optim import optimizers
from resnet_tpu.config import TrainConfig
from resnet_tpu.engines.tensorflow.loss_scale import DynamicLossScale


class StepSums(NamedTuple):
  """What one step adds up on a replica (summed over replicas by the loop).

  loss, top1, top5: per-example sums over the weighted examples; examples:
  their count; unusable: records that could not be used (weight 0); lost:
  stand-ins of records lost to damaged files (weight 0); nonfinite: > 0 when
  the step's loss or gradients were NaN/Inf; by_source: unusable and lost
  examples per source (shard_audit.py), a vector.
  """
  loss: tf.Tensor
  top1: tf.Tensor
  top5: tf.Tensor
  examples: tf.Tensor
  unusable: tf.Tensor
  lost: tf.Tensor
  nonfinite: tf.Tensor
  by_source: tf.Tensor

  @classmethod
  def zeros(cls, num_sources: int = 0) -> "StepSums":
    return cls(*([tf.zeros([])] * (len(cls._fields) - 1)),
               by_source=tf.zeros([num_sources]))

  def __add__(self, other: "StepSums") -> "StepSums":
    return StepSums(*(a + b for a, b in zip(self, other)))

  def packed(self) -> tf.Tensor:
    """One vector, so the sums cross replicas in one all-reduce."""
    return tf.concat([tf.stack(list(self[:-1])), self.by_source], 0)

  @classmethod
  def unpacked(cls, vector: tf.Tensor) -> "StepSums":
    scalars = len(cls._fields) - 1
    return cls(*tf.unstack(vector[:scalars], num=scalars),
               by_source=vector[scalars:])


def decayed_variables(model: keras.Model) -> list[tf.Variable]:
  """Conv and dense kernels: the only variables under L2 weight decay."""
  return [v for v in model.trainable_variables if v.path.endswith("kernel")]


def all_finite(tensors: list[tf.Tensor]) -> tf.Tensor:
  """True when no element of any tensor is NaN or Inf."""
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


class ReplicaStep:
  """Training and eval steps of one replica, for `strategy.run`.

  `accumulators` (batch-size control) are per-replica ON_READ gradient sums
  created under the strategy scope; empty when no --batch_size_schedule.
  `num_sources`: the length of StepSums.by_source, 2 per training file
  (set before the first step is traced).
  """

  def __init__(self, cfg: TrainConfig, model: keras.Model,
               optimizer: keras.optimizers.Optimizer, num_replicas: int,
               accumulators: list[tf.Variable] = (),
               loss_scale: DynamicLossScale | None = None):
    """loss_scale: --precision=float16's dynamic loss scale (loss_scale.py);
    its steps take the skip path of --skip_nonfinite_steps."""
    self.cfg = cfg
    self.loss_scale = loss_scale
    self.num_sources = 0
    self.model = model
    self.optimizer = optimizer
    self.num_replicas = num_replicas
    self.accumulators = list(accumulators)
    in_loss = optimizers.weight_decay_in_loss(cfg.optim.optimizer)
    # The kernels under L2 weight decay in the loss, and the loss's label
    # smoothing (what the step trains with, for lab/study_settings.py).
    self.decayed = (decayed_variables(model)
                    if in_loss and cfg.optim.weight_decay else [])
    self.label_smoothing = cfg.optim.label_smoothing
    self.replica_local = moving_statistics.replica_local_statistics(model)

  def losses_and_hits(self, logits, labels):
    """Per-example loss, top-1 and top-5 hits and weight (train/loss.py)."""
    return losses_and_hits(logits, labels, self.cfg.model.num_classes,
                           self.label_smoothing)

  def gradients(self, images, labels, micro_batches=1):
    """Per-replica gradients and the StepSums of one (micro-)batch."""
    with tf.GradientTape() as tape:
      logits = self.model(images, training=True)
      per_example, top1, top5, weight = self.losses_and_hits(logits, labels)
      # Scaled by the GLOBAL batch: the optimizer sums over replicas.
      scale = tf.cast(self.cfg.run.global_batch_size * micro_batches,
                      tf.float32)
      loss = tf.reduce_sum(per_example) / scale
      if self.decayed:
        l2 = tf.add_n([tf.nn.l2_loss(v) for v in self.decayed])
        loss += (self.cfg.optim.weight_decay * l2 /
                 tf.cast(self.num_replicas * micro_batches, tf.float32))
      if self.loss_scale is not None:
        # float16: scaled so that small gradients do not underflow.
        loss_scale = self.loss_scale.scale.read_value()
        loss *= loss_scale
    grads = tape.gradient(loss, self.model.trainable_variables)
    if self.loss_scale is not None:
      grads = [g / loss_scale for g in grads]
    unusable, lost, by_source = record_guards.fault_counts(
        labels, self.num_sources)
    sums = StepSums(
        loss=tf.reduce_sum(per_example), top1=tf.reduce_sum(top1),
        top5=tf.reduce_sum(top5), examples=tf.reduce_sum(weight),
        unusable=unusable, lost=lost, nonfinite=tf.zeros([]),
        by_source=by_source)
    return grads, sums

  def apply(self, grads) -> None:
    self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))

  def train(self, images, labels) -> StepSums:
    """One training step; `nonfinite` > 0 if its loss/gradients were not
    finite (on this replica, or on any with --skip_nonfinite_steps)."""
    skip = self.skips_nonfinite_steps
    stats = ([tf.identity(v.value) for v in self.model.non_trainable_variables]
             if skip else [])
    grads, sums = self.gradients(images, labels)
    nonfinite = 1.0 - tf.cast(all_finite([sums.loss] + grads), tf.float32)
    if skip:
      nonfinite = tf.distribute.get_replica_context().all_reduce(
          tf.distribute.ReduceOp.SUM, nonfinite)
      self._apply_if_finite(nonfinite, grads, stats)
      if self.loss_scale is not None:
        self.loss_scale.update(tf.equal(nonfinite, 0.0))
    else:
      self.apply(grads)
    return sums._replace(nonfinite=nonfinite)

  @property
  def skips_nonfinite_steps(self) -> bool:
    """--skip_nonfinite_steps, or float16's loss scaling (a step that
    overflows is skipped and the scale halves)."""
    return (self.cfg.optim.skip_nonfinite_steps or
            self.loss_scale is not None)

  def _apply_if_finite(self, nonfinite, grads, stats) -> None:
    """--skip_nonfinite_steps: a step that was not finite on any replica
    leaves no trace: no optimizer update, no step count, BN moving statistics
    put back to `stats`.

    `nonfinite` is summed over all replicas, so every replica and worker
    takes the same branch and the collectives inside it match. Strategies
    that synchronise through merge_call need the branch in cross-replica
    context (as keras.optimizers.LossScaleOptimizer does).
    """
    finite = tf.equal(nonfinite, 0.0)
    if compat.strategy_supports_no_merge_call():
      tf.cond(finite, lambda: self.apply(grads),
              lambda: self._put_back(stats))
    else:
      tf.distribute.get_replica_context().merge_call(
          self._apply_if_finite_cross_replica, args=(finite, grads, stats))

  def _put_back(self, stats) -> None:
    for variable, value in zip(self.model.non_trainable_variables, stats):
      variable.assign(value)

  def _apply_if_finite_cross_replica(self, strategy, finite, grads, stats):
    finite = strategy.experimental_local_results(finite)[0]

    def apply():
      strategy.extended.call_for_each_replica(self.apply, args=(grads,))

    def put_back():
      for variable, value in zip(self.model.non_trainable_variables, stats):
        strategy.extended.update(variable.value, lambda v, x: v.assign(x),
                                 args=(value,), group=False)

    tf.cond(finite, apply, put_back)

  def accumulate(self, images, labels, micro_batches) -> StepSums:
    """Batch-size control (Mikami et al.): adds one micro-batch's gradients
    to the accumulators."""
    grads, sums = self.gradients(images, labels, micro_batches)
    for acc, grad in zip(self.accumulators, grads):
      acc.assign_add(grad)
    return sums

  def apply_accumulated(self) -> tf.Tensor:
    """Applies the accumulated gradients; returns 1.0 if non-finite."""
    grads = [acc.read_value() for acc in self.accumulators]
    self.apply(grads)
    for acc in self.accumulators:
      acc.assign(tf.zeros_like(acc))
    return 1.0 - tf.cast(all_finite(grads), tf.float32)

  def average_moving_statistics(self) -> None:
    """Every replica's BN moving statistics become their mean over all
    replicas (moving_statistics.py): once per host loop, not per step."""
    moving_statistics.average_over_replicas(self.replica_local)

  def eval(self, images, labels, mask) -> StepSums:
    """Sums of one eval batch; `mask` is 0 on the padding of the last."""
    logits = self.model(images, training=False)
    per_example, top1, top5, _ = self.losses_and_hits(logits, labels)
    mask = tf.cast(mask, tf.float32)
    return StepSums.zeros(self.num_sources)._replace(
        loss=tf.reduce_sum(per_example * mask),
        top1=tf.reduce_sum(top1 * mask), top5=tf.reduce_sum(top5 * mask),
        examples=tf.reduce_sum(mask))


def make_accumulators(model: keras.Model) -> list[tf.Variable]:
  """Per-replica gradient sums for batch-size control (never summed across
  replicas: each replica applies its own through the optimizer's sum)."""
  return [tf.Variable(tf.zeros_like(v), trainable=False,
                      synchronization=tf.VariableSynchronization.ON_READ,
                      aggregation=tf.VariableAggregation.SUM)
          for v in model.trainable_variables]
