"""Distributed BN's JAX piece: the group sum is a psum over the device
mesh's BN axis (parallel/jax/bn_all_reduce.py); training takes Keras's
keras.ops path, which XLA fuses, so there are no fused kernels of our own."""
import jax

from resnet_tpu.parallel.jax import bn_all_reduce


def group_sum(layer, x: jax.Array) -> jax.Array:
  """`x` summed over the caller's BN group of `layer`'s replicas."""
  return bn_all_reduce.group_all_reduce(x, layer.group_size)


def fused_training_call(layer, inputs, mask) -> None:
  """None: Keras's path (distributed_batch_norm.py) on every call."""
  del layer, inputs, mask
  return None
