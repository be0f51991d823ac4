"""Trains ResNet on ImageNet-format TFRecords: `python main.py --flagfile=...`.

Flags are defined in resnet_tpu/flags.py; see README.md for the reference.
Exit codes: 0 done, 42 preempted (SIGTERM; a checkpoint was written, run the
same command to resume), 43 another worker was lost (restart all workers),
1 any error.
"""
import sys

import resnet_tpu  # noqa: F401  (before TensorFlow: resnet_tpu/cpu_kernels.py)
from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

from resnet_tpu import flags as resnet_flags
from resnet_tpu import preemption
from resnet_tpu.config import ConfigError
from resnet_tpu.run import run
from resnet_tpu.trainer import ModelFn

resnet_flags.define_flags()
FLAGS = flags.FLAGS


def main(argv: list[str], model_fn: ModelFn | None = None) -> None:
  """Trains the TrainConfig of the flags; `model_fn` (tests) replaces the
  ResNet."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  # tf.distribute logs every collective it builds at INFO; keep ours readable.
  tf.get_logger().setLevel("WARNING")
  cfg = resnet_flags.config_from_flags(FLAGS)
  try:
    result = run(cfg, model_fn=model_fn)
  except ConfigError as error:  # a user error: its message, no traceback
    sys.exit(f"main.py: error: {error}")
  except preemption.Restartable as stop:
    logging.warning("%s", stop)
    sys.exit(stop.exit_code)
  logging.info("Final: %s", result)


if __name__ == "__main__":
  app.run(main)
