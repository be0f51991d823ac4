"""Trains ResNet on ImageNet-format TFRecords: `python main.py --flagfile=...`.

Flags are defined in resnet_tpu/flags.py; see README.md for the reference.
Exit codes: 0 done, 42 preempted (SIGTERM; a checkpoint was written, run the
same command to resume), 43 another worker was lost (restart all workers),
1 any error.

TensorFlow loads only after `set_up_process` has chosen its C++ log level
and CPU kernels (resnet_tpu/process_setup.py), which it reads once, when it
loads.
"""
import functools
import sys

from absl import app
from absl import flags
from absl import logging

from resnet_tpu import process_setup

FLAGS = flags.FLAGS


def set_up_process(argv: list[str]) -> str:
  """Chooses TensorFlow's logs and CPU kernels from `argv`; says what it chose.

  Exits with absl's flag error for a bad --cpu_onednn or flagfile.
  """
  process_setup.quiet_tensorflow_logs()
  try:
    choice, strategy, tpu = process_setup.startup_flags(argv)
  except flags.Error as error:
    sys.exit(f"FATAL Flags parsing error: {error}")
  return process_setup.apply_cpu_kernel_choice(
      choice, process_setup.startup_kind(strategy, tpu))


def main(argv: list[str], cpu_kernels_chosen: str) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  # pylint: disable=g-import-not-at-top  (after set_up_process)
  import tensorflow as tf

  from resnet_tpu import cpu_kernels
  from resnet_tpu import flags as resnet_flags
  from resnet_tpu import preemption
  from resnet_tpu.run import run
  # pylint: enable=g-import-not-at-top
  logging.info("CPU kernels: %s; TensorFlow runs oneDNN's: %s",
               cpu_kernels_chosen,
               "yes" if cpu_kernels.onednn_enabled() else "no")
  # tf.distribute logs every collective it builds at INFO; keep ours readable.
  tf.get_logger().setLevel("WARNING")
  cfg = resnet_flags.config_from_flags(FLAGS)
  try:
    result = run(cfg)
  except preemption.Restartable as stop:
    logging.warning("%s", stop)
    sys.exit(stop.exit_code)
  logging.info("Final: %s", result)


if __name__ == "__main__":
  chosen = set_up_process(sys.argv)
  # resnet_tpu/flags.py imports TensorFlow (through config.py's imports), so
  # the flags are defined after the set-up.
  from resnet_tpu import flags as resnet_flags
  resnet_flags.define_flags()
  app.run(functools.partial(main, cpu_kernels_chosen=chosen))
