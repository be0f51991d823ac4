"""A TPUStrategy over a simulated slice, for tracing without a TPU.

TPUStrategy asks its cluster resolver for the slice's system metadata and
nothing else while a step is traced in graph mode; this resolver answers
with a simulated topology (simulated_slices.py), so the replica
step is built exactly as TPUStrategy builds it (tpu.replicate: the
TPUReplicateMetadata, TPUReplicatedInput/Output and CrossReplicaSum ops),
on any host and either TensorFlow build. Nothing runs: no op has a device.
"""
import collections

import numpy as np
import tensorflow as tf

from resnet_tpu.parallel import tpu_layout
from resnet_tpu.runtime import compat
from simulated_slices import simulated_topology


class SimulatedSliceResolver(tf.distribute.cluster_resolver.TPUClusterResolver):
  """The cluster resolver of a simulated slice such as "v3-8"."""

  def __init__(self, slice_name: str):
    super().__init__(tpu="local")
    self.slice_topology = simulated_topology(slice_name)

  def get_tpu_system_metadata(self):
    topology = self.slice_topology
    hosts, per_host = topology.num_tasks, topology.num_tpus_per_task
    devices = [tf.config.LogicalDevice(
        f"/job:worker/replica:0/task:{t}/device:TPU:{c}", "TPU")
               for t in range(hosts) for c in range(per_host)]
    return compat.tpu_system_metadata(topology, devices)


def tpu_strategy(slice_name: str, bn_group_size: int):
  """TPUStrategy on the simulated slice with the placement and BN tiles
  strategy.py gives it; returns (strategy, layout)."""
  resolver = SimulatedSliceResolver(slice_name)
  layout = tpu_layout.slice_layout(resolver.slice_topology, bn_group_size)
  assignment = tpu_layout.device_assignment(resolver.slice_topology, layout)
  return tf.distribute.TPUStrategy(
      resolver, experimental_device_assignment=assignment), layout


def cross_replica_sums(graph: tf.Graph) -> collections.Counter:
  """How many CrossReplicaSum ops sum over each group assignment (a tuple
  of tuples of replica ids) in `graph`."""
  found = collections.Counter()
  for op in graph.get_operations():
    if op.type == "CrossReplicaSum":
      groups = tf.make_ndarray(op.inputs[1].op.get_attr("value"))
      found[tuple(map(tuple, np.asarray(groups).tolist()))] += 1
  return found
