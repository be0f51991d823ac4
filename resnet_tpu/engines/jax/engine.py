"""JAX's engine for the training loop: host loops of jitted steps over a
device mesh, its state on the devices, its checkpoints and processes.

The loop's policy (cadence, records, SIGTERM, NaN, stalls: train/loop.py,
Ying et al. 2018 §3) is the same as on TensorFlow; what this engine does its
own way:
- a host loop is a Python loop of jitted steps (step.JaxTrainStep),
  dispatched asynchronously as flax and big_vision run them; the host reads
  the loop's metric sums once, at its end;
- the state lives on the devices as a TrainState and is checkpointed
  through tf_checkpoints.py (TensorFlow's files) where TensorFlow is
  installed, through npz_checkpoints.py where it is not;
- the input arrives as numpy batches (host_batches.py, synthetic.py),
  put on the devices two batches ahead of the step by a background thread
  (prefetch.py).

On several hosts (--strategy=multi_worker, one process each: processes.py)
every process runs this loop on its share of each batch; process 0 writes
the files; SIGTERM, the checkpoint clock and the fault counts are agreed
after each host loop (one gather), the restored step before the first;
every process waits for each checkpoint to be written, and a watchdog
(watchdog.py) ends a run that waits on a lost peer.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator, Sequence, TYPE_CHECKING

from absl import logging
import jax
import keras
import numpy as np

from resnet_tpu import files
from resnet_tpu.config import TrainConfig
from resnet_tpu.engines.jax import processes
from resnet_tpu.engines.jax.npz_checkpoints import NpzCheckpoints
from resnet_tpu.engines.jax.prefetch import DevicePrefetch
from resnet_tpu.engines.jax.prefetch import stacker
from resnet_tpu.engines.jax.state import iterations_index
from resnet_tpu.engines.jax.step import JaxTrainStep
from resnet_tpu.engines.jax.step import METRICS
from resnet_tpu.engines.jax.state import LossConfig
from resnet_tpu.engines.jax.state import TrainState
from resnet_tpu.engines.jax.watchdog import Watchdog
from resnet_tpu.model.resnet import build_model
from resnet_tpu.optim import optimizers
from resnet_tpu.runtime import process_setup
from resnet_tpu.train.checkpoints import paths
from resnet_tpu.train import loop
from resnet_tpu.train import preemption
from resnet_tpu.train.engine import LoopCallback
from resnet_tpu.train.engine import ModelFn
from resnet_tpu.train.loop_result import LoopResult
from resnet_tpu.train.loss_scaling import GROWTH_STEPS
from resnet_tpu.train.loss_scaling import INITIAL_SCALE

if TYPE_CHECKING:
  from resnet_tpu.engines.jax.tf_checkpoints import JaxCheckpoints
  from resnet_tpu.inputs.shard_audit import DataFaults

Batches = Iterator[tuple[np.ndarray, ...]]


def checkpoint_store(cfg: TrainConfig, model: keras.Model,
                     optimizer: keras.optimizers.Optimizer,
                     template: TrainState, chief: bool
                     ) -> JaxCheckpoints | NpzCheckpoints:
  """TensorFlow's checkpoint files (tf_checkpoints.py) where TensorFlow is
  installed; .npz files (npz_checkpoints.py) where it is not, and in a
  model_dir that already holds them (a run keeps its format)."""
  if (paths.npz_checkpoints(cfg.model_dir)
      or not files.tensorflow_installed()):
    return NpzCheckpoints(cfg, template, iterations_index(optimizer), chief)
  # pylint: disable-next=g-import-not-at-top  (TensorFlow's)
  from resnet_tpu.engines.jax.tf_checkpoints import JaxCheckpoints
  return JaxCheckpoints(cfg, model, optimizer, cfg.model_dir, chief,
                        jax.device_get(template.loss_scale))


def loop_result(per_step: list[dict], faults: np.ndarray) -> LoopResult:
  """A host loop's LoopResult from its steps' metric sums (a NaN/Inf step
  adds nothing to them) and every host's fault counts, summed."""
  nonfinite = [i for i, m in enumerate(per_step) if m["nonfinite"]]
  kept = [m for m in per_step if not m["nonfinite"]]
  sums = {k: float(sum(m[k] for m in kept)) for k in METRICS}
  n = max(sums["examples"], 1.0)
  count = lambda v: int(round(float(v)))
  return LoopResult(
      sums["loss"] / n, sums["top1"] / n, sums["top5"] / n,
      count(sums["examples"]),
      unusable_examples=count(faults[0]) if faults.size else 0,
      lost_records=count(faults[1]) if faults.size else 0,
      nonfinite_steps=len(nonfinite),
      first_nonfinite=nonfinite[0] if nonfinite else -1,
      by_source=tuple(count(v) for v in faults[2:]))


def _start_trace(logdir: str) -> None:
  jax.profiler.start_trace(logdir)
  _keep_tensorflows_trace_check()


def _stop_trace() -> None:
  jax.profiler.stop_trace()
  _keep_tensorflows_trace_check()


def _keep_tensorflows_trace_check() -> None:
  """Beside TensorFlow (tf.data input, its checkpoint files), undoes what
  jaxlib 0.6.2's profiler does to TensorFlow's (compat.restore_trace_check).
  """
  if "tensorflow" in sys.modules:
    from resnet_tpu.runtime import compat  # pylint: disable=g-import-not-at-top
    compat.restore_trace_check()


class JaxEngine:
  """Owns the JAX step, its state and checkpoints."""

  trace = (_start_trace, _stop_trace)

  def __init__(self, cfg: TrainConfig, mesh: jax.sharding.Mesh,
               model_fn: ModelFn | None = None):
    """model_fn: builds the network (default: model.build_model)."""
    self.cfg = cfg
    self.model = (model_fn(cfg) if model_fn else
                  build_model(cfg.model, cfg.distribution))
    self.optimizer = optimizers.build_optimizer_from_config(
        cfg.optim, cfg.run, cfg.distribution)
    optim = cfg.optim
    weight_decay = (optim.weight_decay if optimizers.weight_decay_in_loss(
        optim.optimizer) else 0.0)
    self.step_fn = JaxTrainStep(
        self.model, self.optimizer, mesh,
        LossConfig(cfg.model.num_classes, cfg.run.global_batch_size,
                   optim.label_smoothing, weight_decay),
        skip_nonfinite=optim.skip_nonfinite_steps,
        loss_scale=((INITIAL_SCALE, GROWTH_STEPS)
                    if cfg.model.precision == "float16" else None))
    self.skips_nonfinite = self.step_fn.skip_nonfinite
    self.reload_weights()
    self.step = 0
    self.input_batches = 0  # global batches read from the training input
    self.chief = processes.is_chief()
    self.checkpoints = checkpoint_store(cfg, self.model, self.optimizer,
                                        self.step_fn.state(), self.chief)
    self._batches: DevicePrefetch | None = None
    self._stack = stacker(self.step_fn.stacked_sharding)
    # --collective_timeout_s on several processes (armed by `running`).
    self._watchdog = Watchdog(0, self._stop_lost_peer)

  def fit(self, train_input: Callable[[int], Batches],
          eval_input: Callable[[], Batches] | None = None,
          faults: DataFaults | None = None,
          loop_callback: LoopCallback | None = None) -> dict:
    """train/loop.fit: `train_input(n)` yields the training batches after
    the first n, `eval_input()` one pass over the eval set."""
    return loop.fit(self, train_input, eval_input, faults, loop_callback)

  def reload_weights(self) -> None:
    """Starts the state from the Keras variables' values (fresh, or set by
    warm_start.py), process 0's on every process, as MultiWorkerMirrored-
    Strategy starts every worker from the chief's initial weights."""
    self.state = self.step_fn.replicate(processes.from_chief(
        jax.device_get(self.step_fn.state())))

  def restore(self) -> str | None:
    path, state, input_batches = self.checkpoints.restore()
    if path is None:
      return None
    self.state = self.step_fn.replicate(state)
    self.input_batches = input_batches
    self.optimizer.iterations.assign(self._iterations())
    self.step = int(self.optimizer.iterations.numpy())
    return path

  def check_restored_agree(self) -> None:
    processes.check_agree([self.step, self.input_batches],
                          ("restored step", "input position"))

  def _iterations(self, state: TrainState | None = None):
    """The optimizer's step count in `state` (self.state by default)."""
    state = self.state if state is None else state
    return state.optimizer[iterations_index(self.optimizer)]

  def start_input(self, train_input: Callable[[int], Batches]) -> None:
    """(images, labels) on the devices, faults on the host, prefetched."""
    self.close_inputs()
    shard = self.step_fn.shard_batch
    self._batches = DevicePrefetch(
        train_input(self.input_batches),
        lambda batch: (*shard(*batch[:2]), np.asarray(batch[2])))

  def host_loop(self, num_steps: int, micro_batches: int = 1) -> LoopResult:
    """`num_steps` steps of `micro_batches` batches each (batch-size
    control), dispatched without waiting; reads their sums once, at the
    end."""
    per_step, faults = [], 0
    for _ in range(num_steps):
      if micro_batches == 1:
        images, labels, batch_faults = next(self._batches)
        self.state, metrics = self.step_fn.step(self.state, images, labels)
      else:
        parts = [next(self._batches) for _ in range(micro_batches)]
        self.state, metrics = self.step_fn.accumulated_step(
            self.state, *self._stack([part[:2] for part in parts]))
        batch_faults = sum(part[2] for part in parts)
      per_step.append(metrics)
      faults = faults + batch_faults
    per_step = jax.device_get(per_step)  # blocks until the loop is done
    self.step = int(jax.device_get(self._iterations()))  # skips not counted
    self.input_batches += num_steps * micro_batches
    # Every host's counts: each read its own files.
    faults = processes.gather(
        np.rint(np.asarray(faults, np.float64)).reshape(-1)).sum(axis=0)
    self._watchdog.alive()  # armed from here: the first loop compiles
    return loop_result(per_step, faults)

  def evaluate(self, eval_input: Callable[[], Batches]) -> LoopResult:
    sums = []
    with DevicePrefetch(eval_input(), lambda batch: self.step_fn.shard_batch(
        *batch)) as batches:
      for batch in batches:
        sums.append(self.step_fn.evaluate(self.state, *batch))
        self._watchdog.alive()
    total = {k: float(sum(s[k] for s in jax.device_get(sums)))
             for k in METRICS}
    self._watchdog.alive()
    n = max(total["examples"], 1.0)
    return LoopResult(total["loss"] / n, total["top1"] / n,
                      total["top5"] / n, int(total["examples"]))

  def recompute_bn(self, num_batches: int) -> None:
    self.state = self.step_fn.recompute_statistics(
        self.state, (next(self._batches)[0] for _ in range(num_batches)))
    self.input_batches += num_batches
    logging.info("BN statistics recomputed from %d training batches at "
                 "step %d.", num_batches, self.step)

  def save(self) -> str:
    """Process 0 writes the checkpoint; every process waits for it."""
    path = self.checkpoints.save(self.state, self.input_batches)
    processes.barrier(f"checkpoint at step {self.step}")
    self._watchdog.alive()
    return path

  def latest(self) -> str | None:
    return self.checkpoints.latest()

  def any_process(self, flags: Sequence[bool]) -> list[bool]:
    agreed = processes.gather(list(flags)).any(axis=0)
    self._watchdog.alive()
    return [bool(flag) for flag in agreed]

  def loss_scale_at_floor(self) -> bool:
    return (not self.state.loss_scale or
            float(jax.device_get(self.state.loss_scale[0])) <= 1.0)

  def learning_rate(self) -> float:
    self.optimizer.iterations.assign(self.step)
    return float(self.optimizer.learning_rate)

  def running(self) -> contextlib.AbstractContextManager:
    """The watchdog, armed on several processes (--collective_timeout_s)."""
    timeout_s = (self.cfg.distribution.collective_timeout_s
                 if jax.process_count() > 1 else 0)
    self._watchdog = Watchdog(timeout_s, self._stop_lost_peer)
    return self._watchdog

  def lost_peer(self, error: Exception) -> str | None:
    if not (isinstance(error, jax.errors.JaxRuntimeError) and
            processes.lost_peer(error)):
      return None
    return str(error).strip().splitlines()[0]

  def close_inputs(self) -> None:
    if self._batches is not None:
      self._batches.close()
    self._batches = None

  def _stop_lost_peer(self, waited_s: float) -> None:
    """The watchdog's end of a run that waited `waited_s` for another
    process: exit 43 naming the checkpoint to resume from (main.py's
    WorkerLost exit, from the watchdog's thread: the main thread waits in
    a collective)."""
    stop = preemption.WorkerLost.after(
        self.step, f"no host loop, agreement, checkpoint or eval finished "
        f"in {waited_s:.0f} s, above --collective_timeout_s="
        f"{self._watchdog.timeout_s:g}", self.checkpoints.latest())
    logging.warning("%s", stop)
    process_setup.exit_skipping_teardown(stop.exit_code)
