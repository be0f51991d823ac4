"""Distributed BN (Ying et al. §3.1) equals standard BN on each group's batch."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import cpu_strategy
from resnet_tpu.model.distributed_batch_norm import DistributedBatchNormalization
from resnet_tpu.engines.tensorflow import moving_statistics

REPLICAS = 8
PER_REPLICA = 2
SHAPE = (4, 4, 3)
MOMENTUM = 0.9


def _data():
  rng = np.random.RandomState(0)
  x = rng.randn(REPLICAS * PER_REPLICA, *SHAPE).astype(np.float32) * 3 + 1
  # A per-example weight so the loss (and so every gradient) depends on
  # which replica holds which example.
  w = rng.randn(REPLICAS * PER_REPLICA, *SHAPE).astype(np.float32)
  gamma = rng.rand(SHAPE[-1]).astype(np.float32) + 0.5
  beta = rng.randn(SHAPE[-1]).astype(np.float32)
  return x, w, gamma, beta


def _distributed(group_size, x, w, gamma, beta, dynamic_batch=False,
                 graph_ops=None):
  """Outputs, gradients and moving statistics of group BN on 8 replicas:
  each replica's own after the step, then every replica's after
  moving_statistics.average_over_replicas.

  dynamic_batch hides the per-replica batch size from the layer, which then
  takes Keras's path with all-reduced moments instead of the fused kernels;
  graph_ops, if a set, receives the op types of the traced step.
  """
  strategy = cpu_strategy(REPLICAS)
  with strategy.scope():
    bn = DistributedBatchNormalization(group_size=group_size,
                                       momentum=MOMENTUM)
    bn.build((None,) + SHAPE)
    bn.gamma.assign(gamma)
    bn.beta.assign(beta)
  dataset = strategy.experimental_distribute_dataset(
      tf.data.Dataset.from_tensor_slices((x, w)).batch(len(x)))

  @tf.function
  def step(batch):
    def replica_fn(xs, ws):
      if dynamic_batch:
        # An all-true mask: same values, batch size unknown to the graph.
        xs = tf.boolean_mask(xs, tf.fill(tf.shape(xs)[:1], True))
      with tf.GradientTape() as tape:
        tape.watch(xs)
        y = bn(xs, training=True)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * ws)
      dx, dgamma, dbeta = tape.gradient(loss, [xs, bn.gamma, bn.beta])
      return y, dx, dgamma, dbeta
    return strategy.run(replica_fn, args=batch)

  batch = next(iter(dataset))
  if graph_ops is not None:
    graph = step.get_concrete_function(batch).graph
    graph_ops.update(op.type for op in graph.get_operations())
  y, dx, dgamma, dbeta = step(batch)
  local = strategy.experimental_local_results

  def statistics():
    return [np.stack([v.numpy() for v in local(s.value)])
            for s in (bn.moving_mean, bn.moving_variance)]

  own = statistics()
  strategy.run(tf.function(lambda: moving_statistics.average_over_replicas(
      [bn.moving_mean, bn.moving_variance])))
  return (np.concatenate([v.numpy() for v in local(y)]),
          np.concatenate([v.numpy() for v in local(dx)]),
          sum(v.numpy() for v in local(dgamma)),
          sum(v.numpy() for v in local(dbeta)), *own, *statistics())


def _reference(group_size, x, w, gamma, beta):
  """Keras BatchNormalization on one device, once per group's batch."""
  group_batch = group_size * PER_REPLICA
  ys, dxs, dgamma, dbeta, means, variances = [], [], 0, 0, [], []
  for start in range(0, len(x), group_batch):
    bn = keras.layers.BatchNormalization(momentum=MOMENTUM, epsilon=1e-3)
    bn.build((None,) + SHAPE)
    bn.gamma.assign(gamma)
    bn.beta.assign(beta)
    xs = tf.constant(x[start:start + group_batch])
    with tf.GradientTape() as tape:
      tape.watch(xs)
      y = bn(xs, training=True)
      loss = tf.reduce_sum(y * w[start:start + group_batch])
    dx, dg, db = tape.gradient(loss, [xs, bn.gamma, bn.beta])
    ys.append(y.numpy())
    dxs.append(dx.numpy())
    dgamma, dbeta = dgamma + dg.numpy(), dbeta + db.numpy()
    means.append(bn.moving_mean.numpy())
    variances.append(bn.moving_variance.numpy())
  # Each replica updates its own moving statistics with its group's (no
  # communication per step); the host loop's average makes every replica's
  # the mean over replicas, i.e. over the groups.
  own = [np.repeat(s, group_size, axis=0) for s in (means, variances)]
  averaged = [np.tile(np.mean(s, axis=0), (REPLICAS, 1))
              for s in (means, variances)]
  return (np.concatenate(ys), np.concatenate(dxs), dgamma, dbeta, *own,
          *averaged)


@pytest.mark.parametrize("dynamic_batch", [False, True],
                         ids=["fused_kernels", "sums_path"])
@pytest.mark.parametrize("group_size", [1, 2, 4, 8])
def test_group_bn_on_8_replicas_equals_single_device_bn_per_group(
    group_size, dynamic_batch):
  data = _data()
  ops = set()
  got = _distributed(group_size, *data, dynamic_batch=dynamic_batch,
                     graph_ops=ops)
  # The path under test is the one that ran.
  fused = {"FusedBatchNormV3", "FusedBatchNormGradV3"} <= ops
  assert fused != dynamic_batch, sorted(ops)
  want = _reference(group_size, *data)
  names = ("outputs", "input gradients", "gamma gradient", "beta gradient",
           "each replica's moving mean", "each replica's moving variance",
           "averaged moving means", "averaged moving variances")
  for name, g, r in zip(names, got, want):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4, err_msg=name)


def test_group_size_changes_the_statistics():
  """Guards the test above: groups 2 and 8 must give different outputs."""
  data = _data()
  y2 = _distributed(2, *data)[0]
  y8 = _distributed(8, *data)[0]
  assert np.abs(y2 - y8).max() > 1e-2


def test_inference_uses_moving_statistics_without_collectives():
  bn = DistributedBatchNormalization(group_size=4)
  bn.build((None,) + SHAPE)
  bn.moving_mean.assign([1.0, 2.0, 3.0])
  bn.moving_variance.assign([4.0, 4.0, 4.0])
  x = np.ones((2,) + SHAPE, np.float32)
  graph = tf.function(lambda v: bn(v, training=False)).get_concrete_function(
      tf.TensorSpec((2,) + SHAPE)).graph
  ops = {op.type for op in graph.get_operations()}
  assert not any("Collective" in t or "AllReduce" in t or "NcclAllReduce" in t
                 for t in ops), ops
  y = bn(x, training=False).numpy()
  expected = (1.0 - np.array([1.0, 2.0, 3.0])) / np.sqrt(4.0 + bn.epsilon)
  np.testing.assert_allclose(y[0, 0, 0], expected, rtol=1e-5)


def test_group_size_must_be_positive():
  with pytest.raises(ValueError, match="group_size"):
    DistributedBatchNormalization(group_size=0)


def _graph_ops(layer, spec):
  fn = tf.function(lambda v: layer(v, training=True))
  return {op.type for op in fn.get_concrete_function(spec).graph
          .get_operations()}


@pytest.mark.parametrize("policy,tolerance", [("float32", 1e-5),
                                              ("mixed_bfloat16", 2e-2)])
def test_local_bn_runs_fused_and_equals_keras_bn(policy, tolerance):
  x, w, gamma, beta = _data()
  previous = keras.mixed_precision.global_policy()
  keras.mixed_precision.set_global_policy(policy)
  try:
    layers = [DistributedBatchNormalization(group_size=1, momentum=MOMENTUM),
              keras.layers.BatchNormalization(momentum=MOMENTUM)]
    results = []
    for bn in layers:
      bn.build((None,) + SHAPE)
      bn.gamma.assign(gamma)
      bn.beta.assign(beta)
      xs = tf.cast(tf.constant(x), bn.compute_dtype)
      with tf.GradientTape() as tape:
        tape.watch(xs)
        y = bn(xs, training=True)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * w)
      grads = tape.gradient(loss, [xs, bn.gamma, bn.beta])
      results.append([tf.cast(t, tf.float32).numpy() for t in
                      [y, *grads, bn.moving_mean, bn.moving_variance]])
    assert "FusedBatchNormV3" in _graph_ops(
        layers[0], tf.TensorSpec(x.shape, layers[0].compute_dtype))
  finally:
    keras.mixed_precision.set_global_policy(previous)
  names = ("outputs", "input gradients", "gamma gradient", "beta gradient",
           "each replica's moving mean", "each replica's moving variance",
           "averaged moving means", "averaged moving variances")
  for name, got, want in zip(names, *results):
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance,
                               err_msg=name)
  # Moving statistics are float32 from the same inputs: tight in both.
  np.testing.assert_allclose(results[0][4:], results[1][4:], rtol=1e-5,
                             atol=1e-6)


def test_bn_takes_the_sums_path_when_it_cannot_fuse():
  bn = DistributedBatchNormalization(group_size=1)
  bn.build((None,) + SHAPE)
  assert "FusedBatchNormV3" in _graph_ops(bn, tf.TensorSpec((2,) + SHAPE))
  # Unknown batch size: the per-channel count is not static.
  assert "FusedBatchNormV3" not in _graph_ops(
      bn, tf.TensorSpec((None,) + SHAPE))


def test_group_bn_in_bfloat16_fused_equals_sums_path():
  """bfloat16 activations: the fused group path agrees with Keras's path."""
  data = _data()
  previous = keras.config.dtype_policy()
  keras.config.set_dtype_policy("mixed_bfloat16")
  try:
    fused = _distributed(4, *data)
    sums = _distributed(4, *data, dynamic_batch=True)
  finally:
    keras.config.set_dtype_policy(previous)
  assert fused[0].dtype == np.dtype(tf.bfloat16.as_numpy_dtype)
  names = ("outputs", "input gradients", "gamma gradient", "beta gradient",
           "each replica's moving mean", "each replica's moving variance",
           "averaged moving means", "averaged moving variances")
  for name, f, s in zip(names, fused, sums):
    f, s = np.asarray(f, np.float32), np.asarray(s, np.float32)
    np.testing.assert_allclose(f, s, rtol=3e-2,
                               atol=3e-2 * np.abs(s).max(), err_msg=name)
