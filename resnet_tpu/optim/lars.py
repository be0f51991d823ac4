"""Layer-wise Adaptive Rate Scaling, LARS (You et al. 2017).

Ying et al. 2018 §3 use LARS to train ResNet-50 at global batches up to 32768,
beyond the 8192 that momentum SGD reaches. For each adapted variable w with
gradient g (the cross-replica sum of the replicas' gradients):

  trust = eta * ||w|| / (||g|| + weight_decay_rate * ||w|| + epsilon)
          (1.0 when ||w|| or ||g|| is 0, as tensorflow/tpu's LARSOptimizer)
  v     = momentum * v + learning_rate * trust * (g + weight_decay_rate * w)
  w     = w - v                                   (classic momentum)
  w     = w - learning_rate * trust * (g + weight_decay_rate * w)
            - momentum * v                        (Nesterov)

Variables that are not adapted use trust = 1 and no weight decay. A variable
is not adapted when its rank is <= 1 (batch-norm gamma/beta, biases) or its
path contains one of `exclude_from_adaptation` (case-insensitive substring).
The decision is taken once, at build time, from the Keras variable path: the
distributed update step only sees the per-device tf.Variable.

Weight decay is part of the update, so the loss must not add an L2 term.
"""
from typing import Sequence

import keras
from keras import ops

DEFAULT_EXCLUDE = ("batch_norm", "bn", "gamma", "beta", "bias")


def uses_layer_adaptation(path: str, rank: int,
                          exclude: Sequence[str] = DEFAULT_EXCLUDE) -> bool:
  """Whether LARS applies its trust ratio and weight decay to a variable."""
  lowered = path.lower()
  return rank > 1 and not any(p.lower() in lowered for p in exclude)


def _l2_norm(x):
  return ops.sqrt(ops.sum(ops.square(x)))


@keras.saving.register_keras_serializable(package="resnet_tpu")
class LARS(keras.optimizers.Optimizer):
  """LARS with classic or Nesterov momentum; see the module docstring.

  Args:
    learning_rate: float or LearningRateSchedule; the global LR before the
      per-layer trust ratio.
    momentum: momentum coefficient in [0, 1].
    nesterov: Nesterov momentum instead of classic momentum.
    weight_decay_rate: L2 coefficient added to the gradient of adapted
      variables inside the update.
    eta: LARS trust coefficient.
    epsilon: added to the trust-ratio denominator.
    exclude_from_adaptation: path substrings of variables to leave unadapted
      (on top of every variable of rank <= 1).
    **kwargs: the base Optimizer's arguments; its decoupled `weight_decay` is
      refused because LARS decays inside the update.
  """

  def __init__(self, learning_rate=0.1, momentum: float = 0.9,
               nesterov: bool = False, weight_decay_rate: float = 1e-4,
               eta: float = 0.001, epsilon: float = 0.0,
               exclude_from_adaptation: Sequence[str] = DEFAULT_EXCLUDE,
               name: str = "lars", **kwargs):
    if kwargs.get("weight_decay") is not None:
      raise ValueError(
          "LARS applies weight decay inside its update: pass "
          "weight_decay_rate, not the base optimizer's weight_decay")
    super().__init__(learning_rate=learning_rate, name=name, **kwargs)
    if not 0.0 <= momentum <= 1.0:
      raise ValueError(f"--momentum must be in [0, 1], got {momentum}")
    if eta <= 0:
      raise ValueError(f"--lars_eta must be positive, got {eta}")
    self.momentum = float(momentum)
    self.nesterov = bool(nesterov)
    self.weight_decay_rate = float(weight_decay_rate)
    self.eta = float(eta)
    self.epsilon = float(epsilon)
    self.exclude_from_adaptation = tuple(exclude_from_adaptation)

  def build(self, variables):
    """Creates one momentum slot per variable; fixes which are adapted."""
    if self.built:
      return
    super().build(variables)
    self.momentums = self.add_optimizer_variables(variables, "momentum")
    self._adapted = tuple(
        uses_layer_adaptation(getattr(v, "path", v.name), len(v.shape),
                              self.exclude_from_adaptation)
        for v in variables)

  def is_adapted(self, variable) -> bool:
    """Whether `variable` (built into this optimizer) gets the trust ratio."""
    return self._adapted[self._get_variable_index(variable)]

  def _adapt(self, gradient, variable, learning_rate):
    """Adds weight decay to the gradient and scales the LR by the trust."""
    w_norm = _l2_norm(variable)
    g_norm = _l2_norm(gradient)
    trust = ops.where(
        w_norm > 0,
        ops.where(
            g_norm > 0,
            self.eta * w_norm /
            (g_norm + self.weight_decay_rate * w_norm + self.epsilon),
            1.0),
        1.0)
    decayed = gradient + self.weight_decay_rate * variable
    return decayed, learning_rate * ops.cast(trust, variable.dtype)

  def update_step(self, gradient, variable, learning_rate):
    """Applies one LARS momentum update to `variable`."""
    learning_rate = ops.cast(learning_rate, variable.dtype)
    gradient = ops.cast(gradient, variable.dtype)
    if self.is_adapted(variable):
      gradient, learning_rate = self._adapt(gradient, variable, learning_rate)
    velocity = self.momentums[self._get_variable_index(variable)]
    momentum = ops.cast(self.momentum, variable.dtype)
    scaled = ops.multiply(gradient, learning_rate)
    self.assign(velocity, ops.add(ops.multiply(velocity, momentum), scaled))
    if self.nesterov:
      self.assign_sub(variable,
                      ops.add(scaled, ops.multiply(velocity, momentum)))
    else:
      self.assign_sub(variable, velocity)

  def get_config(self) -> dict:
    config = super().get_config()
    config.update({
        "momentum": self.momentum,
        "nesterov": self.nesterov,
        "weight_decay_rate": self.weight_decay_rate,
        "eta": self.eta,
        "epsilon": self.epsilon,
        "exclude_from_adaptation": list(self.exclude_from_adaptation),
    })
    return config
