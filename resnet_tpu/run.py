"""One training run, config to metrics: strategy -> data -> trainer.

main.py parses flags into a TrainConfig and calls `run`; tests and the Colab
notebook call it directly.
"""
import dataclasses

from absl import logging
import tensorflow as tf

from resnet_tpu import config as config_lib
from resnet_tpu.runtime import device_check
from resnet_tpu import export
from resnet_tpu.runtime import host_memory
from resnet_tpu.inputs import input_pipeline
from resnet_tpu import preflight
from resnet_tpu.inputs import preprocessing
from resnet_tpu.runtime import process_setup
from resnet_tpu.optim import schedules
from resnet_tpu.inputs import shard_audit
from resnet_tpu.config import TrainConfig
from resnet_tpu.parallel.strategy import configure_cpu_replicas
from resnet_tpu.parallel.strategy import create_strategy
from resnet_tpu.parallel.strategy import Distribution
from resnet_tpu.train.trainer import LoopCallback
from resnet_tpu.train.trainer import ModelFn
from resnet_tpu.train.trainer import Trainer


def input_config(cfg: TrainConfig) -> input_pipeline.InputConfig:
  """The input-pipeline options of `cfg`."""
  return input_pipeline.InputConfig(
      data_dir=cfg.data_dir, image_size=cfg.image_size,
      label_offset=cfg.label_offset, dtype=cfg.transfer_dtype,
      cache_dataset=cfg.cache_dataset,
      shuffle_buffer_size=cfg.shuffle_buffer_size,
      private_threadpool_size=cfg.private_threadpool_size,
      parallel_interleave=cfg.parallel_interleave,
      parallel_map=cfg.parallel_map, fused_decode_crop=cfg.fused_decode_crop,
      prefetch=cfg.prefetch, deterministic=cfg.deterministic_input,
      seed=cfg.seed, num_classes=cfg.num_classes,
      crops=preprocessing.CropOptions(
          eval_crop_fraction=cfg.eval_crop_fraction,
          train_crop_min_area=cfg.train_crop_min_area,
          train_crop_max_aspect=cfg.train_crop_max_aspect,
          train_resize_method=cfg.train_resize_method))


def num_eval_examples(cfg: TrainConfig) -> int:
  """--num_eval_images, or the record count of the validation split."""
  if cfg.use_synthetic_data:
    return 0
  return cfg.num_eval_images or input_pipeline.count_examples(
      cfg.data_dir, "validation")


def run(cfg: TrainConfig, model_fn: ModelFn | None = None,
        loop_callback: LoopCallback | None = None,
        distribution: Distribution | None = None) -> dict:
  """Validates `cfg`, trains, evaluates and exports; returns the last eval.

  Writes <model_dir>/config.json (config.write_config) once the trainer is
  built and, when cfg.export_dir is set, a SavedModel of the final
  checkpoint last.
  model_fn and loop_callback: see Trainer (tests and tools train other
  networks or watch the loops through them). `distribution`: an already
  built strategy of cfg's kind (tests); None builds it (create_strategy).
  """
  # The strategy kind, decided once (before TensorFlow loads, in main.py).
  cfg = dataclasses.replace(
      cfg, strategy=process_setup.startup_kind(cfg.strategy, cfg.tpu))
  kind = cfg.strategy
  build_cpu_replicas = kind == "cpu" and distribution is None
  config_lib.validate(cfg, cfg.num_cpu_replicas if build_cpu_replicas
                      else None)
  device_check.require_accelerator(kind)
  if build_cpu_replicas:
    # Virtual devices must exist before anything (the pre-flight reads
    # below) starts TensorFlow's runtime.
    configure_cpu_replicas(cfg.num_cpu_replicas)
  preflight.check_model_dir(cfg)
  if not cfg.use_synthetic_data:
    preflight.check_data_dir(cfg)
    preflight.check_manifest(cfg)
  cfg = preflight.resolve(cfg)
  schedules.validate_schedule(cfg.lr_schedule, cfg.warmup_epochs,
                              cfg.total_train_epochs,
                              cfg.learning_rate_scaling, cfg.end_learning_rate)
  for warning in preflight.schedule_warnings(cfg):
    logging.warning("%s", warning)
  for note in preflight.input_notes(cfg):
    logging.info("Note: %s", note)
  tf.keras.utils.set_random_seed(cfg.seed)
  distribution = distribution or create_strategy(
      kind, cfg.tpu, cfg.num_cpu_replicas,
      bn_group_size=cfg.bn_group_size, log_topology=cfg.log_topology,
      tpu_device_assignment=cfg.tpu_device_assignment,
      collective_timeout_s=cfg.collective_timeout_s)
  strategy = distribution.strategy
  device_check.log_start_up(strategy)
  # A CPU tuning: only where the model runs on CPU devices (after the
  # runtime's devices are set up).
  if cfg.keep_host_memory and process_setup.cpu_tunings_apply(kind):
    host_memory.keep_freed_memory()
  config_lib.validate_replicas(cfg, strategy.num_replicas_in_sync)
  trainer = Trainer(cfg, strategy, model_fn=model_fn,
                    bn_groups=distribution.bn_groups,
                    loop_callback=loop_callback)
  if trainer.chief:
    config_lib.write_config(cfg, export.labels_file(cfg.data_dir))
  result = train(cfg, trainer)
  if cfg.export_dir and trainer.chief:
    export.export_saved_model(cfg.model_dir, cfg.export_dir)
  return result


def train(cfg: TrainConfig, trainer: Trainer) -> dict:
  """Runs `trainer.fit` on the synthetic or the TFRecord input of `cfg`."""
  if cfg.use_synthetic_data:
    train_fn = input_pipeline.synthetic_dataset_fn(
        cfg.image_size, cfg.num_classes, cfg.global_batch_size,
        cfg.transfer_dtype)
    # One constant batch: a resumed run needs no skipping.
    return trainer.fit(train_fn, resume_dataset_fn=lambda _: train_fn)
  inputs = input_config(cfg)
  num_eval = num_eval_examples(cfg)
  logging.info("Validation split: %d examples", num_eval)
  files = input_pipeline.split_files(cfg.data_dir, "train")
  faults = shard_audit.DataFaults(
      files, shard_audit.expected_records(cfg.data_dir, files),
      cfg.on_corrupt_shard)
  return trainer.fit(
      input_pipeline.train_dataset_fn(inputs, cfg.global_batch_size),
      input_pipeline.eval_dataset_fn(inputs, cfg.eval_batch_size, num_eval),
      input_pipeline.eval_steps(num_eval, cfg.eval_batch_size),
      resume_dataset_fn=lambda start: input_pipeline.train_dataset_fn(
          inputs, cfg.global_batch_size, start_step=start),
      faults=faults)
