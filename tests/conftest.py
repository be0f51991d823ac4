"""Test session set-up: 16 virtual CPUs, configured before TF initialises.

Every test that needs N replicas builds MirroredStrategy over the first N of
these devices, so replica contexts and collectives run for real on CPU.
"""
import os

from resnet_tpu.runtime import process_setup

# Before TensorFlow loads. C++ errors stay visible (level 2): they explain a
# failing test. The models run on CPU devices: the kernels a CPU run gets.
os.environ.setdefault(process_setup.LOG_LEVEL_ENV, "2")
process_setup.apply_cpu_kernel_choice("auto", "cpu")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from resnet_tpu.runtime import compat  # noqa: E402

# 16 for the 4x4 replica grid of the 2-D gradient all-reduce tests; idle
# virtual devices cost no measurable test time.
NUM_VIRTUAL_CPUS = 16

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_VIRTUAL_CPUS)


def cpu_strategy(num_replicas: int) -> tf.distribute.MirroredStrategy:
  """MirroredStrategy over the first `num_replicas` virtual CPUs."""
  # Each strategy numbers its collectives from the same base key; shift it
  # (as TF's strategy_combinations does) so two strategies never collide.
  compat.shift_collective_keys(tf.distribute.MirroredStrategy, 100000)
  return tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(num_replicas)])


@pytest.fixture(autouse=True)
def separate_collective_keys():
  """Strategies a test builds itself (run() builds its own) number their
  collectives apart from those of earlier tests in the same process."""
  compat.shift_collective_keys(tf.distribute.MirroredStrategy, 100000)
