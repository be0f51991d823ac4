"""First contact with a TPU VM or a GPU host: does this machine train right?

  python -m tools.accelerator_check --tpu=local --output=check.json
  python -m tools.accelerator_check --strategy=gpu --output=check.json
  python -m tools.accelerator_check --tiny --strategy=cpu --num_cpu_replicas=2

Run it before the first `main.py`. It stops within seconds, with
device_check's message, when TensorFlow cannot drive the accelerator asked
for. Otherwise it runs one check per row on the machine's replicas, prints a
pass/fail table with what each measured, writes the table, the versions and
the devices (and the TPU layout) to --output as JSON, and exits non-zero if
any check failed:

  devices                    the replicas this TensorFlow sees;
  group_bn                   grouped BN on the replicas equals one-device BN
                             of each group's batch (Ying et al. §3.1);
  replicas_equal_one_device  one step on N replicas equals the same step on
                             one device with the global batch (§3);
  bfloat16_step              a bfloat16 ResNet step is finite (§3);
  xla_compile                the step compiles with XLA on one device of the
                             run (tools/xla_compile.py);
  throughput                 synthetic training images/s per chip, ours vs
                             keras.applications.ResNet50, alternating.

Full size: ResNet-50 at 224 px, 128 images per replica, bfloat16 on TPU and
GPU. --tiny (CI, CPU replicas): ResNet-18 against Keras's ResNet50 at 32 px,
2 images per replica, float32, 2 steps; the equivalence of N replicas and
one device on a small conv net; the XLA step lowered to HLO but not run.
"""
import dataclasses
import json
import sys
import tempfile
import time

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

from resnet_tpu.runtime import device_check
from resnet_tpu.config import ConfigError
from resnet_tpu.parallel.strategy import create_strategy
from resnet_tpu.parallel.strategy import resolve_kind
from tools import accelerator_checks as checks
from tools import bench_common

FLAGS = flags.FLAGS
FULL = checks.Sizes(depth=50, image_size=224, batch=128, steps=20,
                    repetitions=3)
TINY = checks.Sizes(depth=18, image_size=32, batch=2, steps=2,
                    repetitions=2, small_equivalence_model=True,
                    run_xla=False)


def one_device_strategy(strategy: tf.distribute.Strategy,
                        kind: str) -> tf.distribute.Strategy:
  """One replica on the first device of `strategy` (for xla_compile)."""
  device = strategy.extended.worker_devices[0]
  if kind == "tpu":
    return tf.distribute.OneDeviceStrategy(device)
  return tf.distribute.MirroredStrategy([device])


def tpu_summary(strategy: tf.distribute.Strategy) -> dict:
  """Hosts, cores and (where TensorFlow reports it) the TPU mesh."""
  metadata = strategy.cluster_resolver.get_tpu_system_metadata()
  topology = metadata.topology
  return {"num_hosts": metadata.num_hosts, "num_cores": metadata.num_cores,
          "cores_per_host": metadata.num_of_cores_per_host,
          "mesh_shape": (topology.mesh_shape.tolist() if topology else None)}


def chips(kind: str, strategy: tf.distribute.Strategy,
          topology: dict | None) -> int | None:
  """Physical chips under the replicas: one per GPU, the host for CPU
  replicas, a TPU's from its mesh (cores per chip last); None if unknown."""
  if kind == "gpu":
    return strategy.num_replicas_in_sync
  if kind == "cpu":
    return 1
  mesh = topology and topology["mesh_shape"]
  return topology["num_cores"] // mesh[-1] if mesh else None


def devices(kind: str, strategy: tf.distribute.Strategy) -> checks.Check:
  names = strategy.extended.worker_devices
  return checks.Check(
      "devices", len(names) == strategy.num_replicas_in_sync,
      f"{strategy.num_replicas_in_sync} replicas ({kind}) on "
      f"{', '.join(n.split('/')[-1] for n in names)}",
      {"replicas": strategy.num_replicas_in_sync, "worker_devices": names})


def run_checks(kind: str, strategy: tf.distribute.Strategy,
               sizes: checks.Sizes, tmp: str,
               topology: dict | None) -> list[checks.Check]:
  """Every check, in order; one that raises is a failed row."""
  precision = "float32" if kind == "cpu" else "bfloat16"
  rows = [devices(kind, strategy)]
  steps = {
      "group_bn": lambda: checks.group_bn(strategy, sizes),
      "replicas_equal_one_device": lambda: checks.replicas_equal_one_device(
          strategy, sizes, tmp),
      "bfloat16_step": lambda: checks.bfloat16_step(strategy, sizes, tmp),
      "xla_compile": lambda: checks.xla_step(
          one_device_strategy(strategy, kind), sizes, tmp, precision),
      "throughput": lambda: checks.throughput(
          strategy, sizes, tmp, precision, chips(kind, strategy, topology)),
  }
  for name, check in steps.items():
    logging.info("Check %s ...", name)
    start = time.perf_counter()
    try:
      rows.append(check())
    except Exception as e:  # pylint: disable=broad-except
      logging.error("Check %s raised", name, exc_info=True)
      rows.append(checks.Check(name, False,
                               f"{type(e).__name__}: {_first_line(e)}"))
    row = rows[-1]
    row.measured["seconds"] = time.perf_counter() - start
    logging.info("Check %s %s in %.1f s: %s", name,
                 "passed" if row.passed else "FAILED",
                 row.measured["seconds"], row.detail)
  return rows


def _first_line(e: Exception) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else ""


def table(rows: list[checks.Check]) -> str:
  width = max(len(r.name) for r in rows)
  lines = [f"{'check':<{width}}  result  measured"]
  lines += [f"{r.name:<{width}}  {'PASS' if r.passed else 'FAIL':<6}  "
            f"{r.detail}" for r in rows]
  return "\n".join(lines)


def report(kind: str, strategy: tf.distribute.Strategy, sizes: checks.Sizes,
           topology: dict | None, rows: list[checks.Check]) -> dict:
  return {"passed": all(r.passed for r in rows), "strategy": kind,
          "replicas": strategy.num_replicas_in_sync,
          "versions": device_check.versions(),
          "devices": list(strategy.extended.worker_devices),
          "topology": topology, "sizes": dataclasses.asdict(sizes),
          "machine": bench_common.machine(),
          "checks": {r.name: {"passed": r.passed, "detail": r.detail,
                              **r.measured} for r in rows}}


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  tf.get_logger().setLevel("WARNING")
  kind = resolve_kind(FLAGS.strategy, FLAGS.tpu)
  if kind == "multi_worker":
    sys.exit("accelerator_check: TF_CONFIG is set; check one host at a time "
             "(unset TF_CONFIG, or pass --strategy=tpu|gpu|cpu).")
  try:
    device_check.require_accelerator(kind)
  except ConfigError as e:
    logging.error("%s", e)
    sys.exit(1)
  sizes = TINY if FLAGS.tiny else FULL
  if FLAGS.steps:
    sizes = dataclasses.replace(sizes, steps=FLAGS.steps)
  strategy = create_strategy(kind, FLAGS.tpu, FLAGS.num_cpu_replicas,
                             bn_group_size=1,
                             log_topology=kind == "tpu").strategy
  device_check.log_start_up(strategy)
  topology = tpu_summary(strategy) if kind == "tpu" else None
  with tempfile.TemporaryDirectory() as tmp:
    rows = run_checks(kind, strategy, sizes, tmp, topology)
  result = report(kind, strategy, sizes, topology, rows)
  print(table(rows))
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      json.dump(result, f, indent=2, sort_keys=True)
    logging.info("Wrote %s", FLAGS.output)
  sys.exit(0 if result["passed"] else 1)


if __name__ == "__main__":
  flags.DEFINE_string("tpu", "", "TPU name or address, as main.py's --tpu "
                      "(`local` on a TPU VM).")
  flags.DEFINE_enum("strategy", "auto", ("auto", "tpu", "gpu", "cpu"),
                    "Replicas to check: auto = tpu if --tpu, else the GPUs, "
                    "else CPU replicas.")
  flags.DEFINE_integer("num_cpu_replicas", 1, "CPU replicas "
                       "(--strategy=cpu).", lower_bound=1)
  flags.DEFINE_string("output", "accelerator_check.json",
                      "Where the JSON report goes ('' = nowhere).")
  flags.DEFINE_bool("tiny", False, "CI sizes: seconds on CPU replicas.")
  flags.DEFINE_integer("steps", None, "Training steps per timed host loop "
                       "of the throughput check (default 20; 2 with --tiny).",
                       lower_bound=1)
  app.run(main)
