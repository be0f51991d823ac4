"""What each side of a comparison trained with, read back from what it built.

A comparison (the stock-Keras baseline against the project's path) claims
that some settings are equal on both sides: the LR schedule, momentum,
weight decay, label smoothing. Reading them from the config proves nothing
when one side's code ignores it (issue 36: the baseline hard-coded its peak
LR at half the project's while recording the project's). So each side's
optimizer, model and loss are read here, after they are built:

- the LR of every step, from the optimizer itself (its step counter set to
  each step, then restored);
- momentum and Nesterov from the optimizer's config;
- the L2 factor per decayed kernel and how many kernels carry it;
- label smoothing of the loss;
- BN momentum and epsilon, and how many BN layers start with gamma 0;
- each conv kernel's initial std times sqrt(fan_in) (1 for variance
  1/fan_in, 1.41 for He's 2/fan_in): read before training;
- the input's per-channel mean and std as the network's first layer
  normalises it (Normalization or Rescaling).

`differences` names each shared setting that the two sides do not share;
`feature_differences` checks a rung of the ladder: the features it claims
to take from the project are the project's, the others are not.
"""
import math
import tempfile
from typing import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

from resnet_tpu.config import TrainConfig
from resnet_tpu.engines.tensorflow.engine import TensorFlowEngine

# Settings both sides of the baseline claim to share (study_report's
# "same LR rule on both sides").
SHARED = ("peak_learning_rate", "warmup_steps", "learning_rate_curve",
          "momentum", "nesterov", "weight_decay", "decayed_kernels",
          "label_smoothing")
# Two LR curves are the same when no step's LR lies further than this share
# of the peak outside the other curve's LRs at that step and its two
# neighbours: the project's schedule counts epochs, Keras's steps, so a
# warm-up or decay may start a step apart (as warmup_steps may differ by 1).
CURVE_TOLERANCE = 0.02
# Numbers agree to this relative difference (the largest LR over the steps
# falls a fraction of a step either side of the schedule's peak).
RELATIVE_TOLERANCE = 1e-3
# The settings read back for each feature of lab/study_model.FEATURES.
FEATURE_SETTINGS = {
    "conv_init": ("conv_init_gain",),
    "zero_gamma": ("zero_gamma_bn_layers",),
    "bn_settings": ("bn_momentum", "bn_epsilon"),
    "normalization": ("input_mean", "input_std"),
}
# Two conv init gains agree within this share: each is a sample's std.
GAIN_TOLERANCE = 0.05


def learning_rates(optimizer: keras.optimizers.Optimizer,
                   steps: int) -> list[float]:
  """The LR the optimizer applies at each of steps 0..steps-1."""
  counter = optimizer.iterations
  saved = int(counter.numpy())
  rates = []
  try:
    for step in range(steps):
      counter.assign(step)
      rates.append(float(keras.ops.convert_to_numpy(optimizer.learning_rate)))
  finally:
    counter.assign(saved)
  return rates


def optimizer_settings(optimizer: keras.optimizers.Optimizer,
                       steps: int) -> dict:
  """The optimizer's kind, momentum and LR over `steps` steps."""
  rates = learning_rates(optimizer, steps)
  peak = max(rates)
  config = optimizer.get_config()
  return {"optimizer": type(optimizer).__name__,
          "momentum": config.get("momentum"),
          "nesterov": config.get("nesterov"),
          "peak_learning_rate": peak,
          "warmup_steps": next(i for i, r in enumerate(rates)
                               if r >= peak * (1 - 1e-6)),
          "final_learning_rate": rates[-1],
          "learning_rate_curve": rates}


def _gain(kernel: np.ndarray) -> float:
  fan_in = int(np.prod(kernel.shape[:-1]))
  return float(np.std(kernel) * math.sqrt(fan_in))


def input_scaling(model: keras.Model) -> dict:
  """The per-channel mean and std that the network's first Normalization or
  Rescaling layer takes off its 0..255 input (rounded to 0.01)."""
  for layer in model.layers:
    if isinstance(layer, keras.layers.Normalization):
      mean = keras.ops.convert_to_numpy(layer.mean).ravel()
      std = np.sqrt(keras.ops.convert_to_numpy(layer.variance).ravel())
      break
    if isinstance(layer, keras.layers.Rescaling):
      mean = np.full(3, -layer.offset / layer.scale)
      std = np.full(3, 1 / layer.scale)
      break
  else:
    mean, std = np.zeros(3), np.ones(3)
  return {"input_mean": [round(float(m), 2) for m in mean],
          "input_std": [round(float(s), 2) for s in std]}


def model_settings(model: keras.Model) -> dict:
  """BN momentum/epsilon, zero-gamma BN layers, conv init gain and input
  scaling; call it on the model as built, before it trains."""
  bn = [layer for layer in model.layers
        if hasattr(layer, "moving_mean") and hasattr(layer, "gamma")]
  convs = [layer for layer in model.layers
           if isinstance(layer, keras.layers.Conv2D)]
  return {
      "bn_momentum": sorted({float(layer.momentum) for layer in bn}),
      "bn_epsilon": sorted({float(layer.epsilon) for layer in bn}),
      "bn_layers": len(bn),
      "zero_gamma_bn_layers": sum(
          not np.any(keras.ops.convert_to_numpy(layer.gamma)) for layer in bn),
      "conv_init_gain": float(np.median(
          [_gain(keras.ops.convert_to_numpy(layer.kernel))
           for layer in convs])),
      **input_scaling(model),
  }


def stock_regularisation(model: keras.Model) -> dict:
  """The L2 weight decay of a Keras model's kernel regularizers, as the
  `weight_decay` of the project's loss (wd / 2 * sum w^2 per kernel)."""
  factors = [layer.kernel_regularizer.l2 for layer in model.layers
             if getattr(layer, "kernel_regularizer", None) is not None]
  return {"weight_decay": 2 * factors[0] if factors else 0.0,
          "decayed_kernels": len(factors),
          "weight_decay_factors_agree": len(set(factors)) <= 1}


def project(cfg: TrainConfig,
            model_fn: Callable[[TrainConfig], keras.Model]) -> dict:
  """What the project's path trains `cfg` with, read back from a Trainer
  built from it (the run's own builder, on the default strategy: the
  settings read here do not depend on the replicas)."""
  with tempfile.TemporaryDirectory() as model_dir:
    trainer = TensorFlowEngine(cfg.replace(model_dir=model_dir),
                               tf.distribute.get_strategy(), model_fn=model_fn)
    step = trainer.replica_step
    decayed = step.decayed
    return {**optimizer_settings(trainer.optimizer,
                                 cfg.run.total_train_steps),
            **model_settings(trainer.model),
            "weight_decay": cfg.optim.weight_decay if decayed else 0.0,
            "decayed_kernels": len(decayed),
            "weight_decay_factors_agree": True,
            "label_smoothing": step.label_smoothing}


def _curve_gap(x: list[float], y: list[float]) -> float:
  """The largest distance of a y[t] from x[t-1..t+1]'s range."""
  gap = 0.0
  for t, value in enumerate(y):
    near = x[max(0, t - 1):t + 2]
    gap = max(gap, min(near) - value, value - max(near))
  return gap


def differences(a: dict, b: dict, shared: Sequence[str] = SHARED
                ) -> list[str]:
  """Each setting of `shared` that `a` and `b` do not share, named with
  both values (the LR curves by their largest gap)."""
  found = []
  for key in shared:
    x, y = a.get(key), b.get(key)
    if key == "learning_rate_curve":
      if x is None or y is None or len(x) != len(y):
        found.append(f"{key}: lengths {len(x or [])} and {len(y or [])}")
        continue
      gap = _curve_gap(x, y)
      if gap > CURVE_TOLERANCE * max(max(x), max(y)):
        found.append(f"{key}: differs by up to {gap:.4g} at one step")
    elif key == "warmup_steps":
      if x is None or y is None or abs(x - y) > 1:
        found.append(f"{key}: {x} and {y}")
    elif isinstance(x, float) and isinstance(y, float):
      if not math.isclose(x, y, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-9):
        found.append(f"{key}: {x} and {y}")
    elif x != y:
      found.append(f"{key}: {x} and {y}")
  return found


def _same(key: str, x, y) -> bool:
  if key == "conv_init_gain":
    return math.isclose(x, y, rel_tol=GAIN_TOLERANCE)
  return x == y


def feature_differences(project: dict, stock: dict,
                        features: Sequence[str]) -> list[str]:
  """What contradicts a rung that claims the project's `features` (and the
  stock choice of every other FEATURE_SETTINGS feature), both sides read
  back: each contradiction named with both values (project, stock)."""
  found = []
  for feature, keys in FEATURE_SETTINGS.items():
    same = all(_same(k, project.get(k), stock.get(k)) for k in keys)
    if same != (feature in features):
      values = "; ".join(f"{k}: {project.get(k)} and {stock.get(k)}"
                         for k in keys)
      claim = "differs" if feature in features else "is the project's"
      found.append(f"{feature} {claim} ({values})")
  return found


def without_curve(settings: dict) -> dict:
  """`settings` for a JSON record: the LR curve kept at 9 points."""
  rates = settings.get("learning_rate_curve")
  if not rates:
    return dict(settings)
  points = sorted({round(i * (len(rates) - 1) / 8) for i in range(9)})
  return {**{k: v for k, v in settings.items()
             if k != "learning_rate_curve"},
          "learning_rate_at": [(i, rates[i]) for i in points]}
