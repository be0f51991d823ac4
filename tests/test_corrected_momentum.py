"""--momentum_correction: momentum SGD with the LR outside the velocity
(optim/corrected_momentum.py) takes Goyal et al.'s corrected steps across a
step decay, and Keras's SGD's steps at a constant LR."""
import keras
import numpy as np
import pytest

from resnet_tpu.config import ConfigError
from resnet_tpu.config import TrainConfig
from resnet_tpu.config import validate
from resnet_tpu.optim.corrected_momentum import CorrectedMomentum
from resnet_tpu.optim.optimizers import build_optimizer

MOMENTUM = 0.9
STEPS = 8
DECAY_AFTER = 3  # PiecewiseConstantDecay: 1.0 up to step 3, then 0.1


def _grads(seed: int = 0) -> list[np.ndarray]:
  rng = np.random.RandomState(seed)
  return [rng.randn(5).astype(np.float32) for _ in range(STEPS)]


def _train(optimizer) -> list[np.ndarray]:
  """The weights after each of STEPS updates from 1.0."""
  variable = keras.Variable(np.ones(5, np.float32))
  out = []
  for grad in _grads():
    optimizer.apply([grad], [variable])
    out.append(np.array(variable.value))
  return out


def _step_decay():
  return keras.optimizers.schedules.PiecewiseConstantDecay(
      [DECAY_AFTER], [1.0, 0.1])


def _goyal(schedule, nesterov: bool = False) -> list[np.ndarray]:
  """Goyal et al. §3's update with momentum correction, in numpy:
  v <- m (lr_t / lr_{t-1}) v + lr_t g; w <- w - v (Nesterov: w <- w -
  m v - lr_t g, from the corrected v)."""
  w, v, previous, out = np.ones(5), np.zeros(5), None, []
  for t, grad in enumerate(_grads()):
    lr = float(schedule(t))
    v = MOMENTUM * (lr / previous if previous else 1.0) * v + lr * grad
    w = w - (MOMENTUM * v + lr * grad if nesterov else v)
    previous = lr
    out.append(w)
  return out


@pytest.mark.parametrize("nesterov", [False, True])
def test_at_a_constant_lr_it_takes_keras_sgd_s_steps(nesterov):
  ours = _train(CorrectedMomentum(0.1, MOMENTUM, nesterov))
  keras_sgd = _train(keras.optimizers.SGD(0.1, MOMENTUM, nesterov))
  np.testing.assert_allclose(ours, keras_sgd, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nesterov", [False, True])
def test_across_a_step_decay_it_takes_goyal_s_corrected_steps(nesterov):
  ours = _train(CorrectedMomentum(_step_decay(), MOMENTUM, nesterov))
  np.testing.assert_allclose(ours, _goyal(_step_decay(), nesterov),
                             rtol=1e-5, atol=1e-6)
  # Keras's SGD keeps the old LR's velocity after the decay: the first
  # update at the new LR is several times the corrected one.
  keras_sgd = _train(keras.optimizers.SGD(_step_decay(), MOMENTUM,
                                          nesterov))
  at = DECAY_AFTER + 1
  ours_step = np.abs(ours[at] - ours[at - 1]).sum()
  keras_step = np.abs(keras_sgd[at] - keras_sgd[at - 1]).sum()
  assert keras_step > 3 * ours_step


def test_the_flag_builds_it_for_momentum_only():
  optimizer = build_optimizer("momentum", 0.1, momentum_correction=True)
  assert isinstance(optimizer, CorrectedMomentum)
  assert isinstance(build_optimizer("momentum", 0.1),
                    keras.optimizers.SGD)
  cfg = TrainConfig("m").replace(optimizer="lars", momentum_correction=True,
                                 train_steps=10)
  with pytest.raises(ConfigError, match="--momentum_correction"):
    validate(cfg)
