"""Exact resume: preempted after N steps and resumed to 2N, a run ends
bit-identical to an uninterrupted 2N-step run: weights, BN statistics,
optimizer slots, step, input position, learning rate and logged metrics.

The run is the real path of main.py (run.run on ImageNet-format TFRecords
with shuffling, random crops and flips, BN groups over 2 replicas, a
warm-up + cosine LR, momentum, weight decay, label smoothing, and BN
statistics either recomputed before each checkpoint or moving, per replica),
with a tiny network in place of ResNet so that it takes seconds.
"""
import os
import signal

import numpy as np
import pytest
import tensorflow as tf

from conftest import cpu_strategy
from resnet_tpu.train import preemption
from resnet_tpu import run as run_lib
from resnet_tpu.config import TrainConfig
from resnet_tpu.parallel.tensorflow.strategy import Distribution
from resnet_tpu.train.metrics_log import read_metrics
from test_input_pipeline import imagenet_to_gcs_record
from tiny_model import tiny_resnet

CLASSES = 10
TOTAL_STEPS = 6
# After the BN recomputation at step 3, at a step with no scheduled save.
PREEMPT_AT = 5
TIMING_KEYS = ("images_per_sec", "elapsed_s")


def write_random_split(data_dir, split: str, num_records: int,
                       num_files: int, seed: int = 0) -> None:
  """Random 40x40 JPEGs with labels 1..CLASSES (imagenet_to_gcs format)."""
  rng = np.random.default_rng(seed)
  for f in range(num_files):
    name = f"{split}-{f:05d}-of-{num_files:05d}"
    with tf.io.TFRecordWriter(os.path.join(data_dir, name)) as writer:
      for _ in range(f, num_records, num_files):
        image = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
        writer.write(imagenet_to_gcs_record(
            int(rng.integers(1, CLASSES + 1)),
            tf.io.encode_jpeg(image).numpy()))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("data")
  write_random_split(path, "train", 64, 4)
  write_random_split(path, "validation", 16, 1, seed=1)
  return str(path)


def _run(cfg, **kwargs):
  """run.run on 2 CPU replicas."""
  return run_lib.run(cfg, model_fn=tiny_resnet,
                     distribution=Distribution(cpu_strategy(2)), **kwargs)


def _config(model_dir, data_dir, bn_stats: str) -> TrainConfig:
  return TrainConfig.from_flat(
      model_dir=str(model_dir), data_dir=data_dir, strategy="cpu",
      num_cpu_replicas=2, num_classes=CLASSES,
      # Moving statistics over groups of 1: the replicas' copies differ.
      bn_group_size=2 if bn_stats == "recompute" else 1,
      image_size=32, global_batch_size=8, eval_batch_size=8,
      train_steps=TOTAL_STEPS, num_train_images=64, steps_per_loop=2,
      checkpoint_every_steps=3, bn_stats=bn_stats, bn_recompute_batches=1,
      base_learning_rate=0.8, lr_schedule="cosine", warmup_epochs=0.5,
      weight_decay=1e-3, label_smoothing=0.1, seed=3,
      deterministic_input=True, shuffle_buffer_size=32, label_offset=1)


def _sigterm_after_step(step: int):
  """A loop callback that delivers a real SIGTERM to this process once
  `step` is logged."""

  def signal_at(record: dict) -> None:
    if record["step"] == step:
      os.kill(os.getpid(), signal.SIGTERM)

  return signal_at


def _checkpoint_values(model_dir) -> dict:
  """Every training-state tensor of the latest checkpoint (not save_counter,
  which counts saves: the preempted run saved once more)."""
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if not name.startswith(("_CHECKPOINTABLE_OBJECT_GRAPH",
                                  "save_counter"))}


def _without_timing(records: list[dict]) -> list[dict]:
  return [{k: v for k, v in r.items() if k not in TIMING_KEYS}
          for r in records]


@pytest.mark.parametrize("bn_stats", ["recompute", "moving_average"])
def test_preempted_and_resumed_run_equals_uninterrupted_run(
    tmp_path, data_dir, bn_stats):
  """With moving statistics, each replica updates its own and every host
  loop ends with their mean: the preempted run saves between two host
  loops, where the uninterrupted one holds the same mean on every replica,
  so the final evaluation and checkpoint agree too."""
  whole = tmp_path / "uninterrupted"
  _run(_config(whole, data_dir, bn_stats))

  split = tmp_path / "preempted"
  with pytest.raises(preemption.Preempted, match=f"step {PREEMPT_AT}/"):
    _run(_config(split, data_dir, bn_stats),
         loop_callback=_sigterm_after_step(PREEMPT_AT))
  assert tf.train.latest_checkpoint(split).endswith(f"ckpt-{PREEMPT_AT}")
  _run(_config(split, data_dir, bn_stats))

  expected, got = _checkpoint_values(whole), _checkpoint_values(split)
  assert sorted(got) == sorted(expected)
  assert any("input_batches" in name for name in got)
  assert any(name.startswith("optimizer/_variables/")  # momentum slots
             for name in got)
  for name, value in expected.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)
  assert _without_timing(read_metrics(split)) == _without_timing(
      read_metrics(whole))
  steps = [(r["step"], r["split"]) for r in read_metrics(split)]
  assert steps == [(2, "train"), (3, "train"), (5, "train"), (6, "train"),
                   (6, "eval")]
