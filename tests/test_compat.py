"""Every private TensorFlow/Keras API of resnet_tpu/runtime/compat.py still works.

One test per API, run on each supported TensorFlow (the TF 2.21 suite and
`make test-tpu-build` on tensorflow-tpu 2.19.1): an upgrade that moves or
changes one fails here, by name.
"""
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from collective_helpers import per_replica
from conftest import cpu_strategy
from resnet_tpu.runtime import compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_keras_sums_gradients_across_replicas_in_the_replaceable_method():
  strategy = cpu_strategy(2)
  with strategy.scope():
    variable = tf.Variable([1.0, 2.0])
    optimizer = keras.optimizers.SGD(1.0)
    optimizer.build([variable])
  calls = []

  def summation(grads_and_vars):
    calls.append(len(grads_and_vars))
    ctx = tf.distribute.get_replica_context()
    return [(ctx.all_reduce("sum", g), v) for g, v in grads_and_vars]

  compat.replace_gradient_summation(optimizer, summation)

  @tf.function
  def step():
    strategy.run(lambda: optimizer.apply_gradients(
        [(tf.constant([1.0, 1.0]), variable)]))

  step()
  assert calls  # Keras called our summation, not its own
  # Summed once over 2 replicas: 1 - 2 * 1.
  np.testing.assert_allclose(variable.numpy(), [-1.0, 0.0])


def test_replacing_the_summation_fails_by_name_without_the_method():
  with pytest.raises(ValueError, match=compat.KERAS_GRADIENT_SUMMATION):
    compat.replace_gradient_summation(object(), lambda pairs: pairs)


def test_strategy_supports_no_merge_call_answers_for_the_strategy_in_scope():
  # The default strategy needs no merge_call; MirroredStrategy synchronises
  # through it (engines/tensorflow/step.py takes the merge_call branch there).
  assert compat.strategy_supports_no_merge_call() is True
  with cpu_strategy(2).scope():
    assert compat.strategy_supports_no_merge_call() is False


def test_shift_collective_keys_moves_the_mirrored_strategy_key_base():
  before = tf.distribute.MirroredStrategy._collective_key_base  # pylint: disable=protected-access
  compat.shift_collective_keys(tf.distribute.MirroredStrategy, 7)
  assert tf.distribute.MirroredStrategy._collective_key_base == before + 7  # pylint: disable=protected-access


@pytest.mark.parametrize("op", ["sum", "all_to_all", "gather"])
def test_raw_v2_collectives_run_among_a_subgroup(op):
  strategy = cpu_strategy(4)
  devices = strategy.extended.worker_devices
  x = np.arange(8, dtype=np.float32).reshape(4, 2)
  ops = {"sum": compat.collective_sum,
         "all_to_all": compat.collective_all_to_all,
         "gather": compat.collective_gather}
  collective = ops[op]
  # Keys of their own per op: an instance key is bound to one op type.
  key_base = (1 << 29) + 16 * list(ops).index(op)

  @tf.function
  def step():
    def replica_fn():
      ctx = tf.distribute.get_replica_context()
      r = int(tf.get_static_value(ctx.replica_id_in_sync_group))
      with tf.device(devices[r]):
        return collective(
            tf.constant(x[r]), group_size=2, group_key=key_base + r // 2,
            instance_key=1, ordering_token=compat.ordering_token(
                devices[r], "compat_test"), timeout_seconds=30.0)
    return strategy.run(replica_fn)

  got = per_replica(strategy, step())
  pairs = x.reshape(2, 2, 2)  # [group, member, values]
  if op == "sum":
    want = np.repeat(pairs.sum(axis=1), 2, axis=0)
  elif op == "gather":
    want = np.repeat(pairs.reshape(2, 4), 2, axis=0)
  else:  # member i gets element i of each member's vector
    want = pairs.transpose(0, 2, 1).reshape(4, 2)
  np.testing.assert_array_equal(got, want)


def test_onednn_enabled_follows_tensorflows_switch():
  code = ("import tensorflow as tf; from resnet_tpu.runtime import compat; "
          "print(compat.onednn_enabled())")
  answers = {}
  for value in ("0", "1"):
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=value,
               TF_CPP_MIN_LOG_LEVEL="3")
    answers[value] = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=120, check=True).stdout.split()[-1]
  assert answers == {"0": "False", "1": "True"}


def test_has_kernel_reads_the_kernel_registry():
  assert compat.has_kernel("CollectiveReduceV2", "CPU")
  assert not compat.has_kernel("CollectiveReduceV2", "TPU")
  # The public op has no kernel in any build: the TPU rewrite replaces it
  # (device_check.py tells the builds apart by the one it puts there).
  assert not compat.has_kernel("ConfigureDistributedTPU")


def test_keras_batch_norm_still_takes_its_statistics_from_moments():
  """DistributedBatchNormalization overrides the private `_moments` (its
  non-fused path, bn_recompute.py): Keras must still call it in training."""
  calls = []

  class Recording(keras.layers.BatchNormalization):

    def _moments(self, inputs, mask):
      calls.append(inputs.shape)
      return super()._moments(inputs, mask)

  layer = Recording()
  layer(tf.ones([2, 3]), training=True)
  assert calls == [(2, 3)]


def test_tpu_system_metadata_is_what_tpu_strategy_reads():
  """A TPUStrategy builds over a resolver answering with it, no TPU needed."""
  from simulated_slices import simulated_topology  # pylint: disable=g-import-not-at-top
  topology = simulated_topology("v3-8")
  devices = [tf.config.LogicalDevice(f"/job:worker/replica:0/task:0/"
                                     f"device:TPU:{i}", "TPU")
             for i in range(8)]
  metadata = compat.tpu_system_metadata(topology, devices)
  assert (metadata.num_cores, metadata.num_hosts,
          metadata.num_of_cores_per_host) == (8, 1, 8)
  assert metadata.topology is topology and len(metadata.devices) == 8


def test_dataset_graph_holds_the_pipelines_ops_and_functions():
  dataset = tf.data.Dataset.range(4).map(lambda x: x * 2).batch(2)
  graph = compat.dataset_graph(dataset)
  ops = {node.op for node in graph.node}
  assert {"RangeDataset", "MapDataset", "BatchDatasetV2"} <= ops
  assert any(node.op == "Mul" for f in graph.library.function
             for node in f.node_def)


@pytest.mark.parametrize("dtype", [tf.uint8, tf.float32, tf.bfloat16])
def test_tensor_buffer_shares_the_tensors_memory(dtype):
  tensor = tf.cast(tf.reshape(tf.range(24), [2, 4, 3]), dtype) + 1
  array = compat.tensor_buffer(tensor)
  assert array.dtype == dtype.as_numpy_dtype and not array.flags.owndata
  np.testing.assert_array_equal(array, tensor.numpy())
  if dtype != tf.bfloat16:  # the buffer protocol refuses bfloat16
    address = array.__array_interface__["data"][0]
    assert address == np.asarray(memoryview(tensor)).__array_interface__[
        "data"][0]


def test_restore_trace_check_puts_back_what_jaxlib_replaced():
  # pylint: disable=g-direct-tensorflow-import,g-import-not-at-top
  from tensorflow.python.profiler import trace
  from tensorflow.python.profiler.internal import _pywrap_traceme
  original = trace.enabled
  compat.restore_trace_check()  # intact: left as it is
  assert trace.enabled is original
  trace.enabled = True  # what jaxlib 0.6.2's profiler hooks write
  try:
    if hasattr(_pywrap_traceme, "traceme_enabled"):  # TF 2.21: a function
      with pytest.raises(TypeError, match="not callable"):
        tf.constant([1.0])
      compat.restore_trace_check()
      assert trace.enabled is _pywrap_traceme.traceme_enabled
    else:  # TF 2.19 (the TPU build): a bool the hooks keep
      assert original is False
      compat.restore_trace_check()
      assert trace.enabled is True
    assert float(tf.reduce_sum(tf.constant([1.0, 2.0]))) == 3.0
  finally:
    trace.enabled = original
