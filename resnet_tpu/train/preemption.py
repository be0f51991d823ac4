"""Preemption-safe training: SIGTERM ends the run at a host-loop boundary.

Ying et al. 2018 train on TPU pods for minutes to hours; Cloud TPU VMs and GCE
VMs are preempted or moved for maintenance with a SIGTERM and a short grace
period (30 s for GCE spot VMs). The trainer watches for SIGTERM, finishes the
host loop in flight (so keep steps_per_loop x step time well under the grace
period), writes a checkpoint and stops with `Preempted`; main.py turns that
into exit code 42 so a supervisor restarts the same command, which resumes.

Why not tf.distribute.experimental.PreemptionCheckpointHandler: in TF 2.21 it
is a documented no-op on GCP CPU and TPU VMs (failure_handling.py logs "does
not support usage with TPU or CPU device on GCP" and its `run` just calls the
step), it probes the GCE metadata server over the network at start-up, and
its run counter assumes one step per call rather than a host loop. A handler
that sets a flag, checked between host loops and agreed across workers with
one scalar all-reduce, works on every strategy this project uses.
"""
import signal
import threading

from absl import logging

# The restart code TF itself uses for TPU and Borg preemption
# (failure_handling_util.default_tpu_exit_fn, BorgTerminationConfig).
PREEMPTED_EXIT_CODE = 42
# A peer worker died or stopped answering: restart every worker.
WORKER_LOST_EXIT_CODE = 43


class Restartable(Exception):
  """Training stopped cleanly; rerunning the same command resumes it."""
  exit_code = 1


class Preempted(Restartable):
  """SIGTERM was received and a checkpoint was written."""
  exit_code = PREEMPTED_EXIT_CODE

  @classmethod
  def saved(cls, step: int, total: int, path: str) -> "Preempted":
    """The stop of either engine's trainer after saving `path`."""
    return cls(f"Preempted (SIGTERM) at step {step}/{total}: saved {path}. "
               "Run the same command again to resume; exit code "
               f"{PREEMPTED_EXIT_CODE}.")


class WorkerLost(Restartable):
  """A collective failed because another worker died or timed out."""
  exit_code = WORKER_LOST_EXIT_CODE

  @classmethod
  def after(cls, step: int, cause: str, latest: str | None) -> "WorkerLost":
    """The stop of either engine's trainer when a collective failed after
    `step`; `cause` names the error, `latest` the checkpoint to resume."""
    return cls(f"Lost contact with another worker after step {step} "
               f"({cause}). Restart every worker with the same flags to "
               f"resume from {latest or 'the start (no checkpoint yet)'}.")


class SigtermWatcher:
  """Records SIGTERM while active; restores the previous handler on exit.

  Use as a context manager around the training loop, in the main thread
  (Python delivers signals there only).
  """

  def __init__(self):
    self._received = threading.Event()
    self._previous = None

  def __enter__(self) -> "SigtermWatcher":
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    else:
      logging.warning("Training outside the main thread: SIGTERM is not "
                      "watched, a preemption loses the steps since the last "
                      "checkpoint.")
    return self

  def __exit__(self, exc_type, *exc_info) -> None:
    if self._previous is None:
      return
    signal.signal(signal.SIGTERM, self._previous)
    # A SIGTERM that stopped no run (it came in the last host loop or the
    # final eval: the run finished) goes on to a Python handler it
    # displaced, e.g. lab/study.py's, which stops the runs after this one.
    # The default disposition gets nothing: the finished run exits 0.
    if self.received and exc_type is None and callable(self._previous):
      self._previous(signal.SIGTERM, None)

  def _handle(self, signum, frame) -> None:
    del signum, frame
    logging.warning("SIGTERM received: finishing this host loop, then "
                    "checkpointing and exiting with code %d.",
                    PREEMPTED_EXIT_CODE)
    self._received.set()

  @property
  def received(self) -> bool:
    """Whether this process got SIGTERM."""
    return self._received.is_set()
