"""Fail fast on a missing accelerator, and say what this process runs on.

A TPU or GPU run that starts on the wrong TensorFlow build fails minutes
later, deep inside start-up ("No OpKernel was registered to support Op
'ConfigureDistributedTPU'"). These checks run first, in milliseconds, and
name the installed package and the command that fixes it.

The TPU build is told apart by a kernel only it registers:
`_ConfigureDistributedTPU` on the TPU_SYSTEM device, which
DistributedTPURewritePass puts in place of the public
`ConfigureDistributedTPU` that `tpu.initialize_system` builds (that one has
no kernel in any build; tensorflow/tensorflow
core/tpu/kernels/tpu_configuration_ops.cc).
"""
import importlib.metadata
import platform

from absl import logging
import keras
import tensorflow as tf

from resnet_tpu.runtime import compat
from resnet_tpu.config import ConfigError

# Distributions that provide the `tensorflow` module, most specific first.
TENSORFLOW_DISTRIBUTIONS = ("tensorflow-tpu", "tf-nightly-tpu",
                            "tensorflow-cpu", "tensorflow", "tf-nightly")
# The op and device of a kernel that only TPU builds register.
TPU_SYSTEM_OP = "_ConfigureDistributedTPU"
TPU_SYSTEM_DEVICE = "TPU_SYSTEM"
TPU_REPAIR = ("pip uninstall -y tensorflow tensorflow-cpu tensorflow-tpu "
              "libtpu && pip install -r requirements/tpu-vm-tensorflow.txt")
GPU_REPAIR = ("pip uninstall -y tensorflow tensorflow-cpu tensorflow-tpu && "
              "pip install -r requirements/gpu-tensorflow.txt")


def _version(distribution: str) -> str | None:
  try:
    return importlib.metadata.version(distribution)
  except importlib.metadata.PackageNotFoundError:
    return None


def installed_tensorflow() -> str:
  """The installed TensorFlow distributions, e.g. 'tensorflow-cpu 2.19.1'."""
  found = [f"{name} {_version(name)}" for name in TENSORFLOW_DISTRIBUTIONS
           if _version(name)]
  return ", ".join(found) or f"tensorflow {tf.__version__} (no package data)"


def is_tpu_build() -> bool:
  """Whether the TensorFlow loaded here is a TPU build (tensorflow-tpu)."""
  return compat.has_kernel(TPU_SYSTEM_OP, TPU_SYSTEM_DEVICE)


def require_tpu_support() -> None:
  """ConfigError unless this TensorFlow build can drive a TPU."""
  if is_tpu_build():
    return
  raise ConfigError(
      "--tpu/--strategy=tpu: the installed TensorFlow "
      f"({installed_tensorflow()}) has no TPU support (no {TPU_SYSTEM_OP} "
      f"kernel on {TPU_SYSTEM_DEVICE}). On a TPU VM install "
      f"requirements/tpu-vm-tensorflow.txt alone: {TPU_REPAIR}")


def require_gpu() -> None:
  """ConfigError unless this TensorFlow is a CUDA build that sees a GPU."""
  if not tf.test.is_built_with_cuda():
    raise ConfigError(
        f"--strategy=gpu: the installed TensorFlow ({installed_tensorflow()}) "
        "is not a CUDA build. Install requirements/gpu-tensorflow.txt: "
        f"{GPU_REPAIR}")
  if not tf.config.list_physical_devices("GPU"):
    raise ConfigError(
        f"--strategy=gpu: TensorFlow ({installed_tensorflow()}) sees no GPU. "
        "Check `nvidia-smi` and CUDA_VISIBLE_DEVICES, and that the CUDA "
        "libraries of requirements/gpu-tensorflow.txt are installed: "
        f"{GPU_REPAIR}")


def require_accelerator(kind: str) -> None:
  """The check of strategy `kind` ("tpu", "gpu"; others need nothing)."""
  if kind == "tpu":
    require_tpu_support()
  elif kind == "gpu":
    require_gpu()


def versions() -> dict:
  """Python, TensorFlow, Keras, libtpu and the CUDA/cuDNN TensorFlow was
  built with (where present)."""
  build = tf.sysconfig.get_build_info()
  found = {"python": platform.python_version(),
           "tensorflow": f"{tf.__version__} ({installed_tensorflow()})",
           "keras": keras.__version__}
  if _version("libtpu"):
    found["libtpu"] = _version("libtpu")
  if build.get("is_cuda_build"):
    found["cuda"] = str(build.get("cuda_version"))
    found["cudnn"] = str(build.get("cudnn_version"))
  return found


def log_start_up(strategy: tf.distribute.Strategy) -> None:
  """One line of versions and one of the devices the replicas run on."""
  logging.info("Versions: %s", ", ".join(f"{k} {v}"
                                         for k, v in versions().items()))
  logging.info("Devices: %d replicas on %s", strategy.num_replicas_in_sync,
               ", ".join(strategy.extended.worker_devices))
