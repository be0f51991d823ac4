r"""Builds ImageNet TFRecords from a folder of images (Ying et al. 2018, §3.2).

The records match tensorflow/tpu `tools/datasets/imagenet_to_gcs.py`, which is
what resnet_tpu.inputs.input_pipeline reads: files `train-00000-of-01024`, features
`image/encoded` (RGB JPEG), `image/class/label` (1-based, sorted synset
order), `image/class/synset`, `image/height`, `image/width`, `image/channels`,
`image/colorspace`, `image/format`, `image/filename`.

Input layouts:
  * class folders INPUT_DIR/<synset>/<image> (ImageNet train; validation too);
  * a flat INPUT_DIR/<image> with --labels_file: one synset per line for the
    images in sorted file-name order (ImageNet's
    imagenet_2012_validation_synset_labels.txt), or `<file name> <synset>`
    lines.

The training file order is shuffled with a fixed seed so that each shard mixes
classes. RGB JPEGs are stored byte for byte; PNG, CMYK, grayscale and other
images are re-encoded as RGB JPEG. Progressive JPEGs are counted and, with
--progressive_to_baseline, re-encoded as baseline JPEGs: the fused
decode-and-crop of §3.2 saves nothing on a progressive JPEG, whose every scan
must be decoded before any pixel (docs/performance.md; ImageNet's own JPEGs
are baseline). An image that does not decode is reported by path and
skipped. OUTPUT_DIR/synsets.txt lists `<class index>\t<synset>`
(TFRecord label = class index + 1); a later build into the same OUTPUT_DIR,
such as the validation split, reuses it so that both splits share one map.
OUTPUT_DIR/manifest.json gets each split's record count and each file's
size and record count (resnet_tpu/inputs/manifest.py), merged with the other
split's, so that a truncated copy is caught before training starts.

  python -m data.build_tfrecords --input_dir=imagenet/train \
      --output_dir=tfrecords --split=train --num_shards=1024
  python -m data.build_tfrecords --input_dir=imagenet/val \
      --labels_file=synset_labels.txt --output_dir=tfrecords \
      --split=validation --num_shards=128

One class-folder tree of your own becomes both splits with
--validation_fraction: each class holds that fraction out for validation
(stratified, seeded with --seed), e.g.
  python -m data.build_tfrecords --input_dir=my_photos --output_dir=tfrecords \
      --split=train --num_shards=8 --validation_fraction=0.1
"""
import concurrent.futures
import dataclasses
import functools
import os
import random
import sys
import threading
import time

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

if not __package__:  # run as a file: the repository's root on the path
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))

from resnet_tpu.inputs import record_guards
from resnet_tpu.inputs import manifest

SPLITS = ("train", "validation")
SYNSETS_FILE = "synsets.txt"
IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png", ".bmp", ".gif")
JPEG_MAGIC = b"\xff\xd8\xff"
JPEG_QUALITY = 100  # as imagenet_to_gcs.py re-encodes PNG and CMYK images

FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class BuildReport:
  files: list[str]
  num_written: int
  skipped: list[str]
  # Progressive JPEG inputs stored as they are / written as baseline.
  num_progressive_stored: int = 0
  num_progressive_reencoded: int = 0


class _Progress:
  """Thread-safe progress bar on stderr; a log line per 10% when not a tty."""

  def __init__(self, total: int, label: str):
    self._total, self._label = total, label
    self._done, self._start, self._drawn = 0, time.monotonic(), 0.0
    self._lock = threading.Lock()
    self._tty = sys.stderr.isatty()

  def update(self) -> None:
    with self._lock:
      self._done += 1
      finished = self._done == self._total
      if self._tty and (finished or time.monotonic() - self._drawn > 0.2):
        self._drawn = time.monotonic()
        self._draw(finished)
      elif not self._tty and (
          finished or self._done % max(self._total // 10, 1) == 0):
        logging.info("%s: %d/%d images", self._label, self._done, self._total)

  def _draw(self, finished: bool) -> None:
    filled = 30 * self._done // self._total
    rate = self._done / max(time.monotonic() - self._start, 1e-9)
    sys.stderr.write(f"\r{self._label} [{'#' * filled}{'.' * (30 - filled)}] "
                     f"{self._done}/{self._total} {rate:.0f} images/s")
    sys.stderr.write("\n" if finished else "")


def _is_image(name: str) -> bool:
  return name.lower().endswith(IMAGE_EXTENSIONS)


def _class_folder_images(input_dir: str) -> list[tuple[str, str]]:
  pairs = []
  for entry in sorted(tf.io.gfile.listdir(input_dir)):
    synset = entry.rstrip("/")
    folder = os.path.join(input_dir, synset)
    if tf.io.gfile.isdir(folder):
      names = sorted(tf.io.gfile.listdir(folder))
      pairs += [(os.path.join(folder, n), synset)
                for n in names if _is_image(n)]
  return pairs


def _labelled_flat_images(input_dir: str,
                          labels_file: str) -> list[tuple[str, str]]:
  if not tf.io.gfile.exists(labels_file):
    raise ValueError(f"--labels_file {labels_file} does not exist")
  names = sorted(n for n in tf.io.gfile.listdir(input_dir) if _is_image(n))
  with tf.io.gfile.GFile(labels_file) as f:
    rows = [line.split() for line in f if line.strip()]
  if all(len(row) == 2 for row in rows):
    synset_of = dict(rows)
    missing = [n for n in names if n not in synset_of]
    if missing:
      raise ValueError(f"--labels_file {labels_file} has no synset for "
                       f"{len(missing)} images, e.g. {missing[0]}")
    return [(os.path.join(input_dir, n), synset_of[n]) for n in names]
  if all(len(row) == 1 for row in rows) and len(rows) == len(names):
    return [(os.path.join(input_dir, n), row[0]) for n, row in zip(names, rows)]
  raise ValueError(
      f"--labels_file {labels_file} must hold either one synset per image of "
      f"--input_dir in sorted order ({len(names)} lines, found {len(rows)}) "
      "or '<file name> <synset>' lines")


def list_images(input_dir: str,
                labels_file: str | None = None) -> list[tuple[str, str]]:
  """(path, synset) of every image in `input_dir`; ValueError if none."""
  if not tf.io.gfile.isdir(input_dir):
    raise ValueError(f"--input_dir {input_dir} is not a readable directory")
  if labels_file:
    pairs = _labelled_flat_images(input_dir, labels_file)
  else:
    pairs = _class_folder_images(input_dir)
  if not pairs:
    layout = ("image files named in --labels_file" if labels_file else
              "class sub-folders <synset>/<image>.JPEG")
    raise ValueError(f"--input_dir {input_dir} holds no images; expected "
                     f"{layout}")
  return pairs


def read_synsets(path: str) -> list[str]:
  """The class index -> synset list of a synsets.txt written by `build`."""
  with tf.io.gfile.GFile(path) as f:
    rows = [line.split("\t") for line in f.read().splitlines() if line]
  if [int(index) for index, _ in rows] != list(range(len(rows))):
    raise ValueError(f"{path} must list '<index>\\t<synset>' for index 0, 1, "
                     "2, ...")
  return [synset for _, synset in rows]


def class_labels(synsets: list[str], output_dir: str) -> dict[str, int]:
  """1-based labels in sorted synset order, kept in OUTPUT_DIR/synsets.txt."""
  path = os.path.join(output_dir, SYNSETS_FILE)
  classes = sorted(set(synsets))
  if tf.io.gfile.exists(path):
    existing = read_synsets(path)
    unknown = sorted(set(classes) - set(existing))
    if unknown:
      raise ValueError(f"{path} of an earlier build lacks the synsets "
                       f"{unknown[:5]}; delete it or use another --output_dir")
    classes = existing
  else:
    with tf.io.gfile.GFile(path, "w") as f:
      f.write("".join(f"{i}\t{synset}\n" for i, synset in enumerate(classes)))
  return {synset: i + 1 for i, synset in enumerate(classes)}


def to_rgb_jpeg(data: bytes, progressive_to_baseline: bool = False,
                quality: int = JPEG_QUALITY) -> tuple[bytes, int, int]:
  """Decodes `data` fully; returns (RGB JPEG, height, width).

  RGB JPEGs come back unchanged, except progressive ones when
  `progressive_to_baseline`; everything else is re-encoded as a baseline RGB
  JPEG of `quality`. Raises tf.errors.InvalidArgumentError for data that does
  not decode.
  """
  if data.startswith(JPEG_MAGIC):
    image = tf.io.decode_jpeg(data, channels=3)
    reencode = (progressive_to_baseline and
                record_guards.is_progressive_jpeg(data))
    if int(tf.image.extract_jpeg_shape(data)[2]) == 3 and not reencode:
      return data, image.shape[0], image.shape[1]
  else:
    image = tf.io.decode_image(data, channels=3, expand_animations=False)
  jpeg = tf.io.encode_jpeg(image, format="rgb", quality=quality)
  return jpeg.numpy(), image.shape[0], image.shape[1]


def _bytes(value: bytes) -> tf.train.Feature:
  return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int64(value: int) -> tf.train.Feature:
  return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def image_example(path: str, jpeg: bytes, height: int, width: int,
                  synset: str, label: int) -> tf.train.Example:
  """The tf.train.Example of imagenet_to_gcs.py for one RGB JPEG."""
  return tf.train.Example(features=tf.train.Features(feature={
      "image/height": _int64(height),
      "image/width": _int64(width),
      "image/colorspace": _bytes(b"RGB"),
      "image/channels": _int64(3),
      "image/class/label": _int64(label),
      "image/class/synset": _bytes(synset.encode()),
      "image/format": _bytes(b"JPEG"),
      "image/filename": _bytes(os.path.basename(path).encode()),
      "image/encoded": _bytes(jpeg),
  }))


def _write_shard(output_path: str, items: list[tuple[str, str]],
                 labels: dict[str, int], progress: _Progress,
                 progressive_to_baseline: bool,
                 quality: int) -> tuple[list[str], int, int]:
  """Writes one shard, renamed into place when whole; returns the skipped
  paths and how many progressive JPEGs it stored as they are / re-encoded."""
  skipped, stored, reencoded = [], 0, 0
  partial_path = output_path + ".incomplete"
  with tf.io.TFRecordWriter(partial_path) as writer:
    for path, synset in items:
      try:
        with tf.io.gfile.GFile(path, "rb") as f:
          data = f.read()
        jpeg, height, width = to_rgb_jpeg(
            data, progressive_to_baseline, quality)
      except (tf.errors.OpError, OSError) as error:
        reason = str(error).strip().splitlines()[-1]
        logging.warning("skipping unreadable image %s: %s", path, reason)
        skipped.append(path)
      else:
        if record_guards.is_progressive_jpeg(data):
          stored += jpeg is data
          reencoded += jpeg is not data
        example = image_example(path, jpeg, height, width, synset,
                                labels[synset])
        writer.write(example.SerializeToString())
      progress.update()
  tf.io.gfile.rename(partial_path, output_path, overwrite=True)
  return skipped, stored, reencoded


def split_validation(items: list[tuple[str, str]], fraction: float,
                     seed: int = 0) -> tuple[list[tuple[str, str]],
                                             list[tuple[str, str]]]:
  """(train, validation) of (path, synset) `items`, stratified: each class
  gives round(fraction * its images), at least 1, to validation, chosen by
  a shuffle seeded with `seed` and the class; each keeps one for training.
  ValueError names --validation_fraction or the class that cannot give."""
  if not 0.0 < fraction < 1.0:
    raise ValueError(f"--validation_fraction must be in (0, 1), got "
                     f"{fraction}")
  by_class: dict[str, list[tuple[str, str]]] = {}
  for item in sorted(items):
    by_class.setdefault(item[1], []).append(item)
  train, validation = [], []
  for synset, members in sorted(by_class.items()):
    if len(members) < 2:
      raise ValueError(f"class {synset} has {len(members)} image: "
                       "--validation_fraction needs at least 2 a class")
    random.Random(f"{seed}/{synset}").shuffle(members)
    held_out = min(max(1, round(fraction * len(members))), len(members) - 1)
    validation += members[:held_out]
    train += members[held_out:]
  return train, validation


def build(input_dir: str, output_dir: str, split: str, num_shards: int,
          labels_file: str | None = None, num_workers: int = 4,
          seed: int = 0, progressive_to_baseline: bool = False,
          jpeg_quality: int = JPEG_QUALITY,
          items: list[tuple[str, str]] | None = None) -> BuildReport:
  """Writes `split`-%05d-of-%05d TFRecords of the images of `input_dir`
  (or of `items`, (path, synset) pairs, when given)."""
  if split not in SPLITS:
    raise ValueError(f"--split must be one of {SPLITS}, got {split!r}")
  if num_workers < 1:
    raise ValueError(f"--num_workers must be >= 1, got {num_workers}")
  if not 1 <= jpeg_quality <= 100:
    raise ValueError(f"--jpeg_quality must be in [1, 100], got {jpeg_quality}")
  items = list(items) if items is not None else list_images(input_dir,
                                                            labels_file)
  if not 1 <= num_shards <= len(items):
    raise ValueError("--num_shards must be between 1 and the number of "
                     f"images ({len(items)}), got {num_shards}")
  if split == "train":
    random.Random(seed).shuffle(items)
  tf.io.gfile.makedirs(output_dir)
  labels = class_labels([synset for _, synset in items], output_dir)
  files = [os.path.join(output_dir, f"{split}-{i:05d}-of-{num_shards:05d}")
           for i in range(num_shards)]
  chunks = [items[i * len(items) // num_shards:
                  (i + 1) * len(items) // num_shards]
            for i in range(num_shards)]
  progress = _Progress(len(items), split)
  with concurrent.futures.ThreadPoolExecutor(num_workers) as pool:
    write = functools.partial(
        _write_shard, labels=labels, progress=progress,
        progressive_to_baseline=progressive_to_baseline, quality=jpeg_quality)
    shards = list(pool.map(write, files, chunks))
  skipped = sorted(path for paths, _, _ in shards for path in paths)
  if len(skipped) == len(items):
    raise ValueError(f"none of the {len(items)} images under --input_dir "
                     f"{input_dir} could be decoded")
  sizes = manifest.file_sizes(files)
  manifest.write(output_dir, split, {
      os.path.basename(path): manifest.FileEntry(
          sizes[path], len(chunk) - len(shard[0]))
      for path, chunk, shard in zip(files, chunks, shards)})
  report = BuildReport(files, len(items) - len(skipped), skipped,
                       sum(shard[1] for shard in shards),
                       sum(shard[2] for shard in shards))
  logging.info("wrote %d %s images of %d classes into %d files in %s; "
               "skipped %d unreadable images %s", report.num_written, split,
               len(labels), num_shards, output_dir, len(skipped),
               skipped[:10])
  if report.num_progressive_reencoded:
    logging.info("re-encoded %d progressive JPEGs as baseline JPEGs",
                 report.num_progressive_reencoded)
  if report.num_progressive_stored:
    logging.warning(
        "%d of %d images are progressive JPEGs, stored as they are: the "
        "fused decode-and-crop saves nothing on them and they decode more "
        "slowly (docs/performance.md); --progressive_to_baseline "
        "re-encodes them as baseline JPEGs", report.num_progressive_stored,
        report.num_written)
  return report


def define_flags() -> None:
  """Flags exist only when run as a script; importing defines none."""
  flags.DEFINE_string("input_dir", None, "Folder of class sub-folders of "
                      "images, or of images named in --labels_file.")
  flags.DEFINE_string("output_dir", None,
                      "Folder for the TFRecord files and synsets.txt.")
  flags.DEFINE_enum("split", None, list(SPLITS),
                    "Split to write; names the output files.")
  flags.DEFINE_integer("num_shards", None, "Number of TFRecord files.")
  flags.DEFINE_string("labels_file", None, "Synsets of the images of a flat "
                      "--input_dir (see the module docstring).")
  flags.DEFINE_integer("num_workers", os.cpu_count() or 1,
                       "Shards encoded at the same time.")
  flags.DEFINE_integer("seed", 0, "Seed of the training file-order shuffle.")
  flags.DEFINE_bool("progressive_to_baseline", False,
                    "Re-encode progressive JPEGs as baseline JPEGs, which "
                    "the fused decode-and-crop can decode in part.")
  flags.DEFINE_integer("jpeg_quality", JPEG_QUALITY,
                       "Quality of re-encoded images (PNG, CMYK, grayscale; "
                       "progressive with --progressive_to_baseline).")
  flags.DEFINE_float("validation_fraction", 0.0,
                     "With --split=train and class folders: hold this "
                     "fraction of each class out as the validation split "
                     "(stratified, seeded with --seed) and write both.")
  flags.DEFINE_integer("validation_shards", 0, "Files of that validation "
                       "split (0: --num_shards times the fraction, at "
                       "least 1).")
  flags.mark_flags_as_required(["input_dir", "output_dir", "split",
                                "num_shards"])


def build_with_validation(input_dir: str, output_dir: str, num_shards: int,
                          fraction: float, validation_shards: int = 0,
                          seed: int = 0, **options
                          ) -> tuple[BuildReport, BuildReport]:
  """Both splits from one class-folder tree (split_validation); `options`:
  build's other arguments."""
  train, validation = split_validation(list_images(input_dir), fraction,
                                       seed)
  shards = validation_shards or max(1, round(num_shards * fraction))
  return (build(input_dir, output_dir, "train", num_shards, seed=seed,
                items=train, **options),
          build(input_dir, output_dir, "validation", min(shards,
                                                         len(validation)),
                seed=seed, items=validation, **options))


def main(argv: list[str]) -> None:
  del argv
  options = dict(num_workers=FLAGS.num_workers,
                 progressive_to_baseline=FLAGS.progressive_to_baseline,
                 jpeg_quality=FLAGS.jpeg_quality)
  if FLAGS.validation_fraction:
    if FLAGS.split != "train" or FLAGS.labels_file:
      raise app.UsageError("--validation_fraction splits one class-folder "
                           "tree given with --split=train (no "
                           "--labels_file).")
    build_with_validation(FLAGS.input_dir, FLAGS.output_dir,
                          FLAGS.num_shards, FLAGS.validation_fraction,
                          FLAGS.validation_shards, FLAGS.seed, **options)
    return
  build(FLAGS.input_dir, FLAGS.output_dir, FLAGS.split, FLAGS.num_shards,
        FLAGS.labels_file, seed=FLAGS.seed, **options)


if __name__ == "__main__":
  define_flags()
  app.run(main)
