"""The group all-reduce of distributed BN (Ying et al. §3.1).

Every collective runs for real on 8 virtual CPU replicas, with a timeout so a
key mismatch fails instead of hanging.
"""
import numpy as np
import pytest
import tensorflow as tf

from collective_helpers import op_counts as _op_counts
from collective_helpers import per_replica as _per_replica
from collective_helpers import TIMEOUT_S
from conftest import cpu_strategy
from resnet_tpu.parallel.tensorflow import bn_all_reduce
from resnet_tpu.model.distributed_batch_norm import DistributedBatchNormalization

REPLICAS = 8


def _group_sums(x: np.ndarray, group_size: int) -> np.ndarray:
  groups = x.reshape(len(x) // group_size, group_size, *x.shape[1:])
  return np.repeat(groups.sum(axis=1), group_size, axis=0)


@pytest.mark.parametrize("group_size", [1, 2, 4, 8])
def test_group_all_reduce_equals_numpy_group_sums_forward_and_gradient(
    group_size):
  strategy = cpu_strategy(REPLICAS)
  rng = np.random.default_rng(group_size)
  x = rng.normal(size=(REPLICAS, 5)).astype(np.float32)
  w = rng.normal(size=(REPLICAS, 5)).astype(np.float32)

  @tf.function
  def step():
    def replica_fn():
      r = tf.distribute.get_replica_context().replica_id_in_sync_group
      xr, wr = tf.gather(x, r), tf.gather(w, r)
      with tf.GradientTape() as tape:
        tape.watch(xr)
        y = bn_all_reduce.group_all_reduce(xr, group_size, "collective",
                                           TIMEOUT_S)
        loss = tf.reduce_sum(y * wr)
      return y, tape.gradient(loss, xr)
    return strategy.run(replica_fn)

  y, dx = step()
  np.testing.assert_allclose(_per_replica(strategy, y),
                             _group_sums(x, group_size), rtol=1e-6)
  # d/dx_r sum_j w_j . (group sum of x) = the group sum of w.
  np.testing.assert_allclose(_per_replica(strategy, dx),
                             _group_sums(w, group_size), rtol=1e-6)
  # One subgroup collective forward and one backward per replica.
  expected = 2 * REPLICAS if group_size > 1 else 0
  assert _op_counts(step)[("group", group_size)] == expected


def test_group_all_reduce_in_the_trainers_host_loop_keeps_keys_consistent():
  """Same instance keys every iteration of `for _ in tf.range(n)` works."""
  strategy = cpu_strategy(REPLICAS)
  x = np.arange(REPLICAS * 3, dtype=np.float32).reshape(REPLICAS, 3)

  @tf.function
  def loop(num_steps):
    total = tf.zeros([3])
    for step in tf.range(num_steps):
      def replica_fn():
        ctx = tf.distribute.get_replica_context()
        xr = tf.gather(x, ctx.replica_id_in_sync_group)
        xr *= tf.cast(step + 1, tf.float32)
        return (bn_all_reduce.group_all_reduce(xr, 4, "collective", TIMEOUT_S)
                + bn_all_reduce.group_all_reduce(xr, 2, "collective",
                                                 TIMEOUT_S))
      total += strategy.reduce(tf.distribute.ReduceOp.SUM,
                               strategy.run(replica_fn), axis=None)
    return total

  # Each replica holds its group's sum: summing over replicas counts each
  # value group_size times, for both group sizes, in each of 3 steps.
  expected = x.sum(axis=0) * (4 + 2) * (1 + 2 + 3)
  np.testing.assert_allclose(loop(tf.constant(3)).numpy(), expected,
                             rtol=1e-6)


def _bn_step(implementation: str, x: np.ndarray, w: np.ndarray):
  strategy = cpu_strategy(REPLICAS)
  with strategy.scope():
    bn = DistributedBatchNormalization(group_size=4, momentum=0.5,
                                       all_reduce=implementation,
                                       collective_timeout_s=TIMEOUT_S)
    bn.build((None,) + x.shape[2:])

  @tf.function
  def step():
    def replica_fn():
      r = tf.distribute.get_replica_context().replica_id_in_sync_group
      xr, wr = tf.gather(x, r), tf.gather(w, r)
      with tf.GradientTape() as tape:
        tape.watch(xr)
        loss = tf.reduce_sum(bn(xr, training=True) * wr)
      return tape.gradient(loss, [xr, bn.gamma, bn.beta])
    return strategy.run(replica_fn)

  dx, dgamma, dbeta = step()
  ops = _op_counts(step)
  return (_per_replica(strategy, dx), _per_replica(strategy, dgamma),
          _per_replica(strategy, dbeta), bn.moving_mean.numpy(),
          bn.moving_variance.numpy(), ops)


def test_bn_with_collective_path_equals_bn_with_masked_path():
  rng = np.random.default_rng(0)
  x = rng.normal(2.0, 3.0, size=(REPLICAS, 2, 4, 4, 6)).astype(np.float32)
  w = rng.normal(size=x.shape).astype(np.float32)
  *efficient, efficient_ops = _bn_step("collective", x, w)
  *reference, reference_ops = _bn_step("masked", x, w)
  for got, want in zip(efficient, reference):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # Group-of-4 collectives, versus all-reduces over all 8 replicas.
  assert efficient_ops[("group", 4)] == 2 * REPLICAS
  assert reference_ops[("group", 4)] == 0


def test_auto_falls_back_to_masked_eagerly_and_collective_refuses_eager():
  strategy = cpu_strategy(4)
  x = tf.ones([3])
  ctx_sum = strategy.run(lambda: bn_all_reduce.group_all_reduce(x, 2))
  np.testing.assert_allclose(_per_replica(strategy, ctx_sum), 2.0)
  with pytest.raises(ValueError, match="tf.function"):
    strategy.run(lambda: bn_all_reduce.group_all_reduce(x, 2, "collective"))


def test_group_all_reduce_names_the_flag_on_bad_options():
  strategy = cpu_strategy(2)
  with pytest.raises(ValueError, match="--bn_all_reduce"):
    strategy.run(lambda: bn_all_reduce.group_all_reduce(tf.ones([1]), 2,
                                                        "nccl"))
  with pytest.raises(ValueError, match="bn_group_size=3"):
    bn_all_reduce.group_assignment(8, 3)
  assert bn_all_reduce.group_assignment(4, 2) == [[0, 1], [2, 3]]


def test_tpu_path_is_cross_replica_sum_with_groups_and_its_own_gradient():
  """On CPU the TPU op can be traced (not run): check group_assignment."""
  groups = [[0, 1, 2, 3], [4, 5, 6, 7]]

  @tf.function
  def traced(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = bn_all_reduce.tpu_group_all_reduce(x, groups)
    return y, tape.gradient(y, x)

  graph = traced.get_concrete_function(tf.TensorSpec([3])).graph
  sums = [op for op in graph.get_operations()
          if op.type == "CrossReplicaSum"]
  assert len(sums) == 2  # forward and gradient
  for op in sums:
    assignment = tf.get_static_value(op.inputs[1])
    np.testing.assert_array_equal(assignment, groups)


@pytest.mark.parametrize("implementation", ["collective", "masked"])
def test_explicit_groups_of_a_tpu_placement_sum_over_their_members(
    implementation):
  """Under TensorFlow's default TPU placement a BN tile holds replicas
  that are not consecutive (tpu_layout.py): both backends follow `groups`."""
  groups = [[0, 2, 5, 7], [1, 3, 4, 6]]
  strategy = cpu_strategy(REPLICAS)
  x = np.random.default_rng(3).normal(size=(REPLICAS, 4)).astype(np.float32)

  @tf.function
  def step():
    def replica_fn():
      r = tf.distribute.get_replica_context().replica_id_in_sync_group
      return bn_all_reduce.group_all_reduce(tf.gather(x, r), 4,
                                            implementation, TIMEOUT_S, groups)
    return strategy.run(replica_fn)

  want = np.empty_like(x)
  for members in groups:
    want[members] = x[members].sum(axis=0)
  np.testing.assert_allclose(_per_replica(strategy, step()), want, rtol=1e-6)
