"""One training run, config to metrics: strategy -> data -> trainer.

main.py parses flags into a TrainConfig and calls `run`; tests and the Colab
notebook call it directly.
"""
from absl import logging
import tensorflow as tf

from resnet_tpu import config as config_lib
from resnet_tpu.runtime import device_check
from resnet_tpu import export
from resnet_tpu.runtime import host_memory
from resnet_tpu.inputs import input_pipeline
from resnet_tpu import data_checks
from resnet_tpu import preflight
from resnet_tpu.runtime import process_setup
from resnet_tpu.inputs import shard_audit
from resnet_tpu.config import TrainConfig
from resnet_tpu.parallel.strategy import configure_cpu_replicas
from resnet_tpu.parallel.strategy import create_strategy
from resnet_tpu.parallel.strategy import Distribution
from resnet_tpu.train import storage
from resnet_tpu import warm_start
from resnet_tpu.train.trainer import LoopCallback
from resnet_tpu.train.trainer import ModelFn
from resnet_tpu.train.trainer import Trainer


def num_eval_examples(cfg: TrainConfig,
                      files: data_checks.DataFiles | None) -> int:
  """--num_eval_images, or the record count of the validation split."""
  if files is None:
    return 0
  return cfg.run.num_eval_images or input_pipeline.count_examples(
      files.validation)


def run(cfg: TrainConfig, model_fn: ModelFn | None = None,
        loop_callback: LoopCallback | None = None,
        distribution: Distribution | None = None) -> dict:
  """Validates `cfg`, trains, evaluates and exports; returns the last eval.

  Writes <model_dir>/config.json (config.write_config) once the trainer is
  built and, when cfg.run.export_dir is set, a SavedModel of the final
  checkpoint last.
  model_fn and loop_callback: see Trainer (tests and tools train other
  networks or watch the loops through them). `distribution`: an already
  built strategy of cfg's kind (tests); None builds it (create_strategy).
  """
  # The strategy kind, decided once (before TensorFlow loads, in main.py).
  # This is the TensorFlow engine's run (run_jax.py: JAX's).
  if cfg.distribution.backend not in ("auto", "tensorflow"):
    raise config_lib.ConfigError(
        f"--backend={cfg.distribution.backend}: run.run trains on "
        "TensorFlow; main.py runs JAX's (run_jax.run).")
  cfg = cfg.replace(strategy=process_setup.startup_kind(
      cfg.distribution.strategy, cfg.distribution.tpu), backend="tensorflow")
  dist = cfg.distribution
  kind = dist.strategy
  build_cpu_replicas = kind == "cpu" and distribution is None
  config_lib.validate(cfg, dist.num_cpu_replicas if build_cpu_replicas
                      else None)
  device_check.require_accelerator(kind)
  if build_cpu_replicas:
    # Virtual devices must exist before anything (the pre-flight reads
    # below) starts TensorFlow's runtime.
    configure_cpu_replicas(dist.num_cpu_replicas)
  cfg, files, changes = preflight.check_run(cfg)
  # Fine-tuning: a run that has no checkpoint yet starts from another's.
  fine_tune = bool(cfg.run.init_checkpoint and
                   not tf.train.latest_checkpoint(cfg.model_dir))
  if fine_tune:
    warm_start.check_compatible(
        cfg, warm_start.find_source(cfg.run.init_checkpoint))
  tf.keras.utils.set_random_seed(cfg.run.seed)
  distribution = distribution or create_strategy(
      dist, bn_group_size=cfg.model.bn_group_size)
  strategy = distribution.strategy
  device_check.log_start_up(strategy)
  # A CPU tuning: only where the model runs on CPU devices (after the
  # runtime's devices are set up).
  if dist.keep_host_memory and process_setup.cpu_tunings_apply(kind):
    host_memory.keep_freed_memory()
  config_lib.validate_replicas(cfg, strategy.num_replicas_in_sync)
  trainer = Trainer(cfg, strategy, model_fn=model_fn,
                    bn_groups=distribution.bn_groups,
                    loop_callback=loop_callback)
  if fine_tune:
    warm_start.warm_start(cfg, trainer.model, model_fn)
  if trainer.chief:
    storage.written(
        "config.json", cfg.model_dir, cfg.model_dir,
        lambda: config_lib.write_config(
            cfg, export.labels_file(cfg.input.data_dir), changes))
  result = train(cfg, trainer, files)
  if cfg.run.export_dir and trainer.chief:
    storage.written(
        "the export", cfg.run.export_dir, cfg.model_dir,
        lambda: export.export_saved_model(cfg.model_dir, cfg.run.export_dir))
  return result


def train(cfg: TrainConfig, trainer: Trainer,
          files: data_checks.DataFiles | None) -> dict:
  """Runs `trainer.fit` on the synthetic input of `cfg` (files None) or on
  the TFRecord `files` the pre-flight found."""
  model, run_cfg = cfg.model, cfg.run
  if files is None:
    train_fn = input_pipeline.synthetic_dataset_fn(
        model.image_size, model.num_classes, run_cfg.global_batch_size,
        cfg.transfer_dtype)
    # One constant batch: a resumed run needs no skipping.
    return trainer.fit(train_fn, resume_dataset_fn=lambda _: train_fn)
  num_eval = num_eval_examples(cfg, files)
  logging.info("Validation split: %d examples", num_eval)
  faults = shard_audit.DataFaults(
      list(files.train),
      shard_audit.expected_records(cfg.input.data_dir, files.train),
      cfg.input.on_corrupt_shard)
  shape = dict(image_size=model.image_size, num_classes=model.num_classes,
               dtype=cfg.transfer_dtype)

  def train_fn(start_step: int = 0) -> input_pipeline.DatasetFn:
    return input_pipeline.train_dataset_fn(
        cfg.input, files.train, run_cfg.global_batch_size, **shape,
        seed=run_cfg.seed, start_step=start_step)

  return trainer.fit(
      train_fn(),
      input_pipeline.eval_dataset_fn(cfg.input, files.validation,
                                     run_cfg.eval_batch_size, num_eval,
                                     **shape),
      input_pipeline.eval_steps(num_eval, run_cfg.eval_batch_size),
      resume_dataset_fn=train_fn, faults=faults)
