"""Distributed input iterators that never stall the run when they go away.

Under MirroredStrategy each iterator holds one tf.data iterator per device,
each with its own autotune thread (the per-device datasets of
MultiDeviceIterator have default options). Deleting one in TensorFlow 2.21
waits, per device, for that thread's next wake-up: its period doubles up
to 60 s, and the wait is idle (0 % CPU, the GIL released). On 8 CPU
replicas deleting an iterator that had run a few seconds took 5 to 137 s
(issue 38; lab/bench_eval.py measures it). With autotune off in per-replica
datasets the same deletion takes 0.01 s, which confirms the cause, but the
default placement gives no way to turn it off. So:

- evaluations read one long-lived iterator over the eval set repeated
  (`EvalInput`), never a new one per evaluation;
- an iterator that is done is handed to a thread that drops it
  (`release`): the wait happens there, beside the run. The thread is not a
  daemon: one inside TensorFlow's C++ when the interpreter shuts down
  aborts the process (seen as exit -6 on loopback workers), so a process
  waits for it at exit; main.py skips that wait where it runs alone
  (process_setup.exit_skipping_teardown).
"""
import threading
from typing import Iterator

import tensorflow as tf

from resnet_tpu.inputs.input_pipeline import DatasetFn


def release(owned: list) -> None:
  """Empties `owned` and drops its items on a thread of their own.

  The list must hold the only references left (the caller `del`s its own
  names first), so that the thread deletes them, whichever of the two
  threads runs first.
  """
  kept = [item for item in owned if item is not None]
  owned.clear()
  if kept:
    threading.Thread(target=kept.clear, daemon=False,
                     name="release_input_iterators").start()


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
