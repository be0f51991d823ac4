"""The JAX engine's trainer: host loops of jitted steps over a device mesh.

The cadence is the TensorFlow trainer's (trainer.py, Ying et al. 2018 §3):
host loops of --steps_per_loop steps that end at every eval and checkpoint
step (cadence.StepCadence), checkpoints on the wall clock too, one
metrics.jsonl record and log line per loop with the ETA (loop_report.py),
SIGTERM checked between loops (a checkpoint, then exit 42: preemption.py),
a NaN/Inf step stops the run without saving (--skip_nonfinite_steps, and
float16's loss scaling: it is skipped, not counted; host loops of nothing
but skipped steps stop it: loop_report.check_progress), and
--profile_steps records its host loops.

What differs is the engine's own part:
- a host loop is a Python loop of jitted steps (jax_step.JaxTrainStep),
  dispatched asynchronously as flax and big_vision run them; the host reads
  the loop's metric sums once, at its end;
- the state lives on the devices as a TrainState and is checkpointed
  through checkpoints_jax.py (TensorFlow's files) where TensorFlow is
  installed, through checkpoints_npz.py where it is not;
- the input arrives as numpy batches (jax_input.py).

On several hosts (--strategy=multi_worker, one process each: parallel/
jax_processes.py) every process runs this loop on its share of each batch;
process 0 writes the files; SIGTERM, the checkpoint clock and the fault
counts are agreed after each host loop, the restored step before the
first; every process waits for each checkpoint to be written.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator, TYPE_CHECKING

from absl import logging
import jax
import keras
import numpy as np

from resnet_tpu import files
from resnet_tpu.config import TrainConfig
from resnet_tpu.model.resnet import build_model
from resnet_tpu.optim import optimizers
from resnet_tpu.parallel import jax_processes
from resnet_tpu.runtime import process_setup
from resnet_tpu.train import cadence
from resnet_tpu.train import checkpoint_paths
from resnet_tpu.train import loop_report
from resnet_tpu.train import preemption
from resnet_tpu.train.checkpoints_npz import NpzCheckpoints
from resnet_tpu.train.loop_result import LoopResult
from resnet_tpu.train.loss_scaling import GROWTH_STEPS
from resnet_tpu.train.loss_scaling import INITIAL_SCALE
from resnet_tpu.train.jax_step import JaxTrainStep
from resnet_tpu.train.jax_step import LossConfig
from resnet_tpu.train.jax_step import TrainState
from resnet_tpu.train.jax_step import iterations_index
from resnet_tpu.train.metrics_log import MetricsLog
from resnet_tpu.train.profiling import StepProfiler
from resnet_tpu.train.watchdog import Watchdog

if TYPE_CHECKING:
  from resnet_tpu.inputs.shard_audit import DataFaults
  from resnet_tpu.train.checkpoints_jax import JaxCheckpoints

Batches = Iterator[tuple[np.ndarray, ...]]
# Called with each host loop's train record once it is logged.
LoopCallback = Callable[[dict], None]


def checkpoint_store(cfg: TrainConfig, model: keras.Model,
                     optimizer: keras.optimizers.Optimizer,
                     template: TrainState, chief: bool
                     ) -> JaxCheckpoints | NpzCheckpoints:
  """TensorFlow's checkpoint files (checkpoints_jax.py) where TensorFlow is
  installed; .npz files (checkpoints_npz.py) where it is not, and in a
  model_dir that already holds them (a run keeps its format)."""
  if (checkpoint_paths.npz_checkpoints(cfg.model_dir)
      or not files.tensorflow_installed()):
    return NpzCheckpoints(cfg, template, iterations_index(optimizer), chief)
  # pylint: disable-next=g-import-not-at-top  (TensorFlow's)
  from resnet_tpu.train.checkpoints_jax import JaxCheckpoints
  return JaxCheckpoints(cfg, model, optimizer, cfg.model_dir, chief,
                        jax.device_get(template.loss_scale))


class JaxTrainer:
  """Owns the JAX step, its state and checkpoints; trains and evaluates."""

  def __init__(self, cfg: TrainConfig, mesh: jax.sharding.Mesh,
               loop_callback: LoopCallback | None = None):
    if not cfg.run.num_train_images:
      raise ValueError("cfg.run.num_train_images is 0: resolve the config "
                       "first (preflight.check_run).")
    self.cfg = cfg
    self.model = build_model(cfg.model, cfg.distribution)
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
    self.reload_weights()
    self.step = 0
    self.input_batches = 0  # global batches read from the training input
    self._faults = None
    self.chief = jax_processes.is_chief()
    self.checkpoints = checkpoint_store(cfg, self.model, self.optimizer,
                                        self.step_fn.state(), self.chief)
    self.metrics = MetricsLog(cfg.model_dir, enabled=self.chief)
    self.save_timer = cadence.SaveTimer(cfg.run.checkpoint_every_minutes)
    self.profiler = StepProfiler(cfg.run.profile_range, cfg.model_dir,
                                 jax.profiler.start_trace,
                                 jax.profiler.stop_trace)
    self._loop_callback = loop_callback
    self._start_time = time.time()
    # --collective_timeout_s on several processes (fit arms it).
    self._watchdog = Watchdog(0, self._stop_lost_peer)

  def reload_weights(self) -> None:
    """Starts the state from the Keras variables' values (fresh, or set by
    warm_start.py), process 0's on every process, as MultiWorkerMirrored-
    Strategy starts every worker from the chief's initial weights."""
    self.state = self.step_fn.replicate(jax_processes.from_chief(
        jax.device_get(self.step_fn.state())))

  def restore(self) -> int:
    """Restores the newest intact checkpoint of model_dir; returns the
    step. Metric records of later steps (to be redone) are dropped."""
    path, state, input_batches = self.checkpoints.restore()
    jax_processes.check_agree(
        [self.step if path is None else int(self._iterations(state)),
         input_batches], ("restored step", "input position"))
    if path is None:
      return self.step
    self.state = self.step_fn.replicate(state)
    self.input_batches = input_batches
    self.optimizer.iterations.assign(self._iterations())
    self.step = int(self.optimizer.iterations.numpy())
    logging.info("Restored %s at step %d (input at global batch %d)", path,
                 self.step, input_batches)
    dropped = self.metrics.drop_after(self.step)
    if dropped:
      logging.info("Dropped %d metric records of steps after %d.", dropped,
                   self.step)
    return self.step

  def _iterations(self, state: TrainState | None = None):
    """The optimizer's step count in `state` (self.state by default)."""
    state = self.state if state is None else state
    return state.optimizer[iterations_index(self.optimizer)]

  def save(self) -> str:
    """Checkpoints the state (process 0 writes it); returns its path once
    it is written."""
    path = self.checkpoints.save(self.state, self.input_batches)
    jax_processes.barrier(f"checkpoint at step {self.step}")
    self._watchdog.alive()
    return path

  def evaluate(self, batches: Batches) -> dict:
    """Top-1/top-5 over every example of one pass of `batches` (padding
    masked out), with the current state."""
    start = time.time()
    sums = []
    for batch in batches:
      sums.append(self.step_fn.evaluate(self.state,
                                        *self.step_fn.shard_batch(*batch)))
      self._watchdog.alive()
    total = {k: float(sum(s[k] for s in jax.device_get(sums)))
             for k in ("loss", "top1", "top5", "examples")}
    self._watchdog.alive()
    seconds = time.time() - start
    n = max(total["examples"], 1.0)
    record = {"step": self.step, "split": "eval", "loss": total["loss"] / n,
              "top1": total["top1"] / n, "top5": total["top5"] / n,
              "examples": int(total["examples"]),
              "images_per_sec": total["examples"] / seconds,
              "elapsed_s": time.time() - self._start_time}
    self.metrics.write(record)
    logging.info("eval step %d: loss %.4f top-1 %.4f top-5 %.4f over %d "
                 "examples (%.0f images/s)", record["step"], record["loss"],
                 record["top1"], record["top5"], record["examples"],
                 record["images_per_sec"])
    return record

  def fit(self, train_input: Callable[[int], Batches],
          eval_input: Callable[[], Batches] | None = None,
          faults: DataFaults | None = None) -> dict:
    """Trains to cfg.run.total_train_steps, evaluating and checkpointing.

    Resumes from the newest intact checkpoint, input included:
    `train_input(n)` yields the training batches after the first n.
    `eval_input()` yields one pass over the eval set. `faults` names the
    training files behind unusable and lost records (shard_audit.py) per
    host loop. Returns the last
    eval record (or the last train record without an eval set). A run
    restored at its last step only evaluates.

    Raises preemption.Preempted after checkpointing on SIGTERM,
    preemption.WorkerLost when another process is gone
    (jax_processes.lost_peer), and loop_report.NonFiniteLossError, without
    saving, on a NaN/Inf loss or gradient (unless --skip_nonfinite_steps).
    """
    self._start_time = time.time()
    self._faults = faults
    try:
      self.restore()
      if self.input_batches:
        logging.info("Training input resumes at global batch %d",
                     self.input_batches)
      batches = train_input(self.input_batches)
      evaluate = ((lambda: self.evaluate(eval_input())) if eval_input
                  else None)
      timeout_s = (self.cfg.distribution.collective_timeout_s
                   if jax.process_count() > 1 else 0)
      self._watchdog = Watchdog(timeout_s, self._stop_lost_peer)
      with preemption.SigtermWatcher() as sigterm, self._watchdog:
        return self._train(batches, evaluate, sigterm)
    except jax.errors.JaxRuntimeError as e:
      if not jax_processes.lost_peer(e):
        raise
      raise preemption.WorkerLost.after(
          self.step, str(e).strip().splitlines()[0],
          self.checkpoints.latest()) from e
    finally:
      self.profiler.stop()
      self.metrics.flush()

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

  def _train(self, batches: Batches, evaluate: Callable[[], dict] | None,
             sigterm: preemption.SigtermWatcher) -> dict:
    run = self.cfg.run
    plan = cadence.StepCadence.of(run)
    total = plan.total
    step = start_step = self.step
    if step >= total and evaluate is not None:
      logging.info("The run is finished at step %d: evaluating its final "
                   "weights%s.", step, " with recomputed BN statistics"
                   if self._recomputes_bn else "")
      if self._recomputes_bn:
        self._recompute_bn(batches)
      return evaluate()
    last = {}
    self.save_timer.restart()
    seconds_per_step = None  # the pace of the last loop (--max_loop_seconds)
    stalled_loops = 0  # in a row, every step skipped
    while step < total:
      micro_batches = (run.clock.global_batch_at_step(step) //
                       run.global_batch_size)
      n = plan.loop_steps(step, run.steps_per_loop,
                          self.profiler.loop_limit(step),
                          cadence.timed_loop_limit(run.max_loop_seconds,
                                                   seconds_per_step))
      self.profiler.before_loop(step, n)
      t0 = time.time()
      result = self._host_loop(batches, n, micro_batches)
      self._watchdog.alive()  # armed from here: the first loop compiles
      seconds = time.time() - t0
      seconds_per_step = seconds / n
      self.profiler.after_loop(step + n)
      loop_report.check_finite(result, step, n, self.step_fn.skip_nonfinite,
                               self.checkpoints.latest)
      stalled_loops = stalled_loops + 1 if loop_report.stalled(
          result, n, self._loss_scale_at_floor) else 0
      step = self.step
      last = self._log_train(result, n * micro_batches, seconds, start_step,
                             total)
      loop_report.check_progress(stalled_loops, step,
                                 self.checkpoints.latest)
      sigterm_any, timer_due = jax_processes.gather(
          [sigterm.received, self.save_timer.due_here()]).any(axis=0)
      self._watchdog.alive()
      preempted = bool(sigterm_any) and step < total
      do_eval = evaluate is not None and plan.eval_due(step)
      do_save = plan.save_due(step) or timer_due
      if self._recomputes_bn and (do_save or do_eval):
        self._recompute_bn(batches)
        self.input_batches += self.cfg.model.bn_recompute_batches
      if do_save or preempted:
        path = self.save()
        self.save_timer.restart()
      if do_eval:
        last = evaluate()
      if preempted:
        raise preemption.Preempted.saved(step, total, path)
    return last

  def _loss_scale_at_floor(self) -> bool:
    """float16: whether the loss scale is 1 (skipped steps no longer lower
    it); True without one."""
    return (not self.state.loss_scale or
            float(jax.device_get(self.state.loss_scale[0])) <= 1.0)

  @property
  def _recomputes_bn(self) -> bool:
    return self.cfg.model.bn_stats == "recompute"

  def _recompute_bn(self, batches: Batches) -> None:
    """--bn_stats=recompute: the BN statistics of the next
    --bn_recompute_batches training batches (Akiba et al. 2017)."""
    count = self.cfg.model.bn_recompute_batches
    self.state = self.step_fn.recompute_statistics(
        self.state, (next(batches)[0] for _ in range(count)))
    logging.info("BN statistics recomputed from %d training batches at "
                 "step %d.", count, self.step)

  def _host_loop(self, batches: Batches, num_steps: int,
                 micro_batches: int = 1) -> LoopResult:
    """`num_steps` steps of `micro_batches` batches each (batch-size
    control), dispatched without waiting; reads their sums once, at the
    end. A NaN/Inf step adds nothing to the sums."""
    per_step, faults = [], 0
    for _ in range(num_steps):
      if micro_batches == 1:
        images, labels, batch_faults = next(batches)
        self.state, metrics = self.step_fn.step(
            self.state, *self.step_fn.shard_batch(images, labels))
      else:
        images, labels, batch_faults = (np.stack(parts) for parts in zip(
            *(next(batches) for _ in range(micro_batches))))
        self.state, metrics = self.step_fn.accumulated_step(
            self.state, *self.step_fn.shard_micro_batches(images, labels))
        batch_faults = batch_faults.sum(axis=0)
      per_step.append(metrics)
      faults = faults + batch_faults
    per_step = jax.device_get(per_step)  # blocks until the loop is done
    self.step = int(jax.device_get(self._iterations()))  # skips not counted
    self.input_batches += num_steps * micro_batches
    nonfinite = [i for i, m in enumerate(per_step) if m["nonfinite"]]
    kept = [m for m in per_step if not m["nonfinite"]]
    sums = {k: float(sum(m[k] for m in kept))
            for k in ("loss", "top1", "top5", "examples")}
    n = max(sums["examples"], 1.0)
    # Every host's counts: each read its own files.
    faults = jax_processes.gather(
        np.rint(np.asarray(faults, np.float64)).reshape(-1)).sum(axis=0)
    count = lambda v: int(round(float(v)))
    return LoopResult(
        sums["loss"] / n, sums["top1"] / n, sums["top5"] / n,
        count(sums["examples"]),
        unusable_examples=count(faults[0]) if faults.size else 0,
        lost_records=count(faults[1]) if faults.size else 0,
        nonfinite_steps=len(nonfinite),
        first_nonfinite=nonfinite[0] if nonfinite else -1,
        by_source=tuple(count(v) for v in faults[2:]))

  def _log_train(self, result: LoopResult, num_batches: int,
                 seconds: float, start_step: int, total: int) -> dict:
    elapsed = time.time() - self._start_time
    self.optimizer.iterations.assign(self.step)
    record = loop_report.train_record(
        result, self.step, total,
        images_per_sec=(num_batches * self.cfg.run.global_batch_size /
                        seconds),
        elapsed_s=elapsed,
        eta_s=loop_report.eta_seconds(elapsed, self.step - start_step,
                                      total - self.step),
        learning_rate=float(self.optimizer.learning_rate))
    self.metrics.write(record)
    if self._faults:
      self.metrics.flush()  # the count is on disk before a fail stop
      self._faults.report(result.by_source, self.step)
    if self._loop_callback:
      self._loop_callback(record)
    return record
