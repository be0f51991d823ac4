"""The one validated, typed training configuration, and its config.json.

main.py turns absl flags into a `TrainConfig`; library code takes it, one
of its parts (input, model, optim, distribution, run: one per stage) or
explicit arguments, and never reads FLAGS. Flags keep flat names, unique
across the parts (FLAG_FIELDS). `validate` runs before any strategy
start-up, so a bad setting fails in milliseconds with a `ConfigError` naming
the flag; the data's files are the pre-flight's to check. This module and
clock.py are the leaf of the package: they import nothing else of the
project (and not TensorFlow), so flags parse before TensorFlow is
imported.
"""
import dataclasses
import json
import os

from resnet_tpu import files
from resnet_tpu.clock import EpochClock
from resnet_tpu.clock import parse_batch_size_schedule

# The choices of the enum flags.
RESNET_DEPTHS = (18, 34, 50, 101, 152, 200)
RESNET_LAYOUTS = ("v1.5", "keras_v1")
CONV_INITS = ("fan_in", "he_normal")
INPUT_NORMALIZATIONS = ("imagenet", "unit", "caffe")
PRECISIONS = ("float32", "bfloat16", "float16")
BFLOAT16_CONV_KERNELS = ("auto", "native", "float32")
STRATEGIES = ("auto", "tpu", "gpu", "cpu", "multi_worker")
# ImageNet's training images: an epoch of --use_synthetic_data, and of
# data in tensorflow/tpu imagenet_to_gcs.py's 1024-file layout.
IMAGENET_TRAIN_IMAGES = 1281167
# Keras's engine: auto is $KERAS_BACKEND, else tensorflow (main.py).
BACKENDS = ("auto", "tensorflow", "jax")
TPU_DEVICE_ASSIGNMENTS = ("default", "ring")
TPU_RUNTIMES = ("auto", "pjrt", "stream_executor")
BN_STATS = ("moving_average", "recompute")
BN_ALL_REDUCE = ("auto", "collective", "masked")
GRADIENT_ALL_REDUCE = ("auto", "ring", "2d", "2d_ying")
OPTIMIZERS = ("momentum", "lars", "rmsprop_warmup")
SCHEDULES = ("polynomial", "cosine", "step", "slow_start", "constant")
INPUT_DTYPES = ("uint8", "compute")
CPU_ONEDNN = ("auto", "on", "off")
ON_CORRUPT_SHARD = ("skip", "fail")
RESIZE_METHODS = ("bilinear", "bicubic")
LR_SCALINGS = ("linear", "none")
# The network downsamples by 32; below this the last stage sees < 1 pixel.
MIN_IMAGE_SIZE = 32

CONFIG_FILE = "config.json"
# The config.json keys that rebuild the network and its inputs. Flags newer
# than a record (--resnet_layout, --conv_init, ...) had their defaults when
# it was written, so they are not required of it.
MODEL_KEYS = ("resnet_depth", "num_classes", "image_size", "bn_group_size",
              "bn_momentum", "bn_epsilon", "precision", "label_offset")


# config.json's list of the changes deliberate resumes made.
CHANGES_KEY = "config_changes"
# Flags a resumed run may change without --allow_config_change: where the
# files are and how the run is executed, never what it computes
# (preflight.check_resume compares every other flag with config.json).
FREE_ON_RESUME = frozenset({
    "model_dir", "data_dir", "cache_dataset", "private_threadpool_size",
    "parallel_interleave", "parallel_map", "fused_decode_crop", "prefetch",
    "deterministic_input", "input_dtype", "on_corrupt_shard",
    "bfloat16_conv_kernels", "strategy", "tpu", "num_cpu_replicas",
    "bn_all_reduce", "gradient_all_reduce", "all_reduce_grid",
    "tpu_device_assignment", "tpu_runtime", "log_topology",
    "keep_host_memory", "collective_timeout_s", "cpu_onednn",
    "coordinator_address", "num_processes", "process_id", "eval_batch_size",
    "num_eval_images", "steps_per_loop", "eval_every_steps",
    "checkpoint_every_steps", "checkpoint_every_minutes", "max_loop_seconds",
    "keep_checkpoints", "export_dir", "skip_nonfinite_steps",
    "allow_config_change", "profile_steps", "init_checkpoint"})


def allowed_changes(cfg: "TrainConfig") -> list[str]:
  """The flag names of --allow_config_change."""
  return [n.strip().lstrip("-") for n in
          cfg.run.allow_config_change.split(",") if n.strip()]


class ConfigError(ValueError):
  """A user error in the flags, the data or the model_dir: main.py prints
  its message without a traceback."""


@dataclasses.dataclass(frozen=True)
class InputConfig:
  """The input pipeline's part (inputs/input_pipeline.py, preprocessing.py):
  where the records are and the §3.2 switches; the crop fields default to
  ImageNet's."""
  data_dir: str = ""
  use_synthetic_data: bool = False
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
  on_corrupt_shard: str = "skip"
  eval_crop_fraction: float = 0.875
  train_crop_min_area: float = 0.08
  train_crop_max_aspect: float = 4.0 / 3.0
  train_resize_method: str = "bilinear"
  random_flip: bool = True


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The network's part (model/resnet.py): its shape, precision and BN."""
  resnet_depth: int = 50
  resnet_layout: str = "v1.5"
  conv_init: str = "fan_in"
  zero_init_gamma: bool = True
  input_normalization: str = "imagenet"
  num_classes: int = 1000
  image_size: int = 224
  precision: str = "float32"
  bfloat16_conv_kernels: str = "auto"
  bn_group_size: int = 1
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  bn_stats: str = "moving_average"
  bn_recompute_batches: int = 10
  freeze_bn: bool = False

  @property
  def compute_dtype(self) -> str:
    return self.precision


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """The optimizer's part (optim/): the update rule, its LR schedule in
  epochs, and the loss's smoothing and decay."""
  optimizer: str = "momentum"
  base_learning_rate: float = 0.1
  lr_schedule: str = "step"
  warmup_epochs: float = 5.0
  lr_decay_power: float = 2.0
  end_learning_rate: float = 1e-4
  learning_rate_scaling: str = "linear"
  momentum: float = 0.9
  nesterov: bool = False
  momentum_correction: bool = False
  lars_eta: float = 0.001
  lars_epsilon: float = 0.0
  rmsprop_learning_rate: float = 3e-4
  rmsprop_warmup_center_epochs: float = 10.0
  rmsprop_warmup_period_epochs: float = 5.0
  label_smoothing: float = 0.1
  weight_decay: float = 1e-4
  skip_nonfinite_steps: bool = False


@dataclasses.dataclass(frozen=True)
class DistributionConfig:
  """The replicas' part (parallel/, runtime/): the strategy, its all-reduces
  and the host's tunings."""
  backend: str = "auto"  # read before Keras loads (process_setup.py)
  strategy: str = "auto"
  tpu: str = ""
  num_cpu_replicas: int = 1
  bn_all_reduce: str = "auto"
  gradient_all_reduce: str = "auto"
  all_reduce_grid: str = ""
  tpu_device_assignment: str = "default"
  tpu_runtime: str = "auto"  # read before TensorFlow loads (tpu_runtime.py)
  log_topology: bool = False
  keep_host_memory: bool = True
  collective_timeout_s: float = 0.0
  cpu_onednn: str = "auto"  # read before TensorFlow loads (process_setup.py)
  # A multi-host JAX run's processes (jax.distributed; TensorFlow's workers
  # come from TF_CONFIG): all three, or none for JAX's cluster detection.
  coordinator_address: str = ""
  num_processes: int = 0
  process_id: int = -1


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """The run's part (train/): batches, length, cadence, seed and export."""
  global_batch_size: int = 1024
  eval_batch_size: int = 1024
  train_steps: int = 0
  train_epochs: float = 0.0
  num_train_images: int = 0
  num_eval_images: int = 0
  steps_per_loop: int = 100
  eval_every_steps: int = 0
  checkpoint_every_steps: int = 0
  checkpoint_every_minutes: float = 10.0
  max_loop_seconds: float = 0.0
  keep_checkpoints: int = 5
  batch_size_schedule: str = ""
  seed: int = 0
  export_dir: str = ""
  allow_config_change: str = ""
  profile_steps: str = ""
  init_checkpoint: str = ""

  @property
  def profile_range(self) -> tuple[int, int] | None:
    """--profile_steps "a,b" as (a, b); None when off (validate checks)."""
    if not self.profile_steps:
      return None
    first, last = (int(v) for v in self.profile_steps.split(","))
    return first, last

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
    return self.clock.epoch_of_step(self.train_steps)


# The parts of a TrainConfig, by attribute, in the order of the flags.
PARTS = {"input": InputConfig, "model": ModelConfig, "optim": OptimConfig,
         "distribution": DistributionConfig, "run": RunConfig}


def _flag_fields() -> dict[str, tuple[str, dataclasses.Field]]:
  table = {}
  for part, cls in PARTS.items():
    for field in dataclasses.fields(cls):
      if field.name in table or field.name == "model_dir":
        raise TypeError(f"flag {field.name!r} is in two config parts")
      table[field.name] = (part, field)
  return table


# Flag name -> (the part that holds it, its field); model_dir is the
# TrainConfig's own. Flag names are unique across the parts.
FLAG_FIELDS = _flag_fields()


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything a training run needs: the model_dir and one part per stage.

  Users (flags, tests, the lab) name fields flat, by flag name:
  `from_flat`, `replace` and `flat` route each name to its part.
  """
  model_dir: str
  input: InputConfig = InputConfig()
  model: ModelConfig = ModelConfig()
  optim: OptimConfig = OptimConfig()
  distribution: DistributionConfig = DistributionConfig()
  run: RunConfig = RunConfig()

  @classmethod
  def from_flat(cls, model_dir: str, **values) -> "TrainConfig":
    """The config of flag-named `values`; the rest keep their defaults."""
    return cls(model_dir).replace(**values)

  @classmethod
  def tiny(cls, model_dir: str, **overrides) -> "TrainConfig":
    """A run of seconds on CPU replicas, for tests, demos and checks (as
    big_vision's runlocal): ResNet-18 at 32 px, 10 classes, 2 replicas of 4
    images, 2 steps in one host loop, 1,000 images an epoch, a constant LR
    without warm-up. `overrides` set any field by flag name."""
    values = dict(
        resnet_depth=18, num_classes=10, image_size=32,
        strategy="cpu", num_cpu_replicas=2, global_batch_size=8,
        eval_batch_size=8, train_steps=2, steps_per_loop=2,
        num_train_images=1000, lr_schedule="constant", warmup_epochs=0.0)
    return cls.from_flat(model_dir, **{**values, **overrides})

  def replace(self, **overrides) -> "TrainConfig":
    """A copy with flag-named `overrides` set in their parts."""
    unknown = sorted(set(overrides) - set(FLAG_FIELDS) - {"model_dir"})
    if unknown:
      raise TypeError(f"TrainConfig has no flags {unknown}")
    changes = {"model_dir": overrides.pop("model_dir", self.model_dir)}
    for part in PARTS:
      mine = {name: value for name, value in overrides.items()
              if FLAG_FIELDS[name][0] == part}
      changes[part] = dataclasses.replace(getattr(self, part), **mine)
    return dataclasses.replace(self, **changes)

  def flat(self) -> dict:
    """Flag name -> value, every field (config.json's record)."""
    values = {"model_dir": self.model_dir}
    for part in PARTS:
      values.update(dataclasses.asdict(getattr(self, part)))
    return values

  @property
  def transfer_dtype(self) -> str:
    """dtype of the image batches the input pipeline hands the replicas."""
    return ("uint8" if self.input.input_dtype == "uint8" else
            self.model.compute_dtype)


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


def _check(ok: bool, message: str) -> None:
  if not ok:
    raise ConfigError(message)


def parse_grid(text: str) -> tuple[int, int] | None:
  """--all_reduce_grid 'XxY' -> (X, Y); '' -> None (the squarest grid)."""
  if not text:
    return None
  parts = text.lower().split("x")
  _check(len(parts) == 2 and all(p.isdigit() and int(p) > 0 for p in parts),
         f"--all_reduce_grid must look like '4x2' (replicas per row x rows), "
         f"got {text!r}.")
  return int(parts[0]), int(parts[1])


def _check_fields(cfg: TrainConfig) -> None:
  """Every field against RANGES and CHOICES."""
  values = cfg.flat()
  for name, choices in CHOICES.items():
    _check(values[name] in choices,
           f"--{name} must be one of {choices}, got {values[name]!r}.")
  for name, allowed in RANGES.items():
    _check(allowed.contains(values[name]),
           f"--{name} must be {allowed}, got {values[name]!r}.")


def validate(cfg: TrainConfig, num_replicas: int | None = None) -> None:
  """Raises ConfigError naming the flag for any bad or inconsistent setting.

  `num_replicas` is checked when known (it is, for CPU replicas, before the
  strategy starts); TPU/GPU replica counts are checked again after start-up.
  The data's files are the pre-flight's (data_checks.find_data_files).
  """
  run, dist, optim = cfg.run, cfg.distribution, cfg.optim
  _check(bool(cfg.model_dir), "--model_dir is required.")
  _check_fields(cfg)
  profile = run.profile_steps.split(",") if run.profile_steps else []
  _check(not profile or (len(profile) == 2 and all(
      p.strip().isdigit() for p in profile) and
      0 < int(profile[0]) <= int(profile[1])),
         f"--profile_steps must be 'first,last' steps with 0 < first <= "
         f"last (e.g. 10,20), got {run.profile_steps!r}.")
  unknown = [n for n in allowed_changes(cfg) if n not in cfg.flat()]
  _check(not unknown, f"--allow_config_change names {unknown}, which are not "
         "flags of a run (e.g. --allow_config_change=global_batch_size).")
  parse_grid(dist.all_reduce_grid)
  _check(run.train_steps > 0 or run.train_epochs > 0,
         "Set --train_steps or --train_epochs (> 0).")
  _check(not ((dist.tpu or dist.strategy == "tpu") and
              dist.gradient_all_reduce != "auto"),
         "--gradient_all_reduce=ring|2d|2d_ying is for GPU/CPU replicas; on "
         "TPU XLA sums gradients over the torus (use auto).")
  _check(not (optim.nesterov and optim.optimizer == "rmsprop_warmup"),
         "--nesterov is not supported with --optimizer=rmsprop_warmup.")
  _check(not optim.momentum_correction or optim.optimizer == "momentum",
         "--momentum_correction is for --optimizer=momentum (LARS and "
         f"RMSprop warm-up keep their own update); got {optim.optimizer}.")
  _check(not (cfg.model.precision == "float16" and run.batch_size_schedule),
         "--precision=float16 does not support --batch_size_schedule "
         "(gradient accumulation); use float32 or bfloat16.")
  _check(not (cfg.model.precision == "float16" and
              (dist.tpu or dist.strategy == "tpu")),
         "--precision=float16 is for GPUs without fast bfloat16 (V100, T4); "
         "TPUs compute in bfloat16: use --precision=bfloat16.")
  _check(not cfg.model.freeze_bn or bool(run.init_checkpoint),
         "--freeze_bn keeps the BN statistics, scales and offsets of the "
         "network a run starts from: set --init_checkpoint.")
  _check(not (cfg.model.freeze_bn and cfg.model.bn_stats == "recompute"),
         "--freeze_bn keeps the checkpoint's BN statistics; "
         "--bn_stats=recompute would replace them: use moving_average.")
  _check(not (run.max_loop_seconds and dist.strategy == "multi_worker"),
         "--max_loop_seconds times each host's loops apart; workers would "
         "run loops of different lengths: use it on one host, and a "
         "--steps_per_loop that meets the grace period with "
         "--strategy=multi_worker.")
  _check(not (optim.skip_nonfinite_steps and run.batch_size_schedule),
         "--skip_nonfinite_steps does not support --batch_size_schedule "
         "(gradient accumulation); a NaN/Inf loss there stops training.")
  if run.batch_size_schedule:
    try:
      schedule = parse_batch_size_schedule(run.batch_size_schedule)
    except ValueError as e:
      raise ConfigError(str(e)) from None
    for _, batch in schedule:
      _check(batch % run.global_batch_size == 0,
             f"--batch_size_schedule batch {batch} must be a multiple of "
             f"--global_batch_size={run.global_batch_size} (the micro-batch "
             "that is accumulated).")
  _check(cfg.input.use_synthetic_data or bool(cfg.input.data_dir),
         "--data_dir is required unless --use_synthetic_data is set.")
  _check_processes(dist)
  if dist.backend == "jax":
    _check_jax_flags(cfg)
    if not files.tensorflow_installed():
      _check_without_tensorflow(cfg)
  if num_replicas is not None:
    validate_replicas(cfg, num_replicas)


# What the JAX engine does not have yet (issue 49): flag, whether a value
# is refused, and why; the first refused is named. README "Running on JAX"
# lists the same.
JAX_UNSUPPORTED = (
    ("gradient_all_reduce", lambda v: v != "auto", "JAX sums gradients "
     "with one psum (XLA's all-reduce); use auto"),
    ("bn_all_reduce", lambda v: v != "auto", "JAX sums BN statistics with "
     "a psum over the group's mesh axis; use auto"),
    ("all_reduce_grid", bool, "it shapes TensorFlow's 2-D all-reduces"),
    ("tpu", lambda v: v not in ("", "local"), "JAX uses this host's own "
     "chips: --tpu=local or none"),
)


def _check_processes(dist: DistributionConfig) -> None:
  """--coordinator_address, --num_processes and --process_id: a JAX
  multi_worker run's, all three or none."""
  given = [f"--{name}" for name, unset in (
      ("coordinator_address", ""), ("num_processes", 0), ("process_id", -1))
           if getattr(dist, name) != unset]
  if not given:
    return
  _check(dist.backend == "jax" and dist.strategy == "multi_worker",
         f"{', '.join(given)}: for --backend=jax --strategy=multi_worker "
         "(jax.distributed); TensorFlow's workers come from TF_CONFIG.")
  _check(len(given) == 3,
         f"{', '.join(given)} given alone: set all three of "
         "--coordinator_address=HOST:PORT, --num_processes and --process_id, "
         "or none (JAX then detects its cluster: Cloud TPU, SLURM, Open "
         "MPI, Kubernetes).")
  _check(dist.num_processes >= 1 and 0 <= dist.process_id
         < dist.num_processes,
         f"--process_id={dist.process_id} must be in [0, --num_processes="
         f"{dist.num_processes}).")
  _check(dist.coordinator_address.rpartition(":")[2].isdigit(),
         "--coordinator_address must be HOST:PORT (process 0's address), "
         f"got {dist.coordinator_address!r}.")


def _check_jax_flags(cfg: TrainConfig) -> None:
  """Names the first flag the JAX engine does not support."""
  values = cfg.flat()
  for name, refused, why in JAX_UNSUPPORTED:
    _check(not refused(values[name]), f"--{name}={values[name]} is not "
           f"supported with --backend=jax: {why}. Use --backend=tensorflow "
           "for it.")


def _check_without_tensorflow(cfg: TrainConfig) -> None:
  """A JAX run where TensorFlow is not installed trains on the synthetic
  input and writes a local model_dir (files.py); the TFRecords, the
  SavedModel and a fine-tuning source are TensorFlow's formats."""
  install = ("TensorFlow, which is not installed here: pip install -r "
             "requirements-jax.txt beside JAX")
  _check(cfg.input.use_synthetic_data,
         f"--data_dir={cfg.input.data_dir!r}: reading TFRecords needs "
         f"{install}, or train on --use_synthetic_data.")
  _check(not cfg.run.export_dir,
         f"--export_dir={cfg.run.export_dir!r}: the SavedModel is written "
         f"by {install}, or leave --export_dir unset and export the "
         "checkpoints later where TensorFlow is (tools/export_savedmodel.py).")
  _check(not cfg.run.init_checkpoint,
         f"--init_checkpoint={cfg.run.init_checkpoint!r}: it is read by "
         f"{install}.")
  _check(not files.is_remote(cfg.model_dir),
         f"--model_dir={cfg.model_dir!r}: without TensorFlow's file "
         "systems a JAX run writes local paths only; use a local folder, or "
         "install TensorFlow beside JAX (pip install -r requirements-jax.txt).")


def validate_replicas(cfg: TrainConfig, num_replicas: int) -> None:
  """Checks the batch and BN-group sizes against the replica count."""
  run, dist = cfg.run, cfg.distribution
  group_size = cfg.model.bn_group_size
  _check(run.global_batch_size % num_replicas == 0,
         f"--global_batch_size={run.global_batch_size} must be divisible by "
         f"the number of replicas ({num_replicas}).")
  _check(run.eval_batch_size % num_replicas == 0,
         f"--eval_batch_size={run.eval_batch_size} must be divisible by the "
         f"number of replicas ({num_replicas}).")
  _check(num_replicas % group_size == 0,
         f"--bn_group_size={group_size} must divide the number of "
         f"replicas ({num_replicas}).")
  grid = parse_grid(dist.all_reduce_grid)
  if grid and dist.gradient_all_reduce != "auto":
    _check(grid[0] * grid[1] == num_replicas,
           f"--all_reduce_grid={dist.all_reduce_grid} has "
           f"{grid[0] * grid[1]} cells but there are {num_replicas} "
           "replicas.")


# --- config.json -------------------------------------------------------------


def write_config(cfg: TrainConfig, labels_file: str = "",
                 changes: dict | None = None) -> str:
  """Writes `<model_dir>/config.json`: every flag's value + labels_file.

  The export and evaluation tools rebuild the network from it. A resumed
  run that changed flags deliberately (--allow_config_change) passes
  `changes`, flag -> [value before, value now]: they are appended to the
  record's `config_changes`, which keeps every earlier change.
  """
  path = os.path.join(cfg.model_dir, CONFIG_FILE)
  history = []
  if files.exists(path):
    with files.open_file(path) as f:
      history = json.load(f).get(CHANGES_KEY, [])
  if changes:
    history.append({"changed": changes})
  record = dict(cfg.flat(), labels_file=labels_file)
  if history:
    record[CHANGES_KEY] = history
  files.makedirs(cfg.model_dir)
  with files.open_file(path, "w") as f:
    f.write(json.dumps(record, indent=2, sort_keys=True) + "\n")
  return path


def read_config(model_dir: str) -> dict:
  """The config.json of a run; ConfigError if it is missing or incomplete."""
  path = os.path.join(model_dir, CONFIG_FILE)
  _check(files.exists(path),
         f"--model_dir={model_dir!r} has no {CONFIG_FILE}; it is written "
         "when a training run (main.py) starts.")
  with files.open_file(path) as f:
    record = json.load(f)
  missing = [k for k in MODEL_KEYS if k not in record]
  _check(not missing, f"{path} lacks the keys {missing}.")
  return record
