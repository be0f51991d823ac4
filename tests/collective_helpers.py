"""Helpers of the collective tests: per-replica values and op counts."""
import collections
import re

import numpy as np
import tensorflow as tf

from resnet_tpu.parallel.replica_groups import GROUP_KEY_BASE

# Every raw collective in these tests fails after this long instead of
# hanging on a key mismatch.
TIMEOUT_S = 60.0


def per_replica(strategy, values) -> np.ndarray:
  """The replicas' values stacked in replica order."""
  return np.stack([v.numpy() for v in
                   strategy.experimental_local_results(values)])


def op_counts(function, *args) -> collections.Counter:
  """Op types of a traced step; ("group", n) counts n-replica reduces and
  ("ours", n) those with our group keys (not tf.distribute's)."""
  graph = function.get_concrete_function(*args).graph
  counts = collections.Counter(op.type for op in graph.get_operations())
  for op in graph.get_operations():
    if op.type == "CollectiveReduceV2":
      size, key = (int(tf.get_static_value(t)) for t in op.inputs[1:3])
      counts[("group", size)] += 1
      counts[("ours", size)] += key >= GROUP_KEY_BASE
  return counts


# Every op that moves data between replicas, hosts or devices, by type name:
# tf.distribute's and the raw collectives, the TPU ones (CrossReplicaSum,
# AllToAll, CollectivePermute), XLA's, NCCL's, Send/Recv and the TPU
# embedding transfers. test_collective_census.py pins what it matches
# among tf.raw_ops, so a new kind cannot slip past the counts.
COMMUNICATION_OP = re.compile(
    r"Collective|CrossReplica|AllToAll|AllReduce|AllGather|ReduceScatter|"
    r"Nccl|^_?(Host)?(Send|Recv)$|^Xla(Send|Recv)|"
    r"^(Send|Recv)TPUEmbedding")


def graph_nodes(graph_def: tf.compat.v1.GraphDef):
  """(function name or "", NodeDef) of every node of `graph_def`, those of
  its function library (loop bodies, cond branches) included."""
  for node in graph_def.node:
    yield "", node
  for function in graph_def.library.function:
    for node in function.node_def:
      yield function.signature.name, node


def communication_ops(graph_def: tf.compat.v1.GraphDef
                      ) -> collections.Counter:
  """How many ops of each communicating type `graph_def` holds, anywhere."""
  return collections.Counter(node.op for _, node in graph_nodes(graph_def)
                             if COMMUNICATION_OP.search(node.op))


def cross_device_inputs(graph_def: tf.compat.v1.GraphDef
                        ) -> collections.Counter:
  """Inputs an op takes from an op placed on another device (a copy TF
  inserts between devices), by the consuming op's type. Constants do not
  count: the graph optimizer places a copy of each on every device."""
  found = collections.Counter()
  functions = [graph_def.node] + [f.node_def
                                  for f in graph_def.library.function]
  for nodes in functions:
    device = {n.name: _canonical(n.device) for n in nodes if n.op != "Const"}
    for node in nodes:
      for name in node.input:
        source = device.get(name.lstrip("^").split(":")[0])
        here = _canonical(node.device)
        if source and here and source != here:
          found[node.op] += 1
  return found


def _canonical(device: str) -> str:
  return tf.DeviceSpec.from_string(device).to_string() if device else ""
