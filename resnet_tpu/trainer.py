"""The custom training loop, shared by TPUStrategy and Mirrored strategies.

Ying et al. 2018 train with synchronous data parallelism: every replica takes
`global_batch / replicas` images, gradients are summed across replicas once
(inside the Keras optimizer's apply_gradients), and several steps run per
host call (`steps_per_loop`, the TPU "host loop"), so the host is not on the
critical path.
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

from resnet_tpu.bn_recompute import BNStatisticsRecomputer
from resnet_tpu.config import TrainConfig
from resnet_tpu.metrics_log import MetricsLog
from resnet_tpu.model import build_resnet
from resnet_tpu import optimizers
from resnet_tpu.schedules import EpochSchedule

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]
# Per-step sums reduced over replicas: loss, top-1 hits, top-5 hits, examples.
NUM_SUMS = 4


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
  """The ResNet of `cfg` in the precision of `cfg`."""
  with dtype_policy(cfg.precision):
    return build_resnet(cfg.resnet_depth, cfg.num_classes, cfg.image_size,
                        cfg.bn_group_size, cfg.bn_momentum, cfg.bn_epsilon)


def build_optimizer(cfg: TrainConfig) -> keras.optimizers.Optimizer:
  """The optimizer of `cfg` with its epoch-based LR schedule."""
  clock = cfg.clock
  learning_rate = EpochSchedule(
      cfg.base_learning_rate, images_per_epoch=cfg.num_train_images,
      batch_size_schedule=clock.batch_size_schedule,
      train_epochs=cfg.total_train_epochs, warmup_epochs=cfg.warmup_epochs,
      decay=cfg.lr_schedule, decay_power=cfg.lr_decay_power)
  return optimizers.build_optimizer(
      cfg.optimizer, learning_rate, momentum=cfg.momentum,
      nesterov=cfg.nesterov, weight_decay=cfg.weight_decay,
      lars_eta=cfg.lars_eta, lars_epsilon=cfg.lars_epsilon,
      rmsprop_learning_rate=cfg.rmsprop_learning_rate,
      rmsprop_warmup_center_epochs=cfg.rmsprop_warmup_center_epochs,
      rmsprop_warmup_period_epochs=cfg.rmsprop_warmup_period_epochs,
      clock=clock)


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


@dataclasses.dataclass
class LoopResult:
  """Sums of one host loop, turned into the logged metrics."""
  loss: float
  top1: float
  top5: float
  examples: int

  @classmethod
  def from_sums(cls, sums) -> "LoopResult":
    loss, top1, top5, n = (float(v) for v in sums)
    n = max(n, 1.0)
    return cls(loss / n, top1 / n, top5 / n, int(round(n)))


class Trainer:
  """Owns model, optimizer and checkpoints; runs training and evaluation."""

  def __init__(self, cfg: TrainConfig, strategy: tf.distribute.Strategy):
    self.cfg = cfg
    self.strategy = strategy
    self.num_replicas = strategy.num_replicas_in_sync
    self.chief = is_chief(strategy)
    self.clock = cfg.clock
    with strategy.scope():
      self.model = build_model(cfg)
      self.optimizer = build_optimizer(cfg)
      # Built explicitly before the first traced step (slots must exist as
      # distributed variables, not be created inside a replica function).
      self.optimizer.build(self.model.trainable_variables)
      self._accumulators = (self._make_accumulators()
                            if cfg.batch_size_schedule else [])
    self._bn_recomputer = (BNStatisticsRecomputer(self.model, strategy)
                           if cfg.bn_stats == "recompute" else None)
    in_loss = optimizers.weight_decay_in_loss(cfg.optimizer)
    self._decayed = (decayed_variables(self.model)
                     if in_loss and cfg.weight_decay else [])
    self.checkpoint = tf.train.Checkpoint(model=self.model,
                                          optimizer=self.optimizer)
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
    """Restores the latest checkpoint of model_dir, if any; returns the step."""
    latest = tf.train.latest_checkpoint(self.cfg.model_dir)
    if latest:
      self.checkpoint.restore(latest).assert_existing_objects_matched()
      logging.info("Restored %s at step %d", latest, self.step)
    return self.step

  def save(self) -> str:
    path = self.manager.save(checkpoint_number=self.optimizer.iterations)
    if self.chief:
      logging.info("Saved checkpoint %s", path)
    return path

  # --- replica functions ---------------------------------------------------

  def _losses_and_hits(self, logits, labels):
    logits = tf.cast(logits, tf.float32)
    one_hot = tf.one_hot(labels, self.cfg.num_classes)
    per_example = keras.losses.categorical_crossentropy(
        one_hot, logits, from_logits=True,
        label_smoothing=self.cfg.label_smoothing)
    top1 = tf.cast(tf.math.in_top_k(labels, logits, 1), tf.float32)
    top5 = tf.cast(tf.math.in_top_k(labels, logits, 5), tf.float32)
    return per_example, top1, top5

  def _gradients(self, images, labels, micro_batches=1):
    """Per-replica gradients of the loss of one (micro-)batch."""
    with tf.GradientTape() as tape:
      logits = self.model(images, training=True)
      per_example, top1, top5 = self._losses_and_hits(logits, labels)
      # Scaled by the GLOBAL batch: the optimizer sums over replicas.
      scale = tf.cast(self.cfg.global_batch_size * micro_batches, tf.float32)
      loss = tf.reduce_sum(per_example) / scale
      if self._decayed:
        l2 = tf.add_n([tf.nn.l2_loss(v) for v in self._decayed])
        loss += (self.cfg.weight_decay * l2 /
                 tf.cast(self.num_replicas * micro_batches, tf.float32))
    grads = tape.gradient(loss, self.model.trainable_variables)
    n = tf.cast(tf.size(labels), tf.float32)
    sums = tf.stack([tf.reduce_sum(per_example), tf.reduce_sum(top1),
                     tf.reduce_sum(top5), n])
    return grads, sums

  def _train_step(self, images, labels):
    grads, sums = self._gradients(images, labels)
    self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
    return sums

  def _accumulate_step(self, images, labels, micro_batches):
    grads, sums = self._gradients(images, labels, micro_batches)
    for acc, grad in zip(self._accumulators, grads):
      acc.assign_add(grad)
    return sums

  def _apply_accumulated(self):
    grads = [acc.read_value() for acc in self._accumulators]
    self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
    for acc in self._accumulators:
      acc.assign(tf.zeros_like(acc))

  def _eval_step(self, images, labels, mask):
    logits = self.model(images, training=False)
    per_example, top1, top5 = self._losses_and_hits(logits, labels)
    mask = tf.cast(mask, tf.float32)
    return tf.stack([tf.reduce_sum(per_example * mask),
                     tf.reduce_sum(top1 * mask), tf.reduce_sum(top5 * mask),
                     tf.reduce_sum(mask)])

  # --- host loops ------------------------------------------------------------

  @tf.function
  def train_loop(self, iterator: Iterator, num_steps: tf.Tensor) -> tf.Tensor:
    """Runs `num_steps` training steps in one call; returns summed metrics."""
    sums = tf.zeros([NUM_SUMS])
    for _ in tf.range(num_steps):
      per_replica = self.strategy.run(self._train_step, args=next(iterator))
      sums += self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                                   axis=None)
    return sums

  @tf.function
  def accumulating_train_loop(self, iterator: Iterator, num_steps: tf.Tensor,
                              micro_batches: tf.Tensor) -> tf.Tensor:
    """Like train_loop, each step summing `micro_batches` micro-batches.

    Batch-size control (Mikami et al. 2018) without new shapes: the input
    batch stays fixed and a larger global batch is `micro_batches` of them,
    BN statistics still per micro-batch. `micro_batches` is a tensor, so a
    batch-size change does not retrace.
    """
    sums = tf.zeros([NUM_SUMS])
    for _ in tf.range(num_steps):
      for _ in tf.range(micro_batches):
        per_replica = self.strategy.run(
            self._accumulate_step, args=next(iterator) + (micro_batches,))
        sums += self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                                     axis=None)
      self.strategy.run(self._apply_accumulated)
    return sums

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
          eval_dataset_fn: DatasetFn | None = None,
          eval_steps: int = 0) -> dict:
    """Trains to cfg.total_train_steps, evaluating and checkpointing.

    Resumes from the latest checkpoint in model_dir. Returns the last eval
    record (or the last train record when there is no eval set).
    """
    cfg = self.cfg
    self._start_time = time.time()
    total = cfg.total_train_steps
    step = self.restore()
    train_iter = iter(self.strategy.distribute_datasets_from_function(
        train_dataset_fn))
    eval_dataset = (self.strategy.distribute_datasets_from_function(
        eval_dataset_fn) if eval_dataset_fn else None)
    eval_every = cfg.eval_every_steps or total
    ckpt_every = cfg.checkpoint_every_steps or eval_every
    last = {}
    start_step = step
    phase_starts = self.clock.phase_start_steps()
    while step < total:
      next_phase = min([s for s in phase_starts if s > step] + [total])
      n = min(cfg.steps_per_loop, next_phase - step,
              eval_every - step % eval_every, ckpt_every - step % ckpt_every)
      micro_batches = self.accumulation_steps(step)
      t0 = time.time()
      if micro_batches == 1:
        sums = self.train_loop(train_iter, tf.constant(n))
      else:
        sums = self.accumulating_train_loop(train_iter, tf.constant(n),
                                            tf.constant(micro_batches))
      result = LoopResult.from_sums(sums)  # blocks until the loop is done
      seconds = time.time() - t0
      step = self.step
      last = self._log_train(result, n * micro_batches, seconds, step,
                             start_step, total)
      do_save = step % ckpt_every == 0 or step == total
      do_eval = eval_dataset is not None and (step % eval_every == 0 or
                                              step == total)
      if self._bn_recomputer and (do_save or do_eval):
        self._bn_recomputer.recompute(train_iter, cfg.bn_recompute_batches)
      if do_save:
        self.save()
      if do_eval:
        last = self.evaluate(eval_dataset, eval_steps)
    self.metrics.flush()
    return last

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
              "elapsed_s": elapsed, "learning_rate": lr}
    self.metrics.write(record)
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
