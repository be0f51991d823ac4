"""The one validated, typed training configuration.

main.py turns absl flags into a `TrainConfig`; library code takes it (or
explicit arguments) and never reads FLAGS. `validate` runs before any
strategy start-up, so a bad combination fails in milliseconds.
"""
import dataclasses
import glob
import os

from resnet_tpu.bfloat16_convs import BFLOAT16_CONV_KERNELS
from resnet_tpu.collectives import BN_ALL_REDUCE
from resnet_tpu.collectives import GRADIENT_ALL_REDUCE
from resnet_tpu.collectives import parse_grid
from resnet_tpu.model import LAYERS, MIN_IMAGE_SIZE
from resnet_tpu.optimizers import OPTIMIZERS
from resnet_tpu.schedules import EpochClock
from resnet_tpu.schedules import parse_batch_size_schedule
from resnet_tpu.schedules import SCHEDULES

PRECISIONS = ("float32", "bfloat16")
STRATEGIES = ("auto", "tpu", "gpu", "cpu", "multi_worker")
BN_STATS = ("moving_average", "recompute")
INPUT_DTYPES = ("uint8", "compute")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything a training run needs; field names match the flags."""
  model_dir: str
  data_dir: str = ""
  use_synthetic_data: bool = False
  # Model.
  resnet_depth: int = 50
  num_classes: int = 1000
  image_size: int = 224
  precision: str = "float32"
  bfloat16_conv_kernels: str = "auto"
  bn_group_size: int = 1
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  bn_stats: str = "moving_average"
  bn_recompute_batches: int = 10
  # Distribution.
  bn_all_reduce: str = "auto"
  strategy: str = "auto"
  tpu: str = ""
  num_cpu_replicas: int = 1
  gradient_all_reduce: str = "auto"
  all_reduce_grid: str = ""
  log_topology: bool = False
  # Schedule of the run.
  global_batch_size: int = 1024
  eval_batch_size: int = 1024
  train_steps: int = 0
  train_epochs: float = 0.0
  num_train_images: int = 1281167
  num_eval_images: int = 0
  steps_per_loop: int = 100
  eval_every_steps: int = 0
  checkpoint_every_steps: int = 0
  keep_checkpoints: int = 5
  batch_size_schedule: str = ""
  # Optimisation.
  optimizer: str = "momentum"
  base_learning_rate: float = 0.1
  lr_schedule: str = "step"
  warmup_epochs: float = 5.0
  lr_decay_power: float = 2.0
  end_learning_rate: float = 1e-4
  learning_rate_scaling: str = "linear"
  momentum: float = 0.9
  nesterov: bool = False
  lars_eta: float = 0.001
  lars_epsilon: float = 0.0
  rmsprop_learning_rate: float = 3e-4
  rmsprop_warmup_center_epochs: float = 10.0
  rmsprop_warmup_period_epochs: float = 5.0
  label_smoothing: float = 0.1
  weight_decay: float = 1e-4
  seed: int = 0
  skip_nonfinite_steps: bool = False
  # Input pipeline.
  label_offset: int = 1
  cache_dataset: bool = False
  shuffle_buffer_size: int = 1024
  private_threadpool_size: int = 0
  parallel_interleave: bool = True
  parallel_map: bool = True
  fused_decode_crop: bool = True
  prefetch: bool = True
  deterministic_input: bool = False
  input_dtype: str = "uint8"
  eval_crop_fraction: float = 0.875
  train_crop_min_area: float = 0.08
  train_crop_max_aspect: float = 4.0 / 3.0
  train_resize_method: str = "bilinear"
  # Host.
  keep_host_memory: bool = True
  # Export.
  export_dir: str = ""

  @property
  def clock(self) -> EpochClock:
    """Maps steps to epochs and global batches (batch-size control)."""
    schedule = (parse_batch_size_schedule(self.batch_size_schedule)
                if self.batch_size_schedule else
                ((0, self.global_batch_size),))
    return EpochClock(self.num_train_images, schedule)

  @property
  def total_train_steps(self) -> int:
    """`train_steps` if set, else `train_epochs` converted to steps."""
    if self.train_steps:
      return self.train_steps
    return max(1, self.clock.steps_for_epochs(self.train_epochs))

  @property
  def total_train_epochs(self) -> float:
    """`train_epochs` if set, else the epochs `train_steps` cover."""
    if self.train_epochs:
      return self.train_epochs
    return float(self.clock.epoch(self.train_steps))

  @property
  def compute_dtype(self) -> str:
    return "bfloat16" if self.precision == "bfloat16" else "float32"

  @property
  def transfer_dtype(self) -> str:
    """dtype of the image batches the input pipeline hands the replicas."""
    return "uint8" if self.input_dtype == "uint8" else self.compute_dtype


def _check(ok: bool, message: str) -> None:
  if not ok:
    raise ValueError(message)


def validate(cfg: TrainConfig, num_replicas: int | None = None) -> None:
  """Raises ValueError naming the flag for any inconsistent setting.

  `num_replicas` is checked when known (it is, for CPU replicas, before the
  strategy starts); TPU/GPU replica counts are checked again after start-up.
  """
  _check(bool(cfg.model_dir), "--model_dir is required.")
  _check(cfg.resnet_depth in LAYERS,
         f"--resnet_depth must be one of {sorted(LAYERS)}, "
         f"got {cfg.resnet_depth}.")
  _check(cfg.image_size >= MIN_IMAGE_SIZE,
         f"--image_size={cfg.image_size} is too small: ResNet downsamples by "
         f"32, so it needs at least {MIN_IMAGE_SIZE}.")
  _check(cfg.num_classes >= 2, f"--num_classes must be >= 2, "
         f"got {cfg.num_classes}.")
  _check(cfg.precision in PRECISIONS,
         f"--precision must be one of {PRECISIONS}, got {cfg.precision!r}.")
  _check(cfg.bfloat16_conv_kernels in BFLOAT16_CONV_KERNELS,
         f"--bfloat16_conv_kernels must be one of {BFLOAT16_CONV_KERNELS}, "
         f"got {cfg.bfloat16_conv_kernels!r}.")
  _check(cfg.input_dtype in INPUT_DTYPES,
         f"--input_dtype must be one of {INPUT_DTYPES}, got "
         f"{cfg.input_dtype!r}.")
  _check(cfg.strategy in STRATEGIES,
         f"--strategy must be one of {STRATEGIES}, got {cfg.strategy!r}.")
  _check(cfg.num_cpu_replicas >= 1, "--num_cpu_replicas must be >= 1.")
  _check(cfg.bn_group_size >= 1, "--bn_group_size must be >= 1.")
  _check(cfg.bn_all_reduce in BN_ALL_REDUCE,
         f"--bn_all_reduce must be one of {BN_ALL_REDUCE}, "
         f"got {cfg.bn_all_reduce!r}.")
  _check(cfg.gradient_all_reduce in GRADIENT_ALL_REDUCE,
         f"--gradient_all_reduce must be one of {GRADIENT_ALL_REDUCE}, "
         f"got {cfg.gradient_all_reduce!r}.")
  parse_grid(cfg.all_reduce_grid)
  _check(not (cfg.tpu and cfg.gradient_all_reduce != "auto"),
         "--gradient_all_reduce=ring|2d is for GPU/CPU replicas; on TPU XLA "
         "sums gradients over the torus (use auto).")
  _check(cfg.bn_stats in BN_STATS,
         f"--bn_stats must be one of {BN_STATS}, got {cfg.bn_stats!r}.")
  _check(cfg.bn_recompute_batches >= 1, "--bn_recompute_batches must be >= 1.")
  _check(cfg.global_batch_size >= 1, "--global_batch_size must be >= 1.")
  _check(cfg.eval_batch_size >= 1, "--eval_batch_size must be >= 1.")
  _check(cfg.train_steps > 0 or cfg.train_epochs > 0,
         "Set --train_steps or --train_epochs (> 0).")
  _check(cfg.steps_per_loop >= 1, "--steps_per_loop must be >= 1.")
  _check(0.0 <= cfg.label_smoothing < 1.0,
         "--label_smoothing must be in [0, 1).")
  _check(cfg.weight_decay >= 0, "--weight_decay must be >= 0.")
  _check(cfg.keep_checkpoints >= 1, "--keep_checkpoints must be >= 1.")
  _check(cfg.optimizer in OPTIMIZERS,
         f"--optimizer must be one of {OPTIMIZERS}, got {cfg.optimizer!r}.")
  _check(cfg.lr_schedule in SCHEDULES,
         f"--lr_schedule must be one of {SCHEDULES}, got {cfg.lr_schedule!r}.")
  _check(cfg.warmup_epochs >= 0, "--warmup_epochs must be >= 0.")
  _check(not (cfg.skip_nonfinite_steps and cfg.batch_size_schedule),
         "--skip_nonfinite_steps does not support --batch_size_schedule "
         "(gradient accumulation); a NaN/Inf loss there stops training.")
  if cfg.batch_size_schedule:
    for _, batch in parse_batch_size_schedule(cfg.batch_size_schedule):
      _check(batch % cfg.global_batch_size == 0,
             f"--batch_size_schedule batch {batch} must be a multiple of "
             f"--global_batch_size={cfg.global_batch_size} (the micro-batch "
             "that is accumulated).")
  if not cfg.use_synthetic_data:
    _check(bool(cfg.data_dir),
           "--data_dir is required unless --use_synthetic_data is set.")
    _check(cfg.data_dir.startswith("gs://") or os.path.isdir(cfg.data_dir),
           f"--data_dir={cfg.data_dir!r} is not a directory.")
    if not cfg.data_dir.startswith("gs://"):
      for split in ("train", "validation"):
        _check(bool(glob.glob(os.path.join(cfg.data_dir, f"{split}-*"))),
               f"--data_dir={cfg.data_dir!r} holds no '{split}-*' TFRecord "
               "files (expected imagenet_to_gcs layout, e.g. "
               f"{split}-00000-of-00004).")
  if num_replicas is not None:
    validate_replicas(cfg, num_replicas)


def validate_replicas(cfg: TrainConfig, num_replicas: int) -> None:
  """Checks the batch and BN-group sizes against the replica count."""
  _check(cfg.global_batch_size % num_replicas == 0,
         f"--global_batch_size={cfg.global_batch_size} must be divisible by "
         f"the number of replicas ({num_replicas}).")
  _check(cfg.eval_batch_size % num_replicas == 0,
         f"--eval_batch_size={cfg.eval_batch_size} must be divisible by the "
         f"number of replicas ({num_replicas}).")
  _check(num_replicas % cfg.bn_group_size == 0,
         f"--bn_group_size={cfg.bn_group_size} must divide the number of "
         f"replicas ({num_replicas}).")
  grid = parse_grid(cfg.all_reduce_grid)
  if grid and cfg.gradient_all_reduce == "2d":
    _check(grid[0] * grid[1] == num_replicas,
           f"--all_reduce_grid={cfg.all_reduce_grid} has {grid[0] * grid[1]} "
           f"cells but there are {num_replicas} replicas.")
