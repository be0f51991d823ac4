"""One training run on the JAX engine: config -> devices -> data -> trainer.

The JAX twin of run.py, which main.py calls under --backend=jax (or
KERAS_BACKEND=jax). The pre-flight (preflight.check_run), the config record,
the input pipeline and the export are the TensorFlow path's; the devices
are JAX's (`jax.devices()`, one replica each, BN groups as rows of the mesh:
parallel/bn_all_reduce_jax.py) and the trainer is jax_trainer.py.
--strategy=multi_worker runs one such process per host (jax.distributed:
parallel/jax_processes.py); each reads its own share of the data, and
process 0 writes the config, metrics, checkpoints and export.

Where TensorFlow is installed beside JAX, the TFRecord input is tf.data,
and the checkpoints, metrics and export go through TensorFlow's file and
checkpoint APIs (so gs:// model_dirs work). The SavedModel is written by a
TensorFlow engine process (resnet_tpu.export on the run's final
checkpoint), so it has the TensorFlow path's signatures exactly;
--init_checkpoint is read by one too (warm_start.write_weights). Where it
is not (a GPU image with JAX alone), a run trains on --use_synthetic_data
(inputs/synthetic.py) into a local model_dir: .npz checkpoints
(train/checkpoints_npz.py), metrics.jsonl without TensorBoard, no export
(config.validate names what needs TensorFlow). README "Running on JAX"
lists what differs.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING

from absl import logging
import jax
import keras
import numpy as np

from resnet_tpu import config as config_lib
from resnet_tpu import files
from resnet_tpu import preflight
from resnet_tpu.config import TrainConfig
from resnet_tpu.inputs import class_list
from resnet_tpu.inputs import synthetic
from resnet_tpu.parallel import jax_processes
from resnet_tpu.parallel.bn_all_reduce_jax import build_mesh
from resnet_tpu.parallel.bn_all_reduce_jax import replica_groups
from resnet_tpu.train import checkpoint_paths
from resnet_tpu.train import storage
from resnet_tpu.train.jax_trainer import Batches
from resnet_tpu.train.jax_trainer import JaxTrainer
from resnet_tpu.train.jax_trainer import LoopCallback

if TYPE_CHECKING:
  from resnet_tpu.data_checks import DataFiles

# The package's parent: where a child process finds resnet_tpu.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cfg: TrainConfig, loop_callback: LoopCallback | None = None) -> dict:
  """Validates `cfg`, trains on JAX's devices, evaluates and exports;
  returns the last eval record (run.run's contract)."""
  if keras.backend.backend() != "jax":
    raise config_lib.ConfigError(
        "run_jax.run needs Keras on JAX: set --backend=jax (main.py) or "
        "KERAS_BACKEND=jax before Keras loads.")
  cfg = cfg.replace(backend="jax")
  config_lib.validate(cfg)
  if cfg.distribution.strategy == "multi_worker":
    jax_processes.start(cfg.distribution)
  devices = jax.devices()
  check_devices(cfg.distribution.strategy, devices[0].platform,
                jax.process_count())
  config_lib.validate_replicas(cfg, len(devices))
  if files.tensorflow_installed():
    hide_gpus_from_tensorflow()
  cfg, found, changes = preflight.check_run(cfg)
  # Fine-tuning: a run that has no checkpoint yet starts from another's.
  fine_tune = bool(cfg.run.init_checkpoint and
                   not checkpoint_paths.latest(cfg.model_dir))
  if fine_tune:
    # TensorFlow reads the source (config.validate: it is installed).
    from resnet_tpu import warm_start  # pylint: disable=g-import-not-at-top
    warm_start.check_compatible(
        cfg, warm_start.find_source(cfg.run.init_checkpoint))
  keras.utils.set_random_seed(cfg.run.seed)
  mesh = build_mesh(cfg.model.bn_group_size, devices)
  logging.info("JAX %s on %d %s device(s) of %d process(es); BN groups %s",
               jax.__version__, len(devices), devices[0].platform,
               jax.process_count(), replica_groups(mesh))
  trainer = JaxTrainer(cfg, mesh, loop_callback)
  if fine_tune:
    warm_start.warm_start_from_weights(cfg, trainer.model,
                                       source_weights(cfg.run.init_checkpoint))
    trainer.reload_weights()
  if trainer.chief:
    storage.written("config.json", cfg.model_dir, cfg.model_dir,
                    lambda: config_lib.write_config(
                        cfg, class_list.path(cfg.input.data_dir), changes))
  result = train(cfg, trainer, found)
  if cfg.run.export_dir and trainer.chief:
    export_in_tensorflow(cfg.model_dir, cfg.run.export_dir)
  return result


def check_devices(strategy: str, platform: str, process_count: int) -> None:
  """--strategy=tpu or gpu needs JAX to have found that kind of device
  (else it falls back to the CPU silently), and several JAX processes (a
  pod slice runs one per host) need --strategy=multi_worker."""
  if strategy in ("tpu", "gpu") and platform != strategy:
    extra = "tpu" if strategy == "tpu" else "cuda13"
    raise config_lib.ConfigError(
        f"--strategy={strategy}: JAX found no {strategy.upper()}, only "
        f"{platform} devices. Install jax[{extra}] on a host that has one, "
        "or use --strategy=auto or cpu.")
  if process_count > 1 and strategy != "multi_worker":
    raise config_lib.ConfigError(
        f"JAX runs {process_count} processes (a multi-host slice) under "
        f"--strategy={strategy}: use --strategy=multi_worker on every "
        "host.")


def hide_gpus_from_tensorflow() -> None:
  """TensorFlow feeds the input and writes files; JAX alone holds the
  GPUs."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.set_visible_devices([], "GPU")


def train(cfg: TrainConfig, trainer: JaxTrainer,
          found: DataFiles | None) -> dict:
  """trainer.fit on the synthetic input of `cfg` (found None) or on the
  TFRecord files `found`: this process's share of them."""
  model, run_cfg = cfg.model, cfg.run
  if found is None:
    share = run_cfg.global_batch_size // jax.process_count()
    return trainer.fit(lambda _: synthetic.host_batches(
        model.image_size, model.num_classes, share, cfg.transfer_dtype,
        jax.process_index()))
  return train_on_records(cfg, trainer, found)


def train_on_records(cfg: TrainConfig, trainer: JaxTrainer,
                     found: DataFiles) -> dict:
  """trainer.fit on this process's share of the TFRecord files `found`,
  read by tf.data (config.validate: TensorFlow is installed)."""
  # pylint: disable=g-import-not-at-top  (TensorFlow's modules)
  from resnet_tpu.inputs import input_pipeline
  from resnet_tpu.inputs import shard_audit
  from resnet_tpu.train import jax_input
  # pylint: enable=g-import-not-at-top
  model, run_cfg = cfg.model, cfg.run
  context = jax_input.host_context(jax.process_count(), jax.process_index())
  shape = dict(image_size=model.image_size, num_classes=model.num_classes,
               dtype=cfg.transfer_dtype)
  num_eval = cfg.run.num_eval_images or input_pipeline.count_examples(
      found.validation)
  logging.info("Validation split: %d examples", num_eval)
  faults = shard_audit.DataFaults(
      list(found.train),
      shard_audit.expected_records(cfg.input.data_dir, found.train),
      cfg.input.on_corrupt_shard)
  eval_fn = input_pipeline.eval_dataset_fn(
      cfg.input, found.validation, run_cfg.eval_batch_size, num_eval,
      **shape)

  def train_input(start_step: int) -> Batches:
    return jax_input.train_batches(input_pipeline.train_dataset_fn(
        cfg.input, found.train, run_cfg.global_batch_size, **shape,
        seed=run_cfg.seed, start_step=start_step), faults.num_sources,
                                   context)

  return trainer.fit(train_input,
                     lambda: jax_input.eval_batches(eval_fn, context), faults)


def in_tensorflow(call: str, *args: str) -> int:
  """Runs resnet_tpu's `call` (module.function) with `args` in a TensorFlow
  engine process (Keras's engine is chosen once per process); returns its
  exit code, its errors logged above."""
  module = call.split(".")[0]
  code = ("import sys; from absl import logging; "
          "logging.set_verbosity(logging.INFO); "
          f"from resnet_tpu import {module}; {call}(*sys.argv[1:])")
  env = {**os.environ, "KERAS_BACKEND": "tensorflow",
         "PYTHONPATH": os.pathsep.join(
             filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}
  env.pop("XLA_FLAGS", None)
  return subprocess.run([sys.executable, "-c", code, *args], env=env,
                        check=False).returncode


def source_weights(init_checkpoint: str) -> list[np.ndarray]:
  """The weights of --init_checkpoint's network, read in a TensorFlow
  process (warm_start.write_weights)."""
  with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "weights.npz")
    code = in_tensorflow("warm_start.write_weights", init_checkpoint, path)
    if code:
      raise config_lib.ConfigError(
          f"--init_checkpoint={init_checkpoint!r}: reading its network "
          f"failed (its TensorFlow process exited {code}; its error is "
          "above).")
    with np.load(path) as saved:
      return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def export_in_tensorflow(model_dir: str, export_dir: str) -> None:
  """Exports the run's final checkpoint from a TensorFlow engine process."""
  code = in_tensorflow("export.export_saved_model", model_dir, export_dir)
  if code:
    raise config_lib.ConfigError(
        f"The export to {export_dir} failed (its TensorFlow process exited "
        f"{code}; its error is above). The checkpoints are "
        f"intact: python -m tools.export_savedmodel --model_dir={model_dir} "
        f"--export_dir={export_dir} retries it.")
