"""Input pipeline ablation, after Ying et al. 2018 Figure 5 (§3.2, §4).

Generates ImageNet-like JPEGs (500x375, about 110 KB: smooth random fields at
four scales plus noise), writes them as TFRecords and measures the images/s of
resnet_tpu.inputs.input_pipeline's training dataset as the §3.2 optimisations are
switched on one at a time (every variant hands uint8 batches, the default;
one more row casts to float32 on the host), next to the decode-only ceiling:
tf.io.decode_jpeg alone on in-memory bytes with the same thread count. A
second table times the decode alone, fused vs full, on the same windows: the
fusion's own gain, which the work both paths share dilutes in the pipeline.
Every pipeline measurement builds a fresh iterator, warms it up for an epoch
(so that `cache` is full), then counts batches for --seconds. Variants
alternate within each repetition; the table gives the median and the min-max
over repetitions, and the median CPU time per image, which other load on a
shared machine disturbs far less.

  python -m lab.bench_input          # bench_results/input.{json,md}
  python -m lab.bench_input --tiny   # smoke test, < 20 s
  python -m lab.bench_input --jpeg_dir=DIR --output_dir=OUT  # your JPEGs

The two headline ratios are merged into bench_results/summary.json.
"""
import json
import math
import os
import statistics
import tempfile
import time
from typing import Callable

from resnet_tpu.runtime import process_setup

# A CPU benchmark: the kernels a CPU run gets, chosen before TensorFlow loads.
process_setup.apply_cpu_kernel_choice("auto", "cpu")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from data import build_tfrecords  # noqa: E402
from resnet_tpu.config import InputConfig  # noqa: E402
from resnet_tpu.inputs import record_guards  # noqa: E402
from resnet_tpu.runtime import host_memory  # noqa: E402
from resnet_tpu.inputs import input_pipeline  # noqa: E402
from resnet_tpu.inputs import preprocessing  # noqa: E402
from tools import bench_common  # noqa: E402

FLAGS = flags.FLAGS

SOURCE_HEIGHT, SOURCE_WIDTH = 375, 500
NUM_FILES = 8
JPEG_QUALITY = 93
TINY = dict(num_images=16, num_files=4, image_size=64, batch_size=8,
            repetitions=1, seconds=0.25)
_OFF = dict(parallel_interleave=False, parallel_map=False,
            fused_decode_crop=False, cache_dataset=False, prefetch=False)
_PARALLEL = {**_OFF, "parallel_interleave": True, "parallel_map": True}
_FUSED = {**_PARALLEL, "fused_decode_crop": True}
_CACHED = {**_FUSED, "cache_dataset": True}
VARIANTS = {
    "base: sequential read, parse, full decode": _OFF,
    "+ parallel interleave and parse": _PARALLEL,
    "+ fused decode-and-crop": _FUSED,
    "+ cache": _CACHED,
    "+ prefetch (full pipeline)": {**_CACHED, "prefetch": True},
    "full pipeline, float32 batches (--input_dtype=compute)": {
        **_CACHED, "prefetch": True, "dtype": "float32"},
}
CEILING = "decode-only ceiling (tf.io.decode_jpeg)"
DECODE_FULL = "full decode, then slice"
DECODE_FUSED = "fused decode-and-crop"
DECODE_WINDOWS_PER_IMAGE = 4
BASE, PARALLEL, FUSED, _, FULL = list(VARIANTS)[:5]


def photo_like_jpeg(rng: np.random.Generator) -> bytes:
  """A 500x375 JPEG of about 110 KB with photo-like smooth structure."""
  image = np.full((SOURCE_HEIGHT, SOURCE_WIDTH, 3), 128.0, np.float32)
  for cells, amplitude in ((4, 90.0), (16, 45.0), (64, 25.0), (160, 12.0)):
    field = rng.normal(0, 1, (1, cells * 3 // 4 + 2, cells + 2, 3))
    field = tf.image.resize(field.astype(np.float32),
                            (SOURCE_HEIGHT, SOURCE_WIDTH), method="bicubic")
    image += amplitude * field[0].numpy()
  image += rng.normal(0, 15, image.shape)
  image = np.clip(image, 0, 255).astype(np.uint8)
  return tf.io.encode_jpeg(image, quality=JPEG_QUALITY).numpy()


def write_dataset(data_dir: str, num_images: int, num_files: int,
                  seed: int = 0) -> list[bytes]:
  """Writes train-*-of-* TFRecords of generated JPEGs; returns the JPEGs."""
  rng = np.random.default_rng(seed)
  jpegs = [photo_like_jpeg(rng) for _ in range(num_images)]
  write_records(data_dir, jpegs, num_files)
  return jpegs


def read_jpegs(jpeg_dir: str, num_images: int,
               progressive_to_baseline: bool = False) -> list[bytes]:
  """num_images JPEGs: the *.jpg/*.jpeg files of jpeg_dir, sorted, cycled,
  as data/build_tfrecords.py stores them (with `progressive_to_baseline`)."""
  if not os.path.isdir(jpeg_dir):
    raise ValueError(f"--jpeg_dir={jpeg_dir} is not a folder")
  names = sorted(n for n in os.listdir(jpeg_dir)
                 if n.lower().endswith((".jpg", ".jpeg")))
  if not names:
    raise ValueError(f"--jpeg_dir={jpeg_dir} holds no .jpg or .jpeg files")
  files = []
  for name in names:
    with open(os.path.join(jpeg_dir, name), "rb") as f:
      files.append(build_tfrecords.to_rgb_jpeg(
          f.read(), progressive_to_baseline)[0])
  return [files[i % len(files)] for i in range(num_images)]


def write_records(data_dir: str, jpegs: list[bytes], num_files: int) -> None:
  """Writes `jpegs` as train-*-of-* TFRecords in the imagenet_to_gcs format."""
  for shard in range(num_files):
    path = os.path.join(data_dir, f"train-{shard:05d}-of-{num_files:05d}")
    with tf.io.TFRecordWriter(path) as writer:
      for i in range(shard, len(jpegs), num_files):
        height, width, _ = tf.image.extract_jpeg_shape(jpegs[i]).numpy()
        example = build_tfrecords.image_example(
            f"{i}.JPEG", jpegs[i], int(height), int(width), "n00000000", 1)
        writer.write(example.SerializeToString())


def describe(jpegs: list[bytes]) -> str:
  """'192 JPEGs of 500x375 (mean 112 KB)'; for mixed sizes the range, and
  how many are progressive."""
  shapes = sorted({tuple(tf.image.extract_jpeg_shape(j).numpy()[1::-1])
                   for j in set(jpegs)})
  sizes = ("x".join(map(str, shapes[0])) if len(shapes) == 1 else
           f"{len(shapes)} sizes, {'x'.join(map(str, shapes[0]))} to "
           f"{'x'.join(map(str, shapes[-1]))}")
  progressive = sum(map(record_guards.is_progressive_jpeg, jpegs))
  kind = "progressive JPEGs" if progressive == len(jpegs) else "JPEGs"
  mixed = (f", {progressive} progressive" if 0 < progressive < len(jpegs)
           else "")
  mean_kb = sum(map(len, jpegs)) / len(jpegs) / 1e3
  return f"{len(jpegs)} {kind} of {sizes} (mean {mean_kb:.0f} KB{mixed})"


def decode_ceiling_dataset(jpegs: list[bytes], batch_size: int,
                           threads: int) -> tf.data.Dataset:
  """Parallel tf.io.decode_jpeg of in-memory bytes, yielding only shapes."""
  options = tf.data.Options()
  options.threading.private_threadpool_size = threads
  dataset = tf.data.Dataset.from_tensor_slices(jpegs).repeat().map(
      lambda jpeg: tf.shape(tf.io.decode_jpeg(jpeg, channels=3)),
      num_parallel_calls=tf.data.AUTOTUNE)
  dataset = dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)
  return dataset.with_options(options)


def training_dataset(data_dir: str, image_size: int, batch_size: int,
                     threads: int, switches: dict) -> tf.data.Dataset:
  """resnet_tpu.inputs.input_pipeline's training dataset with the VARIANTS
  `switches`, one input pipeline, batches of `batch_size`."""
  switches = dict(switches)
  dtype = switches.pop("dtype", "uint8")
  cfg = InputConfig(data_dir=data_dir, private_threadpool_size=threads,
                    **switches)
  dataset_fn = input_pipeline.train_dataset_fn(
      cfg, input_pipeline.split_files(data_dir, "train"), batch_size,
      image_size=image_size, dtype=dtype)
  return dataset_fn(tf.distribute.InputContext())


def measure(make_dataset: Callable[[], tf.data.Dataset], batch_size: int,
            warmup_batches: int, seconds: float) -> tuple[float, float]:
  """(images/s, CPU ms per image) of a fresh iterator after a warm-up.

  The CPU time of the whole process per image does not depend on what else
  the machine runs, so it is the steadier number on a shared machine.
  """
  iterator = iter(make_dataset())
  for _ in range(warmup_batches):
    next(iterator)
  batches, start, cpu_start = 0, time.perf_counter(), time.process_time()
  while time.perf_counter() - start < seconds:
    next(iterator)
    batches += 1
  images = batches * batch_size
  return (images / (time.perf_counter() - start),
          1e3 * (time.process_time() - cpu_start) / images)


def run_ablation(data_dir: str, jpegs: list[bytes], image_size: int,
                 batch_size: int, repetitions: int, seconds: float,
                 threads: int) -> dict[str, list[tuple[float, float]]]:
  """(images/s, CPU ms/image) per variant and repetition, alternating."""
  makers = {name: (lambda s=switches: training_dataset(
      data_dir, image_size, batch_size, threads, s))
            for name, switches in VARIANTS.items()}
  makers[CEILING] = lambda: decode_ceiling_dataset(jpegs, batch_size, threads)
  warmup_batches = math.ceil(len(jpegs) / batch_size) + 2
  runs = {name: [] for name in makers}
  for repetition in range(repetitions):
    for name, make in makers.items():
      runs[name].append(measure(make, batch_size, warmup_batches, seconds))
      logging.info("repetition %d: %s: %.1f images/s, %.2f CPU ms/image",
                   repetition, name, *runs[name][-1])
  return runs


def resize_kernels(image_size: int, repetitions: int,
                   resizes_per_call: int = 50) -> dict[str, dict]:
  """ms per bilinear resize of a 318x318 uint8 crop (about the mean training
  crop of a 500x375 image) to image_size, rounded to uint8: TensorFlow's
  uint8 kernel vs preprocessing.resize (float32 kernel, casts included).

  Each call runs `resizes_per_call` resizes one after another inside one
  graph, so the Python call overhead is amortised. Alternating repetitions.
  """
  crop = tf.constant(np.random.default_rng(0).integers(
      0, 256, (318, 318, 3), dtype=np.uint8))
  kernels = {
      "uint8 kernel": lambda x: tf.cast(
          tf.image.resize(x, [image_size, image_size]) + 0.5, tf.uint8),
      "float32 kernel (preprocessing.resize)": lambda x: preprocessing.resize(
          x, image_size),
  }

  def timed(kernel):
    @tf.function
    def loop(x):
      checksum = tf.constant(0, tf.int32)
      for i in tf.range(resizes_per_call):
        out = kernel(x)
        checksum += tf.cast(out[0, 0, 0], tf.int32)
      return checksum
    loop(crop).numpy()
    return lambda: bench_common.seconds_per_call(
        lambda: loop(crop).numpy(), 1) / resizes_per_call

  timers = {name: timed(kernel) for name, kernel in kernels.items()}
  return bench_common.summarise(bench_common.alternate(timers, repetitions))


def decode_alone(jpegs: list[bytes], repetitions: int,
                 windows_per_image: int = DECODE_WINDOWS_PER_IMAGE
                 ) -> dict[str, dict]:
  """Seconds of CPU per image of preprocessing.decode_and_crop alone, full
  decode (then slice) vs fused, on the same crop windows:
  `windows_per_image` per JPEG, sampled as in training but stateless, so
  that every run times the same windows.

  This is the fusion's own gain. Inside the pipeline both paths also read,
  parse, resize, round, flip and batch every image, and that shared work
  dilutes the gain (the README's perf profile). One graph decodes every
  window per call, one after another, so its CPU time is the decode's own.
  Alternating repetitions.
  """
  count = windows_per_image * len(jpegs)
  images = tf.constant([jpegs[i % len(jpegs)] for i in range(count)])
  windows = tf.stack([
      preprocessing.sample_crop_window(tf.image.extract_jpeg_shape(images[i]),
                                       tf.constant([0, i]))
      for i in range(count)])

  def timed(fused: bool) -> Callable[[], float]:
    @tf.function
    def loop():
      checksum = tf.constant(0, tf.int32)
      for i in tf.range(count):
        crop = preprocessing.decode_and_crop(images[i], windows[i], fused)
        checksum += tf.shape(crop)[0]
      return checksum

    loop().numpy()

    def measure() -> float:
      start = time.process_time()
      loop().numpy()
      return (time.process_time() - start) / count
    return measure

  timers = {DECODE_FULL: timed(fused=False), DECODE_FUSED: timed(fused=True)}
  return bench_common.summarise(bench_common.alternate(timers, repetitions))


def summarise(runs: dict[str, list[tuple[float, float]]]) -> dict[str, dict]:
  summary = {}
  for name, measured in runs.items():
    rates, cpu_ms = zip(*measured)
    summary[name] = {"median": statistics.median(rates), "min": min(rates),
                     "max": max(rates), "runs": list(rates),
                     "cpu_ms_per_image": statistics.median(cpu_ms)}
  return summary


HEADLINES = {"input_full_vs_decode_ceiling": (FULL, CEILING),
             "input_fused_vs_full_decode": (FUSED, PARALLEL)}


def headline_ratios(summary: dict[str, dict]) -> dict[str, float]:
  """The two ratios of summary.json: ratios of the variants' medians."""
  return {key: summary[num]["median"] / summary[den]["median"]
          for key, (num, den) in HEADLINES.items()}


def headline_ranges(summary: dict[str, dict]) -> dict[str, list[float]]:
  """[min, max] of each headline ratio over the repetitions' pairs of
  windows (bench_common.paired_range)."""
  return {key: bench_common.paired_range(summary[num]["runs"],
                                         summary[den]["runs"])
          for key, (num, den) in HEADLINES.items()}


def seconds_table(caption: str, row: str, unit: str,
                  timings: dict[str, dict]) -> str:
  """A table of seconds per image (shown in ms), each row against the first."""
  first_name, first = next(iter(timings.items()))
  lines = [caption, "", f"| {row} | {unit} (min-max) | speed vs {first_name} |",
           "|---|---:|---:|"]
  for name, t in timings.items():
    lines.append(f"| {name} | {t['median'] * 1e3:.3f} ({t['min'] * 1e3:.3f}"
                 f"-{t['max'] * 1e3:.3f}) | "
                 f"{first['median'] / t['median']:.2f}x |")
  return "\n".join(lines) + "\n"


def decode_table(decodes: dict[str, dict]) -> str:
  return seconds_table(
      "The decode alone (preprocessing.decode_and_crop on the same windows, "
      f"{DECODE_WINDOWS_PER_IMAGE} per image, one at a time):", "decode",
      "CPU ms/image", decodes)


def resize_table(kernels: dict[str, dict], image_size: int) -> str:
  return seconds_table(
      f"Bilinear resize of a 318x318 uint8 crop to {image_size} px, rounded "
      "to uint8 (the pipeline's resize step):", "kernel", "ms/image", kernels)


def markdown_table(summary: dict[str, dict], setup: dict) -> str:
  base = summary[BASE]["median"]
  lines = [
      f"Input pipeline ablation (Ying et al. 2018, Fig. 5): "
      f"{setup['source']}, {setup['image_size']} px "
      f"crops, batch {setup['batch_size']}, {setup['threads']} threads, "
      f"{setup['repetitions']} x {setup['seconds']} s per variant; 1-minute "
      f"load average {setup['load_average'][0]:.1f} before, "
      f"{setup['load_average'][1]:.1f} after on {os.cpu_count()} CPUs.",
      "",
      "| variant | images/s (median) | min-max | vs base | CPU ms/image |",
      "|---|---:|---:|---:|---:|",
  ]
  for name, s in summary.items():
    lines.append(f"| {name} | {s['median']:.1f} | {s['min']:.1f}-"
                 f"{s['max']:.1f} | {s['median'] / base:.2f}x | "
                 f"{s['cpu_ms_per_image']:.2f} |")
  ratios, ranges = headline_ratios(summary), headline_ranges(summary)
  lines += ["", "Headline ratios of the medians (in brackets, the range of "
            "the same ratio within each repetition): " + "; ".join(
                f"{key} {ratios[key]:.3f} ({ranges[key][0]:.3f}-"
                f"{ranges[key][1]:.3f})" for key in HEADLINES) + "."]
  return "\n".join(lines) + "\n"


def write_results(output_dir: str, summary: dict[str, dict], setup: dict,
                  decodes: dict[str, dict],
                  kernels: dict[str, dict]) -> dict[str, float]:
  """Writes input.json and input.md; merges the two headline ratios into
  summary.json (the decode-alone ratio stays in input.json)."""
  os.makedirs(output_dir, exist_ok=True)
  ratios = headline_ratios(summary)
  decode_ratio = (decodes[DECODE_FULL]["median"] /
                  decodes[DECODE_FUSED]["median"])
  with open(os.path.join(output_dir, "input.json"), "w") as f:
    json.dump({"setup": setup, "machine": bench_common.machine(),
               "variants": summary, "decode_alone": decodes,
               "decode_alone_fused_vs_full": decode_ratio,
               "headline_ranges": headline_ranges(summary),
               "resize_kernels": kernels, **ratios}, f, indent=2)
  with open(os.path.join(output_dir, "input.md"), "w") as f:
    f.write(markdown_table(summary, setup) + "\n" + decode_table(decodes) +
            "\n" + resize_table(kernels, setup["image_size"]))
  bench_common.merge_summary(output_dir, ratios)
  return ratios


def define_flags() -> None:
  """Flags exist only when run as a script; importing defines none."""
  flags.DEFINE_string("output_dir", "bench_results",
                      "Folder for input.json, input.md and summary.json.")
  flags.DEFINE_integer("num_images", 192, "Images in one epoch.")
  flags.DEFINE_string("jpeg_dir", "",
                      "Time these JPEGs (*.jpg, *.jpeg; cycled to "
                      "--num_images) instead of generated ones, as "
                      "`python -m data.build_tfrecords` stores them.")
  flags.DEFINE_bool("progressive_to_baseline", False,
                    "With --jpeg_dir: re-encode progressive JPEGs as "
                    "baseline, as build_tfrecords --progressive_to_baseline.")
  flags.DEFINE_integer("num_files", NUM_FILES, "TFRecord files holding them.")
  flags.DEFINE_integer("image_size", 224, "Training crop size.")
  flags.DEFINE_integer("batch_size", 32, "Batch size.")
  flags.DEFINE_integer("repetitions", 7, "Timed windows per variant.")
  flags.DEFINE_float("seconds", 1.5, "Length of one timed window.")
  flags.DEFINE_integer("threads", os.cpu_count() or 1,
                       "tf.data private thread pool size of every variant.")
  flags.DEFINE_bool("keep_host_memory", True,
                    "Keep freed host memory mapped, as training does "
                    "(resnet_tpu/runtime/host_memory.py).")
  flags.DEFINE_bool("tiny", False, "Smoke-test sizes (< 20 s): " + str(TINY))


def main(argv: list[str]) -> None:
  del argv
  setup = dict(num_images=FLAGS.num_images, num_files=FLAGS.num_files,
               image_size=FLAGS.image_size, batch_size=FLAGS.batch_size,
               repetitions=FLAGS.repetitions, seconds=FLAGS.seconds,
               threads=FLAGS.threads)
  if FLAGS.tiny:
    setup.update(TINY)
  if FLAGS.keep_host_memory:
    host_memory.keep_freed_memory()  # as run.py does for every training run
  setup["keep_host_memory"] = FLAGS.keep_host_memory
  with tempfile.TemporaryDirectory() as data_dir:
    if FLAGS.jpeg_dir:
      jpegs = read_jpegs(FLAGS.jpeg_dir, setup["num_images"],
                         FLAGS.progressive_to_baseline)
      write_records(data_dir, jpegs, setup["num_files"])
    else:
      jpegs = write_dataset(data_dir, setup["num_images"], setup["num_files"])
    setup["mean_jpeg_kb"] = sum(map(len, jpegs)) / len(jpegs) / 1e3
    setup["source"] = describe(jpegs)
    if FLAGS.jpeg_dir:
      setup["source"] += f" from {FLAGS.jpeg_dir}" + (
          ", progressive ones re-encoded as baseline"
          if FLAGS.progressive_to_baseline else "")
    load_before = os.getloadavg()[0]
    runs = run_ablation(data_dir, jpegs, setup["image_size"],
                        setup["batch_size"], setup["repetitions"],
                        setup["seconds"], setup["threads"])
    setup["load_average"] = [load_before, os.getloadavg()[0]]
  decodes = decode_alone(jpegs, setup["repetitions"])
  kernels = resize_kernels(setup["image_size"], setup["repetitions"],
                           2 if FLAGS.tiny else 50)
  summary = summarise(runs)
  ratios = write_results(FLAGS.output_dir, summary, setup, decodes, kernels)
  print(markdown_table(summary, setup))
  print(decode_table(decodes))
  print(resize_table(kernels, setup["image_size"]))
  print(json.dumps(ratios, indent=2))


if __name__ == "__main__":
  define_flags()
  app.run(main)
