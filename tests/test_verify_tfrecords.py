"""Specification of data/verify_tfrecords.py, on real damaged files."""
import os
import subprocess
import sys

from data import verify_tfrecords
from resnet_tpu.inputs import manifest
from resnet_tpu.inputs import shard_audit
import damaged_shards

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_verifier_names_each_damaged_file_and_offset_and_exits_1(tmp_path):
  shards = damaged_shards.write_shards(tmp_path, num_files=3)
  damaged_shards.write_shards(tmp_path, "validation", num_files=1)
  (cut, cut_records), (flipped, flipped_records), _ = shards.items()
  cut_at = damaged_shards.truncate_in_record(cut, cut_records, 4)
  flipped_at = damaged_shards.flip_bytes_in_record(flipped, flipped_records, 2)
  result = subprocess.run(
      [sys.executable, "-m", "data.verify_tfrecords",
       f"--data_dir={tmp_path}", "--num_classes=3"],
      cwd=REPO, capture_output=True, text=True, timeout=120)
  assert result.returncode == 1, result.stderr
  assert (f"{cut}: read 4 records, then a truncated record at byte "
          f"{cut_at:,}") in result.stderr
  assert (f"{flipped}: read 2 records, then a corrupt record at byte "
          f"{flipped_at:,} (data CRC mismatch)") in result.stderr
  assert "train: 3 files, 12 records" in result.stderr  # 4 + 2 + 6
  assert "validation: 1 files, 6 records" in result.stderr


def test_verifier_of_whole_files_finds_nothing_and_can_write_the_manifest(
    tmp_path):
  shards = damaged_shards.write_shards(tmp_path)
  report = verify_tfrecords.verify(str(tmp_path), num_classes=3)
  assert report.faults == [] and report.records("train") == 12
  verify_tfrecords.write_manifest(str(tmp_path), report)
  assert manifest.read(str(tmp_path))["train"] == {
      os.path.basename(p): manifest.FileEntry(os.path.getsize(p), len(r))
      for p, r in shards.items()}


def test_verifier_reports_labels_outside_the_range_and_manifest_mismatch(
    tmp_path):
  shards = damaged_shards.write_shards(tmp_path, label_offset=0)
  damaged_shards.write_manifest(tmp_path, "train", shards)
  first = next(iter(shards))
  os.remove(first)
  faults = verify_tfrecords.verify(str(tmp_path), num_classes=3,
                                   label_offset=1).faults
  last = list(shards)[1]
  assert f"{last}: 2 records without a label in [1, 4), e.g. record 0: " \
         "label 0; record 3: label 0" in faults
  assert f"{first}: listed in manifest.json, missing" in faults


def test_masked_crc32c_is_the_one_tfrecord_framing_stores(tmp_path):
  path = next(iter(damaged_shards.write_shards(tmp_path, num_files=1)))
  with open(path, "rb") as f:
    header = f.read(damaged_shards.HEADER)
  assert shard_audit.masked_crc32c(header[:8]) == int.from_bytes(
      header[8:], "little")


def test_without_a_manifest_an_empty_file_is_a_fault(tmp_path):
  shards = damaged_shards.write_shards(tmp_path, num_files=3)
  empty = list(shards)[1]
  open(empty, "wb").close()
  report = verify_tfrecords.verify(str(tmp_path), num_classes=3)
  assert f"{empty}: an empty file (0 bytes)" in report.faults
  assert report.unlisted == ["train"]


def test_without_a_manifest_a_cut_at_a_record_boundary_makes_it_suspect(
    tmp_path):
  shards = damaged_shards.write_shards(tmp_path, num_files=3)
  cut, records = list(shards.items())[0]
  with open(cut, "r+b") as f:  # 4 whole records of 6: reads as whole
    f.truncate(damaged_shards.offset_of(records, 4))
  report = verify_tfrecords.verify(str(tmp_path), num_classes=3)
  assert report.faults == []
  assert report.suspects == [
      f"{cut}: 4 records, while other train files hold up to 6: more than "
      "an even sharding allows, so it may have been cut at a record boundary"]
  (tmp_path / "even").mkdir()
  even = damaged_shards.write_shards(tmp_path / "even", num_files=3)
  with open(list(even)[-1], "r+b") as f:  # the last file may hold fewer
    f.truncate(damaged_shards.offset_of(even[list(even)[-1]], 2))
  assert verify_tfrecords.verify(str(tmp_path / "even")).suspects == []


def test_write_manifest_refuses_to_record_an_empty_or_suspect_file(tmp_path):
  shards = damaged_shards.write_shards(tmp_path, num_files=3)
  damaged_shards.write_shards(tmp_path, "validation", num_files=1)
  cut, records = list(shards.items())[0]
  with open(cut, "r+b") as f:
    f.truncate(damaged_shards.offset_of(records, 3))
  command = [sys.executable, "-m", "data.verify_tfrecords",
             f"--data_dir={tmp_path}", "--write_manifest"]
  result = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 1, result.stderr
  assert f"suspect: {cut}: 3 records" in result.stderr
  assert "cut exactly at a record boundary reads as whole" in result.stderr
  assert "manifest.json not written" in result.stderr
  assert manifest.read(str(tmp_path)) is None

  open(list(shards)[1], "wb").close()
  result = subprocess.run(command + ["--allow_uneven_shards"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 1, result.stderr
  assert "an empty file (0 bytes)" in result.stderr
  assert manifest.read(str(tmp_path)) is None
