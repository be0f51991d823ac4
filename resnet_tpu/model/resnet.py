"""ResNet v1.5 (Goyal et al. 2017, as trained by Ying et al. 2018, §4).

Differences from the original ResNet v1 that matter for large-batch training:
- the stride-2 downsampling sits on the 3x3 conv of the bottleneck (v1.5);
- the last BN of each residual block starts with gamma = 0, so every block
  begins as the identity (Goyal et al. §5.1; --zero_init_gamma);
- no conv biases (BN follows every conv).

As tensorflow/tpu's models/official/resnet/resnet_model.py (commit
61dbdbc1714d9d0e7f96f2db93b365e9198728dd): convs start from
tf.variance_scaling_initializer() (scale 1, fan_in, truncated normal: weight
variance 1/fan_in, half Keras's he_normal), the stem max-pool pads SAME (0
before, 1 after on even sizes) and the logits start from N(0, 0.01). BN
after each conv makes the forward pass blind to the conv's scale, but not the
update: a kernel of twice the variance takes half the effective step, so the
LRs taken from tensorflow/tpu mean the same here only with its init.

Every BatchNormalization is a DistributedBatchNormalization (§3.1). Input
normalisation happens inside the model, so the input pipeline and the
exported SavedModel both feed raw 0..255 pixels. With --precision=bfloat16,
`dtype_policy` builds the model under Keras's `mixed_bfloat16` policy, so
convs and activations run in bfloat16 as in Ying et al. §3 (on CPUs without
bfloat16 arithmetic, through float32 kernels: bfloat16_convs.py); BN
statistics and the logits stay in float32.
"""
import contextlib
import functools
from typing import Sequence

from absl import logging
import keras

from resnet_tpu.model import bfloat16_convs

from resnet_tpu.model.bfloat16_convs import Conv2D
from resnet_tpu.config import DistributionConfig
from resnet_tpu.config import ModelConfig
from resnet_tpu.model.distributed_batch_norm import DistributedBatchNormalization

# ImageNet channel statistics on the 0..255 scale.
MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STDDEV_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)
# keras.applications.resnet's "caffe" preprocessing: BGR channels minus these
# means, unscaled (listed here in RGB order; the converter reorders the stem
# conv's input channels instead of the images).
CAFFE_MEAN_RGB = (123.68, 116.779, 103.939)

# depth -> (block kind, blocks per stage)
LAYERS = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
    200: ("bottleneck", (3, 24, 36, 3)),
}


def conv_initializer(kind: str = "fan_in") -> keras.initializers.Initializer:
  """fan_in: tensorflow/tpu's tf.variance_scaling_initializer(), variance
  1/fan_in; he_normal: Keras's he_normal, 2/fan_in (--conv_init)."""
  if kind == "he_normal":
    return keras.initializers.HeNormal()
  return keras.initializers.VarianceScaling(
      scale=1.0, mode="fan_in", distribution="truncated_normal")


def stem_max_pool(x, symmetric: bool = False):
  """3x3/2 max-pool with SAME padding, as tensorflow/tpu's stem.

  On an even input SAME pads 0 rows before and 1 after, so output i covers
  inputs 2i..2i+2. symmetric=True pads 1/1 with zeros first, as
  keras.applications.ResNet50 does (output i covers 2i-1..2i+1; the input
  follows a ReLU, so a zero pad never wins the max over a real value).
  """
  if symmetric:
    x = keras.layers.ZeroPadding2D(1, name="stem_pool_pad")(x)
  return keras.layers.MaxPooling2D(3, strides=2,
                                   padding="valid" if symmetric else "same",
                                   name="stem_pool")(x)


def input_normalization(kind: str = "imagenet") -> keras.layers.Layer:
  """Raw 0..255 RGB to the stem's input (--input_normalization): ImageNet
  mean/std, pixels / 255 (unit), or keras.applications' Caffe means
  without scaling (caffe)."""
  mean, std = {"imagenet": (MEAN_RGB, STDDEV_RGB),
               "unit": ((0.0,) * 3, (255.0,) * 3),
               "caffe": (CAFFE_MEAN_RGB, (1.0,) * 3)}[kind]
  return keras.layers.Normalization(mean=mean, variance=[s * s for s in std],
                                    dtype="float32", name="normalize")


def _conv(x, filters: int, kernel: int, strides: int, name: str,
          float32_kernels: bool, init: str = "fan_in"):
  if strides > 1 and kernel > 1:
    # Fixed padding, independent of the input size (as tensorflow/tpu does).
    pad = kernel - 1
    x = keras.layers.ZeroPadding2D(((pad // 2, pad - pad // 2),) * 2,
                                   name=name + "_pad")(x)
  return Conv2D(
      filters, kernel, strides=strides,
      padding="valid" if strides > 1 and kernel > 1 else "same",
      use_bias=False, kernel_initializer=conv_initializer(init),
      float32_kernels=float32_kernels, name=name)(x)


def _bn(x, group_size: int, name: str, zero_gamma: bool = False,
        frozen: bool = False, **bn_args):
  """bn_args: momentum, epsilon, all_reduce, collective_timeout_s, groups
  (DistributedBatchNormalization). frozen: not trainable, so training runs
  it in inference mode on its moving statistics (--freeze_bn)."""
  return DistributedBatchNormalization(
      group_size=group_size, **bn_args, trainable=not frozen,
      gamma_initializer="zeros" if zero_gamma else "ones", name=name)(x)


def bottleneck_block(x, filters: int, strides: int, group_size: int,
                     name: str, bn_args: dict, stride_in_3x3: bool = True,
                     float32_kernels: bool = False, init: str = "fan_in",
                     zero_gamma: bool = True):
  """1x1 -> 3x3 -> 1x1 x4, projection when shapes change.

  The stride sits on the 3x3 conv (v1.5), or on the first 1x1 conv with
  stride_in_3x3=False (v1, as keras.applications.ResNet50). float32_kernels:
  see bfloat16_convs.Conv2D; init: --conv_init; zero_gamma: the last BN
  starts at gamma 0 (--zero_init_gamma).
  """
  conv = functools.partial(_conv, float32_kernels=float32_kernels, init=init)
  shortcut = x
  if strides > 1 or x.shape[-1] != 4 * filters:
    shortcut = conv(x, 4 * filters, 1, strides, name + "_proj")
    shortcut = _bn(shortcut, group_size, name + "_proj_bn", **bn_args)
  strides_1x1, strides_3x3 = (1, strides) if stride_in_3x3 else (strides, 1)
  y = conv(x, filters, 1, strides_1x1, name + "_conv1")
  y = keras.layers.ReLU(name=name + "_relu1")(
      _bn(y, group_size, name + "_bn1", **bn_args))
  y = conv(y, filters, 3, strides_3x3, name + "_conv2")
  y = keras.layers.ReLU(name=name + "_relu2")(
      _bn(y, group_size, name + "_bn2", **bn_args))
  y = conv(y, 4 * filters, 1, 1, name + "_conv3")
  y = _bn(y, group_size, name + "_bn3", zero_gamma=zero_gamma, **bn_args)
  return keras.layers.ReLU(name=name + "_out")(
      keras.layers.Add(name=name + "_add")([shortcut, y]))


def basic_block(x, filters: int, strides: int, group_size: int, name: str,
                bn_args: dict, float32_kernels: bool = False,
                init: str = "fan_in", zero_gamma: bool = True):
  """3x3 -> 3x3, projection shortcut when shapes change (ResNet-18/34);
  the arguments as bottleneck_block's."""
  conv = functools.partial(_conv, float32_kernels=float32_kernels, init=init)
  shortcut = x
  if strides > 1 or x.shape[-1] != filters:
    shortcut = conv(x, filters, 1, strides, name + "_proj")
    shortcut = _bn(shortcut, group_size, name + "_proj_bn", **bn_args)
  y = conv(x, filters, 3, strides, name + "_conv1")
  y = keras.layers.ReLU(name=name + "_relu1")(
      _bn(y, group_size, name + "_bn1", **bn_args))
  y = conv(y, filters, 3, 1, name + "_conv2")
  y = _bn(y, group_size, name + "_bn2", zero_gamma=zero_gamma, **bn_args)
  return keras.layers.ReLU(name=name + "_out")(
      keras.layers.Add(name=name + "_add")([shortcut, y]))


def stack(x, block, filters: int, blocks: int, strides: int, group_size: int,
          name: str, bn_args: dict):
  """One stage: the first block downsamples, the rest keep the shape."""
  for i in range(blocks):
    x = block(x, filters, strides if i == 0 else 1, group_size,
              f"{name}_block{i + 1}", bn_args)
  return x


def build_resnet(depth: int = 50, num_classes: int = 1000,
                 image_size: int = 224, bn_group_size: int = 1,
                 bn_momentum: float = 0.9, bn_epsilon: float = 1e-5,
                 layout: str = "v1.5",
                 float32_kernels: bool = False, bn_all_reduce: str = "auto",
                 collective_timeout_s: float = 0.0,
                 bn_groups: Sequence[Sequence[int]] | None = None,
                 freeze_bn: bool = False, conv_init: str = "fan_in",
                 zero_init_gamma: bool = True,
                 normalization: str = "imagenet",
                 logits_dtype: str = "float32") -> keras.Model:
  """ResNet of `depth` taking raw 0..255 RGB images, returning logits.

  layout "v1.5": the network described above. "keras_v1":
  keras.applications.ResNet50's network (--resnet_layout), so that its
  weights convert exactly (keras_weights.py): the bottlenecks' stride on the
  first 1x1 conv, the stem pool padded 1/1 (with normalization="caffe",
  its inputs too). conv_init, zero_init_gamma, normalization: the flags.
  The dtype policy in force (keras.mixed_precision) decides the compute
  dtype; call this under `mixed_bfloat16` for bfloat16 training.
  float32_kernels=True runs the bfloat16 convs on float32 kernels
  (resnet_tpu/model/bfloat16_convs.py). bn_all_reduce,
  collective_timeout_s and bn_groups configure the BN groups' all-reduce
  (bn_all_reduce.py). freeze_bn: every BN layer frozen (--freeze_bn).
  logits_dtype: float32 in every precision of the flags (float64 in the
  engine tests, tests_jax/engine_cases.py).
  """
  kind, blocks = LAYERS[depth]
  if kind == "bottleneck":
    block = functools.partial(bottleneck_block,
                              stride_in_3x3=layout == "v1.5")
  else:
    block = basic_block
  block = functools.partial(block, float32_kernels=float32_kernels,
                            init=conv_init, zero_gamma=zero_init_gamma)
  bn_args = {"momentum": bn_momentum, "epsilon": bn_epsilon,
             "frozen": freeze_bn, "all_reduce": bn_all_reduce,
             "collective_timeout_s": collective_timeout_s,
             "groups": bn_groups}

  inputs = keras.Input((image_size, image_size, 3), name="images")
  x = input_normalization(normalization)(inputs)
  x = _conv(x, 64, 7, 2, "stem_conv", float32_kernels, conv_init)
  x = keras.layers.ReLU(name="stem_relu")(
      _bn(x, bn_group_size, "stem_bn", **bn_args))
  x = stem_max_pool(x, symmetric=layout == "keras_v1")
  for stage, (filters, n) in enumerate(zip((64, 128, 256, 512), blocks)):
    x = stack(x, block, filters, n, 1 if stage == 0 else 2, bn_group_size,
              f"stage{stage + 1}", bn_args)
  x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
  logits = keras.layers.Dense(
      num_classes, dtype=logits_dtype,
      kernel_initializer=keras.initializers.RandomNormal(stddev=0.01),
      name="logits")(x)
  version = "v1_5" if layout == "v1.5" else layout
  return keras.Model(inputs, logits, name=f"resnet{depth}_{version}")


@contextlib.contextmanager
def dtype_policy(precision: str):
  """Keras dtype policy for building the model: mixed_bfloat16,
  mixed_float16 or float32."""
  previous = keras.config.dtype_policy()
  keras.config.set_dtype_policy(
      {"bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}.get(
          precision, "float32"))
  try:
    yield
  finally:
    keras.config.set_dtype_policy(previous)


def build_model(cfg: ModelConfig,
                distribution: DistributionConfig = DistributionConfig(),
                bn_groups: Sequence[Sequence[int]] | None = None
                ) -> keras.Model:
  """The ResNet of `cfg` in the precision of `cfg`: the one mapping from a
  config's model part to the network (training, export and benchmarks use
  it). `distribution`: how BN sums its statistics (--bn_all_reduce,
  --collective_timeout_s).

  Under a strategy scope, --bfloat16_conv_kernels=auto resolves for the
  strategy's devices (bfloat16_convs.py). `bn_groups`: the BN groups of a
  TPU placement (tpu_layout.py); None = replicas [k*g, (k+1)*g).
  """
  float32_kernels = False
  if cfg.precision == "bfloat16":
    float32_kernels = bfloat16_convs.use_float32_kernels(
        cfg.bfloat16_conv_kernels, bfloat16_convs.model_device_types())
    logging.info("bfloat16 convs run on %s kernels (--bfloat16_conv_kernels"
                 "=%s)", "float32" if float32_kernels else "native bfloat16",
                 cfg.bfloat16_conv_kernels)
  with dtype_policy(cfg.precision):
    return build_resnet(cfg.resnet_depth, cfg.num_classes, cfg.image_size,
                        cfg.bn_group_size, cfg.bn_momentum, cfg.bn_epsilon,
                        layout=cfg.resnet_layout,
                        float32_kernels=float32_kernels,
                        bn_all_reduce=distribution.bn_all_reduce,
                        collective_timeout_s=distribution.collective_timeout_s,
                        bn_groups=bn_groups, freeze_bn=cfg.freeze_bn,
                        conv_init=cfg.conv_init,
                        zero_init_gamma=cfg.zero_init_gamma,
                        normalization=cfg.input_normalization)
