"""Damaged training files on JAX, as tests/test_shard_audit.py shows them on
TensorFlow: a file with a CRC mismatch (its size intact, so the pre-flight
passes it) loses its later records in every pass; the JAX run counts them
in metrics.jsonl and trains on, or, with --on_corrupt_shard=fail, stops
naming the file. run.run in this process, on its 8 virtual devices."""
import os
import sys

import pytest

from resnet_tpu import run
from resnet_tpu.config import TrainConfig
from resnet_tpu.inputs import shard_audit
from resnet_tpu.train.metrics_log import read_metrics

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "tests"))
import damaged_shards  # noqa: E402  pylint: disable=wrong-import-position

STEPS, BATCH = 4, 8


def _corrupt_run(tmp_path, **overrides) -> tuple[TrainConfig, str]:
  """A run over 2 files of 6 records, the second with a CRC mismatch in its
  third record (4 of its records lost per pass); returns (cfg, path)."""
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  path = damaged_shards.corrupt_second_file(data_dir)
  cfg = TrainConfig.from_flat(
      model_dir=str(tmp_path / "model"), data_dir=str(data_dir),
      num_classes=3, backend="jax", strategy="cpu", resnet_depth=18,
      image_size=32, global_batch_size=BATCH, eval_batch_size=BATCH,
      train_steps=STEPS, steps_per_loop=2, shuffle_buffer_size=8,
      warmup_epochs=0.0, checkpoint_every_minutes=0, **overrides)
  return cfg, path


def test_a_jax_run_counts_lost_records_in_metrics_and_trains_on(tmp_path):
  cfg, _ = _corrupt_run(tmp_path)
  run.run(cfg)
  train = [r for r in read_metrics(cfg.model_dir) if r["split"] == "train"]
  assert [r["step"] for r in train] == [2, 4]  # trained on to the end
  # 32 records read in 4 steps of 8, at least one pass's 4 lost.
  assert sum(r["lost_records"] for r in train) >= 4
  assert sum(r["examples"] + r["lost_records"] for r in train) == (
      STEPS * BATCH)


def test_on_corrupt_shard_fail_stops_a_jax_run_naming_the_file(tmp_path):
  cfg, path = _corrupt_run(tmp_path, on_corrupt_shard="fail")
  with pytest.raises(shard_audit.CorruptShardError, match=path):
    run.run(cfg)
