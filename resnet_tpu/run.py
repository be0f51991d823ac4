"""One training run, config to metrics, on either engine: one story.

validate -> engine start-up -> pre-flight -> fine-tune -> config.json ->
input -> loop.fit -> export, the engine chosen once.

main.py parses flags into a TrainConfig and calls `run`; tests and the Colab
notebook call it directly. The engine is Keras's in this process
(--backend, or KERAS_BACKEND, chosen before Keras loads): its start-up, its
engine and its input come from engines/<engine>/startup.py; the loop
(train/loop.py), the pre-flight, the run's record and the export are the
same on both. Without TensorFlow (a GPU image with JAX alone) a JAX run
trains on --use_synthetic_data into a local model_dir, with .npz
checkpoints and no export (config.validate names what needs TensorFlow).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, TYPE_CHECKING

from absl import logging
import keras

from resnet_tpu import config as config_lib
from resnet_tpu import preflight
from resnet_tpu.config import TrainConfig
from resnet_tpu.inputs import class_list
from resnet_tpu.runtime import tensorflow_process
from resnet_tpu.train.checkpoints import paths
from resnet_tpu.train import loop
from resnet_tpu.train.checkpoints import storage
from resnet_tpu.train.engine import LoopCallback
from resnet_tpu.train.engine import ModelFn

if TYPE_CHECKING:
  from resnet_tpu.data_checks import DataFiles
  from resnet_tpu.inputs.shard_audit import DataFaults

ENGINES = ("tensorflow", "jax")


def run(cfg: TrainConfig, model_fn: ModelFn | None = None,
        loop_callback: LoopCallback | None = None,
        distribution: Any = None) -> dict:
  """Validates `cfg`, trains, evaluates and exports; returns the last eval
  record (the last train record without an eval set).

  Writes <model_dir>/config.json (config.write_config) once the engine is
  built and, when cfg.run.export_dir is set, a SavedModel of the final
  checkpoint last. model_fn: builds another network (tests, tools);
  loop_callback: sees every host loop's train record; distribution (on
  TensorFlow): an already built strategy of cfg's kind (tests).
  """
  cfg, startup = engine_startup(cfg)
  cfg, devices = startup.start(cfg, distribution)
  cfg, found, changes = preflight.check_run(cfg)
  # Fine-tuning: a run that has no checkpoint yet starts from another's.
  fine_tune = bool(cfg.run.init_checkpoint and
                   not paths.latest(cfg.model_dir))
  if fine_tune:
    # TensorFlow reads the source (config.validate: it is installed).
    from resnet_tpu import warm_start  # pylint: disable=g-import-not-at-top
    warm_start.check_compatible(
        cfg, warm_start.find_source(cfg.run.init_checkpoint))
  keras.utils.set_random_seed(cfg.run.seed)
  engine = startup.build(cfg, devices, model_fn)
  if fine_tune:
    warm_start.fine_tune(cfg, engine.model, model_fn)
    engine.reload_weights()
  if engine.chief:
    storage.written("config.json", cfg.model_dir, cfg.model_dir,
                    lambda: config_lib.write_config(
                        cfg, class_list.path(cfg.input.data_dir), changes))
  train_input, eval_input, faults = inputs(cfg, startup, found)
  result = loop.fit(engine, train_input, eval_input, faults, loop_callback)
  if cfg.run.export_dir and engine.chief:
    export(cfg.model_dir, cfg.run.export_dir)
  return result


def engine_startup(cfg: TrainConfig) -> tuple[TrainConfig, ModuleType]:
  """cfg with its engine named, and that engine's start-up module
  (start, build, synthetic_input, record_input): Keras's engine in this
  process, which --backend (unless auto) must name. Only that engine's
  modules load."""
  running = keras.backend.backend()
  backend = cfg.distribution.backend
  if backend not in ("auto", running) or running not in ENGINES:
    raise config_lib.ConfigError(
        f"--backend={backend}: Keras runs on {running} in this process. "
        "Set --backend (main.py) or KERAS_BACKEND before Keras loads.")
  # pylint: disable=g-import-not-at-top  (the one engine of this process)
  if running == "jax":
    from resnet_tpu.engines.jax import startup
  else:
    from resnet_tpu.engines.tensorflow import startup
  # pylint: enable=g-import-not-at-top
  return cfg.replace(backend=running), startup


def inputs(cfg: TrainConfig, startup: ModuleType, found: DataFiles | None
           ) -> tuple[Any, Any, DataFaults | None]:
  """The engine's training and eval input: synthetic (found None), or the
  TFRecord files `found` the pre-flight found, with their fault counts
  (shard_audit.py) and the validation split's size."""
  if found is None:
    return startup.synthetic_input(cfg), None, None
  # pylint: disable=g-import-not-at-top  (TensorFlow's: records need it)
  from resnet_tpu.inputs import input_pipeline
  from resnet_tpu.inputs import shard_audit
  # pylint: enable=g-import-not-at-top
  num_eval = cfg.run.num_eval_images or input_pipeline.count_examples(
      found.validation)
  logging.info("Validation split: %d examples", num_eval)
  faults = shard_audit.DataFaults(
      list(found.train),
      shard_audit.expected_records(cfg.input.data_dir, found.train),
      cfg.input.on_corrupt_shard)
  train_input, eval_input = startup.record_input(cfg, found, num_eval,
                                                 faults.num_sources)
  return train_input, eval_input, faults


def export(model_dir: str, export_dir: str) -> None:
  """A SavedModel of the run's final checkpoint: written here on
  TensorFlow, by a TensorFlow process from JAX (the same signatures)."""
  if keras.backend.backend() == "tensorflow":
    # pylint: disable-next=g-import-not-at-top  (TensorFlow's)
    from resnet_tpu import export as export_lib
    storage.written("the export", export_dir, model_dir,
                    lambda: export_lib.export_saved_model(model_dir,
                                                          export_dir))
    return
  code = tensorflow_process.in_tensorflow("export.export_saved_model",
                                          model_dir, export_dir)
  if code:
    raise config_lib.ConfigError(
        f"The export to {export_dir} failed (its TensorFlow process exited "
        f"{code}; its error is above). The checkpoints are intact: python "
        f"-m tools.export_savedmodel --model_dir={model_dir} "
        f"--export_dir={export_dir} retries it.")
