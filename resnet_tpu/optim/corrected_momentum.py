"""Momentum SGD with momentum correction (Goyal et al. 2017 §3).

Keras's SGD keeps the LR inside the velocity:
  v <- m v - lr g;  w <- w + v
so when the LR changes, v still holds steps taken at the old LR: after a
step decay the update shrinks over about 1 / (1 - m) steps, not at once,
and during a warm-up it lags the rising LR. Goyal et al. §3 correct this
by scaling v by lr_new / lr_old at each change ("momentum correction").
The corrected update is momentum with the LR outside the velocity:
  u <- m u + g;  w <- w - lr u                       (classic)
  u <- m u + g;  w <- w - lr (g + m u)               (Nesterov)
tf.compat.v1.train.MomentumOptimizer's, which tensorflow/tpu's ResNet
trains with. At a constant LR it takes the same steps as Keras's SGD.
--momentum_correction chooses it for --optimizer=momentum.
"""
import keras
from keras import ops


@keras.saving.register_keras_serializable(package="resnet_tpu")
class CorrectedMomentum(keras.optimizers.Optimizer):
  """Momentum SGD, the LR outside the velocity; see the module docstring.

  Args:
    learning_rate: float or LearningRateSchedule.
    momentum: momentum coefficient in [0, 1].
    nesterov: Nesterov momentum instead of classic momentum.
    **kwargs: the base Optimizer's arguments.
  """

  def __init__(self, learning_rate=0.1, momentum: float = 0.9,
               nesterov: bool = False, name: str = "corrected_momentum",
               **kwargs):
    super().__init__(learning_rate=learning_rate, name=name, **kwargs)
    if not 0.0 <= momentum <= 1.0:
      raise ValueError(f"--momentum must be in [0, 1], got {momentum}")
    self.momentum = float(momentum)
    self.nesterov = bool(nesterov)

  def build(self, variables):
    """Creates one accumulator slot per variable."""
    if self.built:
      return
    super().build(variables)
    self.momentums = self.add_optimizer_variables(variables, "momentum")

  def update_step(self, gradient, variable, learning_rate):
    """u <- m u + g, then w <- w - lr u (Nesterov: lr (g + m u))."""
    learning_rate = ops.cast(learning_rate, variable.dtype)
    gradient = ops.cast(gradient, variable.dtype)
    momentum = ops.cast(self.momentum, variable.dtype)
    accumulator = self.momentums[self._get_variable_index(variable)]
    self.assign(accumulator,
                ops.add(ops.multiply(accumulator, momentum), gradient))
    step = (ops.add(gradient, ops.multiply(accumulator, momentum))
            if self.nesterov else accumulator)
    self.assign_sub(variable, ops.multiply(step, learning_rate))

  def get_config(self) -> dict:
    config = super().get_config()
    config.update({"momentum": self.momentum, "nesterov": self.nesterov})
    return config
