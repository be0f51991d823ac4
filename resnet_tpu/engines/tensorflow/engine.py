"""TensorFlow's engine for the training loop: the model, optimizer and step
under a tf.distribute strategy, its host loops, and its checkpoints.

The step math is step.py, the host loops host_loops.py (Ying et al. 2018:
many steps per host call), the checkpoints train/checkpoints/tf_files.py; the
loop's policy (cadence, records, stops) is train/loop.py, which this engine
serves (train/engine.py). Workers agree through one all-reduce per flag
(parallel/tensorflow/strategy.any_worker).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Sequence

import tensorflow as tf

from resnet_tpu.config import TrainConfig
from resnet_tpu.engines.tensorflow import iterators
from resnet_tpu.engines.tensorflow.bn_recompute import BNStatisticsRecomputer
from resnet_tpu.engines.tensorflow.host_loops import HostLoops
from resnet_tpu.engines.tensorflow.loss_scale import DynamicLossScale
from resnet_tpu.engines.tensorflow.step import make_accumulators
from resnet_tpu.engines.tensorflow.step import ReplicaStep
from resnet_tpu.inputs.input_pipeline import DatasetFn
from resnet_tpu.inputs.shard_audit import DataFaults
from resnet_tpu.model.resnet import build_model
from resnet_tpu.optim.optimizers import build_optimizer_from_config
from resnet_tpu.parallel.tensorflow.strategy import any_worker
from resnet_tpu.parallel.tensorflow.strategy import is_chief
from resnet_tpu.parallel.tensorflow.strategy import PEER_ERRORS
from resnet_tpu.train import loop
from resnet_tpu.train.checkpoints.tf_files import check_workers_agree
from resnet_tpu.train.checkpoints.tf_files import Checkpoints
from resnet_tpu.train.checkpoints.tf_files import worker_checkpoint_dir
from resnet_tpu.train.engine import LoopCallback
from resnet_tpu.train.engine import ModelFn
from resnet_tpu.train.loop_result import LoopResult

@dataclasses.dataclass(frozen=True)
class TrainInput:
  """The training input: `dataset_fn`, and `resume_fn(n)` for the input
  after its first n global batches (input_pipeline's start_step skips
  records before decoding them; None: skip n batches of dataset_fn);
  `num_sources` files whose faults each step counts (shard_audit.py)."""
  dataset_fn: DatasetFn
  resume_fn: Callable[[int], DatasetFn] | None = None
  num_sources: int = 0


@dataclasses.dataclass(frozen=True)
class EvalInput:
  """The eval set: `dataset_fn` and the `steps` that read all of it."""
  dataset_fn: DatasetFn
  steps: int


class TensorFlowEngine:
  """Owns model, optimizer, step, host loops and checkpoints."""

  trace = None  # tf.profiler: train/profiling.py's default

  def __init__(self, cfg: TrainConfig, strategy: tf.distribute.Strategy,
               model_fn: ModelFn | None = None,
               bn_groups: Sequence[Sequence[int]] | None = None):
    """model_fn: builds the network (default: model.build_model with
    `bn_groups`, the TPU placement's BN groups)."""
    self.cfg = cfg
    self.strategy = strategy
    self.chief = is_chief(strategy)
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
      self._input_batches = tf.Variable(0, dtype=tf.int64, trainable=False,
                                        name="input_batches")
    self.replica_step = ReplicaStep(cfg, self.model, self.optimizer,
                                    strategy.num_replicas_in_sync,
                                    accumulators, self.loss_scale)
    self.skips_nonfinite = self.replica_step.skips_nonfinite_steps
    self.loops = HostLoops(strategy, self.replica_step)
    self._bn_recomputer = (BNStatisticsRecomputer(self.model, strategy)
                           if cfg.model.bn_stats == "recompute" else None)
    self.checkpoints = Checkpoints(
        cfg, self.model, self.optimizer, self._input_batches,
        worker_checkpoint_dir(cfg.model_dir, strategy, self.chief),
        self.chief, self.loss_scale)
    self._train_iter = None
    self._eval_input: iterators.EvalInput | None = None

  def fit(self, train_dataset_fn: DatasetFn,
          eval_dataset_fn: DatasetFn | None = None, eval_steps: int = 0,
          resume_dataset_fn: Callable[[int], DatasetFn] | None = None,
          faults: DataFaults | None = None,
          loop_callback: LoopCallback | None = None) -> dict:
    """train/loop.fit on these inputs (TrainInput, EvalInput)."""
    return loop.fit(
        self, TrainInput(train_dataset_fn, resume_dataset_fn,
                         faults.num_sources if faults else 0),
        EvalInput(eval_dataset_fn, eval_steps) if eval_dataset_fn else None,
        faults, loop_callback)

  def reload_weights(self) -> None:
    """The step reads the Keras variables themselves (warm_start.py sets
    them): nothing to reload."""

  @property
  def step(self) -> int:
    return int(self.optimizer.iterations.numpy())

  @property
  def input_batches(self) -> int:
    return int(self._input_batches.numpy())

  def restore(self) -> str | None:
    return self.checkpoints.restore()

  def check_restored_agree(self) -> None:
    """One all-gather of every worker's step and input position
    (tf_files.RestoreMismatch)."""
    check_workers_agree(self.strategy, self.step, self.input_batches)

  def start_input(self, train_input: TrainInput) -> None:
    self.replica_step.num_sources = train_input.num_sources
    self._train_iter = iter(self.strategy.distribute_datasets_from_function(
        self._positioned(train_input)))

  def _positioned(self, train_input: TrainInput) -> DatasetFn:
    """The training input, after the `input_batches` already read."""
    start = self.input_batches
    if not start:
      return train_input.dataset_fn
    if train_input.resume_fn:
      return train_input.resume_fn(start)
    dataset_fn = train_input.dataset_fn

    def skipped(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
      # A pipeline yields one batch per replica it feeds, each step.
      per_step = ctx.num_replicas_in_sync // ctx.num_input_pipelines
      return dataset_fn(ctx).skip(start * per_step)

    return skipped

  def host_loop(self, num_steps: int, micro_batches: int) -> LoopResult:
    if micro_batches == 1:
      sums = self.loops.train(self._train_iter, tf.constant(num_steps))
    else:
      sums = self.loops.accumulating_train(
          self._train_iter, tf.constant(num_steps),
          tf.constant(micro_batches))
    result = LoopResult.of(sums)  # blocks until the loop is done
    self._input_batches.assign_add(num_steps * micro_batches)
    return result

  def evaluate(self, eval_input: EvalInput) -> LoopResult:
    """Evaluations of the same eval set share one iterator
    (iterators.EvalInput); close_inputs releases it."""
    if not (self._eval_input and self._eval_input.serves(
        eval_input.dataset_fn, eval_input.steps)):
      self._close_eval()
      self._eval_input = iterators.EvalInput(
          self.strategy, eval_input.dataset_fn, eval_input.steps)
    return LoopResult.of(self.loops.eval(self._eval_input.iterator,
                                         tf.constant(eval_input.steps)))

  def recompute_bn(self, num_batches: int) -> None:
    self._bn_recomputer.recompute(self._train_iter, num_batches)
    self._input_batches.assign_add(num_batches)

  def save(self) -> str:
    return self.checkpoints.save()

  def latest(self) -> str | None:
    return self.checkpoints.latest()

  def any_process(self, flags: Sequence[bool]) -> list[bool]:
    return [any_worker(self.strategy, flag) for flag in flags]

  def loss_scale_at_floor(self) -> bool:
    return (self.loss_scale is None or
            float(self.loss_scale.scale.numpy()) <= 1.0)

  def learning_rate(self) -> float:
    return float(tf.convert_to_tensor(self.optimizer.learning_rate))

  def running(self) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()

  def lost_peer(self, error: Exception) -> str | None:
    """A collective that failed on a multi-worker strategy: a peer is
    gone."""
    if not (isinstance(error, PEER_ERRORS) and isinstance(
        self.strategy, tf.distribute.MultiWorkerMirroredStrategy)):
      return None
    return f"{type(error).__name__}: {error.message.splitlines()[0]}"

  def close_inputs(self) -> None:
    """Releases the input iterators in the background (iterators.release),
    so a run returns as soon as its last step, save and eval are done."""
    owned = [self._train_iter]
    self._train_iter = None
    iterators.release(owned)
    self._close_eval()

  def _close_eval(self) -> None:
    if self._eval_input:
      self._eval_input.close()
      self._eval_input = None
