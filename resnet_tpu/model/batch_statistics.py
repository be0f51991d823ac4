"""Batch statistics as sums, so that a group of replicas adds them in one
all-reduce (Ying et al. 2018 §3.1); written in keras.ops for either engine."""
from typing import Sequence

import keras
from keras import ops


def local_sums(x, axes: Sequence[int]):
  """[per-channel sum, per-channel sum of squares, count] in float32 (in
  float64 for float64 inputs).

  Concatenated so the group all-reduce is ONE collective per BN layer.
  """
  x = ops.cast(x, keras.backend.result_type(x.dtype, "float32"))
  shape = ops.shape(x)
  count = 1
  for axis in axes:
    count = count * shape[axis]
  count = ops.reshape(ops.cast(count, x.dtype), (1,))
  return ops.concatenate([ops.sum(x, axes), ops.sum(ops.square(x), axes),
                          count], 0)


def moments_from_sums(sums):
  """Mean and biased variance from `local_sums` (possibly summed)."""
  channels = (sums.shape[0] - 1) // 2
  total, total_sq = sums[:channels], sums[channels:2 * channels]
  count = sums[2 * channels:]
  mean = total / count
  return mean, ops.maximum(total_sq / count - ops.square(mean), 0.0)
