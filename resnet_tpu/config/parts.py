"""The config's parts: one frozen dataclass per stage (input, model,
optim, distribution, run) and the TrainConfig that holds them, with the
flags' choices. Flags keep flat names, unique across the parts
(FLAG_FIELDS)."""
import dataclasses

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

def require(ok: bool, message: str) -> None:
  """Raises ConfigError(message) unless `ok`."""
  if not ok:
    raise ConfigError(message)


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
  jax_compilation_cache_dir: str = "auto"

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
