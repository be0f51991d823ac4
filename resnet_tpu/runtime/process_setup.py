"""What an entry point sets before TensorFlow loads: C++ logs and CPU kernels.

TensorFlow reads TF_CPP_MIN_LOG_LEVEL and TF_ENABLE_ONEDNN_OPTS once, when
it loads, so main.py, tools/, data/, tests/conftest.py and the notebook call
these functions before they import it. Importing resnet_tpu sets nothing,
and a variable the user set always wins.

- `quiet_tensorflow_logs`: level 2 hides TensorFlow's C++ INFO and WARNING
  lines (cpu_feature_guard's notice, tf.data's). On a host without an NVIDIA
  GPU or a TPU chip, level 3 also hides its errors: there the only one a run
  prints is `failed call to cuInit`, TensorFlow probing for CUDA. The
  project's own messages use absl's Python logging, which neither level
  touches. TensorFlow 2.21's libraries write a few lines while they load,
  before they read the variable (absl's "All log messages before
  absl::InitializeLog()", oneDNN's and the CUDA stub's notices); no setting
  hides those (tensorflow/tensorflow#102212, abseil/abseil-cpp#1957).
- `apply_cpu_kernel_choice`: oneDNN's CPU kernels (cpu_kernels.py) where
  the model runs on CPU devices, where they were measured; elsewhere
  TensorFlow's own default stands.
"""
from collections.abc import Callable, Mapping, MutableMapping, Sequence
import glob
import importlib.util
import os
import sys

from resnet_tpu.config import ConfigError
from resnet_tpu.config import DistributionConfig
from resnet_tpu.runtime.cpu_kernels import ONEDNN_ENV

BACKEND_ENV = "KERAS_BACKEND"
ENGINES = ("tensorflow", "jax")
# Each engine's install sets (README's Install table).
INSTALL_SETS = {
    "tensorflow": "requirements/cpu.txt, gpu-tensorflow.txt or "
                  "tpu-vm-tensorflow.txt",
    "jax": "requirements/test-jax.txt beside cpu.txt, gpu-jax.txt or "
           "tpu-vm-jax.txt (docs/jax.md)",
}

LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
# An NVIDIA GPU's device files on bare metal, in containers and under WSL2
# (the files JAX's hardware_utils checks).
NVIDIA_DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg")
# Google's PCI vendor ID: TPU chips on a TPU VM (and gVNIC network cards,
# which errs on the side of showing errors).
GOOGLE_PCI_VENDOR = "0x1ae0"


def nvidia_gpu_visible(
    environ: Mapping[str, str] = os.environ,
    device_files: Sequence[str] = NVIDIA_DEVICE_FILES) -> bool:
  """An NVIDIA device file exists and CUDA_VISIBLE_DEVICES does not hide it."""
  if environ.get("CUDA_VISIBLE_DEVICES", "0").strip() in ("", "-1"):
    return False
  return any(os.path.exists(path) for path in device_files)


def tpu_chip_attached() -> bool:
  """A PCI device of Google's is attached, as TPU chips are on a TPU VM."""
  for path in glob.glob("/sys/bus/pci/devices/*/vendor"):
    try:
      with open(path) as f:
        if f.read().strip() == GOOGLE_PCI_VENDOR:
          return True
    except OSError:
      continue
  return False


def quiet_tensorflow_logs(environ: MutableMapping[str, str] = os.environ,
                          accelerator: bool | None = None) -> str:
  """Sets TF_CPP_MIN_LOG_LEVEL unless the user did; returns the level.

  `accelerator`: whether the host has an NVIDIA GPU or a TPU chip (None:
  look).
  """
  if accelerator is None:
    accelerator = nvidia_gpu_visible(environ) or tpu_chip_attached()
  return environ.setdefault(LOG_LEVEL_ENV, "2" if accelerator else "3")


def startup_kind(strategy: str, tpu: str,
                 environ: Mapping[str, str] = os.environ,
                 device_files: Sequence[str] = NVIDIA_DEVICE_FILES) -> str:
  """The strategy kind of --strategy/--tpu, decided once, before TensorFlow
  loads (main.py, the accelerator check and preflight.resolve call it):
  tpu if --tpu names one, multi_worker under TF_CONFIG, gpu where an
  NVIDIA GPU is visible, else cpu.
  """
  if strategy != "auto":
    return strategy
  if tpu:
    return "tpu"
  if "TF_CONFIG" in environ:
    return "multi_worker"
  return "gpu" if nvidia_gpu_visible(environ, device_files) else "cpu"


def strategy_kind(dist: DistributionConfig) -> str:
  """The strategy kind a run starts with (config.validate_start_up): on
  TensorFlow, startup_kind's; on JAX, --strategy as given (auto leaves JAX
  its own devices: jax_platform)."""
  if dist.backend == "jax":
    return dist.strategy
  return startup_kind(dist.strategy, dist.tpu)


def cpu_tunings_apply(kind: str) -> bool:
  """Whether the CPU tunings (oneDNN kernels, host_memory.py) apply to a run.

  Only where the model runs on CPU devices, where they were measured:
  multi_worker does not count, since its workers may hold GPUs.
  """
  return kind == "cpu"


def onednn_value(choice: str, kind: str) -> str | None:
  """TF_ENABLE_ONEDNN_OPTS for --cpu_onednn=`choice` on a `kind` run.

  None leaves TensorFlow's own default.
  """
  if choice == "auto":
    return "1" if cpu_tunings_apply(kind) else None
  return "1" if choice == "on" else "0"


def apply_cpu_kernel_choice(
    choice: str, kind: str,
    environ: MutableMapping[str, str] = os.environ) -> str:
  """Sets TF_ENABLE_ONEDNN_OPTS for `choice` and `kind`; says what it did.

  The user's own variable wins; once TensorFlow is loaded nothing changes.
  """
  if ONEDNN_ENV in environ:
    return f"{ONEDNN_ENV}={environ[ONEDNN_ENV]}, set by the user"
  value = onednn_value(choice, kind)
  reason = f"--cpu_onednn={choice} on a {kind} run"
  if value is None:
    return f"TensorFlow's default ({reason})"
  if "tensorflow" in sys.modules:
    return f"TensorFlow's default: it loaded before the choice ({reason})"
  environ[ONEDNN_ENV] = value
  return f"{ONEDNN_ENV}={value} ({reason})"


def installed(module: str) -> bool:
  """Whether `module` is importable here, without importing it."""
  try:
    return importlib.util.find_spec(module) is not None
  except ImportError:
    return False


def choose_backend(flag: str,
                   environ: MutableMapping[str, str] = os.environ,
                   is_installed: Callable[[str], bool] = installed) -> str:
  """Keras's engine for --backend (auto: $KERAS_BACKEND, else tensorflow);
  sets KERAS_BACKEND, which Keras reads once, when it loads."""
  name = environ.get(BACKEND_ENV, "tensorflow") if flag == "auto" else flag
  if name not in ENGINES:
    raise ConfigError(f"{BACKEND_ENV}={name!r}: resnet_tpu runs on Keras's "
                      f"{' or '.join(ENGINES)} engine (--backend).")
  if not is_installed(name):
    python = ".".join(map(str, sys.version_info[:2]))
    raise ConfigError(f"--backend={name}: {name} is not installed in this "
                      f"environment (Python {python}); install "
                      f"{INSTALL_SETS[name]}.")
  keras = sys.modules.get("keras")
  if keras is not None and keras.backend.backend() != name:
    raise ConfigError(f"--backend={name}: Keras already loaded on "
                      f"{keras.backend.backend()}; set it before Keras "
                      "loads.")
  environ[BACKEND_ENV] = name
  return name


def jax_platform(strategy: str, num_cpu_replicas: int,
                 environ: MutableMapping[str, str] = os.environ) -> str:
  """The JAX engine's devices for --strategy, set before JAX loads: cpu
  gives `num_cpu_replicas` virtual CPU devices (XLA's host device count);
  auto, gpu and tpu leave JAX its own choice (TPU, else GPU, else CPU).
  Returns what it chose, for the log."""
  if strategy != "cpu":
    return "JAX's default devices"
  environ["JAX_PLATFORMS"] = "cpu"
  flag = f"--xla_force_host_platform_device_count={num_cpu_replicas}"
  environ["XLA_FLAGS"] = f"{environ.get('XLA_FLAGS', '')} {flag}".strip()
  return f"{num_cpu_replicas} virtual CPU device(s)"


def exit_skipping_teardown(code: int | str | None = 0) -> None:
  """Ends the process as sys.exit(code) would, without the interpreter's
  teardown: nothing is left to save, and freeing tf.data iterators of
  several devices waits, idle, for each device's autotune thread (up to a
  minute each; resnet_tpu/engines/tensorflow/iterators.py). A str code is
  printed to stderr and exits 1, as sys.exit does."""
  from absl import logging  # pylint: disable=g-import-not-at-top
  if isinstance(code, str):
    print(code, file=sys.stderr)
    code = 1
  logging.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code or 0)
