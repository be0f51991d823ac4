"""JAX's part of the run's story (run.py): start-up on JAX's devices, the
engine over a device mesh, and the input as numpy batches.

The devices are JAX's (`jax.devices()`, one replica each, BN groups as rows
of the mesh: parallel/jax/bn_all_reduce.py). --strategy=multi_worker runs
one such process per host (jax.distributed: processes.py); each reads its
own share of the data, and process 0 writes the files. Where TensorFlow is
installed beside JAX, the TFRecord input is tf.data (host_batches.py) and
TensorFlow sees no GPU; where it is not, a run trains on
--use_synthetic_data (inputs/synthetic.py).

A restart (a preemption, a crash, a resumed run) loads its compiled steps
from JAX's persistent compilation cache (--jax_compilation_cache_dir)
instead of compiling them again (issue 60).
"""
from __future__ import annotations

import os
from typing import Callable, TYPE_CHECKING

from absl import logging
import jax
from jax.experimental.compilation_cache import compilation_cache

from resnet_tpu import config as config_lib
from resnet_tpu import files
from resnet_tpu.config import TrainConfig
from resnet_tpu.engines.jax import processes
from resnet_tpu.engines.jax.engine import Batches
from resnet_tpu.engines.jax.engine import JaxEngine
from resnet_tpu.inputs import synthetic
from resnet_tpu.parallel.jax.bn_all_reduce import build_mesh
from resnet_tpu.parallel.jax.bn_all_reduce import replica_groups
from resnet_tpu.train.engine import ModelFn

if TYPE_CHECKING:
  from resnet_tpu.data_checks import DataFiles


def start(cfg: TrainConfig, distribution: None = None
          ) -> tuple[TrainConfig, list[jax.Device]]:
  """Validates `cfg`, joins the other processes (multi_worker) and checks
  the devices JAX found; returns cfg, its --strategy=auto resolved to
  their kind (resolved_kind), and the devices."""
  del distribution  # a TensorFlow strategy: not JAX's
  # JAX's devices are made before it loads (main.py), and counted below.
  config_lib.validate_start_up(cfg, cfg.distribution.strategy,
                               makes_cpu_replicas=False)
  use_compilation_cache(compilation_cache_dir(cfg))
  if cfg.distribution.strategy == "multi_worker":
    processes.start(cfg.distribution)
  devices = jax.devices()
  check_devices(cfg.distribution.strategy, devices[0].platform,
                jax.process_count())
  config_lib.validate_replicas(cfg, len(devices))
  if files.tensorflow_installed():
    hide_gpus_from_tensorflow()
  return cfg.replace(strategy=resolved_kind(cfg.distribution.strategy,
                                            devices[0].platform)), devices


def resolved_kind(strategy: str, platform: str) -> str:
  """--strategy=auto as the kind of devices JAX chose (cpu, gpu or tpu:
  their platform), for config.json and the pre-flight, whose TensorFlow
  rule (process_setup.startup_kind) would call a TPU VM's run cpu; any
  other kind as given."""
  return platform if strategy == "auto" else strategy


# --jax_compilation_cache_dir=auto's folder: JAX's own setting where the
# user made one, else in the model_dir or, for a model_dir on another file
# system, in the user's cache folder.
JAX_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
CACHE_FOLDER = "jax_compilation_cache"
# Only what takes longer to compile is kept: the steps, the evaluation and
# Keras's weight initialisers (a restart runs them again), not eager
# arithmetic (milliseconds each).
CACHE_MIN_COMPILE_S = 0.2


def compilation_cache_dir(cfg: TrainConfig) -> str:
  """--jax_compilation_cache_dir, auto resolved; '' = off."""
  path = cfg.run.jax_compilation_cache_dir
  if path != "auto":
    return path
  if os.environ.get(JAX_CACHE_ENV):
    return os.environ[JAX_CACHE_ENV]
  if not files.is_remote(cfg.model_dir):
    return os.path.join(cfg.model_dir, CACHE_FOLDER)
  user = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(user, "resnet_tpu", CACHE_FOLDER)


def use_compilation_cache(path: str) -> None:
  """JAX's persistent compilation cache in `path` ('' = none), for every
  entry size: CPU's entries are kept too."""
  jax.config.update("jax_persistent_cache_min_compile_time_secs",
                    CACHE_MIN_COMPILE_S)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  if path != (jax.config.jax_compilation_cache_dir or ""):
    jax.config.update("jax_compilation_cache_dir", path or None)
    # JAX opens its cache once a process: another run in this process
    # (tests, a notebook) reopens it in its own folder.
    compilation_cache.reset_cache()
  if path:
    logging.info("JAX compilation cache: %s", path)


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


def build(cfg: TrainConfig, devices: list[jax.Device],
          model_fn: ModelFn | None = None
          ) -> JaxEngine:
  """The mesh of `devices` (BN groups as its rows), then the engine."""
  mesh = build_mesh(cfg.model.bn_group_size, devices)
  logging.info("JAX %s on %d %s device(s) of %d process(es); BN groups %s",
               jax.__version__, len(devices), devices[0].platform,
               jax.process_count(), replica_groups(mesh))
  return JaxEngine(cfg, mesh, model_fn)


def synthetic_input(cfg: TrainConfig) -> Callable[[int], Batches]:
  """This process's share of one constant batch, every step."""
  model = cfg.model
  share = cfg.run.global_batch_size // jax.process_count()
  return lambda _: synthetic.host_batches(
      model.image_size, model.num_classes, share, cfg.transfer_dtype,
      jax.process_index())


def record_input(cfg: TrainConfig, found: DataFiles, num_eval: int,
                 num_sources: int
                 ) -> tuple[Callable[[int], Batches], Callable[[], Batches]]:
  """This process's share of the TFRecord files `found`, read by tf.data
  (config.validate: TensorFlow is installed)."""
  # pylint: disable=g-import-not-at-top  (TensorFlow's modules)
  from resnet_tpu.engines.jax import host_batches
  from resnet_tpu.inputs import input_pipeline
  # pylint: enable=g-import-not-at-top
  model, run_cfg = cfg.model, cfg.run
  context = host_batches.host_context(jax.process_count(),
                                      jax.process_index())
  shape = dict(image_size=model.image_size, num_classes=model.num_classes,
               dtype=cfg.transfer_dtype)
  eval_fn = input_pipeline.eval_dataset_fn(
      cfg.input, found.validation, run_cfg.eval_batch_size, num_eval,
      **shape)

  def train_input(start_step: int) -> Batches:
    return host_batches.train_batches(input_pipeline.train_dataset_fn(
        cfg.input, found.train, run_cfg.global_batch_size, **shape,
        seed=run_cfg.seed, start_step=start_step), num_sources, context)

  return train_input, lambda: host_batches.eval_batches(eval_fn, context)
