"""Distributed batch normalization (Ying et al. 2018, §3.1).

With thousands of replicas the per-replica batch is tiny (Ying et al. use 32
or fewer images per TPU core), so each replica's batch statistics are noisy.
Distributed BN computes mean and variance over a *group* of `group_size`
replicas: each replica contributes its per-channel sums, one group all-reduce
combines them in float32, and every replica of the group normalises with the
same statistics. group_size 1 is ordinary local BN; group_size equal to the
replica count is fully synchronised BN. Gradients flow through the all-reduce.

Inference mode uses the moving statistics only, so an exported model holds no
collective op.
"""
import keras
import tensorflow as tf

from resnet_tpu import collectives


@keras.saving.register_keras_serializable(package="resnet_tpu")
class DistributedBatchNormalization(keras.layers.BatchNormalization):
  """BatchNormalization whose training statistics span a group of replicas."""

  def __init__(self, group_size: int = 1, **kwargs):
    if group_size < 1:
      raise ValueError(f"group_size must be >= 1, got {group_size}.")
    if kwargs.get("renorm") or kwargs.get("synchronized"):
      raise ValueError("DistributedBatchNormalization replaces `renorm` and "
                       "`synchronized`; use group_size instead.")
    super().__init__(**kwargs)
    self.group_size = group_size

  def build(self, input_shape):
    # Moving statistics are written from every replica; aggregation="mean"
    # keeps them identical on all replicas (the mean of the group updates).
    shape = (input_shape[self.axis],)
    if self.scale:
      self.gamma = self.add_weight(
          shape=shape, name="gamma", initializer=self.gamma_initializer,
          regularizer=self.gamma_regularizer, trainable=True, autocast=False)
    if self.center:
      self.beta = self.add_weight(
          shape=shape, name="beta", initializer=self.beta_initializer,
          regularizer=self.beta_regularizer, trainable=True, autocast=False)
    self.moving_mean = self.add_weight(
        shape=shape, name="moving_mean",
        initializer=self.moving_mean_initializer, trainable=False,
        autocast=False, aggregation="mean")
    self.moving_variance = self.add_weight(
        shape=shape, name="moving_variance",
        initializer=self.moving_variance_initializer, trainable=False,
        autocast=False, aggregation="mean")
    self.input_spec = keras.layers.InputSpec(
        ndim=len(input_shape), axes={self.axis: input_shape[self.axis]})
    axes = list(range(len(input_shape)))
    del axes[self.axis]
    self._reduction_axes = axes
    self.built = True

  def _moments(self, inputs, mask):
    if mask is not None:
      raise ValueError("DistributedBatchNormalization does not support masks.")
    return group_moments(inputs, self._reduction_axes, self.group_size)

  def get_config(self):
    config = super().get_config()
    config.pop("renorm", None)
    config.pop("renorm_clipping", None)
    config.pop("renorm_momentum", None)
    config.pop("synchronized", None)
    return {**config, "group_size": self.group_size}


def group_moments(x: tf.Tensor, axes: list[int],
                  group_size: int) -> tuple[tf.Tensor, tf.Tensor]:
  """Mean and (biased) variance of `x` over `axes` and the replica group.

  Per-channel sum, sum of squares and count travel in ONE float32 collective.
  """
  x = tf.cast(x, tf.float32)
  count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), tf.float32)
  local_sum = tf.reduce_sum(x, axes)
  channels = local_sum.shape[0]
  local = tf.concat(
      [local_sum, tf.reduce_sum(tf.square(x), axes), count[tf.newaxis]], 0)
  total = collectives.group_all_reduce(local, group_size)
  group_sum, group_sq, group_count = tf.split(total, [channels, channels, 1])
  mean = group_sum / group_count
  variance = tf.maximum(group_sq / group_count - tf.square(mean), 0.0)
  return mean, variance
