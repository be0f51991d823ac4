"""Across 2 loopback workers, the run's own evaluation, its export and
tools.evaluate agree: every worker evaluates with the moving statistics the
checkpoint and the export hold.

Each worker reads its own training file (per-host sharding); the two files
differ in brightness, so each worker's BN layers see other statistics. The
workers update their moving statistics on their own and every host loop
ends with their mean over all replicas (moving_statistics.py), so both
evaluate their halves of the validation set with the chief's saved values.
Before, each worker kept its own between restores, and the logged top-1
was not the exported model's.
"""
import json
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

from resnet_tpu.train.metrics_log import read_metrics
from test_input_pipeline import imagenet_to_gcs_record
from test_multi_worker_failure import _kill_all
from test_multi_worker_failure import start_workers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = 4
VALIDATION_IMAGES = 48
DEADLINE_S = 300


def _write(path, images: np.ndarray, labels: np.ndarray) -> None:
  with tf.io.TFRecordWriter(str(path)) as writer:
    for image, label in zip(images, labels):
      writer.write(imagenet_to_gcs_record(
          int(label) + 1, tf.io.encode_jpeg(image).numpy()))


def _data(data_dir) -> None:
  """Two training files, a dark and a bright one; one validation file of
  both. The label is the brightest channel, so a network can learn it."""
  rng = np.random.default_rng(0)

  def images(n, low, high):
    x = rng.integers(low, high, (n, 40, 40, 3), dtype=np.uint8)
    labels = rng.integers(0, CLASSES, n)
    for k, label in enumerate(labels):
      if label < 3:
        x[k, :, :, label] = np.minimum(x[k, :, :, label].astype(int) + 60,
                                       255)
    return x, labels

  _write(data_dir / "train-00000-of-00002", *images(32, 0, 100))
  _write(data_dir / "train-00001-of-00002", *images(32, 120, 200))
  dark, bright = images(VALIDATION_IMAGES // 2, 0, 100), images(
      VALIDATION_IMAGES // 2, 120, 200)
  _write(data_dir / "validation-00000-of-00001",
         np.concatenate([dark[0], bright[0]]),
         np.concatenate([dark[1], bright[1]]))


def test_two_workers_evaluation_equals_their_export_under_tools_evaluate(
    tmp_path):
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  _data(data_dir)
  model_dir, export_dir = tmp_path / "model", tmp_path / "export"
  flags = [f"--model_dir={model_dir}",
           f"--data_dir={data_dir}", f"--export_dir={export_dir}",
           "--strategy=multi_worker", "--resnet_depth=18",
           f"--num_classes={CLASSES}", "--image_size=32", "--label_offset=1",
           "--global_batch_size=8", "--eval_batch_size=8",
           "--train_steps=8", "--steps_per_loop=4", "--num_train_images=64",
           "--bn_group_size=1", "--lr_schedule=constant",
           "--warmup_epochs=0", "--base_learning_rate=0.8",
           "--collective_timeout_s=120"]
  processes = start_workers(tmp_path / "logs", [flags] * 2,
                            script=os.path.join(ROOT, "main.py"))
  try:
    codes = [p.wait(timeout=DEADLINE_S) for p in processes]
  finally:
    _kill_all(processes)
  log = (tmp_path / "logs" / "worker_0.log").read_text()
  assert codes == [0, 0], log[-3000:]
  in_training = [r for r in read_metrics(str(model_dir))
                 if r["split"] == "eval"][-1]
  assert in_training["step"] == 8
  assert in_training["examples"] == VALIDATION_IMAGES
  done = subprocess.run(
      [sys.executable, "-m", "tools.evaluate", f"--saved_model={export_dir}",
       f"--data_dir={data_dir}", "--batch_size=8"],
      cwd=ROOT, text=True, capture_output=True, timeout=180)
  assert done.returncode == 0, done.stderr[-3000:]
  exported = json.loads(done.stdout.strip().splitlines()[-1])
  assert exported == {"top1": in_training["top1"],
                      "top5": in_training["top5"],
                      "examples": VALIDATION_IMAGES}
