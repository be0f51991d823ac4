"""What one host loop (or one evaluation) reports, on either engine.

TensorFlow's loops return tensors of sums (host_loops.py), JAX's trainer
numpy sums (engines/jax/engine.py); both become a LoopResult, which
loop_report.py turns into the log line and the metrics record.
"""
import dataclasses

import numpy as np


@dataclasses.dataclass
class LoopResult:
  """The sums of one host loop (or one eval) as the logged metrics."""
  loss: float
  top1: float
  top5: float
  examples: int
  unusable_examples: int = 0
  lost_records: int = 0
  nonfinite_steps: int = 0
  first_nonfinite: int = -1  # index of the first non-finite step in the loop
  by_source: tuple[int, ...] = ()  # faults per source (shard_audit.py)

  @classmethod
  def of(cls, sums) -> "LoopResult":
    """The result of TensorFlow's StepSums or LoopSums (host_loops.py);
    blocks until the loop that computed `sums` is done."""
    if hasattr(sums, "nonfinite_steps"):  # a LoopSums
      counts = (int(sums.nonfinite_steps), int(sums.first_nonfinite))
      sums = sums.steps
    else:
      counts = (0, -1)
    n = max(float(sums.examples), 1.0)
    count = lambda v: int(round(float(v)))
    return cls(float(sums.loss) / n, float(sums.top1) / n,
               float(sums.top5) / n, count(sums.examples),
               count(sums.unusable), count(sums.lost), *counts,
               tuple(count(v) for v in np.asarray(sums.by_source)))
