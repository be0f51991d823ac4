"""Distributed-BN cost (Ying et al. §3.1): bn_group_size 1 vs 4 vs 8.

  python -m lab.bench_bn_groups --output_dir=bench_results [--tiny]

8 virtual CPU replicas under MirroredStrategy, the same per-replica batch,
ResNet trained by the production loop; only the BN group size changes. The
step-time ratio group 4 / group 1 is the price of pooling statistics over 4
replicas (one float32 group all-reduce per BN layer, forward and backward).

At group 4 it also times the moving statistics and the optimizer's step
counter in the form they had before replica-local statistics (ON_WRITE,
"only_first_replica": replica 0's value copied to every device per variable
and step), against today's (each replica its own, one all-reduce to their
mean per host call): the `statistics_local_vs_broadcast` ratio.
"""
import contextlib

from resnet_tpu.runtime import process_setup

# A CPU benchmark: the kernels a CPU run gets, chosen before TensorFlow loads.
process_setup.apply_cpu_kernel_choice("auto", "cpu")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402
import tensorflow as tf  # noqa: E402

from resnet_tpu.model.distributed_batch_norm import (  # noqa: E402
    DistributedBatchNormalization)
from resnet_tpu.optim.tensorflow import (  # noqa: E402
    optimizers as optimizers_tf)
from resnet_tpu.runtime import host_memory  # noqa: E402
from resnet_tpu.inputs import input_pipeline  # noqa: E402
from resnet_tpu import preflight  # noqa: E402
from resnet_tpu.config import TrainConfig  # noqa: E402
from resnet_tpu.parallel.tensorflow import (  # noqa: E402
    strategy as strategy_lib)
from resnet_tpu.engines.tensorflow.engine import TensorFlowEngine  # noqa: E402
from tools import bench_common  # noqa: E402

FLAGS = flags.FLAGS
REPLICAS = 8
GROUPS = (1, 4, 8)
BROADCAST = "bn_group_size=4,statistics_broadcast"


@contextlib.contextmanager
def statistics_broadcast_from_replica_0():
  """Models and optimizers built here keep the moving statistics and the
  step counter as before replica-local statistics: ON_WRITE with
  aggregation "only_first_replica" (Keras's add_weight and Keras's own
  counter), so every update copies replica 0's value to each device."""

  def on_write(layer, name, shape, initializer):
    return layer.add_weight(shape=shape, name=name, initializer=initializer,
                            trainable=False, autocast=False,
                            aggregation="only_first_replica")

  saved = (DistributedBatchNormalization._replica_local_weight,
           optimizers_tf.STEP_COUNTER_NAME)
  DistributedBatchNormalization._replica_local_weight = on_write
  optimizers_tf.STEP_COUNTER_NAME = None  # Keras's counter, unchanged
  try:
    yield
  finally:
    (DistributedBatchNormalization._replica_local_weight,
     optimizers_tf.STEP_COUNTER_NAME) = saved


def step_timer(strategy, group_size: int, depth: int, image_size: int,
               per_replica: int, steps: int, tmp: str, model_fn=None):
  """A callable timing one training step at `group_size`, warmed up."""
  batch = per_replica * REPLICAS
  cfg = TrainConfig.from_flat(
      model_dir=f"{tmp}/group{group_size}", use_synthetic_data=True,
      resnet_depth=depth, num_classes=1000, image_size=image_size,
      bn_group_size=group_size, global_batch_size=batch,
      eval_batch_size=batch, train_steps=1, lr_schedule="constant",
      warmup_epochs=0.0, num_train_images=preflight.IMAGENET_TRAIN_IMAGES)
  trainer = TensorFlowEngine(cfg, strategy, model_fn=model_fn)
  iterator = iter(strategy.distribute_datasets_from_function(
      input_pipeline.synthetic_dataset_fn(image_size, 1000, batch,
                                          "float32")))
  n = tf.constant(steps)
  bench_common.train_steps(trainer, iterator, n)
  return lambda: bench_common.seconds_per_call(
      lambda: bench_common.train_steps(trainer, iterator, n), 1) / steps


def markdown(summary: dict, setup: dict, ratios: dict, spreads: dict) -> str:
  base = summary["bn_group_size=1"]["median"]
  model = ("small conv net" if setup["smoke_net"]
           else f"ResNet-{setup['depth']}")
  lines = [
      "### Distributed BN: group size on 8 virtual CPU replicas",
      "",
      f"{model}, {setup['image_size']} px, "
      f"{setup['per_replica']} images per replica, {setup['repetitions']} "
      f"alternating repetitions of {setup['steps']} steps. Group 1 "
      "normalises with one fused kernel per layer (FusedBatchNormV3); groups "
      "4 and 8 all-reduce per-channel sums in the group and normalise with "
      "the fused kernels' inference form, one more group all-reduce in the "
      "backward pass. `4, broadcast` keeps the moving statistics and step "
      "counter as before they were replica-local (replica 0's value copied "
      "to every device per variable and step); the others keep them per "
      "replica and average them once per call, here every "
      f"{setup['steps']} steps (a run's --steps_per_loop is larger).",
      "",
      "| bn_group_size | ms/step (min-max) | vs group 1 |",
      "|---|---:|---:|",
  ]
  for name, v in summary.items():
    group = name.split("=")[1].replace(",statistics_broadcast",
                                       ", broadcast")
    lines.append(f"| {group} | {v['median'] * 1e3:.1f} "
                 f"({v['min'] * 1e3:.1f}-{v['max'] * 1e3:.1f}) | "
                 f"{v['median'] / base:.3f}x |")
  key = "statistics_local_vs_broadcast"
  lines += ["", "Replica-local statistics / broadcast ones, group 4: "
            f"{ratios[key]:.3f}x (paired min-max {spreads[key][0]:.3f}-"
            f"{spreads[key][1]:.3f})."]
  return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
  del argv
  tf.get_logger().setLevel("WARNING")
  setup = dict(depth=FLAGS.resnet_depth, image_size=FLAGS.image_size,
               per_replica=FLAGS.per_replica_batch, steps=FLAGS.steps,
               repetitions=FLAGS.repetitions, smoke_net=False)
  if FLAGS.tiny:
    setup.update(image_size=32, per_replica=1, steps=1, repetitions=1,
                 smoke_net=True)
  strategy = tf.distribute.MirroredStrategy(
      strategy_lib.configure_cpu_replicas(REPLICAS))
  host_memory.keep_freed_memory()  # as run.py does for every training run
  model_fn = bench_common.small_convnet if setup["smoke_net"] else None
  timer = lambda g, tag="": step_timer(
      strategy, g, setup["depth"], setup["image_size"], setup["per_replica"],
      setup["steps"], f"{FLAGS.scratch_dir}{tag}", model_fn)
  timers = {f"bn_group_size={g}": timer(g) for g in GROUPS}
  with statistics_broadcast_from_replica_0():
    timers[BROADCAST] = timer(4, "_broadcast")
  summary = bench_common.summarise(
      bench_common.alternate(timers, setup["repetitions"]))
  ratios, spreads = {}, {}
  for key, (num, den) in {
      "bn_group4_vs_group1": ("bn_group_size=4", "bn_group_size=1"),
      "statistics_local_vs_broadcast": ("bn_group_size=4", BROADCAST)
  }.items():
    ratios[key] = summary[num]["median"] / summary[den]["median"]
    spreads[key] = bench_common.paired_range(summary[num]["runs"],
                                             summary[den]["runs"])
  report = markdown(summary, setup, ratios, spreads)
  bench_common.write_json(FLAGS.output_dir, "bn_groups.json", {
      "setup": setup, "machine": bench_common.machine(), "summary": summary,
      **ratios, "headline_ranges": spreads})
  with open(f"{FLAGS.output_dir}/bn_groups.md", "w") as f:
    f.write(report)
  bench_common.merge_summary(FLAGS.output_dir, ratios)
  print(report)
  logging.info("%s", ratios)
  bench_common.exit_without_teardown()


if __name__ == "__main__":
  flags.DEFINE_string("output_dir", "bench_results", "Where results go.")
  flags.DEFINE_string("scratch_dir", "/tmp/resnet_tpu_bench_bn",
                      "Scratch model_dir (nothing is saved there).")
  flags.DEFINE_integer("resnet_depth", 18, "ResNet depth.")
  flags.DEFINE_integer("image_size", 64, "Image side.")
  flags.DEFINE_integer("per_replica_batch", 4, "Images per replica.")
  flags.DEFINE_integer("steps", 2, "Training steps per timed call.")
  flags.DEFINE_integer("repetitions", 9, "Alternating repetitions.")
  flags.DEFINE_bool("tiny", False, "Smoke-test sizes.")
  app.run(main)
