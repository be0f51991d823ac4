"""Group all-reduce (Ying et al. §3.1) and gradient all-reduce (§3.3, Mikami).

Every collective runs for real on 8 virtual CPU replicas, with a timeout so a
key mismatch fails instead of hanging.
"""
import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import cpu_strategy
from resnet_tpu import collectives
from resnet_tpu.distributed_batch_norm import DistributedBatchNormalization
from resnet_tpu.optimizers import build_optimizer
from resnet_tpu.schedules import EpochClock

REPLICAS = 8
TIMEOUT_S = 60.0


@pytest.fixture(autouse=True)
def _collective_timeout():
  with collectives.options(timeout_seconds=TIMEOUT_S):
    yield


def _per_replica(strategy, values):
  return np.stack([v.numpy() for v in
                   strategy.experimental_local_results(values)])


def _op_counts(function, *args) -> collections.Counter:
  """Op types of a traced step; ("group", n) counts n-replica reduces and
  ("ours", n) those with our group keys (not tf.distribute's)."""
  graph = function.get_concrete_function(*args).graph
  counts = collections.Counter(op.type for op in graph.get_operations())
  for op in graph.get_operations():
    if op.type == "CollectiveReduceV2":
      size, key = (int(tf.get_static_value(t)) for t in op.inputs[1:3])
      counts[("group", size)] += 1
      counts[("ours", size)] += key >= collectives.GROUP_KEY_BASE
  return counts


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
        y = collectives.group_all_reduce(xr, group_size, "collective")
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
        return (collectives.group_all_reduce(xr, 4, "collective") +
                collectives.group_all_reduce(xr, 2, "collective"))
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
    bn = DistributedBatchNormalization(group_size=4, momentum=0.5)
    bn.build((None,) + x.shape[2:])
  with collectives.options(bn_all_reduce=implementation):

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
  ctx_sum = strategy.run(lambda: collectives.group_all_reduce(x, 2))
  np.testing.assert_allclose(_per_replica(strategy, ctx_sum), 2.0)
  with pytest.raises(ValueError, match="tf.function"):
    strategy.run(lambda: collectives.group_all_reduce(x, 2, "collective"))


def test_group_all_reduce_names_the_flag_on_bad_options():
  with pytest.raises(ValueError, match="--bn_all_reduce"):
    collectives.set_options(bn_all_reduce="nccl")
  with pytest.raises(ValueError, match="bn_group_size=3"):
    collectives.group_assignment(8, 3)
  assert collectives.group_assignment(4, 2) == [[0, 1], [2, 3]]


def test_tpu_path_is_cross_replica_sum_with_groups_and_its_own_gradient():
  """On CPU the TPU op can be traced (not run): check group_assignment."""
  groups = [[0, 1, 2, 3], [4, 5, 6, 7]]

  @tf.function
  def traced(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = collectives.tpu_group_all_reduce(x, groups)
    return y, tape.gradient(y, x)

  graph = traced.get_concrete_function(tf.TensorSpec([3])).graph
  sums = [op for op in graph.get_operations()
          if op.type == "CrossReplicaSum"]
  assert len(sums) == 2  # forward and gradient
  for op in sums:
    assignment = tf.get_static_value(op.inputs[1])
    np.testing.assert_array_equal(assignment, groups)


# --- gradient all-reduce ------------------------------------------------------


@pytest.mark.parametrize("algorithm,grid",
                         [("2d", (2, 4)), ("2d", (4, 2)), ("2d", (1, 8)),
                          ("ring", None)])
def test_gradient_all_reduce_equals_a_plain_sum(algorithm, grid):
  strategy = cpu_strategy(REPLICAS)
  # 13 values: not a multiple of the row length, so padding is exercised.
  x = np.random.default_rng(1).normal(size=(REPLICAS, 13)).astype(np.float32)

  @tf.function
  def step():
    def replica_fn():
      ctx = tf.distribute.get_replica_context()
      xr = tf.gather(x, ctx.replica_id_in_sync_group)
      if algorithm == "ring":
        return collectives.ring_all_reduce(xr, ctx)
      return collectives.grid_all_reduce(xr, grid, ctx)
    return strategy.run(replica_fn)

  np.testing.assert_allclose(_per_replica(strategy, step()),
                             np.tile(x.sum(axis=0), (REPLICAS, 1)),
                             rtol=1e-5, atol=1e-6)


def _tiny_model():
  return keras.Sequential([
      keras.Input((6, 6, 3)),
      keras.layers.Conv2D(4, 3, activation="relu"),
      keras.layers.Flatten(),
      keras.layers.Dense(5),
  ])


def _train_one_step(optimizer_name, gradient_all_reduce, grid, data):
  images, labels = data
  strategy = cpu_strategy(REPLICAS)
  keras.utils.set_random_seed(0)
  with strategy.scope():
    model = _tiny_model()
    optimizer = build_optimizer(
        optimizer_name, 0.5, clock=EpochClock(64, ((0, 16),)),
        rmsprop_warmup_center_epochs=1.0,
        gradient_all_reduce=gradient_all_reduce, all_reduce_grid=grid)
    optimizer.build(model.trainable_variables)
  global_batch = len(labels)

  @tf.function
  def step():
    def replica_fn():
      r = tf.distribute.get_replica_context().replica_id_in_sync_group
      per = global_batch // REPLICAS
      x = images[r * per:(r + 1) * per]
      y = labels[r * per:(r + 1) * per]
      with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(
            y, logits, from_logits=True)) / global_batch
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
    strategy.run(replica_fn)

  step()
  return [v.numpy() for v in model.trainable_variables], _op_counts(step)


@pytest.mark.parametrize("optimizer_name,algorithm,grid", [
    ("momentum", "2d", (2, 4)),
    ("lars", "2d", (4, 2)),
    ("rmsprop_warmup", "ring", None),
])
def test_training_step_with_explicit_summation_equals_default_summation(
    optimizer_name, algorithm, grid):
  rng = np.random.default_rng(2)
  data = (tf.constant(rng.normal(size=(16, 6, 6, 3)), tf.float32),
          tf.constant(rng.integers(0, 5, size=16)))
  default, default_ops = _train_one_step(optimizer_name, "auto", None, data)
  explicit, explicit_ops = _train_one_step(optimizer_name, algorithm, grid,
                                           data)
  for got, want in zip(explicit, default):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # Keras 3.15 still sums in _all_reduce_sum_gradients: the explicit
  # collectives are in the step (one per replica), and equal weights show
  # Keras did not sum a second time.
  explicit_op = ("CollectiveAllToAllV2" if algorithm == "2d" else
                 ("ours", REPLICAS))
  assert explicit_ops[explicit_op] == REPLICAS
  assert default_ops[explicit_op] == 0


def test_gradient_all_reduce_options_name_their_flags():
  assert collectives.parse_grid("4x2") == (4, 2)
  assert collectives.parse_grid("") is None
  assert collectives.default_grid(8) == (4, 2)
  assert collectives.default_grid(7) == (7, 1)
  with pytest.raises(ValueError, match="--all_reduce_grid"):
    collectives.parse_grid("4by2")
  with pytest.raises(ValueError, match="--gradient_all_reduce"):
    collectives.use_gradient_all_reduce(keras.optimizers.SGD(), "tree")
