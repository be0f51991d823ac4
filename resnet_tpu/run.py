"""One training run, config to metrics: strategy -> data -> trainer.

main.py parses flags into a TrainConfig and calls `run`; tests and the Colab
notebook call it directly.
"""
from absl import logging
import tensorflow as tf

from resnet_tpu import collectives
from resnet_tpu import config as config_lib
from resnet_tpu import cpu_kernels
from resnet_tpu import export
from resnet_tpu import host_memory
from resnet_tpu import input_pipeline
from resnet_tpu import preflight
from resnet_tpu import preprocessing
from resnet_tpu.config import TrainConfig
from resnet_tpu.strategy import configure_cpu_replicas
from resnet_tpu.strategy import create_strategy
from resnet_tpu.strategy import resolve_kind
from resnet_tpu.trainer import Trainer


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


def run(cfg: TrainConfig) -> dict:
  """Validates `cfg`, trains, evaluates and exports; returns the last eval.

  Writes <model_dir>/config.json first (export.write_config) and, when
  cfg.export_dir is set, a SavedModel of the final checkpoint last.
  """
  cpu = resolve_kind(cfg.strategy, cfg.tpu) == "cpu"
  config_lib.validate(cfg, cfg.num_cpu_replicas if cpu else None)
  if cpu:
    # Virtual devices must exist before anything (the pre-flight reads
    # below) starts TensorFlow's runtime.
    configure_cpu_replicas(cfg.num_cpu_replicas)
  preflight.check_model_dir(cfg)
  if not cfg.use_synthetic_data:
    preflight.check_data_dir(cfg)
  tf.keras.utils.set_random_seed(cfg.seed)
  collectives.set_options(bn_all_reduce=cfg.bn_all_reduce)
  strategy = create_strategy(cfg.strategy, cfg.tpu, cfg.num_cpu_replicas,
                             bn_group_size=cfg.bn_group_size,
                             log_topology=cfg.log_topology)
  if cfg.keep_host_memory:  # after the runtime's devices are set up
    host_memory.keep_freed_memory()
  logging.info("TensorFlow's oneDNN CPU kernels: %s (%s=0/1 chooses; "
               "resnet_tpu/cpu_kernels.py)",
               "on" if cpu_kernels.onednn_enabled() else "off",
               cpu_kernels.ONEDNN_ENV)
  config_lib.validate_replicas(cfg, strategy.num_replicas_in_sync)
  trainer = Trainer(cfg, strategy)
  if trainer.chief:
    export.write_config(cfg)
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
  return trainer.fit(
      input_pipeline.train_dataset_fn(inputs, cfg.global_batch_size),
      input_pipeline.eval_dataset_fn(inputs, cfg.eval_batch_size, num_eval),
      input_pipeline.eval_steps(num_eval, cfg.eval_batch_size),
      resume_dataset_fn=lambda start: input_pipeline.train_dataset_fn(
          inputs, cfg.global_batch_size, start_step=start))
