"""The training cadence: host loops, evals, checkpoints, logs and failures.

Ying et al. 2018 train with synchronous data parallelism and several steps
per host call; the step math is train_step.py, the loops host_loops.py, the
checkpoints checkpointing.py. `Trainer` builds them under the strategy and
runs `fit`: host loop after host loop, evaluating and checkpointing on the
configured cadence (steps, and minutes: cadence.py), one record and log
line per loop (loop_report.py).
Between host loops it checks for SIGTERM (preemption.py) and for non-finite
loss or gradients; a run stops with a checkpoint (`Preempted`) or without
overwriting the last good one (`loop_report.NonFiniteLossError`), or skips
such steps with --skip_nonfinite_steps.
"""
import time
from typing import Callable, Iterator, Sequence

from absl import logging
import keras
import tensorflow as tf

from resnet_tpu.train import cadence
from resnet_tpu.train import iterators
from resnet_tpu.train import loop_report
from resnet_tpu.train import preemption
from resnet_tpu.train.loss_scale import DynamicLossScale
from resnet_tpu.train.profiling import StepProfiler
from resnet_tpu.model.bn_recompute import BNStatisticsRecomputer
from resnet_tpu.train.checkpointing import check_workers_agree
from resnet_tpu.train.checkpointing import Checkpoints
from resnet_tpu.train.checkpointing import worker_checkpoint_dir
from resnet_tpu.config import TrainConfig
from resnet_tpu.train.host_loops import HostLoops
from resnet_tpu.train.loop_result import LoopResult
from resnet_tpu.inputs.input_pipeline import DatasetFn
from resnet_tpu.train.metrics_log import MetricsLog
from resnet_tpu.model.resnet import build_model
from resnet_tpu.optim.optimizers import build_optimizer_from_config
from resnet_tpu.inputs.shard_audit import DataFaults
from resnet_tpu.parallel.strategy import any_worker
from resnet_tpu.parallel.strategy import is_chief
from resnet_tpu.parallel.strategy import PEER_ERRORS
from resnet_tpu.train.train_step import make_accumulators
from resnet_tpu.train.train_step import ReplicaStep

ModelFn = Callable[[TrainConfig], keras.Model]
# Called with each host loop's train record once it is logged.
LoopCallback = Callable[[dict], None]


class Trainer:
  """Owns model, optimizer and checkpoints; runs training and evaluation."""

  def __init__(self, cfg: TrainConfig, strategy: tf.distribute.Strategy,
               model_fn: ModelFn | None = None,
               bn_groups: Sequence[Sequence[int]] | None = None,
               loop_callback: LoopCallback | None = None):
    """model_fn: builds the network (default: model.build_model with
    `bn_groups`, the TPU placement's BN groups); loop_callback: called with
    every host loop's train record."""
    if not cfg.run.num_train_images:
      raise ValueError("cfg.run.num_train_images is 0: resolve the config "
                       "first (preflight.resolve fills it from the data), "
                       "or set --num_train_images.")
    self.cfg = cfg
    self.strategy = strategy
    self.chief = is_chief(strategy)
    self.clock = cfg.run.clock
    self._loop_callback = loop_callback
    with strategy.scope():
      self.model = (model_fn(cfg) if model_fn else
                    build_model(cfg.model, cfg.distribution,
                                bn_groups=bn_groups))
      self.optimizer = build_optimizer_from_config(cfg.optim, cfg.run,
                                                   cfg.distribution)
      # Built explicitly before the first traced step (slots must exist as
      # distributed variables, not be created inside a replica function).
      self.optimizer.build(self.model.trainable_variables)
      accumulators = (make_accumulators(self.model)
                      if cfg.run.batch_size_schedule else [])
      self.loss_scale = (DynamicLossScale()
                         if cfg.model.precision == "float16" else None)
      # Global batches read from the training input (micro-batches and BN
      # recomputation included): where a resumed run starts reading.
      self.input_batches = tf.Variable(0, dtype=tf.int64, trainable=False,
                                       name="input_batches")
    self.replica_step = ReplicaStep(cfg, self.model, self.optimizer,
                                    strategy.num_replicas_in_sync,
                                    accumulators, self.loss_scale)
    self.loops = HostLoops(strategy, self.replica_step)
    self._bn_recomputer = (BNStatisticsRecomputer(self.model, strategy)
                           if cfg.model.bn_stats == "recompute" else None)
    self.checkpoints = Checkpoints(
        cfg, self.model, self.optimizer, self.input_batches,
        worker_checkpoint_dir(cfg.model_dir, strategy, self.chief),
        self.chief, self.loss_scale)
    self.metrics = MetricsLog(cfg.model_dir, enabled=self.chief)
    self.save_timer = cadence.SaveTimer(cfg.run.checkpoint_every_minutes)
    self._start_time = time.time()
    self._faults = None
    self._eval_input: iterators.EvalInput | None = None
    self.profiler = StepProfiler(cfg.run.profile_range, cfg.model_dir)

  @property
  def step(self) -> int:
    return int(self.optimizer.iterations.numpy())

  def accumulation_steps(self, step: int) -> int:
    """Micro-batches per optimizer step at `step` (Mikami et al.)."""
    return (self.clock.global_batch_at_step(step) //
            self.cfg.run.global_batch_size)

  def restore(self) -> int:
    """Restores the newest intact checkpoint of model_dir; returns the step.

    Every worker must call this together: they check that all restored the
    same step and input position (checkpointing.RestoreMismatch). Metric
    records of steps after the restored one (training that is about to be
    redone) are dropped.
    """
    path = self.checkpoints.restore()
    input_batches = int(self.input_batches.numpy())
    if path:
      logging.info("Restored %s at step %d (input at global batch %d)",
                   path, self.step, input_batches)
    check_workers_agree(self.strategy, self.step, input_batches)
    dropped = self.metrics.drop_after(self.step) if path else 0
    if dropped:
      logging.info("Dropped %d metric records of steps after %d.", dropped,
                   self.step)
    return self.step

  def save(self) -> str:
    return self.checkpoints.save()

  def evaluate(self, eval_dataset_fn: DatasetFn, eval_steps: int) -> dict:
    """Top-1/top-5 over every example of the eval set (padding masked out),
    with the weights the model has now (call `restore` first to evaluate a
    checkpoint). Evaluations of the same eval set share one iterator
    (iterators.EvalInput); `close_inputs` releases it."""
    if not (self._eval_input and
            self._eval_input.serves(eval_dataset_fn, eval_steps)):
      self.close_inputs()
      self._eval_input = iterators.EvalInput(self.strategy, eval_dataset_fn,
                                             eval_steps)
    start = time.time()
    result = LoopResult.of(self.loops.eval(self._eval_input.iterator,
                                           tf.constant(eval_steps)))
    seconds = time.time() - start
    record = {"step": self.step, "split": "eval", "loss": result.loss,
              "top1": result.top1, "top5": result.top5,
              "examples": result.examples,
              "images_per_sec": result.examples / seconds,
              "elapsed_s": time.time() - self._start_time}
    self.metrics.write(record)
    logging.info("eval step %d: loss %.4f top-1 %.4f top-5 %.4f over %d "
                 "examples (%.0f images/s)", record["step"], result.loss,
                 result.top1, result.top5, result.examples,
                 record["images_per_sec"])
    return record

  def close_inputs(self) -> None:
    """Releases the evaluation iterator, in the background
    (iterators.release); the next evaluation makes a new one."""
    if self._eval_input:
      self._eval_input.close()
      self._eval_input = None

  def fit(self, train_dataset_fn: DatasetFn,
          eval_dataset_fn: DatasetFn | None = None, eval_steps: int = 0,
          resume_dataset_fn: Callable[[int], DatasetFn] | None = None,
          faults: DataFaults | None = None) -> dict:
    """Trains to cfg.run.total_train_steps, evaluating and checkpointing.

    Resumes from the newest intact checkpoint in model_dir, input included:
    reading continues at global batch `input_batches`, from
    `resume_dataset_fn(input_batches)` when given (input_pipeline's
    start_step skips records before decoding them), else by skipping that
    many batches of `train_dataset_fn`. `faults` names the training files
    behind unusable and lost records (shard_audit.py) per host loop. Returns
    the last eval record (or the last train record when there is no eval
    set). A run restored at its last step only evaluates, once
    (_evaluate_finished).

    Its input iterators are released in the background when it returns
    (iterators.py), so it returns as soon as the last step, save and eval
    are done.

    Raises preemption.Preempted after checkpointing when any worker got
    SIGTERM, preemption.WorkerLost when a peer worker failed, and
    loop_report.NonFiniteLossError, without saving, on a NaN/Inf loss or
    gradient unless cfg.optim.skip_nonfinite_steps.
    """
    self._start_time = time.time()
    self._faults = faults
    if faults:
      self.replica_step.num_sources = faults.num_sources
    self.restore()
    train_iter = iter(self.strategy.distribute_datasets_from_function(
        self._positioned_input(train_dataset_fn, resume_dataset_fn)))
    evaluate = ((lambda: self.evaluate(eval_dataset_fn, eval_steps))
                if eval_dataset_fn else None)
    try:
      with preemption.SigtermWatcher() as sigterm:
        return self._train(train_iter, evaluate, sigterm)
    except PEER_ERRORS as e:
      if not isinstance(self.strategy,
                        tf.distribute.MultiWorkerMirroredStrategy):
        raise
      raise preemption.WorkerLost.after(
          self.step, f"{type(e).__name__}: {e.message.splitlines()[0]}",
          self.checkpoints.latest()) from e
    finally:
      owned = [train_iter]
      del train_iter
      iterators.release(owned)
      self.close_inputs()
      self.profiler.stop()
      self.metrics.flush()  # last: it may raise storage.StorageError

  def _positioned_input(self, dataset_fn: DatasetFn,
                        resume_dataset_fn: Callable[[int], DatasetFn] | None
                        ) -> DatasetFn:
    """The training input, after the `input_batches` already read."""
    start = int(self.input_batches.numpy())
    if not start:
      return dataset_fn
    logging.info("Training input resumes at global batch %d", start)
    if resume_dataset_fn:
      return resume_dataset_fn(start)

    def skipped(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
      # A pipeline yields one batch per replica it feeds, each step.
      per_step = ctx.num_replicas_in_sync // ctx.num_input_pipelines
      return dataset_fn(ctx).skip(start * per_step)

    return skipped

  def _train(self, train_iter: Iterator, evaluate: Callable[[], dict] | None,
             sigterm: preemption.SigtermWatcher) -> dict:
    cfg = self.cfg
    plan = cadence.StepCadence.of(cfg.run)
    total = plan.total
    last = {}
    step = start_step = self.step
    if step >= total and evaluate is not None:
      return self._evaluate_finished(train_iter, evaluate)
    self.save_timer.restart()
    stalled_loops = 0
    seconds_per_step = None  # the pace of the last loop (--max_loop_seconds)
    while step < total:
      n = plan.loop_steps(step, cfg.run.steps_per_loop,
                          self.profiler.loop_limit(step),
                          cadence.timed_loop_limit(cfg.run.max_loop_seconds,
                                                   seconds_per_step))
      micro_batches = self.accumulation_steps(step)
      self.profiler.before_loop(step, n)
      t0 = time.time()
      result = self._host_loop(train_iter, n, micro_batches)
      seconds = time.time() - t0
      seconds_per_step = seconds / n
      self.profiler.after_loop(step + n)
      loop_report.check_finite(result, step, n,
                               self.replica_step.skips_nonfinite_steps,
                               self.checkpoints.latest)
      stalled_loops = stalled_loops + 1 if loop_report.stalled(
          result, n, self._loss_scale_at_floor) else 0
      step = self.step
      last = self._log_train(result, n * micro_batches, seconds, step,
                             start_step, total)
      loop_report.check_progress(stalled_loops, step,
                                 self.checkpoints.latest)
      preempted = any_worker(self.strategy, sigterm.received) and step < total
      timed = self.save_timer.due(lambda due: any_worker(self.strategy, due))
      do_save = plan.save_due(step) or timed
      do_eval = evaluate is not None and plan.eval_due(step)
      if self._bn_recomputer and (do_save or do_eval):
        batches = cfg.model.bn_recompute_batches
        self._bn_recomputer.recompute(train_iter, batches)
        self.input_batches.assign_add(batches)
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
    return (self.loss_scale is None or
            float(self.loss_scale.scale.numpy()) <= 1.0)

  def _evaluate_finished(self, train_iter: Iterator,
                         evaluate: Callable[[], dict]) -> dict:
    """A finished run, run again, evaluates its final weights and trains
    nothing; with --bn_stats=recompute their statistics are recomputed
    first (Akiba et al. 2017), which compares both kinds of statistics on
    the same weights. Nothing is saved."""
    logging.info("The run is finished at step %d: evaluating its final "
                 "weights%s.", self.step, " with recomputed BN statistics"
                 if self._bn_recomputer else "")
    if self._bn_recomputer:
      self._bn_recomputer.recompute(train_iter,
                                    self.cfg.model.bn_recompute_batches)
    return evaluate()

  def _host_loop(self, train_iter: Iterator, num_steps: int,
                 micro_batches: int) -> LoopResult:
    if micro_batches == 1:
      sums = self.loops.train(train_iter, tf.constant(num_steps))
    else:
      sums = self.loops.accumulating_train(train_iter, tf.constant(num_steps),
                                           tf.constant(micro_batches))
    result = LoopResult.of(sums)  # blocks until the loop is done
    self.input_batches.assign_add(num_steps * micro_batches)
    return result

  def _log_train(self, result: LoopResult, batches: int, seconds: float,
                 step: int, start_step: int, total: int) -> dict:
    elapsed = time.time() - self._start_time
    record = loop_report.train_record(
        result, step, total,
        images_per_sec=batches * self.cfg.run.global_batch_size / seconds,
        elapsed_s=elapsed,
        eta_s=loop_report.eta_seconds(elapsed, step - start_step,
                                      total - step),
        learning_rate=float(tf.convert_to_tensor(
            self.optimizer.learning_rate)))
    self.metrics.write(record)
    if self._faults:
      self.metrics.flush()  # the count is on disk before a fail stop
      self._faults.report(result.by_source, step)
    if self._loop_callback:
      self._loop_callback(record)
    return record
