"""Dynamic loss scaling for --precision=float16 (GPUs without fast bfloat16).

float16 has 5 exponent bits: small activation gradients underflow to zero
(Micikevicius et al. 2018, "Mixed Precision Training", §3.2). The loss is
multiplied by a scale S before the backward pass and the float32 gradients
divided by S. A step whose loss or gradients are not finite on any replica
is skipped (no update, BN statistics put back: ReplicaStep's skip path,
counted as skipped steps) and S halves; after GROWTH_STEPS finite steps in
a row S doubles (loss_scaling.py, the rule both engines apply). This is
keras.optimizers.LossScaleOptimizer's dynamic rule and defaults, applied in
the training step rather than by wrapping the optimizer in it. Any Keras
optimizer, LARS included, could be wrapped; the reasons are what
keras.optimizers.LossScaleOptimizer does under a tf.distribute strategy
(keras-team/keras v3.15.1, keras/src/optimizers/loss_scale_optimizer.py,
`_tf_apply` and `check_finite`):
- it checks the gradients it is handed, each replica's own, before the
  cross-replica sum (Keras 3 optimizers sum inside `apply`), so a
  non-finite value on one replica is not seen by the others;
- where a strategy needs merge_call it takes replica 0's flag for all
  ("each replica computed the same `finite` value, since `grads` is
  all-reduced"), which does not hold when the sum comes later;
- it skips the optimizer's update only: the BN moving statistics that the
  skipped step's forward pass already moved stay moved.
Here each replica's flag is summed over all replicas before any of them
applies (engines/tensorflow/step.py), so a non-finite value anywhere skips the
step everywhere, whatever --gradient_all_reduce, and a skipped step restores
the BN statistics.

Every replica keeps its own copy of S (replica-local, ON_READ, as the BN
moving statistics): the finite flag is summed over all replicas first, so
every copy takes the same values without a collective of its own. The
checkpoint holds S, so a resumed run continues with it.
"""
import tensorflow as tf

from resnet_tpu.train.loss_scaling import GROWTH_STEPS
from resnet_tpu.train.loss_scaling import INITIAL_SCALE
from resnet_tpu.train.loss_scaling import next_scale


class DynamicLossScale(tf.Module):
  """S and the finite steps since it last changed; build it under the
  strategy scope."""

  def __init__(self, initial_scale: float = INITIAL_SCALE,
               growth_steps: int = GROWTH_STEPS):
    super().__init__(name="loss_scale")
    local = dict(trainable=False,
                 synchronization=tf.VariableSynchronization.ON_READ,
                 aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    self.scale = tf.Variable(initial_scale, dtype=tf.float32, name="scale",
                             **local)
    self.good_steps = tf.Variable(0, dtype=tf.int64, name="good_steps",
                                  **local)
    self.growth_steps = growth_steps

  def update(self, finite: tf.Tensor) -> None:
    """After a step (replica context): halve S when it was not finite,
    double it after growth_steps finite steps in a row."""
    scale, good_steps = next_scale(self.scale.read_value(),
                                   self.good_steps.read_value(), finite,
                                   self.growth_steps)
    self.scale.assign(scale)
    self.good_steps.assign(good_steps)
