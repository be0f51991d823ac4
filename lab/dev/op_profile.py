"""Where a training step's time goes, op by op, from TensorFlow's profiler.

  make profile-ops   # both of:
  python -m lab.dev.op_profile --workloads=ours,ours_v1_layout,keras \\
      --output_dir=bench_results
  python -m lab.dev.op_profile --workloads=bn_group1,bn_group4,bn_group8 \\
      --output_dir=bench_results

`make bench` gives ratios; this tool says which ops make them. Each workload
is the one its benchmark times: `ours`, `ours_v1_layout` and `keras` are
lab/bench_train.py's ResNet-50 steps (1 replica, 224 px, batch 4);
`bn_groupN` is lab/bench_bn_groups.py's ResNet-18 step on 8 virtual CPU
replicas at bn_group_size N. Every workload is built and warmed up first;
then, --repetitions times, each in turn is traced by `tf.profiler` for
--steps steps, and the kernel time of every op the executor ran is summed
per category (conv forward, conv backprop to input and to filter, batch
norm, all-reduces, weight decay, optimizer update, the rest), per step. The
table gives each category's median over the repetitions.

Op times are each kernel's time from start to end, summed over the threads
that run ops: two ops running at once both count, so the column total can
exceed the step's wall time (measured under the profiler), which the table
gives too. A collective's time includes waiting for the other replicas of
its group.
"""
import collections
import glob
import os
import re
import statistics
import tempfile
import time
from typing import Callable

from resnet_tpu.runtime import process_setup

# A CPU benchmark: the kernels a CPU run gets, chosen before TensorFlow loads.
process_setup.apply_cpu_kernel_choice("auto", "cpu")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: E402

from resnet_tpu.runtime import host_memory  # noqa: E402
from resnet_tpu.parallel.tensorflow import (  # noqa: E402
    strategy as strategy_lib)
from lab import bench_bn_groups  # noqa: E402
from tools import bench_common  # noqa: E402
from lab import bench_train  # noqa: E402

FLAGS = flags.FLAGS
STEP_WORKLOADS = {"ours": None, "ours_v1_layout": bench_train.ours_v1_layout,
                  "keras": bench_common.keras_resnet50}
BN_GROUP_WORKLOADS = {f"bn_group{g}": g for g in bench_bn_groups.GROUPS}
WORKLOADS = (*STEP_WORKLOADS, *BN_GROUP_WORKLOADS)

CATEGORIES = ("conv forward", "conv backprop to input",
              "conv backprop to filter", "batch norm", "BN group all-reduce",
              "gradient all-reduce", "other all-reduce (loss, metrics)",
              "weight decay (L2 term)", "optimizer update", "other")
# Ops that run other ops (their time is their callees').
_CONTAINER_OPS = frozenset({"While", "StatelessWhile", "If", "StatelessIf",
                            "PartitionedCall", "StatefulPartitionedCall"})
# Threads whose events are op kernels: the executor's, and the collective
# executor's, where a collective runs from its start until its group is done.
_OP_THREADS = ("tf_Compute", "collective_ops")
# A TensorFlow op event is named "node/path:OpType".
_OP_EVENT = re.compile(r"^([^:]+):([A-Za-z_]\w*)$")
# Our BN layers are "<block>_bn<k>" or distributed_batch_normalization (their
# group gradient: group_batch_norm_grad), Keras's "<block>_bn".
_BN_LAYER = re.compile(r"(^|/)[^/]*(_bn\d*|batch_norm\w*)(_\d+)?(/|$)")
_OPTIMIZER_SCOPE = re.compile(r"(^|/)(sgd|lars|rmsprop\w*)(_\d+)?/",
                              re.IGNORECASE)


def category(node: str, op_type: str) -> str:
  """The CATEGORIES entry of one executed op (`node` is its graph path)."""
  if "Collective" in op_type or "Nccl" in op_type:
    if _BN_LAYER.search(node):
      return "BN group all-reduce"
    if _OPTIMIZER_SCOPE.search(node):
      return "gradient all-reduce"
    return "other all-reduce (loss, metrics)"
  if "Conv2DBackpropFilter" in op_type:
    return "conv backprop to filter"
  if "Conv2DBackpropInput" in op_type:
    return "conv backprop to input"
  if "Conv2D" in op_type:
    return "conv forward"
  if "FusedBatchNorm" in op_type or _BN_LAYER.search(node):
    return "batch norm"
  if "L2Loss" in node:
    return "weight decay (L2 term)"
  if _OPTIMIZER_SCOPE.search(node):
    return "optimizer update"
  return "other"


def op_times(xspace: xplane_pb2.XSpace) -> collections.Counter:
  """Seconds per (node, op type) over the op threads of a trace."""
  times = collections.Counter()
  for plane in xspace.planes:
    for line in plane.lines:
      if not line.name.startswith(_OP_THREADS):
        continue
      for event in line.events:
        match = _OP_EVENT.match(plane.event_metadata[event.metadata_id].name)
        if match and match.group(2) not in _CONTAINER_OPS:
          times[match.groups()] += event.duration_ps * 1e-12
  return times


def by_category(times: collections.Counter) -> dict[str, float]:
  """Seconds per CATEGORIES entry (every entry present)."""
  totals = dict.fromkeys(CATEGORIES, 0.0)
  for (node, op_type), seconds in times.items():
    totals[category(node, op_type)] += seconds
  return totals


def profile(step: Callable[[], object], steps: int, logdir: str
            ) -> tuple[collections.Counter, float]:
  """(op seconds per step by (node, type), wall seconds per step)."""
  tf.profiler.experimental.start(logdir)
  start = time.perf_counter()
  for _ in range(steps):
    step()
  wall = (time.perf_counter() - start) / steps
  tf.profiler.experimental.stop()
  paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
  if not paths:
    raise RuntimeError(f"tf.profiler wrote no trace under {logdir}")
  xspace = xplane_pb2.XSpace()
  with open(paths[0], "rb") as f:
    xspace.ParseFromString(f.read())
  times = op_times(xspace)
  if not times:
    raise RuntimeError(f"no TensorFlow op events in {paths[0]}")
  return collections.Counter({k: v / steps for k, v in times.items()}), wall


def summarise(runs: list[tuple[collections.Counter, float]],
              top_ops: int) -> dict:
  """Medians over repetitions of the wall time and of each category's ms
  per step; the slowest ops of the median-wall repetition."""
  walls = [wall for _, wall in runs]
  categories = [by_category(times) for times, _ in runs]
  op_ms = {c: 1e3 * statistics.median(t[c] for t in categories)
           for c in CATEGORIES}
  times, _ = sorted(runs, key=lambda r: r[1])[len(runs) // 2]
  return {"wall_ms": 1e3 * statistics.median(walls),
          "wall_ms_runs": [1e3 * w for w in walls],
          "op_ms": op_ms, "op_ms_total": sum(op_ms.values()),
          "op_ms_runs": [{c: 1e3 * v for c, v in t.items()}
                         for t in categories],
          "top_ops": [{"node": node, "op": op, "ms": 1e3 * s}
                      for (node, op), s in times.most_common(top_ops)]}


def build_step(name: str, precision: str, tiny: bool, tmp: str,
               strategy: tf.distribute.Strategy | None) -> Callable[[], float]:
  """A warmed-up callable running one step of workload `name`."""
  if name in STEP_WORKLOADS:
    image_size, batch = (32, 2) if tiny else (224, 4)
    cfg = bench_train.train_config(precision, image_size, batch, 50,
                                   f"{tmp}/{name}")
    model_fn = STEP_WORKLOADS[name]
    if tiny:
      cfg = cfg.replace(num_classes=10)
      model_fn = bench_common.small_convnet
    keep, seconds = bench_train.step_timer(cfg, model_fn, 1)
  else:
    depth, image_size, per_replica = (18, 32, 1) if tiny else (18, 64, 4)
    seconds = bench_bn_groups.step_timer(
        strategy, BN_GROUP_WORKLOADS[name], depth, image_size, per_replica, 1,
        tmp, bench_common.small_convnet if tiny else None)
    keep = seconds
  bench_common.keep_until_exit(keep)
  return seconds


def markdown(results: dict[str, dict], precision: str, steps: int,
             repetitions: int) -> str:
  names = list(results)
  lines = [
      f"### Op time per training step: {', '.join(names)}",
      "",
      f"{precision}. Kernel time summed over the threads that run ops, ms "
      "per step (share of the column's op time): medians of "
      f"{repetitions} alternating repetitions of {steps} profiled steps; "
      f"`python -m lab.dev.op_profile --workloads={','.join(names)}`.",
      "",
      "| category | " + " | ".join(names) + " |",
      "|---|" + "---:|" * len(names),
  ]
  for cat in [*CATEGORIES, "all ops", "wall time of the step"]:
    cells = []
    for name in names:
      r = results[name]
      if cat == "wall time of the step":
        cells.append(f"{r['wall_ms']:.1f}")
        continue
      ms = r["op_ms_total"] if cat == "all ops" else r["op_ms"][cat]
      cells.append(f"{ms:.1f} ({100 * ms / r['op_ms_total']:.0f}%)")
    lines.append(f"| {cat} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
  del argv
  names = FLAGS.workloads
  unknown = [n for n in names if n not in WORKLOADS]
  if unknown:
    raise app.UsageError(f"--workloads: unknown {unknown}; expected some of "
                         f"{list(WORKLOADS)}")
  if FLAGS.steps < 1 or FLAGS.repetitions < 1:
    raise app.UsageError(f"--steps and --repetitions must be at least 1, got "
                         f"{FLAGS.steps} and {FLAGS.repetitions}")
  strategy = None
  if any(n in BN_GROUP_WORKLOADS for n in names):
    strategy = tf.distribute.MirroredStrategy(
        strategy_lib.configure_cpu_replicas(bench_bn_groups.REPLICAS))
  host_memory.keep_freed_memory()  # as run.py does for every training run
  tmp = tempfile.mkdtemp(prefix="op_profile_")
  steps = {n: build_step(n, FLAGS.precision, FLAGS.tiny, tmp, strategy)
           for n in names}
  runs = {name: [] for name in names}
  for repetition in range(FLAGS.repetitions):
    for name, step in steps.items():
      step()  # one unprofiled step after the other workloads ran
      times, wall = profile(step, FLAGS.steps,
                            f"{tmp}/trace_{name}_{repetition}")
      runs[name].append((times, wall))
  results = {name: summarise(r, FLAGS.top_ops) for name, r in runs.items()}
  report = markdown(results, FLAGS.precision, FLAGS.steps, FLAGS.repetitions)
  print(report)
  if FLAGS.output_dir:
    stem = "op_profile_" + "_".join(names)
    bench_common.write_json(FLAGS.output_dir, stem + ".json", {
        "workloads": names, "precision": FLAGS.precision,
        "steps": FLAGS.steps, "repetitions": FLAGS.repetitions,
        "machine": bench_common.machine(), "results": results})
    with open(os.path.join(FLAGS.output_dir, stem + ".md"), "w") as f:
      f.write(report)
  bench_common.exit_without_teardown()


if __name__ == "__main__":
  flags.DEFINE_list("workloads", ["ours", "ours_v1_layout", "keras"],
                    f"Some of {list(WORKLOADS)}.")
  flags.DEFINE_enum("precision", "float32", ("float32", "bfloat16"),
                    "dtype of the ResNet-50 workloads (bn_groupN: float32).")
  flags.DEFINE_integer("steps", 3, "Profiled steps per repetition.")
  flags.DEFINE_integer("repetitions", 3,
                       "Alternating repetitions; medians are reported.")
  flags.DEFINE_integer("top_ops", 40, "Slowest ops kept in the JSON.")
  flags.DEFINE_string("output_dir", "",
                      "Where op_profile_<workloads>.json/.md go (optional).")
  flags.DEFINE_bool("tiny", False, "Smoke-test sizes (a small conv net).")
  app.run(main)
