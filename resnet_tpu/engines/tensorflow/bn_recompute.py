"""Batch normalization without moving averages (Akiba et al. 2017).

With huge batches and few steps per epoch the exponential moving averages of
BN lag far behind the weights. Akiba et al. instead recompute the population
statistics with the current weights just before evaluation: here, K training
batches run forward in training mode, every DistributedBatchNormalization
layer adds its per-channel sum, sum of squares and count to an accumulator
(one per replica, summed across all replicas on read), and the moving mean
and variance are set to the exact mean and (biased) variance over all K
batches of all replicas. No exponential average is involved.
"""
from typing import Iterator

import keras
import tensorflow as tf

from resnet_tpu.model.distributed_batch_norm import collect_statistics
from resnet_tpu.model.distributed_batch_norm import DistributedBatchNormalization
from resnet_tpu.model.batch_statistics import moments_from_sums


def bn_layers(model: keras.Model) -> list[DistributedBatchNormalization]:
  """The model's distributed BN layers (the ResNet builder keeps it flat)."""
  return [layer for layer in model.layers
          if isinstance(layer, DistributedBatchNormalization)]


class BNStatisticsRecomputer:
  """Recomputes every BN layer's population statistics from K batches."""

  def __init__(self, model: keras.Model, strategy: tf.distribute.Strategy):
    self.model = model
    self.strategy = strategy
    self.layers = bn_layers(model)
    with strategy.scope():
      self.accumulators = [
          tf.Variable(tf.zeros([2 * layer.moving_mean.shape[0] + 1]),
                      trainable=False,
                      synchronization=tf.VariableSynchronization.ON_READ,
                      aggregation=tf.VariableAggregation.SUM)
          for layer in self.layers]

  def _forward(self, images, labels):
    del labels
    self.model(images, training=True)

  @tf.function
  def _accumulate(self, iterator: Iterator, num_batches: tf.Tensor):
    # Traced (once) with the sinks in place, so the BN layers of this graph
    # feed the accumulators; the training step's graph is unaffected.
    with collect_statistics(self.layers, self.accumulators):
      for _ in tf.range(num_batches):
        self.strategy.run(self._forward, args=next(iterator))

  def recompute(self, iterator: Iterator, num_batches: int) -> None:
    """Sets moving mean/variance to the statistics of `num_batches` batches."""
    for acc in self.accumulators:
      acc.assign(tf.zeros_like(acc))
    self._accumulate(iterator, tf.constant(num_batches))
    for layer, acc in zip(self.layers, self.accumulators):
      mean, variance = moments_from_sums(acc.read_value())  # all replicas
      layer.moving_mean.assign(mean)
      layer.moving_variance.assign(variance)
