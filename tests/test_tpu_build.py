"""The TPU build (tensorflow-tpu 2.19.1, requirements/tpu-vm-tensorflow.txt) against the
stock build: each told apart, each refused or accepted as it must be, and
the TPU-only paths traced with the build's own ops.

This file runs in both suites: `make test` (stock TensorFlow 2.21) and
`make test-tpu-build` (the real TPU wheel, libtpu not loaded, no network).
Each test asserts what its build must do, so neither suite passes by
skipping the other's half.
"""
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from resnet_tpu.parallel.tensorflow import bn_all_reduce
from resnet_tpu.runtime import device_check
from resnet_tpu.parallel.tensorflow import strategy as strategy_lib
from resnet_tpu.config import ConfigError
from resnet_tpu.config import TrainConfig
from resnet_tpu.engines.tensorflow.engine import TensorFlowEngine
import simulated_tpu
from collective_helpers import communication_ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _installed(distribution: str) -> bool:
  try:
    importlib.metadata.version(distribution)
    return True
  except importlib.metadata.PackageNotFoundError:
    return False


TPU_BUILD = _installed("tensorflow-tpu")


def test_the_tpu_build_is_told_apart_by_a_kernel_only_it_registers():
  assert device_check.is_tpu_build() == TPU_BUILD
  if TPU_BUILD:
    device_check.require_tpu_support()  # accepted
    assert "tensorflow-tpu 2.19.1" in device_check.installed_tensorflow()
  else:
    with pytest.raises(ConfigError, match="pip install -r requirements/tpu-vm-tensorflow.txt"):
      device_check.require_tpu_support()


def _no_tpu_run(*command: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
  env.pop("TPU_ACCELERATOR_TYPE", None)
  return subprocess.run([sys.executable, *command], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", [
    ("main.py", "--use_synthetic_data", "--train_steps=1"),
    ("-m", "tools.accelerator_check")])
def test_tpu_local_without_a_tpu_stops_within_a_minute_saying_why(
    tmp_path, command):
  start = time.time()
  out = tmp_path / "out"
  where = (f"--model_dir={out}" if command[0] == "main.py"
           else f"--output={out}")
  done = _no_tpu_run(*command, "--tpu=local", where)
  assert done.returncode == 1, done.stderr[-3000:]
  assert time.time() - start < 60
  assert "Traceback" not in done.stderr
  assert not out.exists()  # nothing started, nothing written
  if TPU_BUILD:
    assert "no TPU was found" in done.stderr
    assert "TPU_SYSTEM device of TPUClusterResolver(tpu='local')" in (
        done.stderr)
  else:
    assert "no TPU support" in done.stderr
    assert "pip install -r requirements/tpu-vm-tensorflow.txt" in done.stderr


def test_a_tpu_named_for_the_cloud_tpu_api_needs_its_client_packages():
  """A pod slice by name goes through the Cloud TPU API client; 'local' and
  grpc:// addresses do not (tensorflow/python/tpu/client/client.py)."""
  strategy_lib.require_cloud_tpu_api("local")
  strategy_lib.require_cloud_tpu_api("grpc://10.0.0.2:8470")
  missing = [m for m in strategy_lib.CLOUD_TPU_API_MODULES
             if importlib.util.find_spec(m) is None]
  assert missing  # neither test build installs requirements/tpu-pod.txt
  with pytest.raises(ConfigError, match="requirements/tpu-pod.txt"):
    strategy_lib.require_cloud_tpu_api("my-v3-32")


def _lower_for_tpu(fn, *args) -> str:
  """The HLO of `fn` as TensorFlow lowers it for a TPU's XLA device."""
  return tf.function(fn, jit_compile=True).experimental_get_compiler_ir(
      *args)(stage="hlo", platform_name="TPU")


def test_grouped_bn_sums_lower_to_tpu_all_reduces_over_the_bn_tiles():
  """Ying et al. §3.1 on the TPU build's own XLA front end: CrossReplicaSum
  forward and its gradient, each one all-reduce over the BN tiles."""
  _, layout = simulated_tpu.tpu_strategy("v3-32", 4)
  groups = layout.group_assignment

  def group_sum_and_gradient(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = bn_all_reduce.tpu_group_all_reduce(x, groups)
      loss = tf.reduce_sum(y * tf.range(8, dtype=tf.float32))
    return y, tape.gradient(loss, x)

  x = tf.ones([8])
  if not TPU_BUILD:
    with pytest.raises(ValueError, match="CrossReplicaSum.*XLA_TPU_JIT"):
      _lower_for_tpu(group_sum_and_gradient, x)
    return
  hlo = _lower_for_tpu(group_sum_and_gradient, x)
  tiles = "{" + ",".join("{" + ",".join(map(str, g)) + "}"
                         for g in groups) + "}"
  all_reduces = re.findall(r"all-reduce\(.*replica_groups=(\{[^ ]*\}),", hlo)
  assert len(groups) == 8 and all_reduces == [tiles, tiles]


def _traced_step(model_dir: str, slice_name: str, depth: int,
                 bn_group_size: int):
  """The graph of one replica step as TPUStrategy builds it, the layout
  and the trainer (graph mode: variables need no TPU)."""
  strategy, layout = simulated_tpu.tpu_strategy(slice_name, bn_group_size)
  replicas = strategy.num_replicas_in_sync
  cfg = TrainConfig.tiny(
      model_dir, strategy="tpu", use_synthetic_data=True, resnet_depth=depth,
      global_batch_size=2 * replicas, bn_group_size=bn_group_size,
      precision="bfloat16", bfloat16_conv_kernels="native")
  with tf.Graph().as_default() as graph:
    trainer = TensorFlowEngine(cfg, strategy, bn_groups=layout.group_assignment)
    images = tf.compat.v1.placeholder(tf.float32, [2, 32, 32, 3])
    labels = tf.compat.v1.placeholder(tf.int32, [2])
    strategy.run(trainer.replica_step.train, args=(images, labels))
  return graph, layout, trainer


def _bn_layers(trainer) -> int:
  return sum(1 for v in trainer.model.non_trainable_variables
             if "moving_mean" in v.name)


@pytest.mark.parametrize("depth,trainable,bn_layers", [(18, 62, 20),
                                                       (50, 161, 53)])
def test_one_tpu_step_issues_only_the_collectives_the_references_do(
    tmp_path, depth, trainable, bn_layers):
  """Per step: one all-replica sum per gradient, which XLA combines (Ying
  et al. §3.3), and two group sums per BN layer (§3.1: forward statistics,
  backward sums), and no other op that communicates, of any kind. The
  moving statistics and the optimizer's step counter add none: each
  replica updates its own, as tensorflow/tpu's ResNet does (their
  ON_WRITE "only_first_replica" form added an AllToAll per variable)."""
  graph, layout, trainer = _traced_step(str(tmp_path), "v3-8", depth,
                                        bn_group_size=4)
  metadata = [op for op in graph.get_operations()
              if op.type == "TPUReplicateMetadata"]
  assert [op.get_attr("num_replicas") for op in metadata] == [8]
  assert len(trainer.model.trainable_variables) == trainable
  assert _bn_layers(trainer) == bn_layers
  assert communication_ops(graph.as_graph_def()) == {
      "CrossReplicaSum": trainable + 2 * bn_layers}
  every_replica = (tuple(range(8)),)
  tiles = tuple(map(tuple, layout.group_assignment))
  assert simulated_tpu.cross_replica_sums(graph) == {
      every_replica: trainable, tiles: 2 * bn_layers}


def test_a_tpu_host_loop_averages_the_moving_statistics_in_one_sum(
    tmp_path):
  """What the host loop adds after its steps (moving_statistics.py): one
  all-replica sum of every BN layer's mean and variance, nothing else."""
  strategy, _ = simulated_tpu.tpu_strategy("v3-8", 4)
  cfg = TrainConfig.tiny(
      str(tmp_path), strategy="tpu", use_synthetic_data=True,
      resnet_depth=18, global_batch_size=16, bn_group_size=4)
  with tf.Graph().as_default() as graph:
    trainer = TensorFlowEngine(cfg, strategy)
    strategy.run(trainer.replica_step.average_moving_statistics)
  assert communication_ops(graph.as_graph_def()) == {"CrossReplicaSum": 1}
  assert simulated_tpu.cross_replica_sums(graph) == {(tuple(range(8)),): 1}
  (summed,) = [op for op in graph.get_operations()
               if op.type == "CrossReplicaSum"]
  channels = sum(v.shape[0] for v in trainer.model.non_trainable_variables)
  assert summed.inputs[0].shape == [channels]
