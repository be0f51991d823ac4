"""RMSprop warm-up (Akiba et al. 2017): RMSprop first, momentum SGD after."""
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import cpu_strategy
from resnet_tpu.optim.optimizers import build_optimizer, weight_decay_in_loss
from resnet_tpu.optim.rmsprop_warmup import (RMSpropWarmup, SgdShareSchedule,
                                       sgd_share)
from resnet_tpu.clock import EpochClock

LR, RMSPROP_LR, MOMENTUM, RHO, EPSILON = 0.05, 0.01, 0.9, 0.99, 1e-8
# 40 images per epoch at batch 10: 4 steps per epoch. The transition centred
# on epoch 1 with period 1 reaches pure SGD at epoch 1.5, i.e. step 6.
SHARE = dict(center_epochs=1.0, period_epochs=1.0, images_per_epoch=40,
             batch_size_schedule=((0, 10),))
FIRST_PURE_SGD_STEP = 6


def numpy_step(w, v, ms, g, alpha):
  """The module docstring's update, in numpy."""
  ms = RHO * ms + (1 - RHO) * g**2
  rmsprop = RMSPROP_LR * g / (np.sqrt(ms) + EPSILON)
  v = MOMENTUM * v + alpha * LR * g + (1 - alpha) * rmsprop
  return w - v, v, ms


def numpy_rmsprop_step(w, v, ms, g):
  ms = RHO * ms + (1 - RHO) * g**2
  v = MOMENTUM * v + RMSPROP_LR * g / (np.sqrt(ms) + EPSILON)
  return w - v, v, ms


def numpy_momentum_sgd_step(w, v, g):
  v = MOMENTUM * v + LR * g
  return w - v, v


def make_optimizer(share):
  return RMSpropWarmup(LR, sgd_share=share, rmsprop_learning_rate=RMSPROP_LR,
                       momentum=MOMENTUM, rho=RHO, epsilon=EPSILON)


def gradients(steps, shape=(3, 2), seed=0):
  rng = np.random.default_rng(seed)
  return [rng.normal(size=shape).astype(np.float32) for _ in range(steps)]


def test_sgd_share_follows_the_elu_shaped_curve():
  values = [float(sgd_share(e, 10.0, 5.0)) for e in (0, 9, 10, 11, 12.5, 30)]
  start = 0.5 * math.exp(-4)
  raw = [start, 0.5 * math.exp(-0.4), 0.5, 0.7]
  np.testing.assert_allclose(
      values, [(r - start) / (1 - start) for r in raw] + [1.0, 1.0],
      rtol=1e-5, atol=1e-7)
  assert values[0] == 0.0
  # Smooth at the centre: both pieces have the same slope there.
  left = float(sgd_share(10 - 1e-3, 10.0, 5.0))
  right = float(sgd_share(10 + 1e-3, 10.0, 5.0))
  assert (right - left) / 2e-3 == pytest.approx(1 / 5 / (1 - start),
                                                rel=1e-3)


def test_with_zero_sgd_share_it_is_exactly_rmsprop():
  w0 = np.ones((3, 2), np.float32)
  variable = keras.Variable(w0)
  optimizer = make_optimizer(0.0)
  w, v, ms = w0, np.zeros_like(w0), np.zeros_like(w0)
  for g in gradients(3):
    optimizer.apply_gradients([(tf.constant(g), variable)])
    w, v, ms = numpy_rmsprop_step(w, v, ms, g)
    np.testing.assert_allclose(variable.numpy(), w, rtol=1e-6, atol=1e-7)


def test_step_0_is_exactly_rmsprop():
  w0 = np.ones((3, 2), np.float32)
  variable = keras.Variable(w0)
  optimizer = make_optimizer(SgdShareSchedule(**SHARE))
  g = gradients(1)[0]
  optimizer.apply_gradients([(tf.constant(g), variable)])
  rmsprop_only, _, _ = numpy_rmsprop_step(w0, 0 * w0, 0 * w0, g)
  np.testing.assert_allclose(variable.numpy(), rmsprop_only, rtol=1e-6)
  sgd_only, _, _ = numpy_step(w0, 0 * w0, 0 * w0, g, 1.0)
  assert not np.allclose(rmsprop_only, sgd_only, rtol=1e-3)


def test_blend_matches_numpy_then_is_exactly_momentum_sgd_after_transition():
  w0 = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
  variable = keras.Variable(w0)
  optimizer = make_optimizer(SgdShareSchedule(**SHARE))
  optimizer.build([variable])
  w, v, ms = w0, np.zeros_like(w0), np.zeros_like(w0)
  grads = gradients(10)
  for step, g in enumerate(grads[:FIRST_PURE_SGD_STEP]):
    optimizer.apply_gradients([(tf.constant(g), variable)])
    alpha = float(sgd_share(step / 4, 1.0, 1.0))
    w, v, ms = numpy_step(w, v, ms, g, alpha)
    np.testing.assert_allclose(variable.numpy(), w, rtol=1e-5, atol=1e-6)

  w, v = variable.numpy(), optimizer.momentums[0].numpy()
  for g in grads[FIRST_PURE_SGD_STEP:]:
    optimizer.apply_gradients([(tf.constant(g), variable)])
    w, v = numpy_momentum_sgd_step(w, v, g)
    np.testing.assert_allclose(variable.numpy(), w, rtol=1e-6, atol=1e-7)


def test_8_replicas_match_a_single_device():
  grads = gradients(8, shape=(4,), seed=1)
  w0 = np.ones((4,), np.float32)

  single = keras.Variable(w0)
  single_optimizer = make_optimizer(SgdShareSchedule(**SHARE))
  for g in grads:
    single_optimizer.apply_gradients([(tf.constant(g), single)])

  strategy = cpu_strategy(8)
  with strategy.scope():
    mirrored = keras.Variable(w0)
    optimizer = make_optimizer(SgdShareSchedule(**SHARE))
    optimizer.build([mirrored])

  @tf.function
  def train_step(g):
    def replica_fn():
      # Each replica holds 1/8 of the gradient; Keras sums them.
      optimizer.apply_gradients([(g / 8.0, mirrored)])
    strategy.run(replica_fn)

  for g in grads:
    train_step(tf.constant(g))
  for value in strategy.experimental_local_results(mirrored.value):
    np.testing.assert_allclose(value.numpy(), single.numpy(), rtol=1e-5)


def test_config_round_trip_keeps_the_share_schedule():
  optimizer = make_optimizer(SgdShareSchedule(**SHARE))
  config = optimizer.get_config()
  restored = RMSpropWarmup.from_config(config)
  assert restored.get_config() == config
  assert isinstance(restored.sgd_share, SgdShareSchedule)


def test_build_optimizer_rmsprop_warmup_transitions_in_epochs_of_the_clock():
  clock = EpochClock(40, ((0, 10),))
  optimizer = build_optimizer(
      "rmsprop_warmup", LR, momentum=MOMENTUM, rmsprop_learning_rate=0.02,
      rmsprop_warmup_center_epochs=1.0, rmsprop_warmup_period_epochs=1.0,
      clock=clock)
  assert isinstance(optimizer, RMSpropWarmup)
  assert optimizer.rmsprop_learning_rate == 0.02
  # Step 4 is epoch 1, the centre: half SGD (after the rescaling that makes
  # step 0 pure RMSprop).
  start = 0.5 * math.exp(-2.0)
  assert float(optimizer.sgd_share(np.int64(4))) == pytest.approx(
      (0.5 - start) / (1 - start))
  assert float(optimizer.sgd_share(np.int64(0))) == 0.0
  assert float(optimizer.sgd_share(np.int64(FIRST_PURE_SGD_STEP))) == 1.0
  assert weight_decay_in_loss("rmsprop_warmup")


@pytest.mark.parametrize("kwargs,flag", [
    ({}, "EpochClock"),
    ({"clock": EpochClock(40, ((0, 10),)), "nesterov": True}, "--nesterov"),
])
def test_build_optimizer_rmsprop_warmup_rejects_bad_arguments(kwargs, flag):
  with pytest.raises(ValueError, match=flag):
    build_optimizer("rmsprop_warmup", LR, **kwargs)
