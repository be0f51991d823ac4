"""Trains ResNet on ImageNet-format TFRecords: `python main.py --flagfile=...`.

Flags are defined in resnet_tpu/flags.py; see README.md for the reference.
tensorflow/tpu's --train_batch_size, --iterations_per_loop, --steps_per_eval
and --num_label_classes are accepted as aliases.
Exit codes: 0 done, 42 preempted (SIGTERM; a checkpoint was written, run the
same command to resume), 43 another worker was lost (restart all workers),
1 any error (a user error, or storage that fails while writing, prints one
line without a traceback).
--backend (or KERAS_BACKEND) chooses Keras's engine, tensorflow or jax,
once; resnet_tpu/run.py tells the same run on either
(resnet_tpu/engines/<engine>/).

TensorFlow loads only after `set_up_process` has decided the strategy kind
and chosen its C++ log level, CPU kernels and TPU runtime
(resnet_tpu/runtime/process_setup.py, tpu_runtime.py), which it reads once,
when it loads: the flags and the config they fill import no TensorFlow, and
the config is checked (config.validate) before either engine loads.
"""
import sys
from typing import Callable

from absl import app
from absl import flags
from absl import logging

from resnet_tpu import config as config_lib
from resnet_tpu import flags as resnet_flags
from resnet_tpu.config import ConfigError
from resnet_tpu.runtime import process_setup
from resnet_tpu.runtime import tpu_runtime
from resnet_tpu.train.preemption import WORKER_LOST_EXIT_CODE

resnet_flags.define_flags()
FLAGS = flags.FLAGS
# --help lists the training flags by config part (absl lists only the flags
# main.py defines itself); `%` is escaped for absl's usage formatting.
__doc__ += ("\nTraining flags:\n"
            + resnet_flags.grouped_help(FLAGS).replace("%", "%%"))


def set_up_process() -> tuple[str, str]:
  """Decides the strategy kind, and chooses TensorFlow's logs, CPU kernels
  and TPU runtime for it, before TensorFlow loads; returns the kind and
  what it chose for the kernels."""
  process_setup.quiet_tensorflow_logs()
  kind = process_setup.startup_kind(FLAGS.strategy, FLAGS.tpu)
  runtime = tpu_runtime.apply(FLAGS.tpu_runtime, kind)
  if runtime:
    logging.info("%s", runtime)
  return kind, process_setup.apply_cpu_kernel_choice(FLAGS.cpu_onednn, kind)


def main(argv: list[str], model_fn=None) -> None:
  """Trains the TrainConfig of the flags; `model_fn` (tests) replaces the
  ResNet (run.ModelFn)."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    backend = process_setup.choose_backend(FLAGS.backend)
    logging.info("Engine: Keras on %s (--backend=%s)", backend, FLAGS.backend)
    cfg = resnet_flags.config_from_flags(FLAGS).replace(backend=backend)
    # Before either engine loads: a bad flag costs milliseconds, not the
    # engine's import (4 s for TensorFlow here).
    config_lib.validate_start_up(cfg, process_setup.strategy_kind(
        cfg.distribution), makes_cpu_replicas=True)
    if backend == "jax":
      set_up_jax()
    else:
      cfg = cfg.replace(strategy=set_up_tensorflow())
  except ConfigError as error:
    sys.exit(f"main.py: error: {error}")
  # pylint: disable-next=g-import-not-at-top  (after the engine's settings)
  from resnet_tpu.run import run
  finish(lambda: run(cfg, model_fn=model_fn))


def set_up_tensorflow() -> str:
  """The TensorFlow process's settings (set_up_process), then TensorFlow;
  returns the strategy kind."""
  kind, chosen = set_up_process()
  # pylint: disable=g-import-not-at-top  (after set_up_process)
  import tensorflow as tf

  from resnet_tpu.runtime import cpu_kernels
  # pylint: enable=g-import-not-at-top
  logging.info("CPU kernels: %s; TensorFlow runs oneDNN's: %s", chosen,
               "yes" if cpu_kernels.onednn_enabled() else "no")
  # tf.distribute logs every collective it builds at INFO; keep ours readable.
  tf.get_logger().setLevel("WARNING")
  return kind


def set_up_jax() -> None:
  """JAX's platform and virtual CPU devices, before JAX loads."""
  devices = process_setup.jax_platform(FLAGS.strategy, FLAGS.num_cpu_replicas)
  logging.info("JAX devices: %s (--strategy=%s)", devices, FLAGS.strategy)


def finish(train: Callable[[], dict]) -> None:
  """Runs either engine's `train`: user and storage errors end in one line
  without a traceback, a restartable stop in its exit code."""
  # pylint: disable=g-import-not-at-top  (the engine's modules load first)
  from resnet_tpu.train import preemption
  from resnet_tpu.train.checkpoints.storage import StorageError
  # pylint: enable=g-import-not-at-top
  try:
    result = train()
  except (ConfigError, StorageError) as error:  # one line, no traceback
    sys.exit(f"main.py: error: {error}")
  except preemption.Restartable as stop:
    logging.warning("%s", stop)
    sys.exit(stop.exit_code)
  logging.info("Final: %s", result)


def cli(argv: list[str]) -> None:
  """main, then the end of the process: a run on one host skips the
  interpreter's teardown (process_setup.exit_skipping_teardown), which
  would wait for the input iterators' release (engines/tensorflow/iterators.py);
  a multi-worker run ends normally, so its peers' shutdown can reach it,
  unless a peer is lost (exit 43): its shutdown would wait for that peer
  (jax.distributed's, until the heartbeat timeout, then abort)."""
  code = 0
  try:
    main(argv)
  except SystemExit as stop:
    code = stop.code
  if (process_setup.startup_kind(FLAGS.strategy, FLAGS.tpu) == "multi_worker"
      and code != WORKER_LOST_EXIT_CODE):
    sys.exit(code)
  process_setup.exit_skipping_teardown(code)


if __name__ == "__main__":
  process_setup.quiet_tensorflow_logs()  # before absl's own start-up
  app.run(cli)
