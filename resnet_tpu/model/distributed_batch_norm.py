"""Distributed batch normalization (Ying et al. 2018, §3.1).

With thousands of replicas the per-replica batch is tiny (Ying et al. use 32
or fewer images per TPU core), so each replica's batch statistics are noisy.
Distributed BN computes mean and variance over a *group* of `group_size`
replicas: each replica contributes its per-channel sums, one group all-reduce
combines them in float32, and every replica of the group normalises with the
same statistics. group_size 1 is ordinary local BN, run as one fused kernel
(FusedBatchNormV3); larger groups normalise with the fused kernels on the
group's statistics and a hand-written gradient that all-reduces the sums of
dy and dy * x_hat in the group (on TPU XLA fuses either form). group_size
equal to the replica count is fully synchronised BN.

Inference mode uses the moving statistics only, so an exported model holds no
collective op. The moving statistics are replica-local: each replica updates
its own with no communication, and moving_statistics.py averages them over
all replicas once per host loop.
"""
import contextlib
import dataclasses
from typing import Sequence

import keras
import tensorflow as tf

from resnet_tpu.parallel import bn_all_reduce


@dataclasses.dataclass(frozen=True)
class StatisticsSink:
  """Holds the accumulator of a layer (a plain holder, so neither Keras nor
  tf.train.Checkpoint tracks the variable as the layer's own)."""
  variable: tf.Variable


@contextlib.contextmanager
def collect_statistics(layers: Sequence["DistributedBatchNormalization"],
                       sinks: Sequence[tf.Variable]):
  """While tracing under this context, each of `layers` adds its local
  [sum, sum of squares, count] to its sink (Akiba et al.'s recomputed
  population statistics, bn_recompute.py)."""
  for layer, sink in zip(layers, sinks):
    layer.statistics_sink = StatisticsSink(sink)
  try:
    yield
  finally:
    for layer in layers:
      layer.statistics_sink = None


@keras.saving.register_keras_serializable(package="resnet_tpu")
class DistributedBatchNormalization(keras.layers.BatchNormalization):
  """BatchNormalization whose training statistics span a group of replicas."""

  def __init__(self, group_size: int = 1, all_reduce: str = "auto",
               collective_timeout_s: float = 0.0,
               groups: Sequence[Sequence[int]] | None = None, **kwargs):
    """group_size: replicas per BN group; all_reduce: --bn_all_reduce;
    collective_timeout_s: fail a group all-reduce that waits longer (0 =
    never); groups: the BN groups when they are not the default ranges (the
    TPU tiles of topology.py)."""
    if group_size < 1:
      raise ValueError(f"group_size must be >= 1, got {group_size}.")
    if kwargs.get("renorm") or kwargs.get("synchronized"):
      raise ValueError("DistributedBatchNormalization replaces `renorm` and "
                       "`synchronized`; use group_size instead.")
    super().__init__(**kwargs)
    self.group_size = group_size
    self.all_reduce = all_reduce
    self.collective_timeout_s = float(collective_timeout_s)
    self.groups = [list(g) for g in groups] if groups else None
    # Set by collect_statistics while bn_recompute traces its pass.
    self.statistics_sink = None

  def _group_sum(self, x: tf.Tensor) -> tf.Tensor:
    return bn_all_reduce.group_all_reduce(
        x, self.group_size, self.all_reduce, self.collective_timeout_s,
        self.groups)

  def build(self, input_shape):
    # Moving statistics: one copy per replica, updated with no
    # communication (moving_statistics.py averages them once per host loop).
    shape = (input_shape[self.axis],)
    if self.scale:
      self.gamma = self.add_weight(
          shape=shape, name="gamma", initializer=self.gamma_initializer,
          regularizer=self.gamma_regularizer, trainable=True, autocast=False)
    if self.center:
      self.beta = self.add_weight(
          shape=shape, name="beta", initializer=self.beta_initializer,
          regularizer=self.beta_regularizer, trainable=True, autocast=False)
    self.moving_mean = self._replica_local_weight(
        "moving_mean", shape, self.moving_mean_initializer)
    self.moving_variance = self._replica_local_weight(
        "moving_variance", shape, self.moving_variance_initializer)
    self.input_spec = keras.layers.InputSpec(
        ndim=len(input_shape), axes={self.axis: input_shape[self.axis]})
    axes = list(range(len(input_shape)))
    del axes[self.axis]
    self._reduction_axes = axes
    self.built = True

  def _replica_local_weight(self, name: str, shape: tuple[int],
                            initializer) -> keras.Variable:
    """A moving statistic each replica updates in place, with no
    communication (ON_READ): read across replicas (saved, exported) it is
    replica 0's copy. Layer.add_weight takes no `synchronization`; the
    variable is tracked as the layer's attribute, in the same order."""
    with keras.name_scope(self.name):
      return keras.Variable(
          initializer=keras.initializers.get(initializer), shape=shape,
          dtype=self.variable_dtype, trainable=False, autocast=False,
          synchronization="on_read", aggregation="only_first_replica",
          name=name)

  def call(self, inputs, training=None, mask=None):
    if training and self.trainable and self._fusable(inputs, mask):
      if self.group_size == 1:
        return self._fused_local_call(inputs)
      return self._fused_group_call(inputs)
    return super().call(inputs, training=training, mask=mask)

  def _fusable(self, inputs, mask) -> bool:
    """Whether this training call can use the fused kernels.

    NHWC, static per-channel count > 1, no mask and no bn_recompute sink:
    group_size 1 runs one local FusedBatchNormV3, larger groups normalise
    with fused kernels around their all-reduced statistics. Everything else
    takes Keras's path with our all-reduced moments.
    """
    shape = inputs.shape
    return (mask is None and shape.rank == 4
            and self.axis in (-1, 3) and self.scale and self.center
            and self.statistics_sink is None
            and shape[:-1].is_fully_defined()
            and shape[:-1].num_elements() > 1)

  def _update_moving_statistics(self, mean, variance) -> None:
    self.moving_mean.assign(self.moving_mean * self.momentum +
                            tf.stop_gradient(mean) * (1.0 - self.momentum))
    self.moving_variance.assign(
        self.moving_variance * self.momentum +
        tf.stop_gradient(variance) * (1.0 - self.momentum))

  def _fused_group_call(self, inputs):
    """Group BN with fused normalisation and a hand-written gradient.

    Forward: local [sum, sum of squares, count], one group all-reduce, then
    FusedBatchNormV3 in inference form with the group's mean and variance.
    Backward: FusedBatchNormGradV3 gives dy * gamma / sigma and the local
    sums of dy and dy * x_hat; one group all-reduce of those two sums adds
    the terms that flow through the group statistics:
      dx = gamma / sigma * (dy - sum_g(dy) / n - x_hat * sum_g(dy x_hat) / n)
    the same gradient as differentiating through the all-reduce, with fewer
    passes over the activations.
    """
    x = _fused_kernel_input(inputs)
    sums = self._group_sum(local_sums(x, self._reduction_axes))
    mean, variance = moments_from_sums(sums)
    self._update_moving_statistics(mean, variance)
    y = _group_normalize(x, tf.cast(self.gamma, tf.float32),
                         tf.cast(self.beta, tf.float32), mean, variance,
                         sums[-1], self.epsilon, self._group_sum)
    return tf.cast(y, self.compute_dtype)

  def _fused_local_call(self, inputs):
    """Local BN as one fused kernel (and one fused gradient kernel).

    Same result as the Keras path in float32 statistics: the kernel takes
    bfloat16/float16 inputs directly, normalises with the biased batch
    variance and returns the Bessel-corrected one, which we undo so the
    moving variance follows Keras's (biased) update.
    """
    x = _fused_kernel_input(inputs)
    no_statistics = tf.constant([], tf.float32)
    y, mean, corrected_variance, _, _, _ = tf.raw_ops.FusedBatchNormV3(
        x=x, scale=tf.cast(self.gamma, tf.float32),
        offset=tf.cast(self.beta, tf.float32), mean=no_statistics,
        variance=no_statistics, epsilon=self.epsilon,
        exponential_avg_factor=1.0, data_format="NHWC", is_training=True)
    count = inputs.shape[:-1].num_elements()
    variance = corrected_variance * ((count - 1) / count)
    self._update_moving_statistics(mean, variance)
    return tf.cast(y, self.compute_dtype)

  def _moments(self, inputs, mask):
    if mask is not None:
      raise ValueError("DistributedBatchNormalization does not support masks.")
    local = local_sums(inputs, self._reduction_axes)
    if self.statistics_sink is not None:
      self.statistics_sink.variable.assign_add(local)
    return moments_from_sums(self._group_sum(local))

  def get_config(self):
    config = super().get_config()
    config.pop("renorm", None)
    config.pop("renorm_clipping", None)
    config.pop("renorm_momentum", None)
    config.pop("synchronized", None)
    return {**config, "group_size": self.group_size,
            "all_reduce": self.all_reduce,
            "collective_timeout_s": self.collective_timeout_s,
            "groups": self.groups}


def _fused_kernel_input(x: tf.Tensor) -> tf.Tensor:
  """`x` in a dtype the fused BN kernels take (float32/bfloat16/float16)."""
  if x.dtype not in (tf.float32, tf.bfloat16, tf.float16):
    return tf.cast(x, tf.float32)
  return x


def _group_normalize(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor,
                     mean: tf.Tensor, variance: tf.Tensor, count: tf.Tensor,
                     epsilon: float, group_sum) -> tf.Tensor:
  """(x - mean) / sigma * gamma + beta with the group gradient (see
  DistributedBatchNormalization._fused_group_call); `group_sum` sums a
  tensor over the BN group.

  mean, variance and count (the group's element count per channel) are
  treated as functions of x through the custom gradient, so they get no
  gradient of their own.
  """
  mean, variance, count = (tf.stop_gradient(t) for t in (mean, variance,
                                                          count))

  @tf.custom_gradient
  def normalize(x, gamma, beta):
    y, _, _, _, _, reserve_3 = tf.raw_ops.FusedBatchNormV3(
        x=x, scale=gamma, offset=beta, mean=mean, variance=variance,
        epsilon=epsilon, data_format="NHWC", is_training=False)

    def grad(dy):
      # The scope name is what lab/dev/op_profile attributes.
      with tf.name_scope("group_batch_norm_grad"):
        # In inference form the reserve spaces are the mean and variance we
        # passed; we pass them again because the bfloat16 (Eigen) forward
        # kernel leaves its reserve_space_2 output uninitialised (TF 2.21).
        dx_local, dgamma, dbeta, _, _ = tf.raw_ops.FusedBatchNormGradV3(
            y_backprop=dy, x=x, scale=gamma, reserve_space_1=mean,
            reserve_space_2=variance, reserve_space_3=reserve_3,
            epsilon=epsilon, data_format="NHWC", is_training=False)
        group = group_sum(tf.concat([dbeta, dgamma], 0))
        sum_dy, sum_dy_xhat = tf.split(group, 2)
        inv_sigma = tf.math.rsqrt(variance + epsilon)
        # dx = dx_local - (a * x + b), per-channel a and b.
        a = gamma * tf.square(inv_sigma) * sum_dy_xhat / count
        b = gamma * inv_sigma * sum_dy / count - a * mean
        dx = tf.cast(dx_local, tf.float32) - (tf.cast(x, tf.float32) * a + b)
        return tf.cast(dx, x.dtype), dgamma, dbeta

    return y, grad

  return normalize(x, gamma, beta)


def local_sums(x: tf.Tensor, axes: list[int]) -> tf.Tensor:
  """[per-channel sum, per-channel sum of squares, count] in float32.

  Concatenated so the group all-reduce is ONE collective per BN layer.
  """
  x = tf.cast(x, tf.float32)
  count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), tf.float32)
  return tf.concat([tf.reduce_sum(x, axes), tf.reduce_sum(tf.square(x), axes),
                    count[tf.newaxis]], 0)


def moments_from_sums(sums: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """Mean and biased variance from `local_sums` (possibly summed)."""
  channels = (sums.shape[0] - 1) // 2
  total, total_sq, count = tf.split(sums, [channels, channels, 1])
  mean = total / count
  return mean, tf.maximum(total_sq / count - tf.square(mean), 0.0)
