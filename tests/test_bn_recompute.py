"""BN without moving averages (Akiba et al. 2017): exact recomputation."""
import keras
import numpy as np
import tensorflow as tf

from conftest import cpu_strategy
from resnet_tpu.engines.tensorflow.bn_recompute import BNStatisticsRecomputer
from resnet_tpu.model.distributed_batch_norm import DistributedBatchNormalization

REPLICAS = 4
PER_REPLICA = 3
BATCHES = 5
CHANNELS = 2


def test_recomputed_statistics_equal_numpy_over_k_batches_of_all_replicas():
  rng = np.random.RandomState(0)
  x = rng.randn(BATCHES * REPLICAS * PER_REPLICA, 3, 3, CHANNELS)
  x = (x * [1.0, 4.0] + [2.0, -3.0]).astype(np.float32)
  strategy = cpu_strategy(REPLICAS)
  with strategy.scope():
    inputs = keras.Input((3, 3, CHANNELS))
    first = DistributedBatchNormalization(group_size=2, momentum=0.99)
    second = DistributedBatchNormalization(group_size=1, momentum=0.99)
    model = keras.Model(inputs, second(keras.layers.Dense(CHANNELS)(
        first(inputs))))
    model.build((None, 3, 3, CHANNELS))
  dataset = tf.data.Dataset.from_tensor_slices(
      (x, np.zeros(len(x), np.int32))).batch(PER_REPLICA)
  iterator = iter(strategy.experimental_distribute_dataset(
      dataset.rebatch(REPLICAS * PER_REPLICA)))
  recomputer = BNStatisticsRecomputer(model, strategy)
  recomputer.recompute(iterator, BATCHES)
  np.testing.assert_allclose(first.moving_mean.numpy(),
                             x.mean(axis=(0, 1, 2)), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(first.moving_variance.numpy(),
                             x.var(axis=(0, 1, 2)), rtol=1e-4, atol=1e-4)
  # With momentum 0.99 an exponential average would still sit near its
  # initial (0, 1); every layer was recomputed, not just the first.
  assert not np.allclose(second.moving_variance.numpy(), 1.0, atol=1e-2)
