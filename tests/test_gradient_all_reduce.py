"""Gradient all-reduce across replicas (Ying et al. §3.3; Mikami et al.).

Every collective runs for real on 8 virtual CPU replicas, with a timeout so a
key mismatch fails instead of hanging.
"""
import keras
import numpy as np
import pytest
import tensorflow as tf

from collective_helpers import op_counts as _op_counts
from collective_helpers import per_replica as _per_replica
from collective_helpers import TIMEOUT_S
from conftest import cpu_strategy
from resnet_tpu import gradient_all_reduce
from resnet_tpu.config import ConfigError
from resnet_tpu.config import parse_grid
from resnet_tpu.optimizers import build_optimizer
from resnet_tpu.schedules import EpochClock

REPLICAS = 8


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
        return gradient_all_reduce.ring_all_reduce(xr, ctx, TIMEOUT_S)
      return gradient_all_reduce.torus_2d_all_reduce(xr, grid, ctx, TIMEOUT_S)
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


def _train_one_step(optimizer_name, algorithm, grid, data):
  images, labels = data
  strategy = cpu_strategy(REPLICAS)
  keras.utils.set_random_seed(0)
  with strategy.scope():
    model = _tiny_model()
    optimizer = build_optimizer(
        optimizer_name, 0.5, clock=EpochClock(64, ((0, 16),)),
        rmsprop_warmup_center_epochs=1.0,
        gradient_all_reduce=algorithm, all_reduce_grid=grid,
        collective_timeout_s=TIMEOUT_S)
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
  # Keras still sums in one replaceable place (compat.py): the explicit
  # collectives are in the step (one per replica), and equal weights show
  # Keras did not sum a second time.
  explicit_op = ("CollectiveAllToAllV2" if algorithm == "2d" else
                 ("ours", REPLICAS))
  assert explicit_ops[explicit_op] == REPLICAS
  assert default_ops[explicit_op] == 0


def test_gradient_all_reduce_options_name_their_flags():
  assert parse_grid("4x2") == (4, 2)
  assert parse_grid("") is None
  assert gradient_all_reduce.default_grid(8) == (4, 2)
  assert gradient_all_reduce.default_grid(7) == (7, 1)
  with pytest.raises(ConfigError, match="--all_reduce_grid"):
    parse_grid("4by2")
  with pytest.raises(ValueError, match="--gradient_all_reduce"):
    gradient_all_reduce.use_gradient_all_reduce(keras.optimizers.SGD(),
                                                "tree")
