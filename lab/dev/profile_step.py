"""Runs one benchmark workload in a loop, for a CPU profiler to sample.

The workloads are those of lab/bench_train.py: a training step of our
ResNet-50 or keras.applications.ResNet50 (1 replica, synthetic data), or the
peak matmul, in float32 or bfloat16; and those of lab/bench_input.py: one
batch of the full training input pipeline (`input`), of the same pipeline
with a full decode instead of the fused decode-and-crop
(`input_full_decode`), or of the decode-only ceiling (`input_ceiling`), on
its generated JPEGs. Nothing is timed against anything here; this is the
program to put under `perf` when a ratio of `make bench` needs explaining:

  perf record -g -o /tmp/step.perf -- \
      python -m lab.dev.profile_step --workload=ours --precision=bfloat16
  perf report -i /tmp/step.perf --no-children --sort dso,symbol

(--bfloat16_conv_kernels=native profiles our model on TensorFlow's bfloat16
conv kernels, as Keras's layers run them.)

Tracing and one warm-up step (for the input workloads, one epoch) run before
the loop; the loop runs --seconds.
"""
import math
import os
import tempfile
import time
from typing import Callable

from resnet_tpu.runtime import process_setup

# A CPU benchmark: the kernels a CPU run gets, chosen before TensorFlow loads.
process_setup.apply_cpu_kernel_choice("auto", "cpu")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402

from resnet_tpu.runtime import host_memory  # noqa: E402
from resnet_tpu.config import BFLOAT16_CONV_KERNELS  # noqa: E402
from tools import bench_common  # noqa: E402
from lab import bench_input  # noqa: E402
from lab import bench_train  # noqa: E402

FLAGS = flags.FLAGS
INPUT_SWITCHES = {
    "input": bench_input.VARIANTS[bench_input.FULL],
    "input_full_decode": {**bench_input.VARIANTS[bench_input.FULL],
                          "fused_decode_crop": False},
}
WORKLOADS = ("ours", "keras", "matmul", *INPUT_SWITCHES, "input_ceiling")


def input_workload(name: str, image_size: int, batch: int, num_images: int,
                   tmp: str) -> Callable[[], object]:
  """A callable taking one batch from an input workload, after an epoch."""
  jpegs = bench_input.write_dataset(tmp, num_images,
                                    min(num_images, bench_input.NUM_FILES))
  threads = os.cpu_count() or 1
  if name == "input_ceiling":
    dataset = bench_input.decode_ceiling_dataset(jpegs, batch, threads)
  else:
    dataset = bench_input.training_dataset(tmp, image_size, batch, threads,
                                           INPUT_SWITCHES[name])
  iterator = iter(dataset)
  for _ in range(math.ceil(num_images / batch) + 2):
    next(iterator)
  return lambda: next(iterator)


def workload(name: str, precision: str, image_size: int, batch: int,
             matmul_size: int, tmp: str, bfloat16_conv_kernels: str = "auto"
             ) -> Callable[[], object]:
  """A warmed-up callable running one step (or matmul) of `name`."""
  if name == "matmul":
    return bench_train.matmul_flops_per_second(precision, matmul_size)
  cfg = bench_train.train_config(precision, image_size, batch, 50, tmp)
  cfg = cfg.replace(bfloat16_conv_kernels=bfloat16_conv_kernels)
  model_fn = bench_common.keras_resnet50 if name == "keras" else None
  _, seconds = bench_train.step_timer(cfg, model_fn, 1)
  return seconds


def main(argv: list[str]) -> None:
  del argv
  if FLAGS.keep_host_memory:
    host_memory.keep_freed_memory()
  is_input = FLAGS.workload.startswith("input")
  # Input workloads have no precision: their batches are uint8.
  what = (FLAGS.workload if is_input
          else f"{FLAGS.workload} {FLAGS.precision}")
  with tempfile.TemporaryDirectory() as tmp:
    if is_input:
      run = input_workload(FLAGS.workload, FLAGS.image_size,
                           FLAGS.input_batch_size, FLAGS.num_images, tmp)
    else:
      run = workload(FLAGS.workload, FLAGS.precision, FLAGS.image_size,
                     FLAGS.batch_size, FLAGS.matmul_size, tmp,
                     FLAGS.bfloat16_conv_kernels)
    logging.info("profiling window starts: %s for %.0f s", what,
                 FLAGS.seconds)
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < FLAGS.seconds:
      run()
      calls += 1
    elapsed = time.perf_counter() - start
  print(f"{what}: {calls} calls in {elapsed:.1f} s")


if __name__ == "__main__":
  flags.DEFINE_enum("workload", "ours", WORKLOADS, "What to run in a loop.")
  flags.DEFINE_enum("precision", "bfloat16", ("float32", "bfloat16"),
                    "dtype of the workload.")
  flags.DEFINE_enum("bfloat16_conv_kernels", "auto", BFLOAT16_CONV_KERNELS,
                    "Kernels of our model's bfloat16 convs "
                    "(resnet_tpu/model/bfloat16_convs.py).")
  flags.DEFINE_integer("image_size", 224, "Image side.")
  flags.DEFINE_integer("batch_size", 4, "Global batch (1 replica).")
  flags.DEFINE_integer("matmul_size", 2048, "Side of the matmul workload.")
  flags.DEFINE_integer("input_batch_size", 32,
                       "Batch of the input workloads (as lab/bench_input).")
  flags.DEFINE_integer("num_images", 192,
                       "JPEGs generated for the input workloads.")
  flags.DEFINE_float("seconds", 60.0, "Length of the profiled loop.")
  flags.DEFINE_bool("keep_host_memory", True,
                    "As run.py: resnet_tpu/runtime/host_memory.py's allocator "
                    "settings.")
  app.run(main)
