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
from schedule import longest_first  # noqa: E402
from session_hooks import pytest_configure  # noqa: E402,F401
from session_hooks import pytest_unconfigure  # noqa: E402,F401

# 16 for the 4x4 replica grid of the 2-D gradient all-reduce tests; idle
# virtual devices cost no measurable test time.
NUM_VIRTUAL_CPUS = 16

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_VIRTUAL_CPUS)

# The suite's longest files, longest first (schedule.py): seconds measured
# on 2 cores, make test at c7fcfca: 317, 91, 72, 68, 56, 48, 47, 47, 46, 44.
LONGEST_FILES = ("test_demo_on_both_engines.py", "test_accelerator_check.py",
                 "test_flagfiles.py", "test_multi_worker_failure.py",
                 "test_float16.py", "test_reliability.py",
                 "test_multi_worker_faults.py", "test_input_pipeline.py",
                 "test_multi_worker.py", "test_doc_shell_blocks.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
  longest_first(items, LONGEST_FILES)


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
