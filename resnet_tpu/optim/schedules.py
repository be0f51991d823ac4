"""Learning-rate schedules for large-batch training, defined in epochs.

Ying et al. 2018 §3 train with linear learning-rate scaling, warm-up and
decay; Goyal et al. 2017 give the linear scaling rule (LR = base x batch/256),
the gradual warm-up and the step decay at epochs 30/60/80; tensorflow/tpu's
LARS runs decay polynomially with power 2; Akiba et al. 2017 use a
"slow-start" schedule; Mikami et al. 2018 change the global batch during
training ("batch-size control").

Every schedule here is a function of the epoch, not of the step: the epoch is
images seen / images per epoch, where images seen follows from the global step
and a batch-size schedule of (start_epoch, global_batch) phases. The LR at a
step is scaled linearly with the global batch of that step, so a schedule
keeps its shape in epochs when the batch changes; with scaling "none" the
base LR is the absolute peak at every batch, so a batch-size switch leaves
the LR where it is and the larger batch alone lowers the gradient noise
(Smith et al. 2018, "Don't Decay the Learning Rate, Increase the Batch
Size", arXiv 1711.00489).
"""
from typing import Sequence

import keras
from keras import ops

from resnet_tpu.clock import EpochClock
from resnet_tpu.config import ConfigError

# tensorflow/tpu lars_util.py decays with tf.train.polynomial_decay, whose
# end_learning_rate defaults to 1e-4; MLPerf v0.6 logs it as
# lars_opt_end_learning_rate (mlcommons/training_results_v0.6 Google
# tpu-v3-1024-resnet/resnet/lars_util.py).
POLY_END_LEARNING_RATE = 1e-4

# Goyal et al. 2017: x0.1 at epochs 30, 60 and 80.
STEP_BOUNDARIES = (30.0, 60.0, 80.0)
STEP_MULTIPLIERS = (1.0, 0.1, 0.01, 0.001)
# Slow start after Akiba et al. 2017: half the scaled LR for the first 40
# epochs, then 0.075x, 0.01x and 0.001x. The paper's abstract (arXiv
# 1711.04325) does not state the numbers; these are those of a public
# ChainerMN re-implementation of the paper's recipe, and the warm-up in front
# of them is Goyal-like.
SLOW_START_BOUNDARIES = (40.0, 70.0, 85.0)
SLOW_START_MULTIPLIERS = (0.5, 0.075, 0.01, 0.001)


def epoch_tensor(clock: EpochClock, step):
  """Fractional epoch of `clock` at `step` (a scalar tensor), as float32."""
  step = ops.cast(step, "float32")
  result = ops.zeros((), "float32")
  for start, (epoch, batch) in zip(clock.phase_start_steps(),
                                   clock.batch_size_schedule):
    in_phase = epoch + (step - start) * (batch / clock.images_per_epoch)
    result = ops.where(step >= start, in_phase, result)
  return result


def global_batch_tensor(clock: EpochClock, step):
  """Global batch of `clock` at `step` (a scalar tensor), as float32."""
  step = ops.cast(step, "float32")
  result = ops.zeros((), "float32")
  for start, (_, batch) in zip(clock.phase_start_steps(),
                               clock.batch_size_schedule):
    result = ops.where(step >= start, float(batch), result)
  return result


def _decay_in_epochs(decay: str, warmup_epochs: float, train_epochs: float,
                     decay_power: float):
  """The decay part as a Keras schedule whose "step" is an epoch count."""
  if decay == "polynomial":
    return keras.optimizers.schedules.PolynomialDecay(
        1.0, train_epochs - warmup_epochs, end_learning_rate=0.0,
        power=decay_power)
  if decay == "cosine":
    return keras.optimizers.schedules.CosineDecay(
        1.0, train_epochs - warmup_epochs)
  if decay == "step":
    return keras.optimizers.schedules.PiecewiseConstantDecay(
        list(STEP_BOUNDARIES), list(STEP_MULTIPLIERS))
  if decay == "slow_start":
    return keras.optimizers.schedules.PiecewiseConstantDecay(
        list(SLOW_START_BOUNDARIES), list(SLOW_START_MULTIPLIERS))
  return None


def validate_schedule(decay: str, warmup_epochs: float, train_epochs: float,
                      scaling: str, end_learning_rate: float) -> None:
  """ConfigError naming the flag for a schedule that cannot be built (the
  pre-flight check of run.py, and every EpochSchedule)."""
  if end_learning_rate < 0:
    raise ConfigError(
        f"--end_learning_rate must be >= 0, got {end_learning_rate}")
  if warmup_epochs < 0:
    raise ConfigError(f"--warmup_epochs must be >= 0, got {warmup_epochs}")
  if decay in ("polynomial", "cosine") and train_epochs <= warmup_epochs:
    raise ConfigError(
        f"the run's {train_epochs:g} epochs (--train_epochs or --train_steps) "
        "must exceed --warmup_epochs "
        f"({warmup_epochs}) for --lr_schedule={decay}")
  boundaries = {"step": STEP_BOUNDARIES, "slow_start": SLOW_START_BOUNDARIES}
  if decay in boundaries and warmup_epochs >= boundaries[decay][0]:
    raise ConfigError(
        f"--warmup_epochs ({warmup_epochs}) must end before the first decay "
        f"of --lr_schedule={decay} at epoch {boundaries[decay][0]}")


@keras.saving.register_keras_serializable(package="resnet_tpu")
class EpochSchedule(keras.optimizers.schedules.LearningRateSchedule):
  """Linearly scaled LR with warm-up and decay, all measured in epochs.

  LR(step) = peak(step) * min(1, epoch / warmup_epochs) * decay(epoch)

  with peak(step) = base_learning_rate * B(step) / reference_batch_size and
  B(step) the global batch of the step (scaling "linear": Goyal et al. 2017
  §2.1; Ying et al. 2018 §3), or peak = base_learning_rate at every batch
  (scaling "none": an absolute LR, as tensorflow/tpu's LARS peaks are). The
  warm-up ramps linearly from 0, as in tensorflow/tpu. decay is one of:
    polynomial: after warm-up, LR = (peak - end) * (1 - (epoch - w) /
      (T - w)) ** decay_power + end, reaching the absolute end_learning_rate
      at train_epochs T, as tf.train.polynomial_decay in tensorflow/tpu's
      lars_util.py (power 2, end 1e-4);
    cosine: 0.5 * (1 + cos(pi * (epoch - w) / (T - w))) after warm-up;
    step: 1, 0.1, 0.01, 0.001 after epochs 30, 60, 80 (Goyal et al. 2017);
    slow_start: 0.5, 0.075, 0.01, 0.001 after epochs 40, 70, 85 (Akiba et
      al. 2017, see SLOW_START_BOUNDARIES for where the numbers come from);
    constant: 1.
  Piecewise decays switch on the first step strictly after a boundary.
  """

  def __init__(self, base_learning_rate: float, *, images_per_epoch: int,
               batch_size_schedule: Sequence[Sequence[int]],
               train_epochs: float, warmup_epochs: float, decay: str,
               decay_power: float = 2.0, reference_batch_size: int = 256,
               scaling: str = "linear",
               end_learning_rate: float = POLY_END_LEARNING_RATE):
    super().__init__()
    validate_schedule(decay, warmup_epochs, train_epochs, scaling,
                      end_learning_rate)
    self.base_learning_rate = float(base_learning_rate)
    self.clock = EpochClock(
        images_per_epoch, tuple(tuple(p) for p in batch_size_schedule))
    self.train_epochs = float(train_epochs)
    self.warmup_epochs = float(warmup_epochs)
    self.decay = decay
    self.decay_power = float(decay_power)
    self.reference_batch_size = int(reference_batch_size)
    self.scaling = scaling
    self.end_learning_rate = float(end_learning_rate)
    self._decay_fn = _decay_in_epochs(decay, self.warmup_epochs,
                                      self.train_epochs, self.decay_power)

  def _warmup(self, epoch):
    if self.warmup_epochs == 0:
      return ops.ones((), "float32")
    return ops.minimum(1.0, epoch / self.warmup_epochs)

  def _decay(self, epoch):
    if self._decay_fn is None:
      return ops.ones((), "float32")
    if self.decay in ("polynomial", "cosine"):
      return self._decay_fn(ops.maximum(epoch - self.warmup_epochs, 0.0))
    return self._decay_fn(epoch)

  def peak(self, step):
    """The LR after warm-up and before decay at `step`."""
    if self.scaling == "none":
      return ops.convert_to_tensor(self.base_learning_rate, "float32")
    return (self.base_learning_rate / self.reference_batch_size *
            global_batch_tensor(self.clock, step))

  def __call__(self, step):
    epoch = epoch_tensor(self.clock, step)
    decay = self._decay(epoch)
    lr = self.peak(step) * self._warmup(epoch) * decay
    if self.decay == "polynomial":
      # decay is 1 during warm-up, so the end shows only after it.
      lr += self.end_learning_rate * (1.0 - decay)
    return lr

  def get_config(self) -> dict:
    return {
        "base_learning_rate": self.base_learning_rate,
        "images_per_epoch": self.clock.images_per_epoch,
        "batch_size_schedule": [list(p)
                                for p in self.clock.batch_size_schedule],
        "train_epochs": self.train_epochs,
        "warmup_epochs": self.warmup_epochs,
        "decay": self.decay,
        "decay_power": self.decay_power,
        "reference_batch_size": self.reference_batch_size,
        "scaling": self.scaling,
        "end_learning_rate": self.end_learning_rate,
    }
