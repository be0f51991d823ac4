"""Every kind of communication in one training step, counted (issue: "a
check counts every kind of the thing it claims about").

A step under MirroredStrategy communicates only through its collectives:
one packed gradient all-reduce per replica (Ying et al. §3.3) and two BN
group sums per layer (§3.1). The BN moving statistics and the optimizer's
step counter are replica-local, so no variable is copied between devices
(their ON_WRITE "only_first_replica" form copied replica 0's value to every
device, per variable and step). The host loop adds one all-reduce per
replica for the moving statistics (moving_statistics.py) and the reduction
of its metric sums. tests/test_tpu_build.py counts the same for a TPU step,
tests/test_multi_worker.py for loopback workers.
"""
import re

import pytest
import tensorflow as tf

from collective_helpers import communication_ops
from collective_helpers import COMMUNICATION_OP
from collective_helpers import cross_device_inputs
from collective_helpers import op_counts
from conftest import cpu_strategy
import multi_worker_train as worker
from resnet_tpu.engines.tensorflow.engine import TensorFlowEngine

REPLICAS = 4
BN_GROUP = 2
BN_LAYERS = 20  # ResNet-18
# Ops that move data between replicas, devices or hosts, in either build.
COMMUNICATING = (
    "AllToAll", "CollectiveAllToAllV2", "CollectiveAllToAllV3",
    "CollectiveAssignGroupV2", "CollectiveBcastRecv", "CollectiveBcastRecvV2",
    "CollectiveBcastSend", "CollectiveBcastSendV2", "CollectiveGather",
    "CollectiveGatherV2", "CollectiveInitializeCommunicator",
    "CollectivePermute", "CollectiveReduce", "CollectiveReduceScatterV2",
    "CollectiveReduceV2", "CollectiveReduceV3", "CrossReplicaSum",
    "NcclAllReduce", "NcclBroadcast", "NcclReduce", "Recv",
    "RecvTPUEmbeddingActivations", "Send", "SendTPUEmbeddingGradients")
# Not communication, though their names look alike.
LOOK_ALIKES = ("All", "Any", "BroadcastTo", "BroadcastArgs", "GatherV2",
               "ResourceGather", "ScatterNd", "ResourceScatterAdd",
               "TensorListGather", "DataFormatVecPermute", "AddN",
               "TPUEmbeddingActivations")


def test_the_census_names_every_communicating_op_of_this_build():
  matched = {name for name in dir(tf.raw_ops) if COMMUNICATION_OP.search(name)}
  assert matched <= set(COMMUNICATING), sorted(matched - set(COMMUNICATING))
  for name in COMMUNICATING + ("_Send", "_Recv", "_HostSend", "_HostRecv",
                               "XlaAllReduce", "XlaReduceScatter", "XlaSend",
                               "XlaRecv"):
    assert COMMUNICATION_OP.search(name), name
  for name in LOOK_ALIKES:
    assert not COMMUNICATION_OP.search(name), name
  # Every op whose name says it communicates is matched.
  says = re.compile(r"Collective|AllToAll|AllReduce|CrossReplica|Nccl")
  assert {n for n in dir(tf.raw_ops) if says.search(n)} <= matched


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
  """A 4-replica ResNet-18 trainer with BN groups of 2, its step and its
  host loop traced on one batch."""
  strategy = cpu_strategy(REPLICAS)
  trainer = TensorFlowEngine(
      worker.config(str(tmp_path_factory.mktemp("census"))), strategy)
  dataset = strategy.distribute_datasets_from_function(
      worker.replica_slices_dataset_fn)
  batch = next(iter(dataset))
  step = tf.function(
      lambda b: strategy.run(trainer.replica_step.train, args=b))
  loop = trainer.loops.train.get_concrete_function(iter(dataset),
                                                   tf.constant(1))
  return trainer, step, batch, loop.graph.as_graph_def()


def test_a_mirrored_step_communicates_only_through_its_collectives(traced):
  trainer, step, batch, _ = traced
  assert len(trainer.model.trainable_variables) == 62
  graph = step.get_concrete_function(batch).graph.as_graph_def()
  per_replica_sums = 1 + 2 * BN_LAYERS
  assert communication_ops(graph) == {
      "CollectiveReduceV2": REPLICAS * per_replica_sums}
  counts = op_counts(step, batch)
  # Keras packs every gradient into one all-reduce over the 4 replicas; the
  # BN layers' sums run over groups of 2 with the project's group keys.
  assert counts[("group", REPLICAS)] == REPLICAS
  assert counts[("group", BN_GROUP)] == counts[("ours", BN_GROUP)] == (
      REPLICAS * 2 * BN_LAYERS)
  assert cross_device_inputs(graph) == {}


def test_a_host_loop_adds_the_statistics_average_and_its_metric_sums(traced):
  _, step, batch, loop = traced
  in_step = communication_ops(
      step.get_concrete_function(batch).graph.as_graph_def())
  # One all-reduce per replica averages the moving statistics at the end.
  assert communication_ops(loop) == {
      "CollectiveReduceV2": in_step["CollectiveReduceV2"] + REPLICAS}
  # The loop's metric sums (StepSums.packed: one short vector a step) are
  # reduced onto the first device: one input from each other replica.
  assert cross_device_inputs(loop) == {"AddN": REPLICAS - 1}
