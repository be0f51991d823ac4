"""TensorFlow's part of the run's story (run.py): start-up under a
tf.distribute strategy, the engine, and the input as tf.data datasets.

The strategy kind was decided before TensorFlow loaded (main.py,
runtime/process_setup.py); here the virtual CPU replicas are made before
anything starts TensorFlow's runtime, and the strategy is built after the
pre-flight (parallel/tensorflow/strategy.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from resnet_tpu import config as config_lib
from resnet_tpu.config import TrainConfig
from resnet_tpu.engines.tensorflow.engine import EvalInput
from resnet_tpu.engines.tensorflow.engine import TensorFlowEngine
from resnet_tpu.engines.tensorflow.engine import TrainInput
from resnet_tpu.inputs import input_pipeline
from resnet_tpu.parallel.tensorflow.strategy import configure_cpu_replicas
from resnet_tpu.parallel.tensorflow.strategy import create_strategy
from resnet_tpu.parallel.tensorflow.strategy import Distribution
from resnet_tpu.runtime import device_check
from resnet_tpu.runtime import host_memory
from resnet_tpu.runtime import process_setup
from resnet_tpu.train.engine import ModelFn

if TYPE_CHECKING:
  from resnet_tpu.data_checks import DataFiles


def start(cfg: TrainConfig, distribution: Distribution | None = None
          ) -> tuple[TrainConfig, Distribution | None]:
  """Validates `cfg` for this host and makes its virtual CPU replicas;
  returns cfg with its strategy kind resolved, and `distribution` (an
  already built strategy of that kind: tests; None builds it in
  `build`)."""
  cfg = config_lib.validate_start_up(
      cfg, process_setup.strategy_kind(cfg.distribution),
      makes_cpu_replicas=distribution is None)
  dist = cfg.distribution
  build_cpu_replicas = dist.strategy == "cpu" and distribution is None
  device_check.require_accelerator(dist.strategy)
  if build_cpu_replicas:
    # Virtual devices must exist before anything (the pre-flight's reads)
    # starts TensorFlow's runtime.
    configure_cpu_replicas(dist.num_cpu_replicas)
  return cfg, distribution


def build(cfg: TrainConfig, distribution: Distribution | None,
          model_fn: ModelFn | None = None) -> TensorFlowEngine:
  """The strategy (unless given), then the engine under it."""
  dist = cfg.distribution
  distribution = distribution or create_strategy(
      dist, bn_group_size=cfg.model.bn_group_size)
  strategy = distribution.strategy
  device_check.log_start_up(strategy)
  # A CPU tuning: only where the model runs on CPU devices (after the
  # runtime's devices are set up).
  if dist.keep_host_memory and process_setup.cpu_tunings_apply(
      dist.strategy):
    host_memory.keep_freed_memory()
  config_lib.validate_replicas(cfg, strategy.num_replicas_in_sync)
  return TensorFlowEngine(cfg, strategy, model_fn=model_fn,
                          bn_groups=distribution.bn_groups)


def synthetic_input(cfg: TrainConfig) -> TrainInput:
  """One constant batch: a resumed run needs no skipping."""
  model = cfg.model
  train_fn = input_pipeline.synthetic_dataset_fn(
      model.image_size, model.num_classes, cfg.run.global_batch_size,
      cfg.transfer_dtype)
  return TrainInput(train_fn, lambda _: train_fn)


def record_input(cfg: TrainConfig, found: DataFiles, num_eval: int,
                 num_sources: int) -> tuple[TrainInput, EvalInput]:
  """The TFRecord files `found` as distributed datasets."""
  model, run_cfg = cfg.model, cfg.run
  shape = dict(image_size=model.image_size, num_classes=model.num_classes,
               dtype=cfg.transfer_dtype)

  def train_fn(start_step: int = 0) -> input_pipeline.DatasetFn:
    return input_pipeline.train_dataset_fn(
        cfg.input, found.train, run_cfg.global_batch_size, **shape,
        seed=run_cfg.seed, start_step=start_step)

  return (TrainInput(train_fn(), train_fn, num_sources),
          EvalInput(input_pipeline.eval_dataset_fn(
              cfg.input, found.validation, run_cfg.eval_batch_size, num_eval,
              **shape), input_pipeline.eval_steps(num_eval,
                                                  run_cfg.eval_batch_size)))
