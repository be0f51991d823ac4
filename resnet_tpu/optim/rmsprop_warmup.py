"""RMSprop warm-up (Akiba et al. 2017): RMSprop that turns into momentum SGD.

Akiba et al. 2017 train ResNet-50 at batch 32k by starting with RMSprop and
moving smoothly to momentum SGD. Our paper summary names the technique only;
the update and the transition curve below follow a public ChainerMN
re-implementation of the paper's recipe:

  ms = rho * ms + (1 - rho) * g**2
  v  = momentum * v + alpha * lr * g
       + (1 - alpha) * rmsprop_lr * g / (sqrt(ms) + epsilon)
  w  = w - v

alpha is the SGD share, a function of the epoch e with centre c and period p:

  alpha(e) = 0.5 * exp(2 * (e - c) / p)   for e < c
           = 0.5 + (e - c) / p            for c <= e < c + p / 2
           = 1                            from e = c + p / 2 on

that is 0.5 * (elu(2 * (e - c) / p) + 1) capped at 1: smooth, 0.5 at the
centre, exactly 1 (pure momentum SGD) from c + p / 2 on. The curve is then
shifted and rescaled, alpha <- (alpha - alpha(0)) / (1 - alpha(0)), so the
first step is exactly RMSprop (the re-implementation starts at alpha(0) =
0.5 * exp(-2c / p), 0.9% SGD with the defaults). With alpha = 0 the update
is exactly RMSprop with momentum (epsilon outside the square root).

The velocity v holds learning-rate-scaled steps, as Keras SGD's does; for a
constant LR this equals the re-implementation's `w += lr * d` form and avoids
dividing by an LR that warm-up may set to 0. Weight decay is not part of the
update: the trainer adds L2 to the loss, as for momentum SGD.
"""
from typing import Sequence

import keras
from keras import ops

from resnet_tpu.clock import EpochClock
from resnet_tpu.optim.schedules import epoch_tensor


def _elu_share(epoch, center_epochs: float, period_epochs: float):
  x = 2.0 * (ops.cast(epoch, "float32") - center_epochs) / period_epochs
  return ops.where(x < 0, 0.5 * ops.exp(ops.minimum(x, 0.0)), 0.5 + 0.5 * x)


def sgd_share(epoch, center_epochs: float, period_epochs: float):
  """The SGD share alpha(epoch) of the module docstring, as float32.

  0 at epoch 0 (pure RMSprop), 1 from center + period / 2 on (pure SGD).
  """
  start = _elu_share(0.0, center_epochs, period_epochs)
  share = (_elu_share(epoch, center_epochs, period_epochs) - start) / (
      1.0 - start)
  return ops.clip(share, 0.0, 1.0)


@keras.saving.register_keras_serializable(package="resnet_tpu")
class SgdShareSchedule(keras.optimizers.schedules.LearningRateSchedule):
  """alpha(epoch(step)): the RMSprop-to-SGD transition, defined in epochs."""

  def __init__(self, center_epochs: float, period_epochs: float, *,
               images_per_epoch: int,
               batch_size_schedule: Sequence[Sequence[int]]):
    super().__init__()
    if period_epochs <= 0:
      raise ValueError(
          f"--rmsprop_warmup_period_epochs must be positive, got "
          f"{period_epochs}")
    self.center_epochs = float(center_epochs)
    self.period_epochs = float(period_epochs)
    self.clock = EpochClock(
        images_per_epoch, tuple(tuple(p) for p in batch_size_schedule))

  def __call__(self, step):
    return sgd_share(epoch_tensor(self.clock, step), self.center_epochs,
                     self.period_epochs)

  def get_config(self) -> dict:
    return {
        "center_epochs": self.center_epochs,
        "period_epochs": self.period_epochs,
        "images_per_epoch": self.clock.images_per_epoch,
        "batch_size_schedule": [list(p)
                                for p in self.clock.batch_size_schedule],
    }


@keras.saving.register_keras_serializable(package="resnet_tpu")
class RMSpropWarmup(keras.optimizers.Optimizer):
  """Blend of RMSprop and momentum SGD; see the module docstring.

  Args:
    learning_rate: float or LearningRateSchedule; the momentum-SGD LR.
    sgd_share: float or LearningRateSchedule (e.g. SgdShareSchedule) giving
      alpha in [0, 1] at each step.
    rmsprop_learning_rate: the constant LR of the RMSprop part.
    momentum: momentum coefficient shared by both parts.
    rho: decay of the running mean of squared gradients.
    epsilon: added to sqrt(ms).
    **kwargs: the base Optimizer's arguments.
  """

  def __init__(self, learning_rate=0.1, *, sgd_share,
               rmsprop_learning_rate: float = 3e-4, momentum: float = 0.9,
               rho: float = 0.99, epsilon: float = 1e-8,
               name: str = "rmsprop_warmup", **kwargs):
    super().__init__(learning_rate=learning_rate, name=name, **kwargs)
    if isinstance(sgd_share, dict):
      sgd_share = keras.optimizers.schedules.deserialize(sgd_share)
    if not 0.0 <= momentum <= 1.0:
      raise ValueError(f"--momentum must be in [0, 1], got {momentum}")
    if not callable(sgd_share) and not 0.0 <= sgd_share <= 1.0:
      raise ValueError(f"sgd_share must be in [0, 1], got {sgd_share}")
    self.sgd_share = sgd_share
    self.rmsprop_learning_rate = float(rmsprop_learning_rate)
    self.momentum = float(momentum)
    self.rho = float(rho)
    self.epsilon = float(epsilon)

  def build(self, variables):
    """Creates the momentum and mean-square slots of every variable."""
    if self.built:
      return
    super().build(variables)
    self.momentums, self.mean_squares = self.add_optimizer_variables(
        variables, ["momentum", "mean_square"])

  def _current_sgd_share(self):
    if callable(self.sgd_share):
      return self.sgd_share(self.iterations)
    return ops.convert_to_tensor(self.sgd_share, "float32")

  def update_step(self, gradient, variable, learning_rate):
    """Applies one blended RMSprop / momentum-SGD update to `variable`."""
    dtype = variable.dtype
    learning_rate = ops.cast(learning_rate, dtype)
    gradient = ops.cast(gradient, dtype)
    alpha = ops.cast(self._current_sgd_share(), dtype)
    index = self._get_variable_index(variable)
    velocity, mean_square = self.momentums[index], self.mean_squares[index]

    self.assign(mean_square, ops.add(
        ops.multiply(self.rho, mean_square),
        ops.multiply(1.0 - self.rho, ops.square(gradient))))
    rmsprop_step = ops.divide(
        ops.multiply(self.rmsprop_learning_rate, gradient),
        ops.add(ops.sqrt(mean_square), self.epsilon))
    sgd_step = ops.multiply(learning_rate, gradient)
    step = ops.add(ops.multiply(alpha, sgd_step),
                   ops.multiply(1.0 - alpha, rmsprop_step))
    self.assign(velocity, ops.add(ops.multiply(self.momentum, velocity), step))
    self.assign_sub(variable, velocity)

  def get_config(self) -> dict:
    config = super().get_config()
    share = self.sgd_share
    if isinstance(share, keras.optimizers.schedules.LearningRateSchedule):
      share = keras.optimizers.schedules.serialize(share)
    config.update({
        "sgd_share": share,
        "rmsprop_learning_rate": self.rmsprop_learning_rate,
        "momentum": self.momentum,
        "rho": self.rho,
        "epsilon": self.epsilon,
    })
    return config
