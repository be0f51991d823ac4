"""What each study trains: its runs as TrainConfigs, and one LR rule each.

Every run follows a published 90-epoch recipe compressed into the images
the run sees: --num_train_images is set to one ninetieth of them, so the
schedule's warm-up, decay boundaries, RMSprop-to-SGD switch and batch-size
phases (all in epochs) keep their place in the run. The rules are chosen
once, here, and never per point:

  momentum (Goyal et al. 2017): 0.1 per 256 images, linear scaling, 5
    warm-up epochs, x0.1 after epochs 30, 60 and 80.
  lars (Ying et al. 2018 §3; You et al. 2017): tensorflow/tpu's absolute
    peak per batch bracket (models/official/resnet/lars_util.py at commit
    95647b535084fe369bdc9c12bace726cb91970b4: 10.0 below 16384 with 5
    warm-up epochs, 25.0 below 32768, 32.0 below 65536), polynomial decay
    with power 2 to 1e-4.
  rmsprop_warmup (Akiba et al. 2017): 0.1 per 256 images, linear scaling,
    slow start, RMSprop LR 3e-4 turning into momentum SGD around epoch 10
    (flags/akiba2017_32k.cfg).

Studies: a (Ying §3.1) distributed BN group sizes at a per-replica batch of
4; b (Goyal, Ying, Akiba) top-1 against the global batch at equal epochs,
each optimizer with its rule and label smoothing 0.1, then the best one at
the largest batch without it; c (Mikami et al. 2018) a growing batch
against the final batch held fixed, with LARS's LR held across switches.
"""
import dataclasses

from resnet_tpu.config import TrainConfig
from resnet_tpu.clock import parse_batch_size_schedule

RECIPE_EPOCHS = 90
OPTIMIZERS = ("momentum", "lars", "rmsprop_warmup")
# tensorflow/tpu lars_util.py poly_rate_schedule: (batch below, peak, warm-up).
LARS_BRACKETS = ((16384, 10.0, 5.0), (32768, 25.0, 5.0), (65536, 32.0, 14.0),
                 (None, 35.6, 40.0))


@dataclasses.dataclass(frozen=True)
class Scale:
  """The size of every study; DEFAULT fits `make study` on 2 CPU cores."""
  num_train: int
  num_test: int
  seeds: tuple[int, ...]
  bn_steps: int  # a: training steps of every group size
  bn_per_replica: int  # a: images per replica and step (the BN batch)
  passes: float  # b, c: passes over the training images per run
  batches: tuple[int, ...]  # b: global batches
  micro_per_replica: int  # b, c: BN batch; larger batches accumulate
  growing: str  # c: the batch-size schedule, in recipe epochs
  replicas: int = 8  # a: replicas (BN groups divide it)
  micro_replicas: int = 2  # b, c: replicas
  steps_per_loop: int = 25


# `make study` on 2 CPU cores; lab/study.py prints its estimate first.
DEFAULT = Scale(num_train=10000, num_test=10000, seeds=(0, 1), bn_steps=150,
                bn_per_replica=4, passes=2.0, batches=(256, 1024, 4096),
                micro_per_replica=32, growing="0:1024,30:2048,60:4096")
# GPU/TPU hosts: all 60k images, 30 passes, batches 256-16384, 3 seeds.
FULL = Scale(num_train=60000, num_test=10000, seeds=(0, 1, 2),
             bn_steps=3000, bn_per_replica=4, passes=30.0,
             batches=(256, 512, 1024, 2048, 4096, 8192, 16384),
             micro_per_replica=32, growing="0:4096,30:8192,60:16384",
             steps_per_loop=100)
# CI: a few steps per point on a few hundred images, 1-2 replicas.
SMOKE = Scale(num_train=200, num_test=100, seeds=(0,), bn_steps=2,
              bn_per_replica=2, passes=0.32, batches=(64,),
              micro_per_replica=32, growing="0:32,45:64", replicas=2,
              micro_replicas=1, steps_per_loop=1)


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run of a study: its point, seed and exact config."""
  study: str
  point: tuple[tuple[str, object], ...]  # e.g. (("bn_group_size", 4),)
  seed: int
  cfg: TrainConfig

  @property
  def label(self) -> str:
    return ", ".join(f"{k}={v}" for k, v in self.point)


def lars_rule(batch: int) -> tuple[float, float]:
  """tensorflow/tpu's absolute LARS peak and warm-up epochs at `batch`."""
  return next((peak, warmup) for below, peak, warmup in LARS_BRACKETS
              if below is None or batch < below)


def optimizer_rule(optimizer: str, batch: int) -> dict:
  """The LR fields of `optimizer`'s one rule at global batch `batch`."""
  if optimizer == "momentum":
    return dict(optimizer="momentum", base_learning_rate=0.1,
                lr_schedule="step", warmup_epochs=5.0)
  if optimizer == "lars":
    peak, warmup = lars_rule(batch)
    return dict(optimizer="lars", learning_rate_scaling="none",
                base_learning_rate=peak, lr_schedule="polynomial",
                lr_decay_power=2.0, end_learning_rate=1e-4,
                warmup_epochs=warmup)
  return dict(optimizer="rmsprop_warmup", base_learning_rate=0.1,
              lr_schedule="slow_start", warmup_epochs=5.0,
              rmsprop_learning_rate=3e-4, rmsprop_warmup_center_epochs=10.0,
              rmsprop_warmup_period_epochs=5.0)


def _images_per_recipe_epoch(images: float) -> int:
  return max(1, round(images / RECIPE_EPOCHS))


def bn_runs(base: TrainConfig, scale: Scale) -> list[Run]:
  """a: every BN group size at the same steps, batch and LR (Ying §3.1)."""
  batch = scale.replicas * scale.bn_per_replica
  groups = [g for g in (1, 2, 4, 8, 16) if g <= scale.replicas]
  runs = []
  for group in groups:
    for seed in scale.seeds:
      cfg = dataclasses.replace(
          base, num_cpu_replicas=scale.replicas, bn_group_size=group,
          global_batch_size=batch, train_steps=scale.bn_steps,
          num_train_images=_images_per_recipe_epoch(scale.bn_steps * batch),
          seed=seed, **optimizer_rule("momentum", batch))
      runs.append(Run("a", (("bn_group_size", group),), seed, cfg))
  return runs


def _batch_run(study: str, base: TrainConfig, scale: Scale, optimizer: str,
               schedule: str, label_smoothing: float, seed: int,
               point: tuple) -> Run:
  micro = scale.micro_replicas * scale.micro_per_replica
  final = parse_batch_size_schedule(schedule)[-1][1]
  cfg = dataclasses.replace(
      base, num_cpu_replicas=scale.micro_replicas, global_batch_size=micro,
      batch_size_schedule=schedule, train_epochs=float(RECIPE_EPOCHS),
      num_train_images=_images_per_recipe_epoch(
          scale.passes * scale.num_train),
      label_smoothing=label_smoothing, seed=seed,
      **optimizer_rule(optimizer, final))
  return Run(study, point, seed, cfg)


def large_batch_runs(base: TrainConfig, scale: Scale) -> list[Run]:
  """b: each optimizer at each global batch, label smoothing 0.1."""
  return [_batch_run("b", base, scale, opt, f"0:{batch}", 0.1, seed,
                     (("optimizer", opt), ("global_batch", batch),
                      ("label_smoothing", 0.1)))
          for opt in OPTIMIZERS for batch in scale.batches
          for seed in scale.seeds]


def label_smoothing_runs(base: TrainConfig, scale: Scale,
                         optimizer: str) -> list[Run]:
  """b: `optimizer`, the best at the largest batch, there without smoothing.

  The largest batch is where Ying et al. (§5) and Mikami et al. (v2) use
  label smoothing to keep accuracy.
  """
  batch = max(scale.batches)
  return [_batch_run("b", base, scale, optimizer, f"0:{batch}", 0.0, seed,
                     (("optimizer", optimizer), ("global_batch", batch),
                      ("label_smoothing", 0.0)))
          for seed in scale.seeds]


def batch_control_runs(base: TrainConfig, scale: Scale) -> list[Run]:
  """c: the growing schedule and its final batch fixed, LARS, same epochs."""
  final = parse_batch_size_schedule(scale.growing)[-1][1]
  return [_batch_run("c", base, scale, "lars", schedule, 0.1, seed,
                     (("batch_size_schedule", schedule),))
          for schedule in (scale.growing, f"0:{final}")
          for seed in scale.seeds]
