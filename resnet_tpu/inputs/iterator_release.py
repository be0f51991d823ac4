"""tf.data iterators dropped beside the run, never on its critical path.

Deleting a tf.data iterator in TensorFlow 2.21 waits for its autotune
thread's next wake-up, whose period doubles up to 60 s; the wait is idle
(0 % CPU, the GIL released). An iterator that had run a few seconds took 5
to 137 s to delete on 8 CPU replicas (issue 38; lab/bench_eval.py). Both
engines hand their finished iterators to `release`: TensorFlow's
distributed ones (engines/tensorflow/iterators.py) and JAX's host pipelines
(engines/jax/host_batches.py).

The thread is not a daemon: one inside TensorFlow's C++ when the
interpreter shuts down aborts the process (seen as exit -6 on loopback
workers), so a process waits for it at exit; main.py skips that wait where
it runs alone (process_setup.exit_skipping_teardown).
"""
import threading

THREAD_NAME = "release_input_iterators"


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
                     name=THREAD_NAME).start()
