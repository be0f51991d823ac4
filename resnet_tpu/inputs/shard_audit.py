"""Training records lost to damaged shards get a file name and a count.

What TensorFlow 2.21's TFRecordDataset does with a damaged file (measured):
  * cut inside a record's data or footer: DataLossError "truncated record at
    <offset>" after the records before it;
  * 8 bytes flipped (CRC mismatch of a length or of the data): DataLossError
    "corrupted record at <offset>";
  * cut inside a 12-byte record header, or at a record boundary: no error,
    the file just ends early.
It never skips one record and reads on: the rest of the file is lost, in
every pass. The error names no file.

So every training file is read as (source, record) pairs, with native
tf.data ops only, so the count works wherever the input pipeline runs
(a TPU pod's remote input hosts included); a healthy file costs what a plain
read costs (Ying et al. 2018 §3.2):

  TFRecordDataset(file).ignore_errors()              a bad record ends it
    .concatenate(one empty record per lost record)   runs only when short
    .take(records in manifest.json)

`source` is 2 * the file's index in the split, + 1 for the stand-ins of
lost records. The input pipeline turns every record it cannot use (a lost
one, one it cannot parse or decode) into a weight-0 example whose label
names its source (record_guards.py), so the training step counts them per
file in its summed StepSums: over all replicas and workers, once per host
loop. `DataFaults` then names each file in a warning (for a lost record: the
records read, expected and lost, and the byte offset where reading stops)
and, under --on_corrupt_shard=fail, every worker raises CorruptShardError
naming the file after the same host loop. Without a manifest the number of
lost records is unknown: a damaged file ends early, uncounted
(data_checks.check_manifest says so at start-up).
"""
import os
from typing import Callable, Sequence

from absl import logging
import tensorflow as tf

from resnet_tpu.inputs import manifest
from resnet_tpu.config import ConfigError

# TFRecord framing: uint64 length, masked CRC32C of it, data, masked CRC32C.
HEADER_BYTES = 12
FRAMING_BYTES = 16
_CRC_MASK_DELTA = 0xA282EAD8


class CorruptShardError(ConfigError):
  """A training shard is damaged and --on_corrupt_shard=fail."""


def _crc_table() -> tuple[int, ...]:
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)  # Castagnoli
    table.append(crc)
  return tuple(table)


_CRC_TABLE = _crc_table()


def masked_crc32c(data: bytes) -> int:
  """The CRC TFRecord framing stores (slow: for one record, not a file)."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  crc ^= 0xFFFFFFFF
  return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def describe_fault(path: str, offset: int) -> str:
  """What the TFRecord framing of `path` holds at byte `offset`, where
  reading stopped: e.g. "a truncated record at byte 5080 (...)"."""
  try:
    size = tf.io.gfile.stat(path).length
    with tf.io.gfile.GFile(path, "rb") as f:
      f.seek(offset)
      header = f.read(HEADER_BYTES)
      length = int.from_bytes(header[:8], "little")
      ok_length = (len(header) == HEADER_BYTES and masked_crc32c(
          header[:8]) == int.from_bytes(header[8:], "little"))
      data = f.read(length + 4) if ok_length else b""
  except tf.errors.OpError as e:
    return f"an unreadable file ({e.message})"
  if offset >= size:
    return f"the end of the file at byte {size:,}"
  if len(header) < HEADER_BYTES:
    return (f"a truncated record header at byte {offset:,} ({len(header)} "
            f"of {HEADER_BYTES} bytes)")
  if not ok_length:
    return f"a corrupt record header at byte {offset:,} (length CRC mismatch)"
  if len(data) < length + 4:
    return (f"a truncated record at byte {offset:,} ({length:,} data bytes, "
            f"{size - offset - HEADER_BYTES:,} left in the file)")
  if masked_crc32c(data[:-4]) != int.from_bytes(data[-4:], "little"):
    return f"a corrupt record at byte {offset:,} (data CRC mismatch)"
  return f"an unreadable record at byte {offset:,}"


def first_record(path: str) -> bytes | None:
  """The first record of TFRecord file `path` (None: it ends before one),
  read with tf.io.gfile alone: no TensorFlow runtime starts, which a
  multi-worker strategy must configure first. Raises DataLossError naming
  what it found where a record should be."""
  with tf.io.gfile.GFile(path, "rb") as f:
    header = f.read(HEADER_BYTES)
    if len(header) < HEADER_BYTES:
      return None  # as TFRecordDataset reads it: no record, no error
    length = int.from_bytes(header[:8], "little")
    ok_length = masked_crc32c(header[:8]) == int.from_bytes(header[8:],
                                                            "little")
    data = f.read(length + 4) if ok_length else b""
  if len(data) == length + 4 and masked_crc32c(data[:-4]) == int.from_bytes(
      data[-4:], "little"):
    return data[:-4]
  raise tf.errors.DataLossError(None, None, describe_fault(path, 0))


def count_records(path: str) -> int:
  """Records of TFRecord file `path` before the first framing fault, from
  their headers alone (each record's data is skipped, not checksummed),
  with tf.io.gfile: no TensorFlow runtime starts (first_record)."""
  records = offset = 0
  with tf.io.gfile.GFile(path, "rb") as f:
    size = f.size()
    while True:
      header = f.read(HEADER_BYTES)
      if len(header) < HEADER_BYTES or masked_crc32c(
          header[:8]) != int.from_bytes(header[8:], "little"):
        return records
      offset += FRAMING_BYTES + int.from_bytes(header[:8], "little")
      if offset > size:
        return records  # cut inside this record
      records += 1
      f.seek(offset)


def readable_prefix(path: str) -> tuple[int, int]:
  """(records, bytes) TensorFlow's reader reads before a damaged record."""
  records = nbytes = 0
  lengths = tf.data.TFRecordDataset(path).ignore_errors().map(
      tf.strings.length).batch(4096)
  for batch in lengths:
    records += int(tf.size(batch))
    nbytes += int(tf.reduce_sum(tf.cast(batch, tf.int64)))
  return records, nbytes + records * FRAMING_BYTES


def source_of(file_index: int | tf.Tensor, lost: bool = False):
  """The source number of `file_index`'s records (module docstring)."""
  return 2 * file_index + (1 if lost else 0)


def reading(files: list[str], indices: list[int], buffer_size: int,
            expected: dict[str, int] | None
            ) -> tuple[tf.data.Dataset, Callable]:
  """The (file, its index in the split, records expected or -1) to
  interleave, and the reader of one file: (source, record) pairs, a lost
  record's stand-in after a damaged file's last readable one when
  `expected` (manifest.json) lists the records of every file."""
  counts = [expected[f] if expected else -1 for f in files]
  names = tf.data.Dataset.from_tensor_slices(
      (files, tf.constant(indices, tf.int64), tf.constant(counts, tf.int64)))

  def read(name, index, count):
    source = tf.cast(source_of(index), tf.int32)
    records = tf.data.TFRecordDataset(
        name, buffer_size=buffer_size).ignore_errors().map(
            lambda record: (source, record))
    if expected is None:
      return records
    lost = tf.data.Dataset.from_tensors((source + 1, tf.constant(""))).repeat()
    return records.concatenate(lost).take(count)

  return names, read


def expected_records(data_dir: str, files: Sequence[str]
                     ) -> dict[str, int] | None:
  """path -> records of `files` in manifest.json; None when it does not
  list them all (data_checks.check_manifest names those)."""
  listed = (manifest.read(data_dir) or {}).get("train", {})
  if not all(os.path.basename(f) in listed for f in files):
    return None
  return {f: listed[os.path.basename(f)].records for f in files}


class DataFaults:
  """Names the files behind each host loop's unusable and lost records.

  `by_source[s]` counts the weight-0 examples of source s (module
  docstring), summed over every replica and worker, so every worker names
  the same files and, under on_corrupt_shard="fail", stops after the same
  host loop.
  """

  def __init__(self, files: list[str], expected: dict[str, int] | None,
               on_corrupt_shard: str = "skip"):
    self.files = list(files)
    self._expected = expected
    self._fail = on_corrupt_shard == "fail"
    self._described = {}  # path -> what is damaged, read once

  @property
  def num_sources(self) -> int:
    return 2 * len(self.files)

  def report(self, by_source: Sequence[int], step: int) -> None:
    """Logs a warning per file with faults in the loop ending at `step`;
    raises CorruptShardError for a lost record under "fail"."""
    damaged = []
    for index, path in enumerate(self.files):
      unusable, lost = by_source[2 * index], by_source[2 * index + 1]
      if unusable:
        logging.warning(
            "%s: %d unusable record(s) in the steps up to %d (not a "
            "tf.train.Example with one image/encoded and one "
            "image/class/label, or not a decodable JPEG); trained on with "
            "weight 0.", path, unusable, step)
      if lost:
        damaged.append(self._describe(path))
        logging.warning("Damaged training shard %s %d record(s) lost in the "
                        "steps up to %d.", damaged[-1], lost, step)
    if damaged and self._fail:
      raise CorruptShardError(
          f"Damaged training shard {damaged[0]} Stopping "
          "(--on_corrupt_shard=fail; =skip trains on without them).")

  def _describe(self, path: str) -> str:
    if path not in self._described:
      expected = self._expected[path]
      records, nbytes = readable_prefix(path)
      verify = manifest.VERIFY_COMMAND.format(data_dir=os.path.dirname(path))
      self._described[path] = (
          f"{path}: read {records:,} of its {expected:,} records "
          f"(manifest.json), {expected - records:,} lost in each pass, "
          f"stopping at {describe_fault(path, nbytes)}. `{verify}` checks "
          "every shard.")
    return self._described[path]
