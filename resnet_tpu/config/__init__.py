"""The one validated, typed training configuration, and its config.json.

main.py turns absl flags into a `TrainConfig`; library code takes it, one
of its parts (input, model, optim, distribution, run: one per stage) or
explicit arguments, and never reads FLAGS. Three jobs, a module each:
- parts.py: the parts, the TrainConfig and the flags' choices;
- checks.py: `validate`, run before any start-up, so a bad setting fails
  in milliseconds with a ConfigError naming the flag (engine_limits.py:
  each engine's limits); the data's files are the pre-flight's to check;
- record.py: the run's config.json and what a resume may change.
This package and clock.py are the leaf of the package: they import nothing
else of the project (and not TensorFlow), so flags parse before TensorFlow
is imported.
"""
from resnet_tpu.config.parts import RESNET_DEPTHS  # noqa: F401
from resnet_tpu.config.parts import RESNET_LAYOUTS  # noqa: F401
from resnet_tpu.config.parts import CONV_INITS  # noqa: F401
from resnet_tpu.config.parts import INPUT_NORMALIZATIONS  # noqa: F401
from resnet_tpu.config.parts import PRECISIONS  # noqa: F401
from resnet_tpu.config.parts import BFLOAT16_CONV_KERNELS  # noqa: F401
from resnet_tpu.config.parts import STRATEGIES  # noqa: F401
from resnet_tpu.config.parts import IMAGENET_TRAIN_IMAGES  # noqa: F401
from resnet_tpu.config.parts import BACKENDS  # noqa: F401
from resnet_tpu.config.parts import TPU_DEVICE_ASSIGNMENTS  # noqa: F401
from resnet_tpu.config.parts import TPU_RUNTIMES  # noqa: F401
from resnet_tpu.config.parts import BN_STATS  # noqa: F401
from resnet_tpu.config.parts import BN_ALL_REDUCE  # noqa: F401
from resnet_tpu.config.parts import GRADIENT_ALL_REDUCE  # noqa: F401
from resnet_tpu.config.parts import OPTIMIZERS  # noqa: F401
from resnet_tpu.config.parts import SCHEDULES  # noqa: F401
from resnet_tpu.config.parts import INPUT_DTYPES  # noqa: F401
from resnet_tpu.config.parts import CPU_ONEDNN  # noqa: F401
from resnet_tpu.config.parts import ON_CORRUPT_SHARD  # noqa: F401
from resnet_tpu.config.parts import RESIZE_METHODS  # noqa: F401
from resnet_tpu.config.parts import LR_SCALINGS  # noqa: F401
from resnet_tpu.config.parts import MIN_IMAGE_SIZE  # noqa: F401
from resnet_tpu.config.parts import require  # noqa: F401
from resnet_tpu.config.parts import ConfigError  # noqa: F401
from resnet_tpu.config.parts import InputConfig  # noqa: F401
from resnet_tpu.config.parts import ModelConfig  # noqa: F401
from resnet_tpu.config.parts import OptimConfig  # noqa: F401
from resnet_tpu.config.parts import DistributionConfig  # noqa: F401
from resnet_tpu.config.parts import RunConfig  # noqa: F401
from resnet_tpu.config.parts import PARTS  # noqa: F401
from resnet_tpu.config.parts import FLAG_FIELDS  # noqa: F401
from resnet_tpu.config.parts import TrainConfig  # noqa: F401
from resnet_tpu.config.checks import Range  # noqa: F401
from resnet_tpu.config.checks import RANGES  # noqa: F401
from resnet_tpu.config.checks import CHOICES  # noqa: F401
from resnet_tpu.config.checks import parse_grid  # noqa: F401
from resnet_tpu.config.checks import validate  # noqa: F401
from resnet_tpu.config.checks import validate_replicas  # noqa: F401
from resnet_tpu.config.checks import validate_start_up  # noqa: F401
from resnet_tpu.config.engine_limits import JAX_UNSUPPORTED  # noqa: F401
from resnet_tpu.config.record import CONFIG_FILE  # noqa: F401
from resnet_tpu.config.record import MODEL_KEYS  # noqa: F401
from resnet_tpu.config.record import CHANGES_KEY  # noqa: F401
from resnet_tpu.config.record import FREE_ON_RESUME  # noqa: F401
from resnet_tpu.config.record import allowed_changes  # noqa: F401
from resnet_tpu.config.record import write_config  # noqa: F401
from resnet_tpu.config.record import read_config  # noqa: F401
