"""The optimizer a run trains with, chosen by name (Ying et al. 2018 §3).

  momentum:       momentum SGD (Goyal et al. 2017), up to batch ~8k;
  lars:           LARS (You et al. 2017), as Ying et al. 2018 use to 32k;
  rmsprop_warmup: RMSprop turning into momentum SGD (Akiba et al. 2017).

momentum is Keras's SGD, the LR inside the velocity (v <- m v - lr g), with
no momentum correction when the LR changes (Goyal et al. §3); with
--momentum_correction it is corrected_momentum.py's, the LR outside, as
tensorflow/tpu's tf.train.MomentumOptimizer (docs/papers.md).

Weight decay is an L2 term in the loss for momentum and rmsprop_warmup, but
part of the update for LARS (see `weight_decay_in_loss`): the trainer must
add L2 to the loss exactly when that function says so.

The optimizers are Keras optimizers written in keras.ops. How they meet the
replicas is the engine's (optim/tensorflow/optimizers.py: replica-local step
counter and gradient all-reduce; optim/jax/optimizers.py: the step's psum
sums gradients).
"""
from typing import Optional, Sequence

from absl import logging
import keras

if keras.backend.backend() == "tensorflow":
  from resnet_tpu.optim.tensorflow import optimizers as engine
elif keras.backend.backend() == "jax":
  from resnet_tpu.optim.jax import optimizers as engine
else:
  raise ImportError("resnet_tpu runs on Keras's tensorflow or jax backend "
                    f"(KERAS_BACKEND), not {keras.backend.backend()!r}.")
from resnet_tpu.clock import EpochClock
from resnet_tpu.config import parse_grid
from resnet_tpu.config import DistributionConfig
from resnet_tpu.config import OptimConfig
from resnet_tpu.config import RunConfig
from resnet_tpu.optim.corrected_momentum import CorrectedMomentum
from resnet_tpu.optim.lars import DEFAULT_EXCLUDE, LARS
from resnet_tpu.optim.rmsprop_warmup import RMSpropWarmup, SgdShareSchedule
from resnet_tpu.optim.schedules import EpochSchedule


def weight_decay_in_loss(name: str) -> bool:
  """Whether the trainer adds weight decay to the loss as an L2 term."""
  return name != "lars"


def _rmsprop_warmup(learning_rate, momentum: float, nesterov: bool,
                    rmsprop_learning_rate: float, rmsprop_rho: float,
                    rmsprop_epsilon: float, center_epochs: float,
                    period_epochs: float, clock: Optional[EpochClock]):
  if nesterov:
    raise ValueError("--nesterov is not supported with "
                     "--optimizer=rmsprop_warmup")
  if clock is None:
    raise ValueError("--optimizer=rmsprop_warmup needs an EpochClock: its "
                     "transition to SGD is defined in epochs")
  share = SgdShareSchedule(
      center_epochs, period_epochs, images_per_epoch=clock.images_per_epoch,
      batch_size_schedule=clock.batch_size_schedule)
  return RMSpropWarmup(learning_rate, sgd_share=share,
                       rmsprop_learning_rate=rmsprop_learning_rate,
                       momentum=momentum, rho=rmsprop_rho,
                       epsilon=rmsprop_epsilon)


def build_optimizer(
    name: str, learning_rate, *, momentum: float = 0.9,
    nesterov: bool = False, momentum_correction: bool = False,
    weight_decay: float = 1e-4,
    lars_eta: float = 0.001, lars_epsilon: float = 0.0,
    lars_exclude: Sequence[str] = DEFAULT_EXCLUDE,
    rmsprop_learning_rate: float = 3e-4, rmsprop_rho: float = 0.99,
    rmsprop_epsilon: float = 1e-8, rmsprop_warmup_center_epochs: float = 10.0,
    rmsprop_warmup_period_epochs: float = 5.0,
    clock: Optional[EpochClock] = None, gradient_all_reduce: str = "auto",
    all_reduce_grid: Optional[tuple[int, int]] = None,
    collective_timeout_s: float = 0.0
) -> keras.optimizers.Optimizer:
  """Builds the optimizer `name`; call it under the strategy scope.

  Args:
    name: one of OPTIMIZERS.
    learning_rate: float or LearningRateSchedule (e.g. EpochSchedule).
    momentum: momentum coefficient of every optimizer.
    nesterov: Nesterov momentum (momentum and lars only).
    momentum_correction: momentum with the LR outside the velocity
      (corrected_momentum.py; momentum only).
    weight_decay: used by lars only; the others take it in the loss.
    lars_eta, lars_epsilon, lars_exclude: LARS trust coefficient,
      denominator epsilon and path substrings left unadapted.
    rmsprop_learning_rate, rmsprop_rho, rmsprop_epsilon: the RMSprop part of
      rmsprop_warmup.
    rmsprop_warmup_center_epochs, rmsprop_warmup_period_epochs: where the
      SGD share reaches 0.5, and twice the epochs from there to pure SGD.
    clock: maps steps to epochs; required by rmsprop_warmup.
    gradient_all_reduce, all_reduce_grid: how gradients are summed across
      replicas (gradient_all_reduce.use_gradient_all_reduce): auto, ring,
      2d or 2d_ying over an (X, Y) grid (None: the squarest).
    collective_timeout_s: fail an explicit gradient all-reduce that waits
      longer (0 = never).
  """
  with engine.creation_scope():
    if name == "momentum" and momentum_correction:
      optimizer = CorrectedMomentum(learning_rate, momentum=momentum,
                                    nesterov=nesterov)
    elif name == "momentum":
      optimizer = keras.optimizers.SGD(learning_rate, momentum=momentum,
                                       nesterov=nesterov)
    elif name == "lars":
      optimizer = LARS(learning_rate, momentum=momentum, nesterov=nesterov,
                       weight_decay_rate=weight_decay, eta=lars_eta,
                       epsilon=lars_epsilon,
                       exclude_from_adaptation=lars_exclude)
    else:  # rmsprop_warmup (config.validate checks the name)
      optimizer = _rmsprop_warmup(
          learning_rate, momentum, nesterov, rmsprop_learning_rate,
          rmsprop_rho, rmsprop_epsilon, rmsprop_warmup_center_epochs,
          rmsprop_warmup_period_epochs, clock)
  logging.info("Optimizer %s: %s", name, optimizer.get_config())
  return engine.sum_gradients_across_replicas(
      optimizer, gradient_all_reduce, all_reduce_grid, collective_timeout_s)


def build_optimizer_from_config(
    cfg: OptimConfig, run: RunConfig,
    distribution: DistributionConfig = DistributionConfig()
) -> keras.optimizers.Optimizer:
  """The optimizer of `cfg` with its epoch-based LR schedule over the
  batches and length of `run`, summing gradients as `distribution` says
  (call it under the strategy scope)."""
  clock = run.clock
  learning_rate = EpochSchedule(
      cfg.base_learning_rate, images_per_epoch=run.num_train_images,
      batch_size_schedule=clock.batch_size_schedule,
      train_epochs=run.total_train_epochs, warmup_epochs=cfg.warmup_epochs,
      decay=cfg.lr_schedule, decay_power=cfg.lr_decay_power,
      scaling=cfg.learning_rate_scaling,
      end_learning_rate=cfg.end_learning_rate)
  return build_optimizer(
      cfg.optimizer, learning_rate, momentum=cfg.momentum,
      nesterov=cfg.nesterov, momentum_correction=cfg.momentum_correction,
      weight_decay=cfg.weight_decay,
      lars_eta=cfg.lars_eta, lars_epsilon=cfg.lars_epsilon,
      rmsprop_learning_rate=cfg.rmsprop_learning_rate,
      rmsprop_warmup_center_epochs=cfg.rmsprop_warmup_center_epochs,
      rmsprop_warmup_period_epochs=cfg.rmsprop_warmup_period_epochs,
      clock=clock, gradient_all_reduce=distribution.gradient_all_reduce,
      all_reduce_grid=parse_grid(distribution.all_reduce_grid),
      collective_timeout_s=distribution.collective_timeout_s)
