"""A stand-in for ResNet that keeps trainer tests and worker scripts fast.

Importable from test worker subprocesses (unlike conftest.py, which
configures virtual CPU devices at import).
"""
import keras

from resnet_tpu.config import TrainConfig
from resnet_tpu.model.distributed_batch_norm import DistributedBatchNormalization


def tiny_resnet(cfg: TrainConfig) -> keras.Model:
  """conv -> distributed BN -> relu -> pool -> dense: the trainer's contract
  (raw pixels in, float32 logits out, group BN) at a fraction of the cost."""
  inputs = keras.Input((cfg.model.image_size, cfg.model.image_size, 3))
  x = keras.layers.Rescaling(1 / 255)(inputs)
  x = keras.layers.Conv2D(8, 3, strides=2, use_bias=False)(x)
  x = DistributedBatchNormalization(
      group_size=cfg.model.bn_group_size,
      all_reduce=cfg.distribution.bn_all_reduce,
      collective_timeout_s=cfg.distribution.collective_timeout_s)(x)
  x = keras.layers.ReLU()(x)
  x = keras.layers.GlobalAveragePooling2D()(x)
  return keras.Model(inputs, keras.layers.Dense(cfg.model.num_classes)(x))
