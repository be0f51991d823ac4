"""The custom training loop, shared by TPUStrategy and Mirrored strategies.

Ying et al. 2018 train with synchronous data parallelism: every replica takes
`global_batch / replicas` images, gradients are summed across replicas once
(inside the Keras optimizer's apply_gradients), and several steps run per
host call (`steps_per_loop`, the TPU "host loop"), so the host is not on the
critical path.

Reliability (README "Reliability"): a checkpoint holds the model, the
optimizer (slots and step) and `input_batches`, the global batches read from
the training input, so a resumed run reads exactly the batches the
interrupted one would have read next. Between host loops the trainer checks
for SIGTERM (preemption.py) and for non-finite loss or gradients; a run stops
with a checkpoint (`Preempted`) or without overwriting the last good one
(`NonFiniteLossError`), or skips such steps with --skip_nonfinite_steps.
Examples labelled -1 (undecodable images, see data_checks.py) weigh 0.
"""
import contextlib
import dataclasses
import math
import os
import time
from typing import Callable, Iterator

from absl import logging
import keras
import tensorflow as tf

from resnet_tpu import bfloat16_convs
from resnet_tpu import collectives
from resnet_tpu.bn_recompute import BNStatisticsRecomputer
from resnet_tpu.config import TrainConfig
from resnet_tpu.metrics_log import MetricsLog
from resnet_tpu.model import build_resnet
from resnet_tpu import optimizers
from resnet_tpu import preemption
from resnet_tpu.schedules import EpochSchedule

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]
# Per-step sums reduced over replicas: loss, top-1 hits, top-5 hits, examples.
NUM_SUMS = 4
# A training step adds undecodable (skipped) images and a non-finite flag.
NUM_STEP_SUMS = NUM_SUMS + 2
# A training loop returns the sums of its finite steps, undecodable images,
# the number of non-finite steps and the index of the first one (-1: none).
NUM_LOOP_OUTPUTS = NUM_SUMS + 3


class NonFiniteLossError(RuntimeError):
  """The loss or the gradients were NaN/Inf; no checkpoint was written."""


@contextlib.contextmanager
def dtype_policy(precision: str):
  """Keras dtype policy for building the model: mixed_bfloat16 or float32."""
  previous = keras.config.dtype_policy()
  keras.config.set_dtype_policy(
      "mixed_bfloat16" if precision == "bfloat16" else "float32")
  try:
    yield
  finally:
    keras.config.set_dtype_policy(previous)


def build_model(cfg: TrainConfig) -> keras.Model:
  """The ResNet of `cfg` in the precision of `cfg`.

  Under a strategy scope, --bfloat16_conv_kernels=auto resolves for the
  strategy's devices (resnet_tpu/bfloat16_convs.py).
  """
  float32_kernels = False
  if cfg.precision == "bfloat16":
    float32_kernels = bfloat16_convs.use_float32_kernels(
        cfg.bfloat16_conv_kernels, bfloat16_convs.model_device_types())
    logging.info("bfloat16 convs run on %s kernels (--bfloat16_conv_kernels"
                 "=%s)", "float32" if float32_kernels else "native bfloat16",
                 cfg.bfloat16_conv_kernels)
  with dtype_policy(cfg.precision):
    return build_resnet(cfg.resnet_depth, cfg.num_classes, cfg.image_size,
                        cfg.bn_group_size, cfg.bn_momentum, cfg.bn_epsilon,
                        float32_kernels=float32_kernels)


def build_optimizer(cfg: TrainConfig) -> keras.optimizers.Optimizer:
  """The optimizer of `cfg` with its epoch-based LR schedule."""
  clock = cfg.clock
  learning_rate = EpochSchedule(
      cfg.base_learning_rate, images_per_epoch=cfg.num_train_images,
      batch_size_schedule=clock.batch_size_schedule,
      train_epochs=cfg.total_train_epochs, warmup_epochs=cfg.warmup_epochs,
      decay=cfg.lr_schedule, decay_power=cfg.lr_decay_power,
      scaling=cfg.learning_rate_scaling,
      end_learning_rate=cfg.end_learning_rate)
  return optimizers.build_optimizer(
      cfg.optimizer, learning_rate, momentum=cfg.momentum,
      nesterov=cfg.nesterov, weight_decay=cfg.weight_decay,
      lars_eta=cfg.lars_eta, lars_epsilon=cfg.lars_epsilon,
      rmsprop_learning_rate=cfg.rmsprop_learning_rate,
      rmsprop_warmup_center_epochs=cfg.rmsprop_warmup_center_epochs,
      rmsprop_warmup_period_epochs=cfg.rmsprop_warmup_period_epochs,
      clock=clock, gradient_all_reduce=cfg.gradient_all_reduce,
      all_reduce_grid=collectives.parse_grid(cfg.all_reduce_grid))


def decayed_variables(model: keras.Model) -> list[tf.Variable]:
  """Conv and dense kernels: the only variables under L2 weight decay."""
  return [v for v in model.trainable_variables if v.path.endswith("kernel")]


def is_chief(strategy: tf.distribute.Strategy) -> bool:
  """True on the worker that writes checkpoints, logs and summaries."""
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is None or not resolver.task_type:
    return True
  return (resolver.task_type == "chief" or
          (resolver.task_type == "worker" and resolver.task_id == 0 and
           "chief" not in resolver.cluster_spec().as_dict()))


def all_finite(tensors: list[tf.Tensor]) -> tf.Tensor:
  """True when no element of any tensor is NaN or Inf."""
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


def _add_step(outputs: tf.Tensor, step_sums: tf.Tensor,
              index: tf.Tensor) -> tf.Tensor:
  """Adds one step's NUM_STEP_SUMS to a loop's NUM_LOOP_OUTPUTS.

  A non-finite step adds nothing to the metric sums (its loss is NaN), so
  the loop's metrics describe the steps that were applied.
  """
  nonfinite = step_sums[-1] > 0
  sums = tf.where(nonfinite, tf.zeros([NUM_SUMS + 1]), step_sums[:-1])
  first = outputs[-1]
  first = tf.where(nonfinite & (first < 0), tf.cast(index, tf.float32), first)
  return tf.concat([outputs[:NUM_SUMS + 1] + sums,
                    [outputs[-2] + tf.cast(nonfinite, tf.float32), first]], 0)


def _empty_loop_outputs() -> tf.Tensor:
  return tf.concat([tf.zeros([NUM_LOOP_OUTPUTS - 1]), [-1.0]], 0)


@dataclasses.dataclass
class LoopResult:
  """Sums of one host loop, turned into the logged metrics."""
  loss: float
  top1: float
  top5: float
  examples: int
  undecodable_images: int = 0
  nonfinite_steps: int = 0
  first_nonfinite: int = -1  # index of the first non-finite step in the loop

  @classmethod
  def from_sums(cls, sums) -> "LoopResult":
    """From eval sums (NUM_SUMS) or train loop outputs (NUM_LOOP_OUTPUTS)."""
    values = [float(v) for v in sums]
    loss, top1, top5, n = values[:NUM_SUMS]
    counts = [int(round(v)) for v in values[NUM_SUMS:]]
    n = max(n, 1.0)
    return cls(loss / n, top1 / n, top5 / n, int(round(values[3])), *counts)


class Trainer:
  """Owns model, optimizer and checkpoints; runs training and evaluation."""

  def __init__(self, cfg: TrainConfig, strategy: tf.distribute.Strategy,
               model_fn: Callable[[TrainConfig], keras.Model] | None = None):
    """`model_fn` (default: build_model) lets benchmarks train another net."""
    self.cfg = cfg
    self.strategy = strategy
    self.num_replicas = strategy.num_replicas_in_sync
    self.chief = is_chief(strategy)
    self.clock = cfg.clock
    with strategy.scope():
      self.model = (model_fn or build_model)(cfg)
      self.optimizer = build_optimizer(cfg)
      # Built explicitly before the first traced step (slots must exist as
      # distributed variables, not be created inside a replica function).
      self.optimizer.build(self.model.trainable_variables)
      self._accumulators = (self._make_accumulators()
                            if cfg.batch_size_schedule else [])
      # Global batches read from the training input (micro-batches and BN
      # recomputation included): where a resumed run starts reading.
      self.input_batches = tf.Variable(0, dtype=tf.int64, trainable=False,
                                       name="input_batches")
    self._bn_recomputer = (BNStatisticsRecomputer(self.model, strategy)
                           if cfg.bn_stats == "recompute" else None)
    in_loss = optimizers.weight_decay_in_loss(cfg.optimizer)
    self._decayed = (decayed_variables(self.model)
                     if in_loss and cfg.weight_decay else [])
    self.checkpoint = tf.train.Checkpoint(model=self.model,
                                          optimizer=self.optimizer,
                                          input_batches=self.input_batches)
    self.manager = tf.train.CheckpointManager(
        self.checkpoint, self._checkpoint_dir(),
        max_to_keep=cfg.keep_checkpoints)
    self.metrics = MetricsLog(cfg.model_dir, enabled=self.chief)

  def _make_accumulators(self) -> list[tf.Variable]:
    """Per-replica gradient sums for batch-size control (never summed)."""
    return [tf.Variable(tf.zeros_like(v), trainable=False,
                        synchronization=tf.VariableSynchronization.ON_READ,
                        aggregation=tf.VariableAggregation.SUM)
            for v in self.model.trainable_variables]

  def accumulation_steps(self, step: int) -> int:
    """Micro-batches per optimizer step at `step` (Mikami et al.)."""
    return self.clock.global_batch_at_step(step) // self.cfg.global_batch_size

  def _checkpoint_dir(self) -> str:
    if self.chief:
      return self.cfg.model_dir
    # Non-chief workers take part in saving but write to a scratch folder.
    task = self.strategy.cluster_resolver.task_id
    return os.path.join(self.cfg.model_dir, f".worker_{task}_scratch")

  @property
  def step(self) -> int:
    return int(self.optimizer.iterations.numpy())

  def restore(self) -> int:
    """Restores the latest checkpoint of model_dir, if any; returns the step.

    The `checkpoint` state file is written only after a checkpoint's data
    files (tf.train.CheckpointManager), so a save cut short leaves the
    previous checkpoint as the latest. Metric records of steps after the
    restored one (training that is about to be redone) are dropped.
    """
    cfg = self.cfg
    latest = tf.train.latest_checkpoint(cfg.model_dir)
    if not latest:
      return self.step
    try:
      self.checkpoint.restore(latest).assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
      reason = str(e).split("\n", 1)[0]  # Keras appends the whole variable
      raise ValueError(
          f"--model_dir={cfg.model_dir!r}: cannot restore {latest} into this "
          f"run (--resnet_depth={cfg.resnet_depth}, --num_classes="
          f"{cfg.num_classes}, --optimizer={cfg.optimizer}): {reason}\nIf "
          "another network wrote it, use a new --model_dir or that run's "
          "flags (its config.json).") from e
    dropped = self.metrics.drop_after(self.step)
    logging.info("Restored %s at step %d (input at global batch %d)%s",
                 latest, self.step, int(self.input_batches.numpy()),
                 f"; dropped {dropped} metric records of later steps"
                 if dropped else "")
    return self.step

  def save(self) -> str:
    path = self.manager.save(checkpoint_number=self.optimizer.iterations)
    if self.chief:
      logging.info("Saved checkpoint %s", path)
    return path

  # --- replica functions ---------------------------------------------------

  def _losses_and_hits(self, logits, labels):
    """Per-example loss, top-1 and top-5 hits and weight (0 for label -1)."""
    logits = tf.cast(logits, tf.float32)
    weight = tf.cast(labels >= 0, tf.float32)
    labels = tf.maximum(labels, 0)
    one_hot = tf.one_hot(labels, self.cfg.num_classes)
    per_example = keras.losses.categorical_crossentropy(
        one_hot, logits, from_logits=True,
        label_smoothing=self.cfg.label_smoothing)
    top1 = tf.cast(tf.math.in_top_k(labels, logits, 1), tf.float32)
    top5 = tf.cast(tf.math.in_top_k(labels, logits, 5), tf.float32)
    return per_example * weight, top1 * weight, top5 * weight, weight

  def _gradients(self, images, labels, micro_batches=1):
    """Per-replica gradients and NUM_SUMS + 1 sums of one (micro-)batch."""
    with tf.GradientTape() as tape:
      logits = self.model(images, training=True)
      per_example, top1, top5, weight = self._losses_and_hits(logits, labels)
      # Scaled by the GLOBAL batch: the optimizer sums over replicas.
      scale = tf.cast(self.cfg.global_batch_size * micro_batches, tf.float32)
      loss = tf.reduce_sum(per_example) / scale
      if self._decayed:
        l2 = tf.add_n([tf.nn.l2_loss(v) for v in self._decayed])
        loss += (self.cfg.weight_decay * l2 /
                 tf.cast(self.num_replicas * micro_batches, tf.float32))
    grads = tape.gradient(loss, self.model.trainable_variables)
    n = tf.reduce_sum(weight)
    sums = tf.stack([tf.reduce_sum(per_example), tf.reduce_sum(top1),
                     tf.reduce_sum(top5), n,
                     tf.cast(tf.size(labels), tf.float32) - n])
    return grads, sums

  def _apply(self, grads):
    self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))

  def _train_step(self, images, labels):
    """One step; returns its NUM_STEP_SUMS, the last one > 0 if non-finite."""
    skip = self.cfg.skip_nonfinite_steps
    stats = ([tf.identity(v.value) for v in self.model.non_trainable_variables]
             if skip else [])
    grads, sums = self._gradients(images, labels)
    nonfinite = 1.0 - tf.cast(all_finite([sums[0]] + grads), tf.float32)
    if skip:
      nonfinite = tf.distribute.get_replica_context().all_reduce(
          tf.distribute.ReduceOp.SUM, nonfinite)
      self._apply_if_finite(nonfinite, grads, stats)
    else:
      self._apply(grads)
    return tf.concat([sums, [nonfinite]], 0)

  def _apply_if_finite(self, nonfinite, grads, stats):
    """--skip_nonfinite_steps: a step that was not finite on any replica
    leaves no trace: no optimizer update, no step count, BN moving statistics
    put back to `stats`.

    `nonfinite` is summed over all replicas, so every replica and worker
    takes the same branch and the collectives inside it match. Strategies
    that synchronise through merge_call need the branch in cross-replica
    context (as keras.optimizers.LossScaleOptimizer does).
    """
    finite = tf.equal(nonfinite, 0.0)
    if tf.__internal__.distribute.strategy_supports_no_merge_call():
      tf.cond(finite, lambda: self._apply(grads),
              lambda: self._put_back(stats))
    else:
      tf.distribute.get_replica_context().merge_call(
          self._apply_if_finite_cross_replica, args=(finite, grads, stats))

  def _put_back(self, stats):
    for variable, value in zip(self.model.non_trainable_variables, stats):
      variable.assign(value)

  def _apply_if_finite_cross_replica(self, strategy, finite, grads, stats):
    finite = strategy.experimental_local_results(finite)[0]

    def apply():
      strategy.extended.call_for_each_replica(self._apply, args=(grads,))

    def put_back():
      for variable, value in zip(self.model.non_trainable_variables, stats):
        strategy.extended.update(variable.value, lambda v, x: v.assign(x),
                                 args=(value,), group=False)

    tf.cond(finite, apply, put_back)

  def _accumulate_step(self, images, labels, micro_batches):
    grads, sums = self._gradients(images, labels, micro_batches)
    for acc, grad in zip(self._accumulators, grads):
      acc.assign_add(grad)
    return sums

  def _apply_accumulated(self):
    """Applies the accumulated gradients; returns 1.0 if non-finite."""
    grads = [acc.read_value() for acc in self._accumulators]
    self._apply(grads)
    for acc in self._accumulators:
      acc.assign(tf.zeros_like(acc))
    return 1.0 - tf.cast(all_finite(grads), tf.float32)

  def _eval_step(self, images, labels, mask):
    logits = self.model(images, training=False)
    per_example, top1, top5, _ = self._losses_and_hits(logits, labels)
    mask = tf.cast(mask, tf.float32)
    return tf.stack([tf.reduce_sum(per_example * mask),
                     tf.reduce_sum(top1 * mask), tf.reduce_sum(top5 * mask),
                     tf.reduce_sum(mask)])

  # --- host loops ------------------------------------------------------------

  @tf.function
  def train_loop(self, iterator: Iterator, num_steps: tf.Tensor) -> tf.Tensor:
    """Runs `num_steps` training steps in one call.

    Returns NUM_LOOP_OUTPUTS: loss, top-1 and top-5 hits and examples summed
    over the finite steps, undecodable images, the number of steps with
    non-finite loss or gradients, and the loop index of the first (-1: none).
    """
    outputs = _empty_loop_outputs()
    for i in tf.range(num_steps):
      per_replica = self.strategy.run(self._train_step, args=next(iterator))
      outputs = _add_step(outputs, self.strategy.reduce(
          tf.distribute.ReduceOp.SUM, per_replica, axis=None), i)
    return outputs

  @tf.function
  def accumulating_train_loop(self, iterator: Iterator, num_steps: tf.Tensor,
                              micro_batches: tf.Tensor) -> tf.Tensor:
    """Like train_loop, each step summing `micro_batches` micro-batches.

    Batch-size control (Mikami et al. 2018) without new shapes: the input
    batch stays fixed and a larger global batch is `micro_batches` of them,
    BN statistics still per micro-batch. `micro_batches` is a tensor, so a
    batch-size change does not retrace.
    """
    outputs = _empty_loop_outputs()
    sums = tf.zeros([NUM_SUMS + 1])
    # One flat loop: nested while loops here trip Grappler's arithmetic
    # optimizer (AlreadyExists on an AddOpsRewrite TemporaryVariable) from
    # the second call on.
    for micro in tf.range(num_steps * micro_batches):
      per_replica = self.strategy.run(
          self._accumulate_step, args=next(iterator) + (micro_batches,))
      sums += self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                                   axis=None)
      if (micro + 1) % micro_batches == 0:
        nonfinite = self.strategy.reduce(
            tf.distribute.ReduceOp.SUM,
            self.strategy.run(self._apply_accumulated), axis=None)
        outputs = _add_step(outputs, tf.concat([sums, [nonfinite]], 0),
                            micro // micro_batches)
        sums = tf.zeros([NUM_SUMS + 1])
    return outputs

  @tf.function
  def eval_loop(self, iterator: Iterator, num_steps: tf.Tensor) -> tf.Tensor:
    sums = tf.zeros([NUM_SUMS])
    for _ in tf.range(num_steps):
      per_replica = self.strategy.run(self._eval_step, args=next(iterator))
      sums += self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                                   axis=None)
    return sums

  def evaluate(self, eval_dataset: tf.distribute.DistributedDataset,
               eval_steps: int) -> dict:
    """Top-1/top-5 over every example of the eval set (padding masked out)."""
    start = time.time()
    result = LoopResult.from_sums(
        self.eval_loop(iter(eval_dataset), tf.constant(eval_steps)))
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

  def fit(self, train_dataset_fn: DatasetFn,
          eval_dataset_fn: DatasetFn | None = None, eval_steps: int = 0,
          resume_dataset_fn: Callable[[int], DatasetFn] | None = None
          ) -> dict:
    """Trains to cfg.total_train_steps, evaluating and checkpointing.

    Resumes from the latest checkpoint in model_dir, input included: reading
    continues at global batch `input_batches`, from
    `resume_dataset_fn(input_batches)` when given (input_pipeline's
    start_step skips records before decoding them), else by skipping that
    many batches of `train_dataset_fn`. Returns the last eval record (or the
    last train record when there is no eval set).

    Raises preemption.Preempted after checkpointing when any worker got
    SIGTERM, preemption.WorkerLost when a peer worker failed, and
    NonFiniteLossError, without saving, on a NaN/Inf loss or gradient unless
    cfg.skip_nonfinite_steps.
    """
    self._start_time = time.time()
    self.restore()
    train_iter = iter(self.strategy.distribute_datasets_from_function(
        self._positioned_input(train_dataset_fn, resume_dataset_fn)))
    eval_dataset = (self.strategy.distribute_datasets_from_function(
        eval_dataset_fn) if eval_dataset_fn else None)
    try:
      with preemption.SigtermWatcher() as sigterm:
        return self._train(train_iter, eval_dataset, eval_steps, sigterm)
    except preemption.PEER_ERRORS as e:
      if not isinstance(self.strategy,
                        tf.distribute.MultiWorkerMirroredStrategy):
        raise
      raise preemption.WorkerLost(
          f"Lost contact with another worker after step {self.step} "
          f"({type(e).__name__}: {e.message.splitlines()[0]}). Restart "
          "every worker with the same flags to resume from "
          f"{tf.train.latest_checkpoint(self.cfg.model_dir)}.") from e
    finally:
      self.metrics.flush()

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

  def _train(self, train_iter: Iterator,
             eval_dataset: tf.distribute.DistributedDataset | None,
             eval_steps: int, sigterm: preemption.SigtermWatcher) -> dict:
    cfg = self.cfg
    total = cfg.total_train_steps
    eval_every = cfg.eval_every_steps or total
    ckpt_every = cfg.checkpoint_every_steps or eval_every
    last = {}
    step = start_step = self.step
    phase_starts = self.clock.phase_start_steps()
    while step < total:
      next_phase = min([s for s in phase_starts if s > step] + [total])
      n = min(cfg.steps_per_loop, next_phase - step,
              eval_every - step % eval_every, ckpt_every - step % ckpt_every)
      micro_batches = self.accumulation_steps(step)
      t0 = time.time()
      result = self._host_loop(train_iter, n, micro_batches)
      seconds = time.time() - t0
      self._check_finite(result, step, n)
      step = self.step
      last = self._log_train(result, n * micro_batches, seconds, step,
                             start_step, total)
      preempted = sigterm.any_worker_received(self.strategy) and step < total
      do_save = step % ckpt_every == 0 or step == total
      do_eval = eval_dataset is not None and (step % eval_every == 0 or
                                              step == total)
      if self._bn_recomputer and (do_save or do_eval):
        self._bn_recomputer.recompute(train_iter, cfg.bn_recompute_batches)
        self.input_batches.assign_add(cfg.bn_recompute_batches)
      if do_save or preempted:
        path = self.save()
      if do_eval:
        last = self.evaluate(eval_dataset, eval_steps)
      if preempted:
        raise preemption.Preempted(
            f"Preempted (SIGTERM) at step {step}/{total}: saved {path}. Run "
            "the same command again to resume; exit code "
            f"{preemption.PREEMPTED_EXIT_CODE}.")
    return last

  def _host_loop(self, train_iter: Iterator, num_steps: int,
                 micro_batches: int) -> LoopResult:
    if micro_batches == 1:
      outputs = self.train_loop(train_iter, tf.constant(num_steps))
    else:
      outputs = self.accumulating_train_loop(train_iter,
                                             tf.constant(num_steps),
                                             tf.constant(micro_batches))
    result = LoopResult.from_sums(outputs)  # blocks until the loop is done
    self.input_batches.assign_add(num_steps * micro_batches)
    return result

  def _check_finite(self, result: LoopResult, first_step: int,
                    num_steps: int) -> None:
    """Raises NonFiniteLossError, or logs the steps that were skipped."""
    if not result.nonfinite_steps:
      return
    loop = f"host loop of steps {first_step + 1}-{first_step + num_steps}"
    if self.cfg.skip_nonfinite_steps:
      logging.warning("Skipped %d step(s) with NaN/Inf loss or gradients in "
                      "the %s (--skip_nonfinite_steps): not applied.",
                      result.nonfinite_steps, loop)
      return
    latest = tf.train.latest_checkpoint(self.cfg.model_dir)
    raise NonFiniteLossError(
        "Loss or gradients are NaN/Inf at step "
        f"{first_step + result.first_nonfinite + 1} ({loop}). Stopped "
        "without saving; the last good checkpoint is "
        f"{latest or 'none (none was written yet)'} and stays the latest. "
        "Restart to resume from it (e.g. with a lower --base_learning_rate "
        "or --precision=float32), or set --skip_nonfinite_steps to skip such "
        "steps.")

  def _log_train(self, result: LoopResult, batches: int, seconds: float,
                 step: int, start_step: int, total: int) -> dict:
    elapsed = time.time() - self._start_time
    done = step - start_step
    eta = elapsed / done * (total - step) if done else math.nan
    images_per_sec = batches * self.cfg.global_batch_size / seconds
    lr = float(tf.convert_to_tensor(self.optimizer.learning_rate))
    record = {"step": step, "split": "train", "loss": result.loss,
              "top1": result.top1, "top5": result.top5,
              "examples": result.examples, "images_per_sec": images_per_sec,
              "elapsed_s": elapsed, "learning_rate": lr,
              "undecodable_images": result.undecodable_images,
              "skipped_steps": result.nonfinite_steps}
    self.metrics.write(record)
    if result.undecodable_images:
      logging.warning("Skipped %d undecodable image(s) in the steps up to %d "
                      "(counted in metrics.jsonl as undecodable_images).",
                      result.undecodable_images, step)
    logging.info("step %d/%d: loss %.4f top-1 %.4f lr %.4g %.1f images/s "
                 "ETA %s", step, total, result.loss, result.top1, lr,
                 images_per_sec, _format_seconds(eta))
    return record


def _format_seconds(seconds: float) -> str:
  if math.isnan(seconds):
    return "?"
  minutes, secs = divmod(int(seconds), 60)
  hours, minutes = divmod(minutes, 60)
  return f"{hours}:{minutes:02d}:{secs:02d}"
