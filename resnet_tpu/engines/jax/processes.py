"""The processes of a multi-host JAX run: one per host (jax.distributed).

Each process drives its own devices and feeds them its share of every
global batch; the step's collectives span all of them (engines/jax/step.py).
What TensorFlow's MultiWorkerMirroredStrategy agrees with small all-reduces
(parallel/tensorflow/strategy.any_worker for SIGTERM and the checkpoint clock,
tf_files.check_workers_agree), a JAX run agrees here, with one
allgather of a few integers across the processes, as big_vision and flax
do with jax.experimental.multihost_utils. With one process nothing is
exchanged.

A process that dies breaks the collective its peers are in (gloo and NCCL
report the lost connection): lost_peer recognises the error and the trainer
stops with exit 43 (preemption.WorkerLost), as TensorFlow's workers do. One
that hangs while alive is caught by the trainer's watchdog
(--collective_timeout_s, engines/jax/watchdog.py), or else by jax.distributed's
heartbeat timeout, which aborts the other processes with JAX's own message.
"""
import inspect
from typing import Mapping, Sequence

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np

from resnet_tpu.config import ConfigError
from resnet_tpu.config import DistributionConfig

# How long process 0 waits for the others to join, and they for it.
START_TIMEOUT_S = 300
# jax.distributed's default: a process silent this long is dead, and the
# coordination service aborts every other process (JAX's message, exit 134).
HEARTBEAT_TIMEOUT_S = 100
# With --collective_timeout_s the trainer's watchdog (engines/jax/watchdog.py)
# comes first, by this much: it names the checkpoint and exits 43.
_WATCHDOG_FIRST_S = 60
# How a collective fails when another process died or stopped answering:
# gloo (CPU) and NCCL (GPU) name themselves and the broken connection; the
# coordination service and the TPU runtime answer with these status codes.
_PEER_CODES = ("UNAVAILABLE:", "ABORTED:", "DEADLINE_EXCEEDED:",
               "CANCELLED:")
_PEER_WORDS = ("Gloo", "NCCL", "Connection reset", "Connection refused",
               "heartbeat")


def start(dist: DistributionConfig,
          timeout_s: int = START_TIMEOUT_S) -> None:
  """jax.distributed.initialize from --coordinator_address, --num_processes
  and --process_id (config/engine_limits.py), or, all unset, from JAX's
  cluster detection (Cloud TPU, SLURM, Open MPI, Kubernetes). Call before
  JAX starts its devices."""
  given = dist.num_processes > 0
  heartbeat = heartbeat_argument(
      heartbeat_timeout_s(dist.collective_timeout_s),
      dist.collective_timeout_s)
  try:
    jax.distributed.initialize(
        dist.coordinator_address or None,
        dist.num_processes if given else None,
        dist.process_id if given else None,
        # Flags given: no look for a cluster (Cloud TPU's asks a server).
        cluster_detection_method="deactivate" if given else None,
        initialization_timeout=timeout_s,
        **heartbeat)
  except (RuntimeError, ValueError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    raise ConfigError(
        "--strategy=multi_worker on JAX could not start its processes "
        f"(jax.distributed.initialize: {type(e).__name__}: {first}). Give "
        "every host --coordinator_address=HOST:PORT (process 0's), "
        "--num_processes and its own --process_id, or run where JAX "
        "detects the cluster (a Cloud TPU slice, SLURM, Open MPI).") from e
  logging.info("JAX process %d of %d (jax.distributed)", jax.process_index(),
               jax.process_count())


def heartbeat_timeout_s(collective_timeout_s: float) -> int:
  """jax.distributed's heartbeat timeout: its default, or above
  --collective_timeout_s so that the watchdog's exit 43 comes first."""
  return int(max(HEARTBEAT_TIMEOUT_S,
                 collective_timeout_s + _WATCHDOG_FIRST_S))


def heartbeat_argument(timeout_s: int, collective_timeout_s: float,
                       parameters: Mapping[str, object] | None = None
                       ) -> dict[str, int]:
  """jax.distributed.initialize's heartbeat_timeout_seconds where it
  differs from the default (`parameters`: initialize's, by default). JAX
  0.6.2 (the last for Python 3.10) has no such parameter: its timeout is
  100 s (10 missed heartbeats 10 s apart), so there --collective_timeout_s
  may be at most 40."""
  if timeout_s == HEARTBEAT_TIMEOUT_S:
    return {}
  if parameters is None:
    parameters = inspect.signature(jax.distributed.initialize).parameters
  if "heartbeat_timeout_seconds" not in parameters:
    raise ConfigError(
        f"--collective_timeout_s={collective_timeout_s:g} needs JAX's "
        f"heartbeat timeout raised to {timeout_s} s, so that the watchdog "
        f"comes {_WATCHDOG_FIRST_S} s first; JAX {jax.__version__} cannot "
        "set it (jax.distributed.initialize has no heartbeat_timeout_seconds)."
        f" Use --collective_timeout_s={HEARTBEAT_TIMEOUT_S - _WATCHDOG_FIRST_S}"
        " or less, or JAX 0.10 or later (Python 3.11+).")
  return {"heartbeat_timeout_seconds": timeout_s}


def is_chief() -> bool:
  """Process 0 writes the run's files (config, metrics, checkpoints)."""
  return jax.process_index() == 0


def lost_peer(error: Exception) -> bool:
  """Whether `error` is a collective's failure because another process is
  gone (never on one process: there is no other)."""
  if (jax.process_count() == 1 or
      not isinstance(error, jax.errors.JaxRuntimeError)):
    return False
  text = str(error)
  return text.startswith(_PEER_CODES) or any(w in text for w in _PEER_WORDS)


def gather(values: Sequence[int]) -> np.ndarray:
  """Every process's `values`: [processes, len(values)] int64 (a
  collective: every process calls it at the same point)."""
  mine = np.asarray(values, np.int64)
  if jax.process_count() == 1:
    return mine[None]
  return np.asarray(multihost_utils.process_allgather(mine)).reshape(
      jax.process_count(), -1)


def check_agree(values: Sequence[int], what: Sequence[str]) -> None:
  """Raises ConfigError naming each process's `values` (named by `what`)
  unless all processes hold the same (a collective)."""
  every = gather(values)
  if (every == every[0]).all():
    return
  raise ConfigError(
      "The JAX processes disagree on " + " and ".join(what) + " (" +
      "; ".join(f"process {i}: " + ", ".join(
          f"{w} {v}" for w, v in zip(what, row))
                for i, row in enumerate(every.tolist())) +
      "). Stopped before any training step. Every process must read the "
      "same --model_dir: give them all the same one, see each process's "
      "warnings for a checkpoint it found damaged, and run again.")


def barrier(name: str) -> None:
  """Waits until every process reaches `name` (no-op on one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def from_chief(tree):
  """Process 0's values of `tree` (host arrays) on every process, as
  MultiWorkerMirroredStrategy starts every worker from the chief's
  initial weights."""
  if jax.process_count() == 1:
    return tree
  return multihost_utils.broadcast_one_to_all(tree)
