"""Training-step benchmarks: ours vs keras.applications.ResNet50, MFU, host loop.

  python -m lab.bench_train --output_dir=bench_results [--tiny]

1. Throughput (images/s) of our ResNet-50 (DistributedBatchNormalization,
   custom loop, 1 replica, bn_group_size 1) against
   keras.applications.ResNet50(weights=None) trained by the SAME loop,
   optimizer, batch, image size and precision, in float32 and bfloat16;
   in float32 also our model in Keras's v1 layout (stride on the first 1x1
   conv), which has exactly Keras's FLOPs (v1.5 has 6% more). In bfloat16
   ours runs --bfloat16_conv_kernels=auto (float32 kernels on CPUs without
   bfloat16 arithmetic, resnet_tpu/model/bfloat16_convs.py), and also, as
   `ours_bfloat16_native`, on TensorFlow's bfloat16 kernels as Keras does.
2. Model FLOP utilisation: 3 x the forward FLOPs of the convs and dense layer
   (2 FLOPs per multiply-add) times images/s, over the FLOP/s of a large
   matmul in the same dtype measured in the same run.
3. Host-loop effect: seconds per step with --steps_per_loop 1, 10 and 100 on
   a small conv net (bench_common.small_convnet) at 32 px, whose step takes
   milliseconds: the per-call dispatch overhead a TPU host loop hides.
4. Host memory: our float32 step with --keep_host_memory (what run.py does,
   and every other variant here) against glibc's allocator as tf.data leaves
   it (128 KB mmap and trim thresholds), switched by mallopt between calls.
All variants alternate A B A B ...; medians and min-max are reported. The
two variants on TensorFlow's bfloat16 conv kernels take many times longer per
step on a CPU without bfloat16 arithmetic, so they take part in only the
first --native_bf16_repetitions repetitions.
"""

from resnet_tpu.runtime import process_setup

# A CPU benchmark: the kernels a CPU run gets, chosen before TensorFlow loads.
process_setup.apply_cpu_kernel_choice("auto", "cpu")

import dataclasses  # noqa: E402

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from resnet_tpu.model import bfloat16_convs  # noqa: E402
from resnet_tpu.runtime import host_memory  # noqa: E402
from resnet_tpu.inputs import input_pipeline  # noqa: E402
from resnet_tpu import preflight  # noqa: E402
from resnet_tpu.config import TrainConfig  # noqa: E402
from resnet_tpu.model.resnet import build_model  # noqa: E402
from resnet_tpu.engines.tensorflow.engine import TensorFlowEngine  # noqa: E402
from lab.model_flops import forward_flops  # noqa: E402
from tools import bench_common  # noqa: E402

FLAGS = flags.FLAGS
HOST_LOOPS = (1, 10, 100)
# A small step (small conv net, 32 px, 2 images), so per-call dispatch shows.
HOST_LOOP_BATCH = 2
HOST_LOOP_IMAGE_SIZE = 32
# The variants on TensorFlow's bfloat16 conv kernels.
NATIVE_BF16 = ("keras_bfloat16", "ours_bfloat16_native")


def ours_v1_layout(cfg: TrainConfig) -> keras.Model:
  """Our model in keras.applications.ResNet50's layout (stride on the first
  1x1 conv): the same FLOPs as the reference, so only our BN, loop and
  layers differ."""
  return build_model(
      dataclasses.replace(cfg.model, resnet_layout="keras_v1"),
      cfg.distribution)


def train_config(precision: str, image_size: int, batch: int, depth: int,
                 tmp: str) -> TrainConfig:
  """The 1-replica synthetic-data run every step benchmark times."""
  return TrainConfig.from_flat(
      model_dir=tmp, use_synthetic_data=True, resnet_depth=depth,
      num_classes=1000, image_size=image_size, precision=precision,
      global_batch_size=batch, eval_batch_size=batch, train_steps=1,
      steps_per_loop=1, lr_schedule="constant", warmup_epochs=0.0,
      label_smoothing=0.1, weight_decay=1e-4,
      num_train_images=preflight.IMAGENET_TRAIN_IMAGES)


def step_timer(cfg: TrainConfig, model_fn, steps: int):
  """A callable timing `steps` training steps; traced and warmed up once."""
  trainer = TensorFlowEngine(cfg, tf.distribute.MirroredStrategy(["/cpu:0"]),
                             model_fn=model_fn)
  iterator = iter(trainer.strategy.distribute_datasets_from_function(
      input_pipeline.synthetic_dataset_fn(
          cfg.model.image_size, cfg.model.num_classes,
          cfg.run.global_batch_size, cfg.model.compute_dtype)))
  n = tf.constant(steps)
  bench_common.train_steps(trainer, iterator, n)  # trace + warm up
  seconds = lambda: bench_common.seconds_per_call(
      lambda: bench_common.train_steps(trainer, iterator, n), 1) / steps
  return trainer, seconds


def matmul_flops_per_second(dtype: str, size: int):
  """A callable measuring the FLOP/s of a size x size matmul in `dtype`."""
  a = tf.random.normal([size, size], dtype=tf.float32)
  a = tf.cast(a, dtype)
  matmul = tf.function(lambda x: tf.reduce_sum(
      tf.cast(tf.matmul(x, x)[0, 0], tf.float32)))
  matmul(a).numpy()
  reps = 3
  return lambda: 2 * size**3 / bench_common.seconds_per_call(
      lambda: matmul(a).numpy(), reps)


def _with_glibc_malloc(seconds) -> float:
  """`seconds()` under glibc's allocator settings as tf.data leaves them."""
  host_memory.keep_freed_memory(*host_memory.GLIBC_AFTER_TF_DATA)
  try:
    return seconds()
  finally:
    host_memory.keep_freed_memory()


def bench_models(image_size: int, batch: int, steps: dict[str, int],
                 repetitions: int, native_bf16_repetitions: int,
                 matmul_size: int, tmp: str) -> dict:
  """Ours vs Keras in float32 and bfloat16, plus the matmul peaks.

  `steps` maps each precision to the training steps per timed call; the
  NATIVE_BF16 variants run `native_bf16_repetitions` of the repetitions.
  """
  variants, flops = {}, {}
  for precision in ("float32", "bfloat16"):
    cfg = train_config(precision, image_size, batch, 50,
                       f"{tmp}/{precision}")
    for name, model_fn in (("ours", None),
                           ("keras", bench_common.keras_resnet50)):
      trainer, seconds = step_timer(cfg, model_fn, steps[precision])
      flops[f"{name}_{precision}"] = 3 * forward_flops(trainer.model)
      variants[f"{name}_{precision}"] = (
          lambda s=seconds: batch / s())
      if name == "ours" and precision == "float32":
        variants["ours_float32_glibc_malloc"] = (
            lambda s=seconds: batch / _with_glibc_malloc(s))
    if precision == "bfloat16":
      native = cfg.replace(bfloat16_conv_kernels="native")
      trainer, seconds = step_timer(native, None, steps[precision])
      variants["ours_bfloat16_native"] = lambda s=seconds: batch / s()
    if precision == "float32":
      trainer, seconds = step_timer(cfg, ours_v1_layout, steps[precision])
      flops["ours_v1_float32"] = 3 * forward_flops(trainer.model)
      variants["ours_v1_float32"] = lambda s=seconds: batch / s()
    variants[f"matmul_{precision}"] = matmul_flops_per_second(
        precision, matmul_size)
  fewer = {name: min(native_bf16_repetitions, repetitions)
           for name in NATIVE_BF16}
  runs = bench_common.alternate(variants, repetitions, fewer)
  bench_common.keep_until_exit(variants)  # freeing them stalls: see there
  return {"summary": bench_common.summarise(runs),
          "train_flops_per_image": flops}


def bench_host_loop(batch: int, total_steps: int, repetitions: int,
                    tmp: str) -> dict:
  """Seconds per step when one call runs 1, 10 or 100 steps."""
  cfg = train_config("float32", HOST_LOOP_IMAGE_SIZE, batch, 18,
                     f"{tmp}/host_loop")  # depth unused: small_convnet
  trainer = TensorFlowEngine(cfg, tf.distribute.MirroredStrategy(["/cpu:0"]),
                             model_fn=bench_common.small_convnet)
  iterator = iter(trainer.strategy.distribute_datasets_from_function(
      input_pipeline.synthetic_dataset_fn(HOST_LOOP_IMAGE_SIZE, 1000, batch,
                                          "float32")))
  variants = {}
  for per_call in HOST_LOOPS:
    calls = max(1, total_steps // per_call)
    n = tf.constant(min(per_call, total_steps))
    bench_common.train_steps(trainer, iterator, n)
    variants[f"steps_per_loop={per_call}"] = (
        lambda n=n, calls=calls: bench_common.seconds_per_call(
            lambda: bench_common.train_steps(trainer, iterator, n), calls) /
        int(n))
  runs = bench_common.alternate(variants, repetitions)
  return bench_common.summarise(runs)


def ratios(models: dict) -> dict[str, float]:
  s = {k: v["median"] for k, v in models["summary"].items()}
  flops = models["train_flops_per_image"]
  return {
      "ours_vs_keras_fp32": s["ours_float32"] / s["keras_float32"],
      "ours_vs_keras_bf16": s["ours_bfloat16"] / s["keras_bfloat16"],
      "ours_v1_layout_vs_keras_fp32": s["ours_v1_float32"] /
                                      s["keras_float32"],
      "mfu_bf16": s["ours_bfloat16"] * flops["ours_bfloat16"] /
                  s["matmul_bfloat16"],
      "mfu_fp32": s["ours_float32"] * flops["ours_float32"] /
                  s["matmul_float32"],
      "keras_mfu_bf16": s["keras_bfloat16"] * flops["keras_bfloat16"] /
                        s["matmul_bfloat16"],
      "keep_host_memory_speedup_fp32": s["ours_float32"] /
                                       s["ours_float32_glibc_malloc"],
      "ours_native_bf16_kernels_vs_keras_bf16": s["ours_bfloat16_native"] /
                                                s["keras_bfloat16"],
      "ours_bf16_vs_ours_fp32": s["ours_bfloat16"] / s["ours_float32"],
      "mfu_bf16_of_fp32_peak": s["ours_bfloat16"] * flops["ours_bfloat16"] /
                               s["matmul_float32"],
      # The peaks the MFUs divide by (this run, this CPU: its features are
      # in the JSON's `machine`), so figures of two machines compare.
      "matmul_peak_bf16_gflop_s": s["matmul_bfloat16"] / 1e9,
      "matmul_peak_fp32_gflop_s": s["matmul_float32"] / 1e9,
  }


def headline_ranges(models: dict) -> dict[str, list[float]]:
  """[min, max] over the repetitions of each ratio merged into summary.json
  (bench_common.paired_range)."""
  runs = {name: v["runs"] for name, v in models["summary"].items()}
  flops = models["train_flops_per_image"]["ours_bfloat16"]
  return {
      "ours_vs_keras_fp32": bench_common.paired_range(runs["ours_float32"],
                                                      runs["keras_float32"]),
      "ours_vs_keras_bf16": bench_common.paired_range(runs["ours_bfloat16"],
                                                      runs["keras_bfloat16"]),
      "mfu_bf16": bench_common.paired_range(
          [r * flops for r in runs["ours_bfloat16"]], runs["matmul_bfloat16"]),
  }


def markdown(models: dict, host_loop: dict, result: dict,
             setup: dict) -> str:
  s = models["summary"]
  lines = [
      "### Training step: ours vs keras.applications.ResNet50",
      "",
      f"ResNet-50, {setup['image_size']} px, batch {setup['batch_size']}, "
      f"1 replica, same custom loop and optimizer (momentum SGD), "
      f"{setup['model_repetitions']} alternating repetitions of "
      f"{setup['float32_steps']} float32 / {setup['bfloat16_steps']} "
      "bfloat16 steps (the two variants on TensorFlow's bfloat16 conv "
      f"kernels: the first {setup['native_bf16_repetitions']}).",
      "",
      "| precision | ours images/s (min-max) | Keras images/s (min-max) | "
      "ours / Keras |",
      "|---|---:|---:|---:|",
  ]
  for precision, key in (("float32", "fp32"), ("bfloat16", "bf16")):
    ours, ref = s[f"ours_{precision}"], s[f"keras_{precision}"]
    lines.append(
        f"| {precision} | {ours['median']:.2f} ({ours['min']:.2f}-"
        f"{ours['max']:.2f}) | {ref['median']:.2f} ({ref['min']:.2f}-"
        f"{ref['max']:.2f}) | {result[f'ours_vs_keras_{key}']:.2f}x |")
  native = s["ours_bfloat16_native"]
  kernels = ("float32" if bfloat16_convs.use_float32_kernels("auto", ["CPU"])
             else "native bfloat16")
  lines += [
      "",
      f"bfloat16 convs: ours on {kernels} kernels (`--bfloat16_conv_kernels"
      "=auto` on this CPU; resnet_tpu/model/bfloat16_convs.py), Keras's "
      "Conv2D on TensorFlow's bfloat16 kernels. Ours on those same native kernels: "
      f"{native['median']:.2f} ({native['min']:.2f}-{native['max']:.2f}) "
      "images/s, "
      f"{result['ours_native_bf16_kernels_vs_keras_bf16']:.2f}x Keras. "
      "Ours in bfloat16 vs ours in float32: "
      f"{result['ours_bf16_vs_ours_fp32']:.2f}x.",
  ]
  v1 = s["ours_v1_float32"]
  lines += [
      "",
      "Equal FLOPs: our model with the stride on the first 1x1 conv "
      "(keras.applications' v1 layout, `--resnet_layout=keras_v1`),"
      f" float32: {v1['median']:.2f} ({v1['min']:.2f}-{v1['max']:.2f}) "
      f"images/s, {result['ours_v1_layout_vs_keras_fp32']:.2f}x Keras.",
  ]
  flops = models["train_flops_per_image"]
  lines += [
      "",
      "### Model FLOP utilisation",
      "",
      f"Training FLOPs per image = 3 x forward conv/dense FLOPs at "
      f"{setup['image_size']} px: ours (v1.5, stride on the 3x3 conv) "
      f"{flops['ours_float32'] / 1e9:.2f} GFLOP, Keras (v1, stride on the "
      f"first 1x1 conv) {flops['keras_float32'] / 1e9:.2f} GFLOP; peak = "
      f"{setup['matmul_size']}^2 matmul in the same dtype, same run. "
      "ours / Keras MFU compares the work done per second, whatever the "
      "architecture's FLOPs.",
      "",
      "| precision | matmul peak GFLOP/s | ours MFU | Keras MFU | "
      "ours / Keras MFU |",
      "|---|---:|---:|---:|---:|",
  ]
  for precision in ("float32", "bfloat16"):
    peak = s[f"matmul_{precision}"]["median"]
    ours = s[f"ours_{precision}"]["median"] * flops[f"ours_{precision}"]
    ref = s[f"keras_{precision}"]["median"] * flops[f"keras_{precision}"]
    lines.append(f"| {precision} | {peak / 1e9:.1f} | {ours / peak:.1%} | "
                 f"{ref / peak:.1%} | {ours / ref:.2f}x |")
  lines += [
      "",
      "Ours in bfloat16 over the float32 matmul peak: "
      f"{result['mfu_bf16_of_fp32_peak']:.1%} (on a CPU without bfloat16 "
      "arithmetic the bfloat16 matmul can peak lower than float32).",
  ]
  glibc = s["ours_float32_glibc_malloc"]
  lines += [
      "",
      "### Host memory (resnet_tpu/runtime/host_memory.py)",
      "",
      "Our float32 step with freed memory kept mapped (--keep_host_memory, "
      "every row above) vs glibc's allocator as tf.data leaves it, "
      "alternating in the same process: "
      f"{s['ours_float32']['median']:.2f} vs {glibc['median']:.2f} "
      f"({glibc['min']:.2f}-{glibc['max']:.2f}) images/s, "
      f"{result['keep_host_memory_speedup_fp32']:.2f}x.",
  ]
  lines += [
      "",
      "### Host loop (steps per tf.function call)",
      "",
      f"Small conv net (conv, BN, pool, dense), {HOST_LOOP_IMAGE_SIZE} px, "
      f"batch {HOST_LOOP_BATCH}, 1 replica, {setup['repetitions']} "
      f"alternating repetitions of {setup['host_loop_steps']} steps: "
      "seconds per training step.",
      "",
      "| steps_per_loop | ms/step (min-max) | speed vs 1 |",
      "|---|---:|---:|",
  ]
  base = host_loop[f"steps_per_loop={HOST_LOOPS[0]}"]["median"]
  for name, v in host_loop.items():
    lines.append(f"| {name.split('=')[1]} | {v['median'] * 1e3:.2f} "
                 f"({v['min'] * 1e3:.2f}-{v['max'] * 1e3:.2f}) | "
                 f"{base / v['median']:.2f}x |")
  return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
  del argv
  tf.get_logger().setLevel("WARNING")
  setup = dict(image_size=FLAGS.image_size, batch_size=FLAGS.batch_size,
               float32_steps=FLAGS.float32_steps,
               bfloat16_steps=FLAGS.bfloat16_steps,
               model_repetitions=FLAGS.model_repetitions,
               native_bf16_repetitions=FLAGS.native_bf16_repetitions,
               repetitions=FLAGS.repetitions, matmul_size=FLAGS.matmul_size,
               host_loop_steps=FLAGS.host_loop_steps)
  if FLAGS.tiny:
    setup.update(image_size=32, batch_size=2, float32_steps=1,
                 bfloat16_steps=1, model_repetitions=1,
                 native_bf16_repetitions=1, repetitions=1,
                 matmul_size=256, host_loop_steps=10)
  tmp = FLAGS.scratch_dir
  host_memory.keep_freed_memory()  # as run.py does for every training run
  models = bench_models(setup["image_size"], setup["batch_size"],
                        {"float32": setup["float32_steps"],
                         "bfloat16": setup["bfloat16_steps"]},
                        setup["model_repetitions"],
                        setup["native_bf16_repetitions"],
                        setup["matmul_size"], tmp)
  host_loop = bench_host_loop(HOST_LOOP_BATCH, setup["host_loop_steps"],
                              setup["repetitions"], tmp)
  result = ratios(models)
  report = markdown(models, host_loop, result, setup)
  bench_common.write_json(FLAGS.output_dir, "train.json", {
      "setup": setup, "machine": bench_common.machine(), "models": models,
      "host_loop": host_loop, "ratios": result,
      "headline_ranges": headline_ranges(models)})
  with open(f"{FLAGS.output_dir}/train.md", "w") as f:
    f.write(report)
  bench_common.merge_summary(FLAGS.output_dir, {
      k: result[k] for k in ("ours_vs_keras_fp32", "ours_vs_keras_bf16",
                             "mfu_bf16", "matmul_peak_bf16_gflop_s")})
  print(report)
  logging.info("ratios: %s", result)
  bench_common.exit_without_teardown()


if __name__ == "__main__":
  flags.DEFINE_string("output_dir", "bench_results", "Where results go.")
  flags.DEFINE_string("scratch_dir", "/tmp/resnet_tpu_bench_train",
                      "Scratch model_dir (nothing is saved there).")
  flags.DEFINE_integer("image_size", 224, "Image side.")
  flags.DEFINE_integer("batch_size", 4, "Global batch (1 replica).")
  flags.DEFINE_integer("float32_steps", 3,
                       "float32 training steps per timed call.")
  flags.DEFINE_integer("bfloat16_steps", 1,
                       "bfloat16 training steps per timed call.")
  flags.DEFINE_integer("model_repetitions", 5,
                       "Alternating repetitions of the model comparison.")
  flags.DEFINE_integer("native_bf16_repetitions", 3,
                       "Of those, the repetitions of the two variants on "
                       "TensorFlow's bfloat16 conv kernels (slow on CPUs "
                       "without bfloat16 arithmetic).")
  flags.DEFINE_integer("repetitions", 5,
                       "Alternating repetitions of the host-loop comparison.")
  flags.DEFINE_integer("matmul_size", 2048, "Side of the peak matmul.")
  flags.DEFINE_integer("host_loop_steps", 100, "Steps per host-loop sample.")
  flags.DEFINE_bool("tiny", False, "Smoke-test sizes (seconds, not minutes).")
  app.run(main)
