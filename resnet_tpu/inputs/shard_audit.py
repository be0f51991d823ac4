"""Training records lost to damaged shards get a file name and a count.

What TensorFlow 2.21's TFRecordDataset does with a damaged file (measured):
  * cut inside a record's data or footer: DataLossError "truncated record at
    <offset>" after the records before it;
  * 8 bytes flipped (CRC mismatch of a length or of the data): DataLossError
    "corrupted record at <offset>";
  * cut inside a 12-byte record header, or at a record boundary: no error,
    the file just ends early.
It never skips one record and reads on: the rest of the file is lost, in
every pass. With ignore_errors() the file ends there, quietly. The error
names no file, and the batch guard of data_checks.py swallows it, dropping
the batch, with a C++ warning (none at TF_CPP_MIN_LOG_LEVEL=2). An error
raised inside the pipeline on purpose would be swallowed the same way.

So each training file listed in manifest.json is read with native tf.data
ops only: a healthy file runs no function per record, and the whole-file
parallel reads of Ying et al. 2018 §3.2 cost what plain reads cost.

  TFRecordDataset(file).ignore_errors().batch(1)    a bad record ends it
    .concatenate(one element per lost record)        runs only when short
    .take(records in manifest.json).unbatch()        the lost ones: empty

When the file ends early, the elements after it come from the second
dataset, whose map calls LostRecords.report (a tf.py_function, once per lost
record): it counts each one and, on the first of a file in each pass, logs a
warning naming the file, the records read, expected and lost, and the byte
offset where reading stops. Without a manifest the count is unknown and the
files are read as they are (preflight.check_manifest says so at start-up).
With cache_dataset a file is read, and checked, in the first pass only.
Under on_corrupt_shard="fail", LostRecords.take raises CorruptShardError
naming the file.
"""
import functools
import os
import threading
from typing import Callable

from absl import logging
import tensorflow as tf

from resnet_tpu.inputs import manifest
from resnet_tpu.config import ConfigError
from resnet_tpu.config import ON_CORRUPT_SHARD

# TFRecord framing: uint64 length, masked CRC32C of it, data, masked CRC32C.
HEADER_BYTES = 12
FRAMING_BYTES = 16
_CRC_MASK_DELTA = 0xA282EAD8
# More than any file holds; the lost-record stream is cut by take().
MAX_LOST = 1 << 62


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


def readable_prefix(path: str) -> tuple[int, int]:
  """(records, bytes) TensorFlow's reader reads before a damaged record."""
  records = nbytes = 0
  lengths = tf.data.TFRecordDataset(path).ignore_errors().map(
      tf.strings.length).batch(4096)
  for batch in lengths:
    records += int(tf.size(batch))
    nbytes += int(tf.reduce_sum(tf.cast(batch, tf.int64)))
  return records, nbytes + records * FRAMING_BYTES


class LostRecords:
  """Thread-safe count of training records lost to damaged shards.

  The input pipeline reports into it (from tf.data threads); the training
  loop calls `take` once per host loop.
  """

  def __init__(self, on_corrupt_shard: str = "skip"):
    if on_corrupt_shard not in ON_CORRUPT_SHARD:
      raise ValueError(f"--on_corrupt_shard must be one of {ON_CORRUPT_SHARD}"
                       f", got {on_corrupt_shard!r}")
    self._fail = on_corrupt_shard == "fail"
    self._lock = threading.Lock()
    self._lost = 0
    self._failure = ""
    self._messages = {}  # path -> warning, each file read once on a fault

  def report(self, path: str, expected: int, index: int) -> None:
    """Counts one lost record of `path`; the `index`-th of it this pass."""
    with self._lock:
      self._lost += 1
    if index:
      return
    with self._lock:
      message = self._messages.get(path)
    if message is None:
      message = self._describe(path, expected)
      with self._lock:
        self._messages[path] = message
        if self._fail and not self._failure:
          self._failure = message
    logging.warning("Damaged training shard %s", message)

  def _describe(self, path: str, expected: int) -> str:
    records, nbytes = readable_prefix(path)
    verify = manifest.VERIFY_COMMAND.format(data_dir=os.path.dirname(path))
    return (f"{path}: read {records:,} of its {expected:,} records "
            f"(manifest.json), {expected - records:,} lost in each pass, "
            f"stopping at {describe_fault(path, nbytes)}. `{verify}` checks "
            "every shard.")

  def take(self) -> int:
    """Records lost since the last call; raises CorruptShardError for a
    damaged file under on_corrupt_shard="fail"."""
    with self._lock:
      if self._failure:
        raise CorruptShardError(
            f"Damaged training shard {self._failure} Stopping "
            "(--on_corrupt_shard=fail; =skip trains on without them).")
      lost, self._lost = self._lost, 0
    return lost


class FileAudit:
  """Reads the training files counting lost records (module docstring)."""

  def __init__(self, expected: dict[str, int], lost: LostRecords):
    self._expected = expected
    self._lost = lost

  @classmethod
  def of(cls, data_dir: str, files: list[str],
         lost: LostRecords) -> "FileAudit | None":
    """The audit of `files`, or None when manifest.json does not list them
    all (preflight.check_manifest names those)."""
    listed = (manifest.read(data_dir) or {}).get("train", {})
    if not all(os.path.basename(f) in listed for f in files):
      return None
    return cls({f: listed[os.path.basename(f)].records for f in files}, lost)

  def names(self, files: list[str]) -> tf.data.Dataset:
    """(file, its records in manifest.json) of `files`."""
    return tf.data.Dataset.from_tensor_slices(
        (files, tf.constant([self._expected[f] for f in files], tf.int64)))

  def reader(self, buffer_size: int, counted: bool) -> Callable:
    """(file, records) -> its records; `counted` reads report losses."""
    def read(name, expected):
      records = tf.data.TFRecordDataset(
          name, buffer_size=buffer_size).ignore_errors().batch(1)
      return records.concatenate(self._lost_records(name, expected, counted)
                                 ).take(expected).unbatch()

    return read

  def _lost_records(self, name, expected, counted) -> tf.data.Dataset:
    """Endless empty elements; each reports one lost record when counted."""
    empty = tf.zeros([0], tf.string)
    if not counted:
      return tf.data.Dataset.from_tensors(empty).repeat()

    def report(path, expected, index) -> bool:
      self._lost.report(path.numpy().decode(), int(expected), int(index))
      return True

    def lost(index):
      done = tf.py_function(report, [name, expected, index], tf.bool)
      with tf.control_dependencies([done]):
        return tf.identity(empty)

    return tf.data.Dataset.range(MAX_LOST).map(lost)


def reading(files: list[str], buffer_size: int, audit: FileAudit | None,
            counted: bool) -> tuple[tf.data.Dataset, Callable]:
  """The names to interleave and the reader of one file: plain
  TFRecordDatasets without an `audit`; `counted` ones report losses."""
  if audit is None:
    return tf.data.Dataset.from_tensor_slices(files), functools.partial(
        tf.data.TFRecordDataset, buffer_size=buffer_size)
  return audit.names(files), audit.reader(buffer_size, counted)
