"""Distributed input iterators that never stall the run when they go away.

Under MirroredStrategy each iterator holds one tf.data iterator per device,
each with its own autotune thread (the per-device datasets of
MultiDeviceIterator have default options). Deleting one waits, per device,
for that thread's next wake-up (inputs/iterator_release.py): on 8 CPU
replicas, 5 to 137 s (issue 38; lab/bench_eval.py). With autotune off in
per-replica datasets the same deletion takes 0.01 s, which confirms the
cause, but the default placement gives no way to turn it off. So:

- evaluations read one long-lived iterator over the eval set repeated
  (`EvalInput`), never a new one per evaluation;
- an iterator that is done is handed to a thread that drops it
  (iterator_release.release): the wait happens there, beside the run.
"""
from typing import Iterator

import tensorflow as tf

from resnet_tpu.inputs.input_pipeline import DatasetFn
from resnet_tpu.inputs.iterator_release import release


class EvalInput:
  """One iterator over an eval dataset repeated: each evaluation reads the
  next `eval_steps` steps, the same batches per replica in the same order
  each time, with no new iterator (and no teardown) per evaluation.

  The dataset must yield at least `eval_steps` batches per replica (a
  shorter one of known length is refused: it would wrap into the next
  pass).
  """

  def __init__(self, strategy: tf.distribute.Strategy,
               dataset_fn: DatasetFn, eval_steps: int):
    self.dataset_fn, self.eval_steps = dataset_fn, eval_steps

    def repeated(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
      # A pipeline yields one batch per replica it feeds, each step.
      batches = eval_steps * (ctx.num_replicas_in_sync //
                              ctx.num_input_pipelines)
      dataset = dataset_fn(ctx)
      known = int(dataset.cardinality())
      if 0 <= known < batches:
        raise ValueError(
            f"The eval dataset has {known} batches per input pipeline; "
            f"eval_steps={eval_steps} reads {batches} (pad it, as "
            "input_pipeline.eval_dataset_fn does, or lower eval_steps).")
      return dataset.take(batches).repeat()

    self.iterator: Iterator | None = iter(
        strategy.distribute_datasets_from_function(repeated))

  def serves(self, dataset_fn: DatasetFn, eval_steps: int) -> bool:
    return (dataset_fn, eval_steps) == (self.dataset_fn, self.eval_steps)

  def close(self) -> None:
    """Releases the iterator (in the background)."""
    owned = [self.iterator]
    self.iterator = None
    release(owned)
