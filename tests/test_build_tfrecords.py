"""Specification of data/build_tfrecords.py and data/make_synthetic.py."""
import io
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from data import build_tfrecords
from data import make_synthetic
from resnet_tpu.inputs import record_guards
from resnet_tpu.config import InputConfig
from resnet_tpu.inputs import input_pipeline
from resnet_tpu.inputs import manifest
from resnet_tpu.inputs import preprocessing

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Grey level per synset, listed out of sorted order on purpose.
GREY = {"n03000000": 40, "n01000000": 120, "n02000000": 200}


def write_jpeg(path, value: int, height: int = 12, width: int = 16,
               channels: int = 3) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  image = np.full((height, width, channels), value, np.uint8)
  tf.io.write_file(str(path), tf.io.encode_jpeg(image, quality=100))


def class_folders(root, per_class: int = 2) -> str:
  for synset, grey in GREY.items():
    for i in range(per_class):
      write_jpeg(os.path.join(root, synset, f"{synset}_{i}.JPEG"), grey)
  return str(root)


def read_records(files) -> list[dict]:
  """Every record as {feature name: its one value}."""
  rows = []
  for record in tf.data.TFRecordDataset(files):
    features = tf.train.Example.FromString(record.numpy()).features.feature
    rows.append({name: (f.int64_list.value or f.bytes_list.value)[0]
                 for name, f in features.items()})
  return rows


def test_labels_round_trip_synset_to_1_based_label_to_0_based_class(tmp_path):
  out = str(tmp_path / "records")
  build_tfrecords.build(class_folders(tmp_path / "images"), out, "validation",
                        num_shards=2)
  records = read_records(input_pipeline.split_files(out, "validation"))
  synsets = sorted(GREY)
  assert {(r["image/class/synset"].decode(), r["image/class/label"])
          for r in records} == {(s, i + 1) for i, s in enumerate(synsets)}
  assert build_tfrecords.read_synsets(os.path.join(out, "synsets.txt")) == (
      synsets)
  dataset = input_pipeline.eval_dataset_fn(
      InputConfig(data_dir=out), input_pipeline.split_files(out, "validation"),
      6, 6, image_size=8)(tf.distribute.InputContext())
  images, labels, _ = next(iter(dataset))
  for image, label in zip(images.numpy(), labels.numpy()):
    assert abs(image.mean() - GREY[synsets[label]]) < 2


def test_records_carry_every_imagenet_to_gcs_feature(tmp_path):
  path = tmp_path / "images" / "n01000000" / "a.JPEG"
  write_jpeg(path, 99, height=10, width=14)
  out = str(tmp_path / "records")
  build_tfrecords.build(str(tmp_path / "images"), out, "train", num_shards=1)
  record, = read_records([os.path.join(out, "train-00000-of-00001")])
  assert record == {
      "image/height": 10, "image/width": 14, "image/colorspace": b"RGB",
      "image/channels": 3, "image/class/label": 1,
      "image/class/synset": b"n01000000", "image/format": b"JPEG",
      "image/filename": b"a.JPEG", "image/encoded": path.read_bytes(),
  }


def test_png_grayscale_and_cmyk_are_reencoded_as_rgb_jpeg(tmp_path):
  pil_image = pytest.importorskip("PIL.Image")
  folder = tmp_path / "images" / "n01000000"
  write_jpeg(folder / "gray.JPEG", 77, channels=1)
  rgb = np.full((12, 16, 3), 77, np.uint8)
  tf.io.write_file(str(folder / "png.JPEG"), tf.io.encode_png(rgb))
  cmyk = io.BytesIO()
  pil_image.fromarray(rgb).convert("CMYK").save(cmyk, "JPEG", quality=100)
  (folder / "cmyk.JPEG").write_bytes(cmyk.getvalue())
  report = build_tfrecords.build(str(tmp_path / "images"),
                                 str(tmp_path / "records"), "train", 1)
  assert report.num_written == 3 and not report.skipped
  for record in read_records(report.files):
    jpeg = record["image/encoded"]
    assert jpeg.startswith(build_tfrecords.JPEG_MAGIC)
    assert tf.image.extract_jpeg_shape(jpeg).numpy().tolist() == [12, 16, 3]
    pixels = tf.cast(tf.io.decode_jpeg(jpeg), tf.float32)
    assert abs(float(tf.reduce_mean(pixels)) - 77) < 3


def _photo(height: int = 48, width: int = 64) -> np.ndarray:
  """Smooth RGB content, so that re-encoding changes pixels only slightly."""
  y, x = np.mgrid[0:height, 0:width]
  return np.stack([x * 4, y * 5, (x + y) * 2], -1).clip(0, 255).astype(
      np.uint8)


def test_progressive_jpegs_are_recognised_by_their_frame_header():
  pixels = _photo()
  baseline = tf.io.encode_jpeg(pixels).numpy()
  progressive = tf.io.encode_jpeg(pixels, progressive=True).numpy()
  assert record_guards.is_progressive_jpeg(progressive)
  assert not record_guards.is_progressive_jpeg(baseline)
  # A JPEG whose header segments come first (an EXIF-like APP1 segment).
  app1 = b"\xff\xe1" + (10).to_bytes(2, "big") + b"Exif\0\0\0\0"
  assert record_guards.is_progressive_jpeg(progressive[:2] + app1 +
                                             progressive[2:])
  for not_jpeg in (b"", b"\x89PNG\r\n", baseline[:3], b"\xff\xd8\xff\xda"):
    assert not record_guards.is_progressive_jpeg(not_jpeg)


def test_progressive_jpegs_are_stored_or_reencoded_as_baseline(tmp_path,
                                                               caplog):
  pixels = _photo()
  folder = tmp_path / "images" / "n01000000"
  folder.mkdir(parents=True)
  progressive = tf.io.encode_jpeg(pixels, progressive=True).numpy()
  (folder / "p.JPEG").write_bytes(progressive)
  baseline = tf.io.encode_jpeg(pixels[::-1], quality=90).numpy()
  (folder / "b.JPEG").write_bytes(baseline)
  with caplog.at_level(logging.WARNING):
    kept = build_tfrecords.build(str(tmp_path / "images"),
                                 str(tmp_path / "kept"), "validation", 1)
  assert (kept.num_progressive_stored, kept.num_progressive_reencoded) == (1, 0)
  assert "1 of 2 images are progressive JPEGs" in caplog.text
  assert "--progressive_to_baseline" in caplog.text
  stored = {r["image/filename"]: r["image/encoded"]
            for r in read_records(kept.files)}
  assert stored == {b"p.JPEG": progressive, b"b.JPEG": baseline}

  converted = build_tfrecords.build(
      str(tmp_path / "images"), str(tmp_path / "baseline"), "validation", 1,
      progressive_to_baseline=True)
  assert (converted.num_progressive_stored,
          converted.num_progressive_reencoded) == (0, 1)
  records = {r["image/filename"]: r for r in read_records(converted.files)}
  jpeg = records[b"p.JPEG"]["image/encoded"]
  assert not record_guards.is_progressive_jpeg(jpeg)
  assert (records[b"p.JPEG"]["image/height"],
          records[b"p.JPEG"]["image/width"]) == (48, 64)
  decoded = tf.cast(tf.io.decode_jpeg(jpeg), tf.float32)
  original = tf.cast(tf.io.decode_jpeg(progressive), tf.float32)
  assert float(tf.reduce_max(tf.abs(decoded - original))) <= 8
  # The baseline JPEG of the folder is still stored byte for byte.
  assert records[b"b.JPEG"]["image/encoded"] == baseline


def test_jpeg_quality_sets_the_quality_of_reencoded_images(tmp_path):
  folder = tmp_path / "images" / "n01000000"
  folder.mkdir(parents=True)
  (folder / "p.JPEG").write_bytes(
      tf.io.encode_jpeg(_photo(96, 128), progressive=True).numpy())
  sizes = []
  for quality in (100, 30):
    report = build_tfrecords.build(
        str(tmp_path / "images"), str(tmp_path / f"q{quality}"), "train", 1,
        progressive_to_baseline=True, jpeg_quality=quality)
    sizes.append(len(read_records(report.files)[0]["image/encoded"]))
  assert sizes[1] < sizes[0]
  with pytest.raises(ValueError, match="--jpeg_quality must be in"):
    build_tfrecords.build(str(tmp_path / "images"), str(tmp_path / "q0"),
                          "train", 1, jpeg_quality=0)


def test_corrupt_images_are_reported_by_path_and_skipped(tmp_path, caplog):
  input_dir = class_folders(tmp_path / "images")
  rng = np.random.default_rng(0)
  noise = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
  cut_short = tf.io.encode_jpeg(noise).numpy()[:3000]
  # The header survives, so only a full decode finds the damage.
  assert tf.image.extract_jpeg_shape(cut_short).numpy().tolist() == [64, 64, 3]
  truncated = os.path.join(input_dir, "n01000000", "truncated.JPEG")
  garbage = os.path.join(input_dir, "n02000000", "garbage.JPEG")
  with open(truncated, "wb") as f:
    f.write(cut_short)
  with open(garbage, "wb") as f:
    f.write(rng.bytes(500))
  caplog.set_level(logging.WARNING)
  report = build_tfrecords.build(input_dir, str(tmp_path / "records"),
                                 "train", num_shards=3)
  assert report.skipped == sorted([truncated, garbage])
  assert report.num_written == 6 == len(read_records(report.files))
  warnings = "\n".join(r.getMessage() for r in caplog.records
                       if r.levelno == logging.WARNING)
  assert truncated in warnings and garbage in warnings


@pytest.mark.parametrize("make_input", [
    lambda root: os.makedirs(root) or str(root),
    lambda root: str(root / "does_not_exist")])
def test_empty_or_missing_input_dir_is_a_clear_error(tmp_path, make_input):
  with pytest.raises(ValueError, match="--input_dir"):
    build_tfrecords.build(make_input(tmp_path / "images"),
                          str(tmp_path / "records"), "train", num_shards=1)


def test_build_writes_a_manifest_and_merges_the_other_split(tmp_path):
  out = str(tmp_path / "records")
  build_tfrecords.build(class_folders(tmp_path / "train"), out, "train", 2)
  build_tfrecords.build(class_folders(tmp_path / "val", per_class=1), out,
                        "validation", 1)
  splits = manifest.read(out)
  for split, count in (("train", 6), ("validation", 3)):
    assert manifest.records(splits[split]) == count
    for name, entry in splits[split].items():
      path = os.path.join(out, name)
      assert entry.bytes == os.path.getsize(path)
      assert entry.records == len(read_records([path]))


def test_training_order_is_shuffled_with_a_fixed_seed(tmp_path):
  input_dir = class_folders(tmp_path / "images", per_class=8)
  orders = []
  for run, seed in (("a", 0), ("b", 0), ("c", 1)):
    report = build_tfrecords.build(input_dir, str(tmp_path / run), "train",
                                   num_shards=2, seed=seed)
    orders.append([r["image/filename"] for r in read_records(report.files)])
  assert orders[0] == orders[1] != orders[2]
  assert orders[0] != sorted(orders[0])
  assert len({name[:9] for name in orders[0][:12]}) == 3  # shard 0 mixes


@pytest.mark.parametrize("two_columns", [False, True])
def test_validation_from_a_flat_folder_and_a_labels_file(tmp_path,
                                                         two_columns):
  expected = {}
  for i, synset in enumerate(["n02000000", "n01000000", "n03000000"]):
    name = f"ILSVRC2012_val_{i + 1:08d}.JPEG"
    write_jpeg(tmp_path / "val" / name, GREY[synset])
    expected[name.encode()] = synset
  lines = [f"{name.decode()} {synset}" if two_columns else synset
           for name, synset in expected.items()]
  (tmp_path / "labels.txt").write_text("\n".join(lines) + "\n")
  report = build_tfrecords.build(str(tmp_path / "val"),
                                 str(tmp_path / "records"), "validation", 1,
                                 str(tmp_path / "labels.txt"))
  records = read_records(report.files)
  assert [r["image/filename"] for r in records] == sorted(expected)
  assert all(r["image/class/synset"].decode() == expected[r["image/filename"]]
             for r in records)


def test_validation_build_reuses_the_training_label_map(tmp_path):
  out = str(tmp_path / "records")
  build_tfrecords.build(class_folders(tmp_path / "train"), out, "train", 1)
  write_jpeg(tmp_path / "val" / "n03000000" / "x.JPEG", 40)
  report = build_tfrecords.build(str(tmp_path / "val"), out, "validation", 1)
  assert read_records(report.files)[0]["image/class/label"] == 3
  write_jpeg(tmp_path / "other" / "n09000000" / "x.JPEG", 40)
  with pytest.raises(ValueError, match="n09000000"):
    build_tfrecords.build(str(tmp_path / "other"), out, "validation", 1)


def test_synthetic_classes_stay_apart_after_random_crops_and_flips(tmp_path):
  counts = make_synthetic.make_synthetic(str(tmp_path), num_classes=8,
                                         images_per_class=6, image_size=48)
  assert counts == {"train": 48, "validation": 8}
  assert sorted(os.listdir(tmp_path / "train")) == [
      make_synthetic.synset(c) for c in range(8)]

  def mean_colour_of_train_crops(split):
    features, labels = [], []
    for c in range(8):
      folder = tmp_path / split / make_synthetic.synset(c)
      for name in sorted(os.listdir(folder)):
        jpeg = tf.io.read_file(str(folder / name))
        image = preprocessing.preprocess_for_train(jpeg, 32, fused=True)
        features.append(image.numpy().mean(axis=(0, 1)))
        labels.append(c)
    return np.array(features), np.array(labels)

  train_x, train_y = mean_colour_of_train_crops("train")
  val_x, val_y = mean_colour_of_train_crops("validation")
  centroids = np.stack([train_x[train_y == c].mean(axis=0) for c in range(8)])
  distances = ((val_x[:, None] - centroids[None]) ** 2).sum(-1)
  assert (distances.argmin(axis=1) == val_y).mean() >= 0.75


def test_command_lines_make_synthetic_then_build_then_count(tmp_path):
  def run(module, *args):
    subprocess.run([sys.executable, "-m", module, *args], cwd=REPO,
                   check=True, capture_output=True, timeout=120)

  run("data.make_synthetic", f"--output_dir={tmp_path / 'images'}",
      "--num_classes=3", "--images_per_class=4", "--image_size=16")
  run("data.build_tfrecords", f"--input_dir={tmp_path / 'images' / 'train'}",
      f"--output_dir={tmp_path / 'records'}", "--split=train",
      "--num_shards=2", "--num_workers=2")
  assert input_pipeline.count_examples(input_pipeline.split_files(
      str(tmp_path / "records"), "train")) == 12


def test_one_tree_splits_into_stratified_seeded_train_and_validation(
    tmp_path):
  """--validation_fraction (issue 50): each class holds its share out, the
  same images for the same seed, and the two splits share one class map
  and manifest."""
  tree = class_folders(tmp_path / "images", per_class=10)
  out = str(tmp_path / "records")
  train, validation = build_tfrecords.build_with_validation(
      tree, out, num_shards=3, fraction=0.2, seed=7)
  assert (train.num_written, validation.num_written) == (24, 6)
  held_out = {r["image/filename"]: r["image/class/synset"].decode()
              for r in read_records(input_pipeline.split_files(
                  out, "validation"))}
  trained = {r["image/filename"] for r in read_records(
      input_pipeline.split_files(out, "train"))}
  assert not set(held_out) & trained
  assert sorted(held_out.values()) == sorted(sorted(GREY) * 2)  # 2 a class
  listed = manifest.read(out)
  assert [sum(e.records for e in listed[split].values())
          for split in ("train", "validation")] == [24, 6]
  again, other = ([p for p, _ in build_tfrecords.split_validation(
      build_tfrecords.list_images(tree), 0.2, seed)[1]] for seed in (7, 8))
  assert {os.path.basename(p).encode() for p in again} == set(held_out)
  assert again != other


def test_a_validation_fraction_that_cannot_split_is_named(tmp_path):
  tree = class_folders(tmp_path / "images", per_class=1)
  items = build_tfrecords.list_images(tree)
  with pytest.raises(ValueError, match="at least 2 a class"):
    build_tfrecords.split_validation(items, 0.5)
  with pytest.raises(ValueError, match=r"--validation_fraction must be in"):
    build_tfrecords.split_validation(items, 1.0)
