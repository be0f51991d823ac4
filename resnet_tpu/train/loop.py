"""The training loop, written once for both engines: host loops, evals,
checkpoints, the records and log lines, and how a run stops.

Ying et al. 2018 train with synchronous data parallelism and many steps per
host call. The loop runs host loops of --steps_per_loop steps that end at
every eval and checkpoint step (cadence.StepCadence) and saves on the wall
clock too (cadence.SaveTimer); it writes one metrics record and log line per
host loop, with the ETA (loop_report.py). Between host loops it checks for
SIGTERM (a checkpoint, then preemption.Preempted), for NaN/Inf steps (a stop
without saving: loop_report.NonFiniteLossError, or with
--skip_nonfinite_steps loops of nothing but skipped steps: a stall), and
turns a lost peer into preemption.WorkerLost. What a step is, and how the
processes agree, is the engine's (train/engine.py).
"""
from __future__ import annotations

import time
from typing import Any, Callable, TYPE_CHECKING

from absl import logging

from resnet_tpu.train import cadence
from resnet_tpu.train import loop_report
from resnet_tpu.train import preemption
from resnet_tpu.train.engine import Engine
from resnet_tpu.train.engine import LoopCallback
from resnet_tpu.train.loop_result import LoopResult
from resnet_tpu.train.metrics_log import MetricsLog
from resnet_tpu.train.profiling import StepProfiler

if TYPE_CHECKING:
  from resnet_tpu.inputs.shard_audit import DataFaults


def fit(engine: Engine, train_input: Any, eval_input: Any = None,
        faults: DataFaults | None = None,
        loop_callback: LoopCallback | None = None) -> dict:
  """Trains `engine` to cfg.run.total_train_steps (TrainingLoop.fit)."""
  return TrainingLoop(engine, faults, loop_callback).fit(train_input,
                                                         eval_input)


class TrainingLoop:
  """The run's policy around an engine's host loops."""

  def __init__(self, engine: Engine, faults: DataFaults | None = None,
               loop_callback: LoopCallback | None = None):
    """`faults` names the training files behind unusable and lost records
    (shard_audit.py) per host loop; `loop_callback` is called with every
    host loop's train record."""
    cfg = engine.cfg
    if not cfg.run.num_train_images:
      raise ValueError("cfg.run.num_train_images is 0: resolve the config "
                       "first (preflight.check_run fills it from the data), "
                       "or set --num_train_images.")
    self.engine = engine
    self.cfg = cfg
    self.metrics = MetricsLog(cfg.model_dir, enabled=engine.chief)
    self.save_timer = cadence.SaveTimer(cfg.run.checkpoint_every_minutes)
    self.profiler = StepProfiler(cfg.run.profile_range, cfg.model_dir,
                                 *(engine.trace or ()))
    self._faults = faults
    self._loop_callback = loop_callback
    self._start_time = time.time()

  def restore(self) -> int:
    """Restores the newest intact checkpoint of model_dir; returns the
    step. Metric records of later steps (to be redone) are dropped."""
    path = self.engine.restore()
    step = self.engine.step
    if path:
      logging.info("Restored %s at step %d (input at global batch %d)",
                   path, step, self.engine.input_batches)
    self.engine.check_restored_agree()
    if path:
      dropped = self.metrics.drop_after(step)
      if dropped:
        logging.info("Dropped %d metric records of steps after %d.",
                     dropped, step)
    return step

  def evaluate(self, eval_input: Any) -> dict:
    """Top-1/top-5 over every example of the eval set (padding masked
    out), with the current weights; writes and logs the record."""
    start = time.time()
    result = self.engine.evaluate(eval_input)
    seconds = time.time() - start
    record = {"step": self.engine.step, "split": "eval",
              "loss": result.loss, "top1": result.top1,
              "top5": result.top5, "examples": result.examples,
              "images_per_sec": result.examples / seconds,
              "elapsed_s": time.time() - self._start_time}
    self.metrics.write(record)
    logging.info("eval step %d: loss %.4f top-1 %.4f top-5 %.4f over %d "
                 "examples (%.0f images/s)", record["step"], result.loss,
                 result.top1, result.top5, result.examples,
                 record["images_per_sec"])
    return record

  def fit(self, train_input: Any, eval_input: Any = None) -> dict:
    """Trains to cfg.run.total_train_steps, evaluating and checkpointing.

    Resumes from the newest intact checkpoint, input included (the engine
    opens `train_input` after the global batches already read). Returns the
    last eval record (the last train record without an eval set). A run
    restored at its last step only evaluates, once.

    Raises preemption.Preempted after checkpointing when any process got
    SIGTERM, preemption.WorkerLost when a peer is gone, and
    loop_report.NonFiniteLossError, without saving, on a NaN/Inf loss or
    gradient unless --skip_nonfinite_steps.
    """
    self._start_time = time.time()
    engine = self.engine
    try:
      self.restore()
      if engine.input_batches:
        logging.info("Training input resumes at global batch %d",
                     engine.input_batches)
      engine.start_input(train_input)
      evaluate = ((lambda: self.evaluate(eval_input))
                  if eval_input is not None else None)
      with preemption.SigtermWatcher() as sigterm, engine.running():
        return self._train(evaluate, sigterm)
    except Exception as e:  # pylint: disable=broad-except  (re-raised)
      cause = engine.lost_peer(e)
      if cause is None:
        raise
      raise preemption.WorkerLost.after(engine.step, cause,
                                        engine.latest()) from e
    finally:
      engine.close_inputs()
      self.profiler.stop()
      self.metrics.flush()  # last: it may raise storage.StorageError

  def _train(self, evaluate: Callable[[], dict] | None,
             sigterm: preemption.SigtermWatcher) -> dict:
    engine, run = self.engine, self.cfg.run
    plan = cadence.StepCadence.of(run)
    total = plan.total
    step = start_step = engine.step
    if step >= total and evaluate is not None:
      return self._evaluate_finished(evaluate)
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
      result = engine.host_loop(n, micro_batches)
      seconds = time.time() - t0
      seconds_per_step = seconds / n
      self.profiler.after_loop(step + n)
      loop_report.check_finite(result, step, n, engine.skips_nonfinite,
                               engine.latest)
      stalled_loops = stalled_loops + 1 if loop_report.stalled(
          result, n, engine.loss_scale_at_floor) else 0
      step = engine.step
      last = self._log_train(result, n * micro_batches, seconds, start_step,
                             total)
      loop_report.check_progress(stalled_loops, step, engine.latest)
      sigterm_any, timer_due = engine.any_process(
          [sigterm.received, self.save_timer.due_here()])
      preempted = sigterm_any and step < total
      do_save = plan.save_due(step) or timer_due
      do_eval = evaluate is not None and plan.eval_due(step)
      if self._recomputes_bn and (do_save or do_eval):
        engine.recompute_bn(self.cfg.model.bn_recompute_batches)
      if do_save or preempted:
        path = engine.save()
        self.save_timer.restart()
      if do_eval:
        last = evaluate()
      if preempted:
        raise preemption.Preempted.saved(step, total, path)
    return last

  @property
  def _recomputes_bn(self) -> bool:
    return self.cfg.model.bn_stats == "recompute"

  def _evaluate_finished(self, evaluate: Callable[[], dict]) -> dict:
    """A finished run, run again, evaluates its final weights and trains
    nothing; with --bn_stats=recompute their statistics are recomputed
    first (Akiba et al. 2017), which compares both kinds of statistics on
    the same weights. Nothing is saved."""
    logging.info("The run is finished at step %d: evaluating its final "
                 "weights%s.", self.engine.step,
                 " with recomputed BN statistics" if self._recomputes_bn
                 else "")
    if self._recomputes_bn:
      self.engine.recompute_bn(self.cfg.model.bn_recompute_batches)
    return evaluate()

  def _log_train(self, result: LoopResult, batches: int, seconds: float,
                 start_step: int, total: int) -> dict:
    step = self.engine.step
    elapsed = time.time() - self._start_time
    record = loop_report.train_record(
        result, step, total,
        images_per_sec=batches * self.cfg.run.global_batch_size / seconds,
        elapsed_s=elapsed,
        eta_s=loop_report.eta_seconds(elapsed, step - start_step,
                                      total - step),
        learning_rate=self.engine.learning_rate())
    self.metrics.write(record)
    if self._faults:
      self.metrics.flush()  # the count is on disk before a fail stop
      self._faults.report(result.by_source, step)
    if self._loop_callback:
      self._loop_callback(record)
    return record
