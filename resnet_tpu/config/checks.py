"""The config's checks: every numeric flag's range, every enum's choices,
the flags that go together (each engine's limits: engine_limits.py). `validate`
runs before any start-up, so a bad setting fails in milliseconds with a
ConfigError naming the flag."""
import dataclasses

from resnet_tpu.clock import parse_batch_size_schedule
from resnet_tpu.config import engine_limits
from resnet_tpu.config.record import allowed_changes
from resnet_tpu.config.parts import BACKENDS
from resnet_tpu.config.parts import BFLOAT16_CONV_KERNELS
from resnet_tpu.config.parts import BN_ALL_REDUCE
from resnet_tpu.config.parts import BN_STATS
from resnet_tpu.config.parts import ConfigError
from resnet_tpu.config.parts import CONV_INITS
from resnet_tpu.config.parts import CPU_ONEDNN
from resnet_tpu.config.parts import GRADIENT_ALL_REDUCE
from resnet_tpu.config.parts import INPUT_DTYPES
from resnet_tpu.config.parts import INPUT_NORMALIZATIONS
from resnet_tpu.config.parts import LR_SCALINGS
from resnet_tpu.config.parts import MIN_IMAGE_SIZE
from resnet_tpu.config.parts import ON_CORRUPT_SHARD
from resnet_tpu.config.parts import OPTIMIZERS
from resnet_tpu.config.parts import PRECISIONS
from resnet_tpu.config.parts import require
from resnet_tpu.config.parts import RESIZE_METHODS
from resnet_tpu.config.parts import RESNET_DEPTHS
from resnet_tpu.config.parts import RESNET_LAYOUTS
from resnet_tpu.config.parts import SCHEDULES
from resnet_tpu.config.parts import STRATEGIES
from resnet_tpu.config.parts import TPU_DEVICE_ASSIGNMENTS
from resnet_tpu.config.parts import TPU_RUNTIMES
from resnet_tpu.config.parts import TrainConfig


@dataclasses.dataclass(frozen=True)
class Range:
  """The allowed values of a numeric flag: low <= v (or low < v with
  low_open), v <= high (or v < high with high_open); None = unbounded."""
  low: float | None = None
  high: float | None = None
  low_open: bool = False
  high_open: bool = False

  def contains(self, value: float) -> bool:
    if self.low is not None and (value <= self.low if self.low_open
                                 else value < self.low):
      return False
    return self.high is None or (value < self.high if self.high_open
                                 else value <= self.high)

  def __str__(self) -> str:
    low = "" if self.low is None else (
        f"{'>' if self.low_open else '>='} {self.low:g}")
    high = "" if self.high is None else (
        f"{'<' if self.high_open else '<='} {self.high:g}")
    return " and ".join(p for p in (low, high) if p)


_POSITIVE = Range(0, low_open=True)
_NON_NEGATIVE = Range(0)
_AT_LEAST_1 = Range(1)
_FRACTION = Range(0, 1, high_open=True)  # [0, 1)

# Every numeric flag (FLAG_FIELDS) and its range (a test walks them all).
RANGES: dict[str, Range] = {
    "num_classes": Range(2),
    "image_size": Range(MIN_IMAGE_SIZE),
    "bn_group_size": _AT_LEAST_1,
    "bn_momentum": _FRACTION,
    "bn_epsilon": _POSITIVE,
    "bn_recompute_batches": _AT_LEAST_1,
    "num_cpu_replicas": _AT_LEAST_1,
    "global_batch_size": _AT_LEAST_1,
    "eval_batch_size": _AT_LEAST_1,
    "train_steps": _NON_NEGATIVE,
    "train_epochs": _NON_NEGATIVE,
    "num_train_images": _NON_NEGATIVE,  # 0: from the data (preflight.py)
    "num_eval_images": _NON_NEGATIVE,
    "steps_per_loop": _AT_LEAST_1,
    "eval_every_steps": _NON_NEGATIVE,
    "checkpoint_every_steps": _NON_NEGATIVE,
    "checkpoint_every_minutes": _NON_NEGATIVE,
    "max_loop_seconds": _NON_NEGATIVE,
    "keep_checkpoints": _AT_LEAST_1,
    "base_learning_rate": _POSITIVE,
    "warmup_epochs": _NON_NEGATIVE,
    "lr_decay_power": _POSITIVE,
    "momentum": _FRACTION,
    "lars_eta": _POSITIVE,
    "lars_epsilon": _NON_NEGATIVE,
    "rmsprop_learning_rate": _POSITIVE,
    "rmsprop_warmup_center_epochs": _NON_NEGATIVE,
    "rmsprop_warmup_period_epochs": _POSITIVE,
    "label_smoothing": _FRACTION,
    "weight_decay": _NON_NEGATIVE,
    "seed": _NON_NEGATIVE,
    "label_offset": _NON_NEGATIVE,
    "shuffle_buffer_size": _AT_LEAST_1,
    "private_threadpool_size": _NON_NEGATIVE,
    "collective_timeout_s": _NON_NEGATIVE,
    "num_processes": _NON_NEGATIVE,  # 0: unset
    "process_id": Range(-1),  # -1: unset
    "eval_crop_fraction": Range(0, 1, low_open=True),  # (0, 1]
    "train_crop_min_area": Range(0, 1, low_open=True),
    "train_crop_max_aspect": Range(1),
    "end_learning_rate": _NON_NEGATIVE,
}

# Every enum flag and its choices (flags.py defines them).
CHOICES: dict[str, tuple] = {
    "resnet_depth": RESNET_DEPTHS,
    "resnet_layout": RESNET_LAYOUTS,
    "conv_init": CONV_INITS,
    "input_normalization": INPUT_NORMALIZATIONS,
    "precision": PRECISIONS,
    "bfloat16_conv_kernels": BFLOAT16_CONV_KERNELS,
    "backend": BACKENDS,
    "strategy": STRATEGIES,
    "tpu_device_assignment": TPU_DEVICE_ASSIGNMENTS,
    "tpu_runtime": TPU_RUNTIMES,
    "bn_stats": BN_STATS,
    "bn_all_reduce": BN_ALL_REDUCE,
    "gradient_all_reduce": GRADIENT_ALL_REDUCE,
    "optimizer": OPTIMIZERS,
    "lr_schedule": SCHEDULES,
    "input_dtype": INPUT_DTYPES,
    "cpu_onednn": CPU_ONEDNN,
    "on_corrupt_shard": ON_CORRUPT_SHARD,
    "train_resize_method": RESIZE_METHODS,
    "learning_rate_scaling": LR_SCALINGS,
}


def parse_grid(text: str) -> tuple[int, int] | None:
  """--all_reduce_grid 'XxY' -> (X, Y); '' -> None (the squarest grid)."""
  if not text:
    return None
  parts = text.lower().split("x")
  require(len(parts) == 2 and all(p.isdigit() and int(p) > 0 for p in parts),
         f"--all_reduce_grid must look like '4x2' (replicas per row x rows), "
         f"got {text!r}.")
  return int(parts[0]), int(parts[1])


def _check_fields(cfg: TrainConfig) -> None:
  """Every field against RANGES and CHOICES."""
  values = cfg.flat()
  for name, choices in CHOICES.items():
    require(values[name] in choices,
           f"--{name} must be one of {choices}, got {values[name]!r}.")
  for name, allowed in RANGES.items():
    require(allowed.contains(values[name]),
           f"--{name} must be {allowed}, got {values[name]!r}.")


def validate(cfg: TrainConfig, num_replicas: int | None = None) -> None:
  """Raises ConfigError naming the flag for any bad or inconsistent setting.

  `num_replicas` is checked when known (it is, for CPU replicas, before the
  strategy starts); TPU/GPU replica counts are checked again after start-up.
  The data's files are the pre-flight's (data_checks.find_data_files).
  """
  run, dist, optim = cfg.run, cfg.distribution, cfg.optim
  require(bool(cfg.model_dir), "--model_dir is required.")
  _check_fields(cfg)
  profile = run.profile_steps.split(",") if run.profile_steps else []
  require(not profile or (len(profile) == 2 and all(
      p.strip().isdigit() for p in profile) and
      0 < int(profile[0]) <= int(profile[1])),
         f"--profile_steps must be 'first,last' steps with 0 < first <= "
         f"last (e.g. 10,20), got {run.profile_steps!r}.")
  unknown = [n for n in allowed_changes(cfg) if n not in cfg.flat()]
  require(not unknown, f"--allow_config_change names {unknown}, which are not "
         "flags of a run (e.g. --allow_config_change=global_batch_size).")
  parse_grid(dist.all_reduce_grid)
  require(run.train_steps > 0 or run.train_epochs > 0,
         "Set --train_steps or --train_epochs (> 0).")
  require(not ((dist.tpu or dist.strategy == "tpu") and
              dist.gradient_all_reduce != "auto"),
         "--gradient_all_reduce=ring|2d|2d_ying is for GPU/CPU replicas; on "
         "TPU XLA sums gradients over the torus (use auto).")
  require(not (optim.nesterov and optim.optimizer == "rmsprop_warmup"),
         "--nesterov is not supported with --optimizer=rmsprop_warmup.")
  require(not optim.momentum_correction or optim.optimizer == "momentum",
         "--momentum_correction is for --optimizer=momentum (LARS and "
         f"RMSprop warm-up keep their own update); got {optim.optimizer}.")
  require(not (cfg.model.precision == "float16" and run.batch_size_schedule),
         "--precision=float16 does not support --batch_size_schedule "
         "(gradient accumulation); use float32 or bfloat16.")
  require(not (cfg.model.precision == "float16" and
              (dist.tpu or dist.strategy == "tpu")),
         "--precision=float16 is for GPUs without fast bfloat16 (V100, T4); "
         "TPUs compute in bfloat16: use --precision=bfloat16.")
  require(not cfg.model.freeze_bn or bool(run.init_checkpoint),
         "--freeze_bn keeps the BN statistics, scales and offsets of the "
         "network a run starts from: set --init_checkpoint.")
  require(not (cfg.model.freeze_bn and cfg.model.bn_stats == "recompute"),
         "--freeze_bn keeps the checkpoint's BN statistics; "
         "--bn_stats=recompute would replace them: use moving_average.")
  require(not (run.max_loop_seconds and dist.strategy == "multi_worker"),
         "--max_loop_seconds times each host's loops apart; workers would "
         "run loops of different lengths: use it on one host, and a "
         "--steps_per_loop that meets the grace period with "
         "--strategy=multi_worker.")
  require(not (optim.skip_nonfinite_steps and run.batch_size_schedule),
         "--skip_nonfinite_steps does not support --batch_size_schedule "
         "(gradient accumulation); a NaN/Inf loss there stops training.")
  if run.batch_size_schedule:
    try:
      schedule = parse_batch_size_schedule(run.batch_size_schedule)
    except ValueError as e:
      raise ConfigError(str(e)) from None
    for _, batch in schedule:
      require(batch % run.global_batch_size == 0,
             f"--batch_size_schedule batch {batch} must be a multiple of "
             f"--global_batch_size={run.global_batch_size} (the micro-batch "
             "that is accumulated).")
  require(cfg.input.use_synthetic_data or bool(cfg.input.data_dir),
         "--data_dir is required unless --use_synthetic_data is set.")
  engine_limits.check(cfg)
  if num_replicas is not None:
    validate_replicas(cfg, num_replicas)


def validate_start_up(cfg: TrainConfig, kind: str,
                      makes_cpu_replicas: bool) -> TrainConfig:
  """`validate` as a run starts: --strategy resolved to `kind`
  (runtime/process_setup.strategy_kind) and, where this process makes its
  own virtual CPU replicas (`makes_cpu_replicas` under kind cpu), their
  count. main.py runs it before either engine loads, each engine's
  start-up again (tests and tools enter there). Returns cfg with `kind`."""
  cfg = cfg.replace(strategy=kind)
  known = kind == "cpu" and makes_cpu_replicas
  validate(cfg, cfg.distribution.num_cpu_replicas if known else None)
  return cfg


def validate_replicas(cfg: TrainConfig, num_replicas: int) -> None:
  """Checks the batch and BN-group sizes against the replica count."""
  run, dist = cfg.run, cfg.distribution
  group_size = cfg.model.bn_group_size
  require(run.global_batch_size % num_replicas == 0,
         f"--global_batch_size={run.global_batch_size} must be divisible by "
         f"the number of replicas ({num_replicas}).")
  require(run.eval_batch_size % num_replicas == 0,
         f"--eval_batch_size={run.eval_batch_size} must be divisible by the "
         f"number of replicas ({num_replicas}).")
  require(num_replicas % group_size == 0,
         f"--bn_group_size={group_size} must divide the number of "
         f"replicas ({num_replicas}).")
  grid = parse_grid(dist.all_reduce_grid)
  if grid and dist.gradient_all_reduce != "auto":
    require(grid[0] * grid[1] == num_replicas,
           f"--all_reduce_grid={dist.all_reduce_grid} has "
           f"{grid[0] * grid[1]} cells but there are {num_replicas} "
           "replicas.")
