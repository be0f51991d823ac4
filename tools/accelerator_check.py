"""First contact with a TPU VM or a GPU host: does this machine train right?

  python -m tools.accelerator_check --tpu=local --output=check.json
  python -m tools.accelerator_check --strategy=gpu --output=check.json
  python -m tools.accelerator_check --tiny --strategy=cpu --num_cpu_replicas=2

Run it before the first `main.py`. It chooses the TPU runtime before
TensorFlow loads, as main.py does (resnet_tpu/runtime/tpu_runtime.py). It stops
within seconds, with one message and no traceback, when TensorFlow cannot
drive the accelerator asked for or finds none. Otherwise it runs one check
per row on the machine's replicas, prints a PASS/FAIL/SKIP table with what
each measured, writes the table, the versions, the TPU runtime and
generation, the chips and the devices to --output as JSON, and exits
non-zero if any check failed (a skipped row, e.g. grouped BN on one
replica, compared nothing and fails nothing):

  devices                    the replicas this TensorFlow sees;
  group_bn                   grouped BN on the replicas equals one-device BN
                             of each group's batch (Ying et al. §3.1);
  replicas_equal_one_device  one step on N replicas equals the same step on
                             one device with the global batch (§3);
  bfloat16_step              a bfloat16 ResNet step is finite (§3);
  xla_compile                the step compiles with XLA for the run's first
                             device, named in the row (tools/xla_compile.py);
  throughput                 synthetic training images/s per chip, ours vs
                             keras.applications.ResNet50, alternating; fails
                             below --min_throughput_ratio.

Full size: ResNet-50 at 224 px, 128 images per replica, bfloat16 on TPU and
GPU. --tiny (CI, CPU replicas): ResNet-18 against Keras's ResNet50 at 32 px,
2 images per replica, float32, 2 steps; the equivalence of N replicas and
one device on a small conv net; the XLA step lowered to HLO but not run.
"""
import json
import os
import sys
import tempfile

from absl import app
from absl import flags
from absl import logging

if not __package__:  # run as a file: the repository's root on the path
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))

from resnet_tpu.config import ConfigError
from resnet_tpu.runtime import process_setup
from resnet_tpu.runtime import tpu_runtime

FLAGS = flags.FLAGS


def _fail(message: str) -> None:
  """One line on stderr and exit 1: a user's error, no traceback."""
  logging.error("%s", message)
  sys.exit(f"accelerator_check: error: {message}")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  kind = process_setup.startup_kind(FLAGS.strategy, FLAGS.tpu)
  if kind == "multi_worker":
    _fail("TF_CONFIG is set; check one host at a time (unset TF_CONFIG, or "
          "pass --strategy=tpu|gpu|cpu).")
  try:
    chosen = tpu_runtime.apply(FLAGS.tpu_runtime, kind)
  except ConfigError as e:
    _fail(str(e))
  runtime = tpu_runtime.choose(FLAGS.tpu_runtime) if kind == "tpu" else None
  if chosen:
    logging.info("%s", chosen)
  # pylint: disable=g-import-not-at-top  (after the runtime's variables)
  import dataclasses
  import tensorflow as tf
  from resnet_tpu.runtime import device_check
  from resnet_tpu.config import DistributionConfig
  from resnet_tpu.parallel.tensorflow.strategy import create_strategy
  from tools import accelerator_report
  # pylint: enable=g-import-not-at-top
  tf.get_logger().setLevel("WARNING")
  try:
    device_check.require_accelerator(kind)
    distribution = create_strategy(DistributionConfig(
        strategy=kind, tpu=FLAGS.tpu, num_cpu_replicas=FLAGS.num_cpu_replicas,
        log_topology=kind == "tpu"))
  except ConfigError as e:
    _fail(str(e))
  sizes = accelerator_report.TINY if FLAGS.tiny else accelerator_report.FULL
  if FLAGS.steps:
    sizes = dataclasses.replace(sizes, steps=FLAGS.steps)
  strategy = distribution.strategy
  device_check.log_start_up(strategy)
  topology = accelerator_report.topology_summary(distribution.tpu_topology)
  gpus = accelerator_report.gpu_summary() if kind == "gpu" else None
  with tempfile.TemporaryDirectory() as tmp:
    rows = accelerator_report.run_checks(kind, strategy, sizes, tmp,
                                         topology,
                                         FLAGS.min_throughput_ratio)
  result = accelerator_report.report(
      kind, strategy, sizes, topology, rows,
      dataclasses.asdict(runtime) if runtime else None, gpus)
  print(accelerator_report.table(rows))
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      json.dump(result, f, indent=2, sort_keys=True)
    logging.info("Wrote %s", FLAGS.output)
  sys.exit(0 if result["passed"] else 1)


if __name__ == "__main__":
  process_setup.quiet_tensorflow_logs()
  flags.DEFINE_string("tpu", "", "TPU name or address, as main.py's --tpu "
                      "(`local` on a TPU VM).")
  flags.DEFINE_enum("strategy", "auto", ("auto", "tpu", "gpu", "cpu"),
                    "Replicas to check: auto = tpu if --tpu, else the GPUs, "
                    "else CPU replicas.")
  flags.DEFINE_enum("tpu_runtime", "auto", ("auto", "pjrt",
                                            "stream_executor"),
                    "As main.py's --tpu_runtime.")
  flags.DEFINE_integer("num_cpu_replicas", 1, "CPU replicas "
                       "(--strategy=cpu).", lower_bound=1)
  flags.DEFINE_string("output", "accelerator_check.json",
                      "Where the JSON report goes ('' = nowhere).")
  flags.DEFINE_bool("tiny", False, "CI sizes: seconds on CPU replicas.")
  flags.DEFINE_integer("steps", None, "Training steps per timed host loop "
                       "of the throughput check (default 20; 2 with --tiny).",
                       lower_bound=1)
  # Measured on CPU, float32: 1.05 (bench_results/train.md).
  flags.DEFINE_float("min_throughput_ratio", 0.8, "The throughput row "
                     "fails when ours trains slower than this fraction of "
                     "keras.applications.ResNet50's images/s.")
  app.run(main)
