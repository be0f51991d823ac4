"""Damaged training shards are named and their lost records counted, at
start-up (data_checks.check_manifest) and while training (shard_audit.py).
Built from real damaged files: cut mid-record, 8 bytes flipped mid-file."""
import logging
import os

import pytest
import tensorflow as tf

from conftest import cpu_strategy
import damaged_shards
from resnet_tpu.inputs import record_guards
from resnet_tpu.inputs import input_pipeline
from resnet_tpu import data_checks
from resnet_tpu.engines.tensorflow import startup as tf_startup
from resnet_tpu import run as run_lib
from resnet_tpu.runtime import compat
from resnet_tpu.inputs import shard_audit
from resnet_tpu.config import InputConfig
from resnet_tpu.config import TrainConfig
from resnet_tpu.train.metrics_log import read_metrics
from resnet_tpu.parallel.tensorflow.strategy import Distribution
from tiny_model import tiny_resnet

PER_FILE = 6


def _train_fn(data_dir, seed=None, **overrides) -> input_pipeline.DatasetFn:
  """The training input of the 8 px images of `data_dir`, batches of 2."""
  cfg = InputConfig(data_dir=str(data_dir),
                    **dict(dict(shuffle_buffer_size=64), **overrides))
  return input_pipeline.train_dataset_fn(
      cfg, input_pipeline.split_files(str(data_dir), "train"),
      global_batch_size=2, image_size=8, seed=seed)


def _read_one_pass(data_dir, num=8, **overrides) -> list[int]:
  """Labels of the first `num` training examples (the shuffle buffer reads
  every file of the first pass to its end first); negative: weight 0."""
  dataset = _train_fn(data_dir, **overrides)(tf.distribute.InputContext())
  return [int(label) for _, labels in dataset.take(num // 2)
          for label in labels]


@pytest.fixture(params=["truncated", "corrupt"])
def damaged(request, tmp_path):
  """(data_dir, damaged file, its offset, records lost), with a manifest."""
  shards = damaged_shards.write_shards(tmp_path)
  damaged_shards.write_manifest(tmp_path, "train", shards)
  path, records = list(shards.items())[1]
  damage = {"truncated": damaged_shards.truncate_in_record,
            "corrupt": damaged_shards.flip_bytes_in_record}[request.param]
  return tmp_path, path, damage(path, records, 2), PER_FILE - 2


LOST_IN_FILE_1 = record_guards.fault_label(shard_audit.source_of(1, lost=True))


def test_each_lost_record_is_a_weight_0_example_naming_its_file(damaged):
  data_dir, _, _, lost_count = damaged
  labels = _read_one_pass(data_dir, num=2 * PER_FILE, shuffle_buffer_size=1,
                          seed=0, deterministic_input=True)
  assert labels.count(LOST_IN_FILE_1) == lost_count
  assert sorted(l for l in labels if l >= 0) == sorted(
      [r % 3 for r in range(PER_FILE)] + [r % 3 for r in range(PER_FILE,
                                                               PER_FILE + 2)])


# Ops that run Python in the process that built the pipeline: they fail
# where a pod's input runs remotely (tensorflow script_ops.py).
PYTHON_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}


def test_the_training_input_counts_losses_without_running_python(damaged):
  """The count works wherever the input pipeline runs (a TPU pod's hosts):
  no op of the pipeline's graph, its functions included, calls Python."""
  data_dir = damaged[0]
  dataset = _train_fn(data_dir)(tf.distribute.InputContext())
  graph = compat.dataset_graph(dataset)
  ops = {node.op for node in graph.node} | {
      node.op for function in graph.library.function
      for node in function.node_def}
  assert "TFRecordDataset" in ops
  assert ops & {"MapDataset", "ParallelMapDatasetV2"}  # the fused map's ops
  assert not ops & PYTHON_OPS, sorted(ops & PYTHON_OPS)


def test_damaged_training_file_is_named_and_its_lost_records_counted(
    damaged, caplog):
  data_dir, path, offset, lost_count = damaged
  files = input_pipeline.split_files(str(data_dir), "train")
  faults = shard_audit.DataFaults(
      files, shard_audit.expected_records(str(data_dir), files))
  labels = _read_one_pass(data_dir, num=2 * PER_FILE)
  _, lost, by_source = record_guards.fault_counts(tf.constant(labels),
                                                faults.num_sources)
  assert int(lost) == lost_count
  with caplog.at_level(logging.WARNING):
    faults.report([int(n) for n in by_source], step=6)
  assert (f"{path}: read 2 of its {PER_FILE} records (manifest.json), "
          f"{lost_count} lost in each pass, stopping at a ") in caplog.text
  assert f"at byte {offset:,}" in caplog.text
  assert f"{lost_count} record(s) lost in the steps up to 6" in caplog.text


def test_on_corrupt_shard_fail_raises_naming_the_file(damaged):
  data_dir, path, _, lost_count = damaged
  files = input_pipeline.split_files(str(data_dir), "train")
  faults = shard_audit.DataFaults(
      files, shard_audit.expected_records(str(data_dir), files), "fail")
  faults.report([1, 0, 0, 0], step=2)  # an unusable record: no stop
  with pytest.raises(shard_audit.CorruptShardError, match=path):
    faults.report([0, 0, 0, lost_count], step=4)


def test_first_record_is_read_from_the_framing_and_damage_is_named(
    tmp_path):
  (path, records), (other, others) = damaged_shards.write_shards(
      tmp_path).items()
  assert shard_audit.first_record(path) == records[0]
  damaged_shards.flip_bytes_in_record(other, others, 0)
  with pytest.raises(tf.errors.DataLossError,
                     match=r"a corrupt record at byte 0 \(data CRC mismatch"):
    shard_audit.first_record(other)
  (tmp_path / "empty").write_bytes(b"")
  assert shard_audit.first_record(str(tmp_path / "empty")) is None


def test_count_records_counts_the_records_before_a_cut(tmp_path):
  (path, records), (cut, others) = damaged_shards.write_shards(
      tmp_path).items()
  damaged_shards.truncate_in_record(cut, others, 2)
  assert shard_audit.count_records(path) == PER_FILE
  assert shard_audit.count_records(cut) == 2 == shard_audit.readable_prefix(
      cut)[0]


def test_counting_leaves_the_records_and_their_order_alone(tmp_path):
  shards = damaged_shards.write_shards(tmp_path)
  same = dict(seed=3, deterministic_input=True)
  unlisted = _read_one_pass(tmp_path, **same)
  damaged_shards.write_manifest(tmp_path, "train", shards)
  assert _read_one_pass(tmp_path, **same) == unlisted
  assert min(unlisted) >= 0


def test_without_a_manifest_files_are_read_as_they_are_uncounted(tmp_path):
  shards = damaged_shards.write_shards(tmp_path)
  path, records = list(shards.items())[0]
  damaged_shards.truncate_in_record(path, records, 3)
  assert shard_audit.expected_records(str(tmp_path), list(shards)) is None
  labels = _read_one_pass(tmp_path, num=2 * PER_FILE - 3)
  assert min(labels) >= 0


def _train_config(data_dir) -> TrainConfig:
  return TrainConfig.from_flat(model_dir="unused", data_dir=str(data_dir),
                               num_classes=3, train_steps=1)


def test_preflight_names_a_truncated_and_a_missing_file_via_the_manifest(
    tmp_path):
  shards = damaged_shards.write_shards(tmp_path, num_files=3)
  damaged_shards.write_shards(tmp_path, "validation", num_files=1)
  damaged_shards.write_manifest(tmp_path, "train", shards)
  (cut, records), (missing, _), _ = shards.items()
  size = os.path.getsize(cut)
  damaged_shards.truncate_in_record(cut, records, 4)
  os.remove(missing)
  files = data_checks.find_data_files(str(tmp_path))
  with pytest.raises(ValueError) as error:
    data_checks.check_manifest(_train_config(tmp_path), files)
  message = str(error.value)
  assert (f"{cut} is {os.path.getsize(cut):,} bytes, manifest.json says "
          f"{size:,}") in message
  assert f"{missing} is missing ({PER_FILE} records)" in message
  assert f"python -m data.verify_tfrecords --data_dir={tmp_path}" in message


def test_preflight_without_a_manifest_warns_that_losses_go_uncounted(
    tmp_path, caplog):
  shards = damaged_shards.write_shards(tmp_path)
  files = data_checks.DataFiles(train=tuple(shards), validation=())
  with caplog.at_level(logging.WARNING):
    data_checks.check_manifest(_train_config(tmp_path), files)
  assert "has no manifest.json: records lost" in caplog.text
  assert "--write_manifest" in caplog.text


def test_run_stops_before_start_up_on_a_file_shorter_than_its_manifest(
    tmp_path, monkeypatch):
  def no_strategy(*args, **kwargs):
    raise AssertionError("the strategy started before the sizes were checked")

  monkeypatch.setattr(tf_startup, "create_strategy", no_strategy)
  (tmp_path / "data").mkdir()
  shards = damaged_shards.write_shards(tmp_path / "data")
  damaged_shards.write_shards(tmp_path / "data", "validation", num_files=1)
  damaged_shards.write_manifest(tmp_path / "data", "train", shards)
  path, records = next(iter(shards.items()))
  damaged_shards.truncate_in_record(path, records, 1)
  cfg = _train_config(tmp_path / "data").replace(
      model_dir=str(tmp_path / "model"), strategy="cpu", image_size=32)
  with pytest.raises(ValueError, match=f"{path} is .* bytes, manifest.json"):
    run_lib.run(cfg)


def _corrupt_run(tmp_path, **overrides) -> tuple[TrainConfig, str]:
  """A run over 2 files of 6 records, the second with a CRC mismatch in its
  third record (same size, so pre-flight passes it); returns (cfg, path)."""
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  path = damaged_shards.corrupt_second_file(data_dir)
  cfg = _train_config(data_dir).replace(
      model_dir=str(tmp_path / "model"), strategy="cpu", num_cpu_replicas=2,
      image_size=32, global_batch_size=4, eval_batch_size=4, train_steps=4,
      steps_per_loop=2, shuffle_buffer_size=8, warmup_epochs=0.0, **overrides)
  return cfg, path


def test_a_run_counts_lost_records_in_metrics_and_trains_on(tmp_path):
  cfg, _ = _corrupt_run(tmp_path)
  run_lib.run(cfg, model_fn=tiny_resnet,
              distribution=Distribution(cpu_strategy(2)))
  train = [r for r in read_metrics(cfg.model_dir) if r["split"] == "train"]
  assert [r["step"] for r in train] == [2, 4]  # trained on to the end
  # 4 of the damaged file's 6 records are lost in every pass read:
  # 16 records read, 2 passes over 12 records in the files.
  assert sum(r["lost_records"] for r in train) >= 4
  assert sum(r["examples"] + r["lost_records"] for r in train) == 16


def test_on_corrupt_shard_fail_stops_the_run_naming_the_file(tmp_path):
  cfg, path = _corrupt_run(tmp_path, on_corrupt_shard="fail")
  with pytest.raises(shard_audit.CorruptShardError, match=path):
    run_lib.run(cfg, model_fn=tiny_resnet,
                distribution=Distribution(cpu_strategy(2)))
