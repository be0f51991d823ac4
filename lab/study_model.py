"""The studies' network: a narrow ResNet-10 at 32 px, two ways.

`narrow_resnet` is built from the project's own pieces (resnet.stack of
resnet.basic_block, every BN a DistributedBatchNormalization of the run's
--bn_group_size, zero-initialised gamma on each block's last BN as Goyal
et al. 2017 §5.1, tensorflow/tpu's conv and logit initialisers) and is
passed to resnet_tpu.run.run as its model_fn. It stands in for ResNet-50
because the studies' claims are about what BN statistics, the optimizer
and the batch schedule do to residual training (Ying et al. 2018 §3.1,
§3; Goyal §2; Mikami et al. 2018 §3), not about depth or width: it keeps
BN after every conv, identity-initialised residual blocks, the same head
and the same distributed-BN path, at 1/4 of ResNet-18's widths (16 to 128
channels, one block per stage, a 3x3 stem without max-pool for 32 px), so
a 2-core machine can train it to convergence with >= 100 steps at the
largest batch of each study.

`stock_narrow_resnet` is the same topology from stock Keras layers (Conv2D
with he_normal, BatchNormalization with Keras's momentum and epsilon, gamma
1, pixels / 255), the network a user would write before adopting a
framework: the stock-Keras baseline trains it. Its `features` take the
project's choices instead, one FEATURES name at a time (the ladder of
lab/study_plan.py, issue 36); the project's path drops one with the
config's flags (WITHOUT).
"""
import functools

import keras

from resnet_tpu.config import ModelConfig
from resnet_tpu.config import TrainConfig
from resnet_tpu.model import resnet
from resnet_tpu.model.bfloat16_convs import Conv2D
from resnet_tpu.model.distributed_batch_norm import (
    DistributedBatchNormalization)

WIDTHS = (16, 32, 64, 128)
BLOCKS_PER_STAGE = 1
NAME = "narrow ResNet-10 (widths 16-128, one basic block per stage)"
# Where the project's network differs from the stock one, in the order the
# ladder adds them to the stock network.
FEATURES = ("conv_init", "zero_gamma", "bn_settings", "normalization")
# keras.layers.BatchNormalization's defaults.
STOCK_BN = {"momentum": 0.99, "epsilon": 1e-3}
# The flags that give the project's network the stock choice of a feature.
WITHOUT = {
    "conv_init": {"conv_init": "he_normal"},
    "zero_gamma": {"zero_init_gamma": False},
    "bn_settings": {"bn_momentum": STOCK_BN["momentum"],
                    "bn_epsilon": STOCK_BN["epsilon"]},
    "normalization": {"input_normalization": "unit"},
}


def _head(x, num_classes: int, regularizer=None):
  x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
  return keras.layers.Dense(
      num_classes, dtype="float32", kernel_regularizer=regularizer,
      kernel_initializer=keras.initializers.RandomNormal(stddev=0.01),
      name="logits")(x)


def narrow_resnet(cfg: TrainConfig) -> keras.Model:
  """The project's blocks and distributed BN at narrow widths (model_fn),
  with cfg's --conv_init, --zero_init_gamma and --input_normalization."""
  bn_args = {"momentum": cfg.model.bn_momentum,
             "epsilon": cfg.model.bn_epsilon,
             "all_reduce": cfg.distribution.bn_all_reduce,
             "collective_timeout_s": cfg.distribution.collective_timeout_s,
             "groups": None}
  size = cfg.model.image_size
  inputs = keras.Input((size, size, 3), name="images")
  x = resnet.input_normalization(cfg.model.input_normalization)(inputs)
  x = Conv2D(WIDTHS[0], 3, padding="same", use_bias=False,
             kernel_initializer=resnet.conv_initializer(cfg.model.conv_init),
             name="stem_conv")(x)
  x = DistributedBatchNormalization(group_size=cfg.model.bn_group_size,
                                    name="stem_bn", **bn_args)(x)
  x = keras.layers.ReLU(name="stem_relu")(x)
  block = functools.partial(resnet.basic_block, init=cfg.model.conv_init,
                            zero_gamma=cfg.model.zero_init_gamma)
  for stage, filters in enumerate(WIDTHS):
    x = resnet.stack(x, block, filters, BLOCKS_PER_STAGE,
                     1 if stage == 0 else 2, cfg.model.bn_group_size,
                     f"stage{stage + 1}", bn_args)
  return keras.Model(inputs, _head(x, cfg.model.num_classes),
                     name="narrow_resnet10")


def _stock_block(x, filters: int, strides: int, name: str, conv, bn,
                 last_gamma: str):
  shortcut = x
  if strides > 1 or x.shape[-1] != filters:
    shortcut = conv(filters, 1, strides, name=name + "_proj")(x)
    shortcut = bn(name=name + "_proj_bn")(shortcut)
  y = conv(filters, 3, strides, name=name + "_conv1")(x)
  y = keras.layers.ReLU()(bn(name=name + "_bn1")(y))
  y = conv(filters, 3, 1, name=name + "_conv2")(y)
  y = bn(name=name + "_bn2", gamma_initializer=last_gamma)(y)
  return keras.layers.ReLU()(keras.layers.Add()([shortcut, y]))


def stock_narrow_resnet(model: ModelConfig, weight_decay: float = 0.0,
                        features: tuple[str, ...] = ()) -> keras.Model:
  """The same topology from stock Keras layers, inputs scaled to 0..1, of
  `model`'s classes and image size; each of `features` (FEATURES) takes
  `model`'s setting instead (its conv init, zero-init gamma, BN momentum
  and epsilon, input normalisation).

  weight_decay: an L2 term of weight_decay / 2 * sum(w^2) per kernel.
  """
  unknown = set(features) - set(FEATURES)
  if unknown:
    raise ValueError(f"No stock-network features {sorted(unknown)}.")
  l2 = keras.regularizers.L2(weight_decay / 2) if weight_decay else None
  init = (resnet.conv_initializer(model.conv_init) if "conv_init" in features
          else "he_normal")
  bn = functools.partial(
      keras.layers.BatchNormalization,
      **({"momentum": model.bn_momentum, "epsilon": model.bn_epsilon}
         if "bn_settings" in features else STOCK_BN))
  last_gamma = ("zeros" if "zero_gamma" in features and model.zero_init_gamma
                else "ones")

  def conv(filters: int, kernel: int, strides: int, name: str):
    return keras.layers.Conv2D(filters, kernel, strides, padding="same",
                               use_bias=False, kernel_initializer=init,
                               kernel_regularizer=l2, name=name)

  size = model.image_size
  inputs = keras.Input((size, size, 3), name="images")
  x = (resnet.input_normalization(model.input_normalization)(inputs)
       if "normalization" in features else
       keras.layers.Rescaling(1 / 255)(inputs))
  x = conv(WIDTHS[0], 3, 1, name="stem_conv")(x)
  x = keras.layers.ReLU()(bn(name="stem_bn")(x))
  for stage, filters in enumerate(WIDTHS):
    for i in range(BLOCKS_PER_STAGE):
      x = _stock_block(x, filters, 2 if stage and not i else 1,
                       f"stage{stage + 1}_block{i + 1}", conv, bn, last_gamma)
  return keras.Model(inputs, _head(x, model.num_classes, l2),
                     name="stock_resnet10")
