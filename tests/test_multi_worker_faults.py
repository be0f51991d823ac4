"""What one worker alone sees stops or reaches every worker.

Worker processes run MultiWorkerMirroredStrategy on 127.0.0.1 (two train:
tests/reliability_worker.py, main.py with a tiny network), each bounded in
time and killed if it outlives its bound:
  * a damaged training file that only the non-chief worker reads is counted
    in the chief's metrics.jsonl (`lost_records`, summed over workers), and
    with --on_corrupt_shard=fail every worker exits 1 naming the file;
  * a worker that restores an older checkpoint than the other (its view of
    model_dir has the newest one damaged) makes both stop, naming both
    steps, before any training step;
  * pre-flight's reads leave TensorFlow's runtime unstarted, so a
    multi-worker strategy can still configure its collectives after them.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import tensorflow as tf

import damaged_shards
from resnet_tpu.train.checkpoints import tf_files
from resnet_tpu.train.metrics_log import read_metrics
from test_multi_worker import _free_loopback_ports
from test_multi_worker_failure import _kill_all
from test_multi_worker_failure import start_workers

WORKERS = 2
# Start-up, a few steps and an eval of the tiny network on a loaded 2-core
# machine.
RUN_BOUND_S = 240
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON_FLAGS = ("--strategy=multi_worker", "--image_size=32",
                "--global_batch_size=4", "--eval_batch_size=4",
                "--lr_schedule=constant", "--warmup_epochs=0",
                "--collective_timeout_s=60")


def _run_workers(log_dir, flags: list[list[str]]) -> list[int]:
  """Runs worker `task` with COMMON_FLAGS + flags[task]; returns the exit
  codes. Every process is killed once RUN_BOUND_S has passed."""
  log_dir.mkdir()
  processes = []
  try:
    processes = start_workers(log_dir, [[*COMMON_FLAGS, *task_flags]
                                        for task_flags in flags])
    return [p.wait(timeout=RUN_BOUND_S) for p in processes]
  finally:
    _kill_all(processes)


def _logs(log_dir) -> list[str]:
  return [(log_dir / f"worker_{task}.log").read_text()
          for task in range(WORKERS)]


def _damaged_data(data_dir) -> str:
  """2 training files of 6 records, with a manifest; the second, read only
  by worker 1, has a CRC mismatch in its third record (4 lost per pass).
  Returns its path."""
  data_dir.mkdir()
  return damaged_shards.corrupt_second_file(data_dir)


def _data_flags(tmp_path, *extra: str) -> list[str]:
  return [f"--data_dir={tmp_path / 'data'}",
          f"--model_dir={tmp_path / 'model'}", "--num_classes=3",
          "--train_steps=4", "--steps_per_loop=2", "--shuffle_buffer_size=8",
          *extra]


def test_damage_in_a_non_chief_workers_file_counts_in_the_chiefs_metrics(
    tmp_path):
  path = _damaged_data(tmp_path / "data")
  codes = _run_workers(tmp_path / "logs", [_data_flags(tmp_path)] * WORKERS)
  logs = _logs(tmp_path / "logs")
  assert codes == [0] * WORKERS, logs[0][-3000:] + logs[1][-3000:]
  # Whole files per worker: the chief reads only the intact one.
  assert "input pipeline 0 of 2: 1 files, sharded by file" in logs[0]
  assert "input pipeline 1 of 2: 1 files, sharded by file" in logs[1]
  train = [r for r in read_metrics(str(tmp_path / "model"))
           if r["split"] == "train"]
  assert [r["step"] for r in train] == [2, 4]
  # Worker 1 read 8 records of its 6-record file: the 4 lost in the first
  # pass, and in the second up to 2 more.
  assert 4 <= sum(r["lost_records"] for r in train) <= 6
  assert sum(r["examples"] + r["lost_records"] for r in train) == 16
  assert f"Damaged training shard {path}" in logs[0]


def test_on_corrupt_shard_fail_stops_every_worker_naming_the_non_chiefs_file(
    tmp_path):
  path = _damaged_data(tmp_path / "data")
  codes = _run_workers(
      tmp_path / "logs",
      [_data_flags(tmp_path, "--on_corrupt_shard=fail")] * WORKERS)
  logs = _logs(tmp_path / "logs")
  assert codes == [1] * WORKERS, logs[0][-3000:] + logs[1][-3000:]
  for log in logs:
    assert f"main.py: error: Damaged training shard {path}" in log
    assert "Lost contact with another worker" not in log


# The second run trains longer: a deliberate change (preflight.check_resume).
ALLOW_LONGER = ["--allow_config_change=train_steps"]


def _synthetic_flags(model_dir, train_steps: int) -> list[str]:
  return [f"--model_dir={model_dir}", "--use_synthetic_data",
          "--num_classes=10", f"--train_steps={train_steps}",
          "--steps_per_loop=5", "--checkpoint_every_steps=5"]


def test_workers_that_restore_different_steps_stop_before_training(
    tmp_path):
  model_dir = tmp_path / "model"
  codes = _run_workers(tmp_path / "first",
                       [_synthetic_flags(model_dir, 10)] * WORKERS)
  assert codes == [0] * WORKERS, _logs(tmp_path / "first")[0][-3000:]
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-10")
  # Worker 1's view of model_dir: the newest checkpoint's data cut short,
  # so it falls back to ckpt-5 (as on damage only it saw).
  stale_dir = tmp_path / "stale_copy"
  shutil.copytree(model_dir, stale_dir)
  data, = stale_dir.glob("ckpt-10.data-*")
  data.write_bytes(data.read_bytes()[:data.stat().st_size // 2])

  codes = _run_workers(tmp_path / "second",
                       [_synthetic_flags(model_dir, 20) + ALLOW_LONGER,
                        _synthetic_flags(stale_dir, 20) + ALLOW_LONGER])
  logs = _logs(tmp_path / "second")
  assert codes == [1] * WORKERS, logs[0][-3000:] + logs[1][-3000:]
  for log in logs:
    assert "main.py: error: worker restores disagree: steps 10 and 5" in log
    assert not re.search(r"step \d+/20", log)  # no host loop ran
  assert "ckpt-10 at step 10 (input at global batch 10)" in logs[0]
  assert "ckpt-5 at step 5 (input at global batch 5)" in logs[1]
  assert "worker 0: step 10, input at global batch 10" in logs[0]
  assert "worker 1: step 5, input at global batch 5" in logs[0]
  assert max(r["step"] for r in read_metrics(str(model_dir))) == 10
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-10")


def test_a_restore_disagreement_names_what_differs_on_each_worker():
  assert tf_files.restore_disagreement({0: (10, 10), 1: (10, 10)}) is None
  steps = tf_files.restore_disagreement({0: (10, 10), 1: (5, 5),
                                              2: (3, 3)})
  assert steps.startswith("worker restores disagree: steps 10, 5 and 3 (")
  inputs = tf_files.restore_disagreement({0: (10, 12), 1: (10, 10)})
  assert inputs.startswith("worker restores disagree: step 10, input at "
                           "global batches 12 and 10 (worker 0: step 10, "
                           "input at global batch 12; worker 1: step 10, "
                           "input at global batch 10).")


PREFLIGHT_THEN_STRATEGY = """
import sys
from resnet_tpu import data_checks
from resnet_tpu import preflight
from resnet_tpu.config import TrainConfig
cfg = TrainConfig.from_flat(data_dir=sys.argv[1], model_dir=sys.argv[2],
                            num_classes=3)
files = data_checks.find_data_files(cfg.input.data_dir)
data_checks.check_data_dir(cfg, files)
preflight.check_model_dir(cfg)
data_checks.check_manifest(cfg, files)
print("training images:", preflight.num_train_images(cfg, files))
import tensorflow as tf
tf.distribute.MultiWorkerMirroredStrategy()
print("strategy started")
"""


def test_preflight_leaves_a_multi_worker_strategy_free_to_start(tmp_path):
  """MultiWorkerMirroredStrategy configures its collectives only before
  TensorFlow's runtime starts: pre-flight must not start it."""
  damaged_shards.write_shards(tmp_path)  # no manifest: records are counted
  damaged_shards.write_shards(tmp_path, "validation", num_files=1)
  port, = _free_loopback_ports(1)
  env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=ROOT,
             TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(
                 {"cluster": {"worker": [f"127.0.0.1:{port}"]},
                  "task": {"type": "worker", "index": 0}}))
  done = subprocess.run(
      [sys.executable, "-c", PREFLIGHT_THEN_STRATEGY, str(tmp_path),
       str(tmp_path / "model")], env=env, cwd=ROOT, capture_output=True,
      text=True, timeout=RUN_BOUND_S, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "training images: 12\nstrategy started" in done.stdout
