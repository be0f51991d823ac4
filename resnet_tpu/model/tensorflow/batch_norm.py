"""Distributed BN's TensorFlow piece: the group sum and fused kernels.

The group sum is tf.distribute's (parallel/tensorflow/bn_all_reduce.py:
TPUStrategy, Mirrored and multi-worker). In training, group_size 1 runs one
local FusedBatchNormV3; larger groups normalise with the fused kernels on the
group's statistics and a hand-written gradient that all-reduces the sums of dy
and dy * x_hat in the group (on TPU XLA fuses either form). Calls the fused
kernels cannot take go through Keras's path with the layer's group moments
(distributed_batch_norm.py).
"""
import tensorflow as tf

from resnet_tpu.parallel.tensorflow import bn_all_reduce
from resnet_tpu.model.batch_statistics import local_sums
from resnet_tpu.model.batch_statistics import moments_from_sums


def group_sum(layer, x: tf.Tensor) -> tf.Tensor:
  """`x` summed over the caller's BN group of `layer`'s replicas."""
  return bn_all_reduce.group_all_reduce(
      x, layer.group_size, layer.all_reduce, layer.collective_timeout_s,
      layer.groups)


def fusable(layer, inputs, mask) -> bool:
  """Whether this training call can use the fused kernels.

  NHWC in a dtype the kernels take (float32, bfloat16, float16), static
  per-channel count > 1, no mask and no bn_recompute sink:
  group_size 1 runs one local FusedBatchNormV3, larger groups normalise
  with fused kernels around their all-reduced statistics. Everything else
  takes Keras's path with the layer's all-reduced moments.
  """
  shape = inputs.shape
  return (mask is None and shape.rank == 4
          and inputs.dtype in (tf.float32, tf.bfloat16, tf.float16)
          and layer.axis in (-1, 3) and layer.scale and layer.center
          and layer.statistics_sink is None
          and shape[:-1].is_fully_defined()
          and shape[:-1].num_elements() > 1)


def fused_training_call(layer, inputs, mask) -> tf.Tensor | None:
  """The training call on fused kernels, or None for Keras's path."""
  if not fusable(layer, inputs, mask):
    return None
  if layer.group_size == 1:
    return _fused_local_call(layer, inputs)
  return _fused_group_call(layer, inputs)


def _fused_group_call(layer, inputs):
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
  x = inputs
  sums = layer.group_sum(local_sums(x, layer._reduction_axes))
  mean, variance = moments_from_sums(sums)
  layer.update_moving_statistics(mean, variance)
  y = _group_normalize(x, tf.cast(layer.gamma, tf.float32),
                       tf.cast(layer.beta, tf.float32), mean, variance,
                       sums[-1], layer.epsilon, layer.group_sum)
  return tf.cast(y, layer.compute_dtype)


def _fused_local_call(layer, inputs):
  """Local BN as one fused kernel (and one fused gradient kernel).

  Same result as the Keras path in float32 statistics: the kernel takes
  bfloat16/float16 inputs directly, normalises with the biased batch
  variance and returns the Bessel-corrected one, which we undo so the
  moving variance follows Keras's (biased) update.
  """
  x = inputs
  no_statistics = tf.constant([], tf.float32)
  y, mean, corrected_variance, _, _, _ = tf.raw_ops.FusedBatchNormV3(
      x=x, scale=tf.cast(layer.gamma, tf.float32),
      offset=tf.cast(layer.beta, tf.float32), mean=no_statistics,
      variance=no_statistics, epsilon=layer.epsilon,
      exponential_avg_factor=1.0, data_format="NHWC", is_training=True)
  count = inputs.shape[:-1].num_elements()
  variance = corrected_variance * ((count - 1) / count)
  layer.update_moving_statistics(mean, variance)
  return tf.cast(y, layer.compute_dtype)


def _group_normalize(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor,
                     mean: tf.Tensor, variance: tf.Tensor, count: tf.Tensor,
                     epsilon: float, group_sum) -> tf.Tensor:
  """(x - mean) / sigma * gamma + beta with the group gradient (see
  _fused_group_call); `group_sum` sums a tensor over the BN group.

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
