"""Grouped BN on JAX (Ying et al. §3.1) equals Keras's BatchNormalization on
each group's images: outputs, input and parameter gradients, and the moving
statistics averaged over replicas (as tests/test_distributed_batch_norm.py
on TensorFlow)."""
import jax
from jax.sharding import PartitionSpec
import keras
import numpy as np
import pytest

from resnet_tpu.model.distributed_batch_norm import DistributedBatchNormalization
from resnet_tpu.parallel.jax.bn_all_reduce import build_mesh
from resnet_tpu.parallel.jax.bn_all_reduce import REPLICA_AXES

REPLICAS = 8
PER_REPLICA = 2
SHAPE = (4, 4, 3)
MOMENTUM = 0.9


def _data():
  rng = np.random.RandomState(0)
  x = rng.randn(REPLICAS * PER_REPLICA, *SHAPE).astype(np.float32) * 3 + 1
  # A per-example weight so that every gradient depends on which replica
  # holds which example.
  w = rng.randn(REPLICAS * PER_REPLICA, *SHAPE).astype(np.float32)
  gamma = rng.rand(SHAPE[-1]).astype(np.float32) + 0.5
  beta = rng.randn(SHAPE[-1]).astype(np.float32)
  return x, w, gamma, beta


def _gradients(layer, trainable, non_trainable, x, w):
  """Output, d(sum(y * w))/d(x, trainable) and the new moving statistics."""
  def loss(trainable, x):
    y, new = layer.stateless_call(trainable, non_trainable, x, training=True)
    return (y * w).sum(), (y, new)
  (d_trainable, dx), (y, new) = jax.grad(loss, argnums=(0, 1),
                                         has_aux=True)(trainable, x)
  return y, dx, d_trainable, new


def _distributed(group_size, x, w, gamma, beta):
  """Group BN on 8 devices: every output in replica order, the parameter
  gradients and moving statistics summed/averaged over replicas."""
  bn = DistributedBatchNormalization(group_size=group_size, momentum=MOMENTUM)
  bn.build((None,) + SHAPE)
  trainable = [gamma, beta]
  non_trainable = [v.value for v in bn.non_trainable_variables]

  def replica(trainable, xs, ws):
    y, dx, d_trainable, new = _gradients(bn, trainable, non_trainable, xs, ws)
    d_trainable, new = jax.lax.psum((d_trainable, new), REPLICA_AXES)
    return y, dx, d_trainable, [v / REPLICAS for v in new]

  batch, replicated = PartitionSpec(REPLICA_AXES), PartitionSpec()
  step = jax.jit(jax.shard_map(
      replica, mesh=build_mesh(group_size),
      in_specs=(replicated, batch, batch),
      out_specs=(batch, batch, replicated, replicated), check_vma=False))
  y, dx, (dgamma, dbeta), (mean, variance) = step(trainable, x, w)
  return [np.asarray(t) for t in (y, dx, dgamma, dbeta, mean, variance)]


def _reference(group_size, x, w, gamma, beta):
  """Keras's BatchNormalization on one device, once per group's images."""
  bn = keras.layers.BatchNormalization(momentum=MOMENTUM)
  bn.build((None,) + SHAPE)
  non_trainable = [v.value for v in bn.non_trainable_variables]
  size = group_size * PER_REPLICA
  outs = [_gradients(bn, [gamma, beta], non_trainable, x[s:s + size],
                     w[s:s + size]) for s in range(0, len(x), size)]
  y = np.concatenate([o[0] for o in outs])
  dx = np.concatenate([o[1] for o in outs])
  dgamma = sum(np.asarray(o[2][0]) for o in outs)
  dbeta = sum(np.asarray(o[2][1]) for o in outs)
  # Each replica's moving statistics, averaged over replicas: the mean
  # over groups (every group has the same number of replicas).
  mean = np.mean([o[3][0] for o in outs], axis=0)
  variance = np.mean([o[3][1] for o in outs], axis=0)
  return [y, dx, dgamma, dbeta, mean, variance]


NAMES = ("outputs", "input gradients", "gamma gradient", "beta gradient",
         "averaged moving means", "averaged moving variances")


@pytest.mark.parametrize("group_size", [1, 2, 4, 8])
def test_group_bn_on_8_devices_equals_keras_bn_per_group(group_size):
  data = _data()
  got = _distributed(group_size, *data)
  want = _reference(group_size, *data)
  for name, g, r in zip(NAMES, got, want):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5, err_msg=name)


def test_group_size_changes_the_statistics():
  """Guards the test above: groups 2 and 8 give different outputs."""
  data = _data()
  assert not np.allclose(_distributed(2, *data)[0],
                         _distributed(8, *data)[0], atol=1e-3)


def test_a_mesh_of_other_groups_is_refused():
  """The layer's group size must be the mesh's: a mismatch is named."""
  data = _data()
  bn = DistributedBatchNormalization(group_size=2)
  bn.build((None,) + SHAPE)
  non_trainable = [v.value for v in bn.non_trainable_variables]
  batch = PartitionSpec(REPLICA_AXES)
  step = jax.shard_map(
      lambda x: bn.stateless_call([data[2], data[3]], non_trainable, x,
                                  training=True)[0],
      mesh=build_mesh(4), in_specs=batch, out_specs=batch, check_vma=False)
  with pytest.raises(ValueError, match="bn_group_size=2.*4 devices"):
    jax.jit(step)(data[0])


def test_outside_a_mesh_group_bn_is_local_bn():
  """Outside the step's shard_map (one replica) the group sum is the
  identity, as on TensorFlow outside a replica context."""
  x, _, gamma, beta = _data()
  bn = DistributedBatchNormalization(group_size=4)
  reference = keras.layers.BatchNormalization()
  for layer in (bn, reference):
    layer.build((None,) + SHAPE)
    layer.gamma.assign(gamma)
    layer.beta.assign(beta)
  np.testing.assert_allclose(bn(x, training=True), reference(x, training=True),
                             rtol=1e-4, atol=1e-5)


def test_mesh_groups_are_consecutive_devices():
  mesh = build_mesh(4)
  assert mesh.axis_names == REPLICA_AXES
  assert [[d.id for d in row] for row in mesh.devices] == [[0, 1, 2, 3],
                                                           [4, 5, 6, 7]]
  with pytest.raises(ValueError, match="--bn_group_size=3 must divide"):
    build_mesh(3)
