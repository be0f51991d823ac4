"""Helpers of the collective tests: per-replica values and op counts."""
import collections

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
