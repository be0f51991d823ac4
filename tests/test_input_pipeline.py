"""Specification of resnet_tpu.inputs.input_pipeline (Ying et al. 2018, §3.2)."""
import collections
import dataclasses
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from resnet_tpu import config as config_lib
from resnet_tpu.inputs import input_pipeline as ip
from resnet_tpu.config import InputConfig
from resnet_tpu.config import TrainConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 8


def solid_jpeg(value: int) -> bytes:
  image = np.full((12, 16, 3), value, np.uint8)
  return tf.io.encode_jpeg(image, quality=100).numpy()


def imagenet_to_gcs_record(label: int, jpeg: bytes) -> bytes:
  """A record as imagenet_to_gcs.py writes it, independent of data/."""
  def b(value):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

  def i(value):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

  return tf.train.Example(features=tf.train.Features(feature={
      "image/height": i(12), "image/width": i(16), "image/channels": i(3),
      "image/colorspace": b(b"RGB"), "image/format": b(b"JPEG"),
      "image/class/label": i(label),
      "image/class/synset": b(b"n%08d" % label),
      "image/filename": b(b"%d.JPEG" % label), "image/encoded": b(jpeg),
  })).SerializeToString()


def write_split(data_dir, split: str, num_records: int, num_files: int,
                label_offset: int = 1) -> None:
  """Record r, in file r % num_files: label r + offset, grey 5 * (r % 50)."""
  for f in range(num_files):
    name = f"{split}-{f:05d}-of-{num_files:05d}"
    with tf.io.TFRecordWriter(os.path.join(data_dir, name)) as writer:
      for r in range(f, num_records, num_files):
        jpeg = solid_jpeg(5 * (r % 50))
        writer.write(imagenet_to_gcs_record(r + label_offset, jpeg))


def context(num_pipelines: int, pipeline_id: int,
            num_replicas: int) -> tf.distribute.InputContext:
  return tf.distribute.InputContext(num_input_pipelines=num_pipelines,
                                    input_pipeline_id=pipeline_id,
                                    num_replicas_in_sync=num_replicas)


def batches(dataset: tf.data.Dataset, n: int) -> list[tuple]:
  return [tuple(t.numpy() for t in batch) for batch in dataset.take(n)]


def train_fn(cfg: InputConfig, global_batch_size: int,
             **kwargs) -> ip.DatasetFn:
  """The training input of cfg.data_dir's train files at SIZE px."""
  return ip.train_dataset_fn(cfg, ip.split_files(cfg.data_dir, "train"),
                             global_batch_size, image_size=SIZE, **kwargs)


def eval_fn(cfg: InputConfig, global_batch_size: int,
            num_examples: int) -> ip.DatasetFn:
  """The eval input of cfg.data_dir's validation files at SIZE px."""
  return ip.eval_dataset_fn(cfg, ip.split_files(cfg.data_dir, "validation"),
                            global_batch_size, num_examples, image_size=SIZE)


@pytest.mark.parametrize("num_files,num_pipelines,cache", [
    (4, 2, False), (4, 4, False), (3, 4, False), (5, 2, True)])
def test_every_record_seen_once_per_epoch_across_pipelines(
    tmp_path, num_files, num_pipelines, cache):
  num_records = 24
  write_split(tmp_path, "train", num_records, num_files)
  cfg = InputConfig(data_dir=str(tmp_path), cache_dataset=cache,
                    shuffle_buffer_size=64)
  dataset_fn = train_fn(cfg, global_batch_size=num_pipelines)
  streams = []
  for i in range(num_pipelines):
    dataset = dataset_fn(context(num_pipelines, i, num_pipelines))
    streams.append([int(label) for _, labels in
                    batches(dataset, 2 * num_records) for label in labels])
  shards = [set(stream) for stream in streams]
  assert sum(map(len, shards)) == num_records  # no record in two shards
  assert set.union(*shards) == set(range(num_records))  # and none lost
  for stream, shard in zip(streams, shards):
    epochs = [stream[e * len(shard):(e + 1) * len(shard)]
              for e in range(len(stream) // len(shard))]
    assert len(epochs) >= 2
    assert all(sorted(epoch) == sorted(shard) for epoch in epochs)


@pytest.mark.parametrize("dtype", ["uint8", "float32", "bfloat16"])
def test_train_batches_are_per_replica_raw_pixels_in_the_transfer_dtype(
    tmp_path, dtype):
  write_split(tmp_path, "train", 16, 2)
  cfg = InputConfig(data_dir=str(tmp_path), deterministic_input=True)
  dataset = train_fn(cfg, global_batch_size=8, dtype=dtype, seed=5)(
      context(1, 0, 2))
  images, labels = next(iter(dataset))
  assert images.shape == (4, SIZE, SIZE, 3) and images.dtype == dtype
  assert labels.shape == (4,) and labels.dtype == tf.int32
  assert float(tf.reduce_max(tf.cast(images, tf.float32))) > 1.0
  # Host-side casts change the dtype, not the (integer) pixel values.
  uint8_images, _ = next(iter(train_fn(cfg, 8, seed=5)(context(1, 0, 2))))
  np.testing.assert_array_equal(tf.cast(images, tf.float32).numpy(),
                                tf.cast(uint8_images, tf.float32).numpy())


def test_default_transfer_dtype_is_uint8(tmp_path):
  assert InputConfig(data_dir=str(tmp_path)).input_dtype == "uint8"
  assert TrainConfig(str(tmp_path)).transfer_dtype == "uint8"


@pytest.mark.parametrize("label_offset", [1, 0])
def test_reads_records_of_another_writer_with_its_label_offset(
    tmp_path, label_offset):
  write_split(tmp_path, "validation", 6, 1, label_offset=label_offset)
  cfg = InputConfig(data_dir=str(tmp_path), label_offset=label_offset)
  dataset = eval_fn(cfg, 6, 6)(context(1, 0, 1))
  (images, labels, mask), = batches(dataset, 1)
  assert labels.tolist() == list(range(6)) and mask.tolist() == [1.0] * 6
  np.testing.assert_allclose(images.mean(axis=(1, 2, 3)),
                             [5.0 * r for r in range(6)], atol=1.0)


@pytest.mark.parametrize("num_examples,global_batch,num_pipelines,replicas", [
    (10, 4, 1, 1), (10, 4, 2, 2), (10, 8, 2, 4), (7, 6, 3, 3), (9, 16, 2, 8)])
def test_eval_counts_every_example_once_with_a_padded_masked_last_batch(
    tmp_path, num_examples, global_batch, num_pipelines, replicas):
  write_split(tmp_path, "validation", num_examples, 2)
  cfg = InputConfig(data_dir=str(tmp_path))
  dataset_fn = eval_fn(cfg, global_batch, num_examples)
  steps = ip.eval_steps(num_examples, global_batch)
  seen, padding = collections.Counter(), 0
  for i in range(num_pipelines):
    pipeline = batches(dataset_fn(context(num_pipelines, i, replicas)), 10**6)
    assert len(pipeline) == steps * replicas // num_pipelines
    for _, labels, mask in pipeline:
      assert len(labels) == global_batch // replicas
      seen.update(labels[mask == 1.0].tolist())
      padding += int((mask == 0.0).sum())
  assert seen == collections.Counter(range(num_examples))
  assert padding == steps * global_batch - num_examples


@pytest.mark.parametrize("num_pipelines", [1, 2])
def test_eval_of_fewer_examples_than_the_split_counts_exactly_that_many(
    tmp_path, num_pipelines):
  write_split(tmp_path, "validation", 10, 2)
  cfg = InputConfig(data_dir=str(tmp_path))
  dataset_fn = eval_fn(cfg, 4, num_examples=5)
  seen = collections.Counter()
  for i in range(num_pipelines):
    for _, labels, mask in batches(dataset_fn(context(num_pipelines, i, 2)),
                                   10):
      seen.update(labels[mask == 1.0].tolist())
  assert sum(seen.values()) == len(seen) == 5


def test_seeded_deterministic_stream_repeats_and_resumes_at_start_step(
    tmp_path):
  write_split(tmp_path, "train", 12, 3)
  cfg = InputConfig(data_dir=str(tmp_path), deterministic_input=True)
  ctx = context(1, 0, 1)
  stream = batches(train_fn(cfg, 2, seed=7)(ctx), 10)
  again = batches(train_fn(cfg, 2, seed=7)(ctx), 10)
  resumed = batches(train_fn(cfg, 2, seed=7, start_step=4)(ctx), 6)
  other = batches(train_fn(cfg, 2, seed=8)(ctx), 10)
  for (images_a, labels_a), (images_b, labels_b) in zip(
      stream + stream[4:], again + resumed):
    np.testing.assert_array_equal(images_a, images_b)
    np.testing.assert_array_equal(labels_a, labels_b)
  assert any(not np.array_equal(a[1], b[1]) for a, b in zip(stream, other))


def test_ablation_switches_change_speed_not_data(tmp_path):
  write_split(tmp_path, "train", 12, 3)
  cfg = InputConfig(data_dir=str(tmp_path), deterministic_input=True)
  ablated = dataclasses.replace(
      cfg, parallel_interleave=False, parallel_map=False,
      fused_decode_crop=False, cache_dataset=True, prefetch=False,
      private_threadpool_size=1)
  full = batches(train_fn(cfg, 4, seed=3)(context(1, 0, 1)), 6)
  slow = batches(train_fn(ablated, 4, seed=3)(context(1, 0, 1)), 6)
  for (images_a, labels_a), (images_b, labels_b) in zip(full, slow):
    np.testing.assert_array_equal(labels_a, labels_b)
    np.testing.assert_allclose(images_a, images_b, atol=24)


def test_split_files_and_count_examples(tmp_path):
  write_split(tmp_path, "validation", 7, 3)
  names = [os.path.basename(f)
           for f in ip.split_files(str(tmp_path), "validation")]
  assert names == [f"validation-{i:05d}-of-00003" for i in range(3)]
  assert ip.count_examples(ip.split_files(str(tmp_path), "validation")) == 7
  with pytest.raises(ValueError, match=r"train-\*-of-\*"):
    ip.split_files(str(tmp_path), "train")
  with pytest.raises(ValueError, match="split"):
    ip.split_files(str(tmp_path), "test")


def test_invalid_config_is_rejected_naming_the_field():
  def validate(**overrides):
    config_lib.validate(TrainConfig.from_flat(
        model_dir="x", use_synthetic_data=True, train_steps=1, **overrides))

  with pytest.raises(ValueError, match="--input_dtype"):
    validate(input_dtype="float16")
  with pytest.raises(ValueError, match="--private_threadpool_size"):
    validate(private_threadpool_size=-1)


def test_synthetic_data_is_one_constant_batch_per_replica():
  dataset = ip.synthetic_dataset_fn(SIZE, 10, 8, "bfloat16")(context(2, 1, 4))
  (images_a, labels_a), (images_b, _) = batches(dataset, 2)
  assert images_a.shape == (2, SIZE, SIZE, 3)
  assert images_a.dtype == tf.bfloat16.as_numpy_dtype
  assert labels_a.dtype == np.int32
  assert 0 <= labels_a.min() and labels_a.max() < 10
  np.testing.assert_array_equal(images_a, images_b)


def test_bench_input_tiny_writes_the_ablation_and_merges_summary(tmp_path):
  (tmp_path / "summary.json").write_text(json.dumps({"other_key": 1.5}))
  subprocess.run([sys.executable, "-m", "lab.bench_input", "--tiny",
                  f"--output_dir={tmp_path}"],
                 cwd=REPO, check=True, capture_output=True, timeout=120)
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["other_key"] == 1.5
  assert summary["input_full_vs_decode_ceiling"] > 0
  assert summary["input_fused_vs_full_decode"] > 0
  result = json.loads((tmp_path / "input.json").read_text())
  # Five ablation steps, the float32-batches row and the decode ceiling.
  assert len(result["variants"]) == 7
  assert any("float32 batches" in name for name in result["variants"])
  assert all(v["median"] > 0 and v["cpu_ms_per_image"] > 0
             for v in result["variants"].values())
  assert "| + fused decode-and-crop |" in (tmp_path / "input.md").read_text()
  assert len(result["resize_kernels"]) == 2
  assert all(k["median"] > 0 for k in result["resize_kernels"].values())
  decodes = result["decode_alone"]
  assert len(decodes) == 2 and all(d["median"] > 0 for d in decodes.values())
  assert result["decode_alone_fused_vs_full"] == pytest.approx(
      decodes["full decode, then slice"]["median"] /
      decodes["fused decode-and-crop"]["median"])
  assert "| fused decode-and-crop | " in (tmp_path / "input.md").read_text()
  assert "decode_alone_fused_vs_full" not in summary
  # One repetition: its pair of windows is the median, so the range is the
  # ratio itself.
  for key in ("input_full_vs_decode_ceiling", "input_fused_vs_full_decode"):
    assert result["headline_ranges"][key] == pytest.approx([result[key]] * 2)
    assert f"{key} {result[key]:.3f} (" in (tmp_path / "input.md").read_text()
  assert "16 JPEGs of 500x375" in (tmp_path / "input.md").read_text()


def test_bench_input_times_the_jpegs_of_a_folder(tmp_path):
  jpeg_dir = tmp_path / "photos"
  jpeg_dir.mkdir()
  for i, (height, width) in enumerate([(90, 120), (120, 90), (100, 100)]):
    pixels = np.random.default_rng(i).integers(0, 256, (height, width, 3),
                                               dtype=np.uint8)
    (jpeg_dir / f"p{i}.jpg").write_bytes(
        tf.io.encode_jpeg(pixels, progressive=i == 0).numpy())
  (jpeg_dir / "notes.txt").write_text("not an image")
  sizes = re.escape("16 JPEGs of 3 sizes, 90x120 to 120x90 (mean ")
  for switch, expected in (
      ("--noprogressive_to_baseline",
       sizes + r"\d+ KB, 6 progressive\) from " + re.escape(str(jpeg_dir))),
      ("--progressive_to_baseline",
       sizes + r"\d+ KB\) from " + re.escape(str(jpeg_dir)) +
       ", progressive ones re-encoded as baseline")):
    out = tmp_path / switch
    subprocess.run([sys.executable, "-m", "lab.bench_input", "--tiny",
                    f"--jpeg_dir={jpeg_dir}", switch, f"--output_dir={out}"],
                   cwd=REPO, check=True, capture_output=True, timeout=120)
    text = (out / "input.md").read_text()
    assert re.search(expected, text), text[:300]
  empty = tmp_path / "empty"
  empty.mkdir()
  result = subprocess.run(
      [sys.executable, "-m", "lab.bench_input", "--tiny",
       f"--jpeg_dir={empty}", f"--output_dir={out}"],
      cwd=REPO, capture_output=True, text=True, timeout=120)
  assert result.returncode != 0
  assert f"--jpeg_dir={empty} holds no .jpg or .jpeg files" in result.stderr


def test_the_crop_and_resize_flags_are_in_the_part_the_pipeline_takes():
  cfg = TrainConfig.from_flat(
      model_dir="/tmp/unused", eval_crop_fraction=0.6,
      train_crop_min_area=0.3, train_crop_max_aspect=1.2,
      train_resize_method="bicubic")
  assert cfg.input == InputConfig(
      eval_crop_fraction=0.6, train_crop_min_area=0.3,
      train_crop_max_aspect=1.2, train_resize_method="bicubic")
