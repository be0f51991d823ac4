"""bfloat16 convolutions (Ying et al. 2018, §3) on any device.

Ying et al. run convolutions and activations in bfloat16 and everything else
in float32. A TPU's matrix unit multiplies bfloat16 operands and accumulates
the products in float32. Where TensorFlow has native bfloat16 convolution
kernels (TPU, recent GPUs, x86 CPUs with AVX512-BF16 or AMX through oneDNN)
Keras's Conv2D under the `mixed_bfloat16` policy uses them. On other CPUs
(AVX2 x86 such as this project's AMD EPYC) TensorFlow runs bfloat16
convolutions in Eigen's generic kernel, which converts element by element,
so a bfloat16 step there is many times slower than a float32 one
(`ours_bfloat16_native` in bench_results/REPORT.md).

`Conv2D` below can instead widen the bfloat16 operands to float32 (exact:
every bfloat16 is a float32), convolve with TensorFlow's float32 kernels and
round the output to bfloat16. That is the arithmetic of the TPU (bfloat16
products, float32 sums; a product of two bfloat16s is exact in float32); the
layer's inputs, kernel and outputs stay bfloat16-valued, so activations and
gradients keep their bfloat16 precision (tests/test_bfloat16_convs.py checks
the outputs and gradients against Keras's bfloat16 Conv2D and a float64
reference). In float32 the layer is Keras's Conv2D.

`--bfloat16_conv_kernels`: `native` (TensorFlow's bfloat16 kernels), `float32`
(widened operands), or `auto`: float32 when the model's devices are CPUs
without native bfloat16 arithmetic, native on TPU, GPU and AVX512-BF16/AMX.
"""
from collections.abc import Sequence

import keras
from keras import ops

from resnet_tpu.runtime import cpu_kernels

# /proc/cpuinfo flags of CPUs whose bfloat16 kernels TensorFlow runs natively
# (x86 AVX512-BF16 and AMX via oneDNN; aarch64 BF16 via oneDNN/ACL).
NATIVE_BFLOAT16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def cpu_has_native_bfloat16(flags: frozenset[str] | None = None) -> bool:
  """Whether this CPU (or one with `flags`) has bfloat16 arithmetic."""
  flags = cpu_kernels.cpu_flags() if flags is None else flags
  return any(f in flags for f in NATIVE_BFLOAT16_CPU_FLAGS)


def model_device_types() -> list[str]:
  """Device types (CPU, GPU, TPU) the model being built will run on.

  TensorFlow: the workers of the strategy in scope, else the logical
  devices it would place the model on (an accelerator when there is one).
  JAX: the platform of its default devices.
  """
  if keras.backend.backend() == "jax":
    import jax  # pylint: disable=g-import-not-at-top (the engine's own)
    return [jax.devices()[0].platform.upper()]
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if tf.distribute.has_strategy():
    devices = tf.distribute.get_strategy().extended.worker_devices
    return sorted({tf.DeviceSpec.from_string(d).device_type for d in devices})
  for kind in ("TPU", "GPU"):
    if tf.config.list_logical_devices(kind):
      return [kind]
  return ["CPU"]


def use_float32_kernels(setting: str, device_types: Sequence[str],
                        native_cpu: bool | None = None) -> bool:
  """Resolves --bfloat16_conv_kernels for devices of `device_types`."""
  if setting != "auto":
    return setting == "float32"
  if native_cpu is None:
    native_cpu = cpu_has_native_bfloat16()
  return set(device_types) == {"CPU"} and not native_cpu


@keras.saving.register_keras_serializable(package="resnet_tpu")
class Conv2D(keras.layers.Conv2D):
  """Keras Conv2D; bfloat16 convs widened to float32 kernels on request.

  With `float32_kernels=True` and a bfloat16 compute dtype, the (bfloat16)
  inputs and kernel are cast to float32, convolved, and the output is
  rounded to bfloat16: float32 accumulation of exact bfloat16 products.
  """

  def __init__(self, *args, float32_kernels: bool = False, **kwargs):
    super().__init__(*args, **kwargs)
    self.float32_kernels = float32_kernels

  def convolution_op(self, inputs, kernel):
    if (not self.float32_kernels or
        keras.backend.standardize_dtype(inputs.dtype) != "bfloat16"):
      return super().convolution_op(inputs, kernel)
    # The kernel variable is float32; under autocast it reads as bfloat16,
    # and the explicit round keeps it bfloat16-valued in any case.
    kernel = ops.cast(ops.cast(kernel, "bfloat16"), "float32")
    outputs = super().convolution_op(ops.cast(inputs, "float32"), kernel)
    return ops.cast(outputs, "bfloat16")

  def get_config(self) -> dict:
    return dict(super().get_config(), float32_kernels=self.float32_kernels)
