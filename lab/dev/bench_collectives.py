"""Distributed-BN group all-reduce: subgroup collective vs masked fallback.

Ying et al. 2018 §3.1 sum BN statistics over groups of replicas. On 8
virtual CPU replicas, BN groups of 4, this times two implementations of
parallel/tensorflow/bn_all_reduce.group_all_reduce (`--bn_all_reduce`):

  collective: one CollectiveReduceV2 per group (cost ~ the group);
  masked:     a full all-reduce of an [N/g, size] one-hot buffer.

Two workloads: a DistributedBatchNormalization forward+backward step (its
payload is 2C+1 floats, so latency dominates) and a bare group all-reduce of
1M floats (bandwidth dominates). Each timed call runs --steps steps in one
tf.function host loop, as the trainer does. After a warm-up call, the two
implementations alternate (A B A B ...) for --repetitions rounds; the table
gives the median and min-max of ms per step.

  python -m lab.dev.bench_collectives          # bench_results/collectives.*
  python -m lab.dev.bench_collectives --tiny   # smoke test, < 30 s

The headline ratios are merged into bench_results/summary.json.
"""
import json
import os
import statistics
import time
from typing import Callable

from resnet_tpu.runtime import process_setup

# A CPU benchmark: the kernels a CPU run gets, chosen before TensorFlow loads.
process_setup.apply_cpu_kernel_choice("auto", "cpu")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import tensorflow as tf  # noqa: E402

from resnet_tpu.parallel.tensorflow import bn_all_reduce  # noqa: E402
from resnet_tpu.parallel.tensorflow import (  # noqa: E402
    strategy as strategy_lib)
from resnet_tpu.model.distributed_batch_norm import (  # noqa: E402
    DistributedBatchNormalization)
from tools import bench_common  # noqa: E402

FLAGS = flags.FLAGS

NUM_REPLICAS = 8
GROUP_SIZE = 4
IMPLEMENTATIONS = ("collective", "masked")
TINY = dict(batch=2, image_size=4, channels=8, vector_size=1024, steps=2,
            repetitions=2)


def _bn_step_fn(strategy, setup: dict, implementation: str) -> Callable:
  """One BN forward+backward step of a replica."""
  shape = (setup["batch"], setup["image_size"], setup["image_size"],
           setup["channels"])
  with strategy.scope():
    bn = DistributedBatchNormalization(group_size=GROUP_SIZE,
                                       all_reduce=implementation)
    bn.build((None,) + shape[1:])
  images = tf.random.stateless_normal(shape, seed=(1, 2))

  def replica_step():
    with tf.GradientTape() as tape:
      tape.watch(images)
      loss = tf.reduce_sum(tf.square(bn(images, training=True)))
    return tf.reduce_sum(tape.gradient(loss, images))

  return replica_step


def _all_reduce_fn(strategy, setup: dict, implementation: str) -> Callable:
  """One bare group all-reduce of `vector_size` floats."""
  del strategy
  vector = tf.ones([setup["vector_size"]])

  def replica_step():
    return tf.reduce_sum(bn_all_reduce.group_all_reduce(
        vector, GROUP_SIZE, implementation))

  return replica_step


WORKLOADS = {"bn_step": _bn_step_fn, "group_all_reduce": _all_reduce_fn}


def _host_loop(strategy, replica_step: Callable) -> Callable:
  """Runs `num_steps` replica steps in one tf.function call."""

  @tf.function
  def loop(num_steps):
    total = tf.constant(0.0)
    for _ in tf.range(num_steps):
      total += strategy.reduce("SUM", strategy.run(replica_step), axis=None)
    return total

  return lambda num_steps: float(loop(tf.constant(num_steps)))


def measure(setup: dict) -> dict[str, dict[str, list[float]]]:
  """ms per step of each workload and implementation, per repetition."""
  devices = strategy_lib.configure_cpu_replicas(NUM_REPLICAS)
  strategy = tf.distribute.MirroredStrategy(devices)
  times = {}
  for workload, build in WORKLOADS.items():
    loops = {name: _host_loop(strategy, build(strategy, setup, name))
             for name in IMPLEMENTATIONS}
    for loop in loops.values():
      loop(setup["steps"])  # warm-up: trace, optimise, first run
    times[workload] = {name: [] for name in IMPLEMENTATIONS}
    for _ in range(setup["repetitions"]):
      for name, loop in loops.items():
        start = time.perf_counter()
        loop(setup["steps"])
        elapsed = time.perf_counter() - start
        times[workload][name].append(1e3 * elapsed / setup["steps"])
  return times


def summarise(times: dict) -> dict:
  return {workload: {name: dict(median=statistics.median(ms), min=min(ms),
                                max=max(ms), runs=ms)
                     for name, ms in by_name.items()}
          for workload, by_name in times.items()}


def headline_ratios(summary: dict) -> dict[str, float]:
  return {f"collectives_{workload}_masked_over_collective":
          s["masked"]["median"] / s["collective"]["median"]
          for workload, s in summary.items()}


def headline_ranges(summary: dict) -> dict[str, list[float]]:
  """[min, max] of each ratio over the repetitions (paired_range)."""
  return {f"collectives_{workload}_masked_over_collective":
          bench_common.paired_range(s["masked"]["runs"],
                                    s["collective"]["runs"])
          for workload, s in summary.items()}


def markdown_table(summary: dict, setup: dict) -> str:
  lines = [
      "# Distributed-BN group all-reduce: collective vs masked",
      "",
      f"{NUM_REPLICAS} virtual CPU replicas, BN groups of {GROUP_SIZE}; "
      f"setup {json.dumps(setup)}. ms per step, median and min-max over "
      "repetitions (implementations alternate).",
      "",
      "| workload | implementation | median ms | min-max ms | vs collective |",
      "|---|---|---|---|---|",
  ]
  for workload, by_name in summary.items():
    base = by_name["collective"]["median"]
    for name, s in by_name.items():
      lines.append(f"| {workload} | {name} | {s['median']:.2f} | "
                   f"{s['min']:.2f}-{s['max']:.2f} | "
                   f"{s['median'] / base:.2f}x |")
  return "\n".join(lines) + "\n"


def write_results(output_dir: str, summary: dict,
                  setup: dict) -> dict[str, float]:
  """Writes collectives.json and .md; merges the ratios into summary.json."""
  os.makedirs(output_dir, exist_ok=True)
  ratios = headline_ratios(summary)
  with open(os.path.join(output_dir, "collectives.json"), "w") as f:
    json.dump({"setup": setup, "machine": bench_common.machine(),
               "workloads": summary, **ratios,
               "headline_ranges": headline_ranges(summary)}, f, indent=2)
  with open(os.path.join(output_dir, "collectives.md"), "w") as f:
    f.write(markdown_table(summary, setup))
  bench_common.merge_summary(output_dir, ratios)
  return ratios


def define_flags() -> None:
  """Flags exist only when run as a script; importing defines none."""
  flags.DEFINE_string("output_dir", "bench_results",
                      "Folder for collectives.json, .md and summary.json.")
  flags.DEFINE_integer("batch", 8, "Images per replica in the BN step.")
  flags.DEFINE_integer("image_size", 16, "Feature-map side in the BN step.")
  flags.DEFINE_integer("channels", 256, "BN channels (payload 2C+1).")
  flags.DEFINE_integer("vector_size", 1 << 20,
                       "Floats in the bare group all-reduce.")
  flags.DEFINE_integer("steps", 10, "Steps per timed host-loop call.")
  flags.DEFINE_integer("repetitions", 7, "Timed calls per implementation.")
  flags.DEFINE_bool("tiny", False, "Smoke-test sizes (< 30 s): " + str(TINY))


def main(argv: list[str]) -> None:
  del argv
  setup = dict(batch=FLAGS.batch, image_size=FLAGS.image_size,
               channels=FLAGS.channels, vector_size=FLAGS.vector_size,
               steps=FLAGS.steps, repetitions=FLAGS.repetitions)
  if FLAGS.tiny:
    setup.update(TINY)
  summary = summarise(measure(setup))
  ratios = write_results(FLAGS.output_dir, summary, setup)
  print(markdown_table(summary, setup))
  print(json.dumps(ratios, indent=2))


if __name__ == "__main__":
  define_flags()
  app.run(main)
