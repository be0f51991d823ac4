"""Small TFRecord shards, and the damage a partial copy or bit rot does."""
import os

import numpy as np
import tensorflow as tf

from resnet_tpu.inputs import manifest

# TFRecord framing around each record: length, its CRC, the data's CRC.
FRAMING = 16
HEADER = 12


def example(label: int, grey: int) -> bytes:
  """An imagenet_to_gcs-style record of an 8x8 solid JPEG."""
  jpeg = tf.io.encode_jpeg(np.full((8, 8, 3), grey, np.uint8)).numpy()
  return tf.train.Example(features=tf.train.Features(feature={
      "image/encoded": tf.train.Feature(
          bytes_list=tf.train.BytesList(value=[jpeg])),
      "image/class/label": tf.train.Feature(
          int64_list=tf.train.Int64List(value=[label])),
  })).SerializeToString()


def write_shards(data_dir, split: str = "train", num_files: int = 2,
                 per_file: int = 6, labels: int = 3,
                 label_offset: int = 1) -> dict[str, list[bytes]]:
  """`split` files of `per_file` records labelled label_offset + r % labels;
  returns path -> its records."""
  shards = {}
  for f in range(num_files):
    path = os.path.join(str(data_dir), f"{split}-{f:05d}-of-{num_files:05d}")
    records = [example(label_offset + r % labels, 10 * r)
               for r in range(f * per_file, (f + 1) * per_file)]
    with tf.io.TFRecordWriter(path) as writer:
      for record in records:
        writer.write(record)
    shards[path] = records
  return shards


def write_manifest(data_dir, split: str,
                   shards: dict[str, list[bytes]]) -> None:
  """manifest.json of the shards as written (before any damage)."""
  manifest.write(str(data_dir), split, {
      os.path.basename(path): manifest.FileEntry(
          sum(len(r) + FRAMING for r in records), len(records))
      for path, records in shards.items()})


def offset_of(records: list[bytes], index: int) -> int:
  """Byte offset of record `index` in its file."""
  return sum(len(r) + FRAMING for r in records[:index])


def truncate_in_record(path: str, records: list[bytes], index: int) -> int:
  """Cuts `path` in the middle of record `index`'s data; returns its
  offset."""
  offset = offset_of(records, index)
  with open(path, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(data[:offset + HEADER + len(records[index]) // 2])
  return offset


def flip_bytes_in_record(path: str, records: list[bytes], index: int) -> int:
  """Flips 8 bytes in the middle of record `index`'s data (its CRC no longer
  matches); returns its offset."""
  offset = offset_of(records, index)
  start = offset + HEADER + len(records[index]) // 2
  with open(path, "rb") as f:
    data = bytearray(f.read())
  data[start:start + 8] = bytes(b ^ 0xFF for b in data[start:start + 8])
  with open(path, "wb") as f:
    f.write(bytes(data))
  return offset


def corrupt_second_file(data_dir) -> str:
  """2 training files of 6 records and a validation file, with a manifest;
  the second training file has a CRC mismatch in its third record (same
  size, so pre-flight passes it; 4 records lost per pass). Returns its
  path."""
  shards = write_shards(data_dir)
  write_shards(data_dir, "validation", num_files=1)
  write_manifest(data_dir, "train", shards)
  path, records = list(shards.items())[1]
  flip_bytes_in_record(path, records, 2)
  return path
