r"""Reads every TFRecord shard of a data folder and reports what is damaged.

  python -m data.verify_tfrecords --data_dir=gs://bucket/imagenet \
      --num_classes=1000 [--label_offset=1] [--write_manifest]

Every train-* and validation-* file is read in full, several at once (the
parallel reads of Ying et al. 2018 §3.2), with TensorFlow's CRC-checked
reader. Reported, each naming the file:
  * a truncated or corrupt record, with its byte offset and what the record
    framing holds there (resnet_tpu/inputs/shard_audit.py); the records after it
    cannot be read;
  * with a manifest.json (resnet_tpu/inputs/manifest.py): files it lists that are
    missing, files it does not list, and sizes or record counts that differ;
  * records without one image/class/label, and with --num_classes labels
    outside [--label_offset, --label_offset + --num_classes);
  * without a manifest: zero-byte files. A file cut exactly at a record
    boundary reads as whole, so it cannot be detected without one; a split
    whose files' record counts differ more than an even sharding allows
    (data/build_tfrecords.py: by at most 1; imagenet_to_gcs.py: the last
    file may hold fewer) is reported as suspect.
It logs the records of each split and exits 1 on any fault. --write_manifest
writes manifest.json from what was read, for data that has none (e.g. the
output of tensorflow/tpu imagenet_to_gcs.py); only when no file is faulty or
suspect (--allow_uneven_shards accepts uneven splits made on purpose).
"""
import concurrent.futures
import dataclasses
import os
import sys
import time

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf
from google.protobuf import message

if not __package__:  # run as a file: the repository's root on the path
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))

from resnet_tpu.inputs import input_pipeline
from resnet_tpu.inputs import manifest
from resnet_tpu.inputs import shard_audit

LABEL = "image/class/label"
READ_BATCH = 256
PROGRESS_SECONDS = 5.0
EXAMPLES_PER_FAULT = 3

FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class FileReport:
  """What reading one file found; `fault` is "" when it reads whole."""
  path: str
  bytes: int
  records: int
  fault: str = ""
  bad_labels: tuple[str, ...] = ()  # "record 7: label 0", a few of them
  num_bad_labels: int = 0


@dataclasses.dataclass(frozen=True)
class Report:
  files: dict[str, list[FileReport]]  # split -> files
  faults: list[str]
  suspects: list[str] = dataclasses.field(default_factory=list)
  unlisted: list[str] = dataclasses.field(default_factory=list)  # splits

  def records(self, split: str) -> int:
    return sum(f.records for f in self.files[split])


def _label(record: bytes) -> int | None:
  """The one image/class/label of a tf.train.Example, else None."""
  try:
    feature = tf.train.Example.FromString(record).features.feature
  except message.DecodeError:
    return None
  labels = feature[LABEL].int64_list.value if LABEL in feature else []
  return labels[0] if len(labels) == 1 else None


def verify_file(path: str, labels: range | None) -> FileReport:
  """Reads `path` to the end or to its first damaged record."""
  size = tf.io.gfile.stat(path).length
  records = nbytes = num_bad = 0
  bad = []
  dataset = tf.data.TFRecordDataset(
      path, buffer_size=input_pipeline.READ_BUFFER_BYTES).ignore_errors()
  for batch in dataset.batch(READ_BATCH):
    for record in batch.numpy():
      label = _label(record)
      if label is None or (labels is not None and label not in labels):
        num_bad += 1
        if len(bad) < EXAMPLES_PER_FAULT:
          bad.append(f"record {records}: " + (
              f"label {label}" if label is not None else
              f"no single {LABEL} in a tf.train.Example"))
      records += 1
      nbytes += len(record) + shard_audit.FRAMING_BYTES
  fault = "" if nbytes == size else (
      f"read {records:,} records, then " +
      shard_audit.describe_fault(path, nbytes))
  return FileReport(path, size, records, fault, tuple(bad), num_bad)


def _read_all(split: str, paths: list[str], labels: range | None,
              num_threads: int) -> list[FileReport]:
  """verify_file on every path in a thread pool, logging progress."""
  start = time.monotonic()
  with concurrent.futures.ThreadPoolExecutor(num_threads) as pool:
    futures = [pool.submit(verify_file, p, labels) for p in paths]
    pending = set(futures)
    while pending:
      _, pending = concurrent.futures.wait(pending, PROGRESS_SECONDS)
      done = [f.result() for f in futures if f.done()]
      seconds = time.monotonic() - start
      logging.info("%s: read %d/%d files, %s records, %.1f MB/s", split,
                   len(done), len(paths), f"{sum(r.records for r in done):,}",
                   sum(r.bytes for r in done) / 1e6 / max(seconds, 1e-9))
    return [f.result() for f in futures]


def _manifest_faults(data_dir: str, split: str, reports: list[FileReport],
                     listed: manifest.Split) -> list[str]:
  found = {os.path.basename(r.path): r for r in reports}
  faults = [f"{os.path.join(data_dir, name)}: listed in manifest.json, "
            "missing" for name in sorted(set(listed) - set(found))]
  for name, report in sorted(found.items()):
    entry = listed.get(name)
    if entry is None:
      faults.append(f"{report.path}: a {split} file manifest.json does not "
                    "list")
    elif (report.bytes, report.records) != (entry.bytes, entry.records):
      faults.append(
          f"{report.path}: {report.bytes:,} bytes, {report.records:,} "
          f"records read; manifest.json says {entry.bytes:,} bytes, "
          f"{entry.records:,} records")
  return faults


def _file_faults(report: FileReport, labels: range | None) -> list[str]:
  faults = [f"{report.path}: {report.fault}"] if report.fault else []
  if report.num_bad_labels:
    expected = (f"a label in [{labels.start}, {labels.stop})" if labels
                else f"one {LABEL}")
    faults.append(f"{report.path}: {report.num_bad_labels:,} records "
                  f"without {expected}, e.g. {'; '.join(report.bad_labels)}")
  return faults


def _uneven(split: str, reports: list[FileReport]) -> list[str]:
  """Files whose record counts an even sharding cannot explain: all but
  the last within 1 of each other, the last no larger."""
  counts = [r.records for r in reports]
  if len(counts) < 2:
    return []
  most = max(counts[:-1])
  short = [r for r in reports[:-1] if r.records < most - 1]
  if counts[-1] > most:
    short = [r for r in reports[:-1] if r.records < counts[-1]]
  return [f"{r.path}: {r.records:,} records, while other {split} files hold "
          f"up to {max(counts):,}: more than an even sharding allows, so it "
          "may have been cut at a record boundary" for r in short]


def verify(data_dir: str, num_classes: int = 0, label_offset: int = 1,
           num_threads: int = 16) -> Report:
  """Reads every shard of `data_dir`; ValueError if it holds none."""
  labels = (range(label_offset, label_offset + num_classes)
            if num_classes else None)
  listed = manifest.read(data_dir)
  files, faults, suspects, unlisted = {}, [], [], []
  for split in input_pipeline.SPLITS:
    paths = sorted(tf.io.gfile.glob(os.path.join(data_dir, f"{split}-*-of-*")))
    if not paths and split not in (listed or {}):
      continue
    files[split] = _read_all(split, paths, labels, num_threads)
    for report in files[split]:
      faults += _file_faults(report, labels)
    if listed is not None and split in listed:
      faults += _manifest_faults(data_dir, split, files[split], listed[split])
    else:
      unlisted.append(split)
      faults += [f"{r.path}: an empty file (0 bytes)" for r in files[split]
                 if not r.bytes]
      suspects += _uneven(split, files[split])
  if not any(files.values()):
    raise ValueError(f"--data_dir={data_dir!r} holds no train-*-of-* or "
                     "validation-*-of-* TFRecord files")
  return Report(files, faults, suspects, unlisted)


def write_manifest(data_dir: str, report: Report) -> str:
  for split, reports in report.files.items():
    path = manifest.write(data_dir, split, {
        os.path.basename(r.path): manifest.FileEntry(r.bytes, r.records)
        for r in reports})
  return path


def define_flags() -> None:
  """Flags exist only when run as a script; importing defines none."""
  flags.DEFINE_string("data_dir", None, "Folder (or gs:// path) of "
                      "train-*/validation-* TFRecord files.")
  flags.DEFINE_integer("num_classes", 0, "Check that labels lie in "
                       "[--label_offset, --label_offset + --num_classes); "
                       "0 = only that each record has one label.")
  flags.DEFINE_integer("label_offset", 1, "The smallest valid stored label "
                       "(imagenet_to_gcs: 1).")
  flags.DEFINE_integer("num_threads", 16, "Files read at once.")
  flags.DEFINE_bool("write_manifest", False, "Write manifest.json from the "
                    "records read, when no file is faulty or suspect.")
  flags.DEFINE_bool("allow_uneven_shards", False, "Accept splits whose "
                    "files' record counts differ more than an even sharding "
                    "allows (uneven on purpose).")
  flags.mark_flag_as_required("data_dir")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    report = verify(FLAGS.data_dir, FLAGS.num_classes, FLAGS.label_offset,
                    FLAGS.num_threads)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  for split, reports in report.files.items():
    logging.info("%s: %d files, %s records", split, len(reports),
                 f"{report.records(split):,}")
  for fault in report.faults:
    logging.error("%s", fault)
  suspects = [] if FLAGS.allow_uneven_shards else report.suspects
  for suspect in suspects:
    logging.warning("suspect: %s", suspect)
  for split in report.unlisted:
    logging.warning(
        "%s has no manifest.json entry: a file cut exactly at a record "
        "boundary reads as whole and cannot be detected without one; only "
        "empty files and uneven record counts were checked.", split)
  if report.faults:
    raise SystemExit(f"{len(report.faults)} faults in {FLAGS.data_dir}" + (
        "; manifest.json not written" if FLAGS.write_manifest else ""))
  if suspects and FLAGS.write_manifest:
    raise SystemExit(
        f"{len(suspects)} suspect files in {FLAGS.data_dir}; manifest.json "
        "not written (it would record them as whole). Restore them from the "
        "source, or pass --allow_uneven_shards if the split is uneven on "
        "purpose.")
  if FLAGS.write_manifest:
    logging.info("wrote %s", write_manifest(FLAGS.data_dir, report))
  logging.info("no damaged records in %s", FLAGS.data_dir)


if __name__ == "__main__":
  define_flags()
  app.run(main)
