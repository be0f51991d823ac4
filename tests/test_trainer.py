"""The custom loop: gradients summed once, resume, accumulation, metrics."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import cpu_strategy
from resnet_tpu.engines.tensorflow import engine as engine_lib
from resnet_tpu.config import TrainConfig
from resnet_tpu.model.distributed_batch_norm import DistributedBatchNormalization
from resnet_tpu.train.metrics_log import REQUIRED_KEYS
from tiny_model import tiny_resnet

IMAGE = 32
CLASSES = 10


def _config(tmp_path, **overrides) -> TrainConfig:
  return TrainConfig.tiny(str(tmp_path), **{
      "use_synthetic_data": True, "num_classes": CLASSES,
      "image_size": IMAGE, "global_batch_size": 16, "eval_batch_size": 16,
      "train_steps": 1, "steps_per_loop": 1, "num_train_images": 10_000,
      "base_learning_rate": 0.5, "label_smoothing": 0.1,
      "weight_decay": 1e-3, **overrides})


def _trainer(cfg, strategy,
             model_fn=tiny_resnet) -> engine_lib.TensorFlowEngine:
  return engine_lib.TensorFlowEngine(cfg, strategy, model_fn=model_fn)


def _examples(n, seed=0):
  rng = np.random.RandomState(seed)
  images = rng.uniform(0, 255, (n, IMAGE, IMAGE, 3)).astype(np.float32)
  labels = rng.randint(0, CLASSES, n).astype(np.int32)
  return images, labels


def _train_fn(images, labels, global_batch):
  """Replica i of step s gets rows [s*B + i*b, s*B + (i+1)*b)."""
  def dataset_fn(ctx):
    batch = ctx.get_per_replica_batch_size(global_batch)
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(
        batch, drop_remainder=True).repeat()
  return dataset_fn


def _weights(trainer):
  return [v.numpy() for v in trainer.model.variables]


def _copy_weights(src, dst):
  for s, d in zip(src.model.variables, dst.model.variables):
    d.assign(s.numpy())


def _run_steps(trainer, dataset_fn, steps, loop=None):
  iterator = iter(trainer.strategy.distribute_datasets_from_function(
      dataset_fn))
  loop = loop or trainer.loops.train
  return loop(iterator, tf.constant(steps))


def test_one_step_on_8_replicas_equals_one_device_with_global_batch(tmp_path):
  images, labels = _examples(16)
  one = _trainer(_config(tmp_path / "a", bn_group_size=1),
                            cpu_strategy(1))
  eight = _trainer(_config(tmp_path / "b", bn_group_size=8),
                              cpu_strategy(8))
  _copy_weights(one, eight)
  before = _weights(one)
  _run_steps(one, _train_fn(images, labels, 16), 1)
  _run_steps(eight, _train_fn(images, labels, 16), 1)
  changed = 0
  for b, w1, w8 in zip(before, _weights(one), _weights(eight)):
    np.testing.assert_allclose(w8, w1, rtol=2e-4, atol=2e-5)
    changed += not np.allclose(b, w1)
  assert changed >= 4  # the step really moved conv, BN and dense weights


def _learnable_examples(n, seed=0):
  """Each class a colour of its own under pixel noise: a task the tiny net
  learns in a few dozen steps, where an untrained net is at chance."""
  rng = np.random.RandomState(seed)
  labels = np.arange(n) % CLASSES
  colours = rng.uniform(0, 255, (CLASSES, 3))
  noise = rng.normal(0, 10, (n, IMAGE, IMAGE, 3))
  images = np.clip(colours[labels][:, None, None, :] + noise, 0, 255)
  return images.astype(np.float32), labels.astype(np.int32)


def test_loop_sums_all_replicas_and_the_trained_net_beats_the_untrained_one(
    tmp_path):
  images, labels = _learnable_examples(16)
  trainer = _trainer(_config(tmp_path, bn_group_size=2,
                             base_learning_rate=2.0), cpu_strategy(4))
  dataset_fn = _train_fn(images, labels, 16)
  untrained = _run_steps(trainer, dataset_fn, 2).steps
  _run_steps(trainer, dataset_fn, 40)
  trained = _run_steps(trainer, dataset_fn, 2).steps
  assert untrained.examples == trained.examples == 32  # 2 steps x 16
  assert np.log(CLASSES) * 0.5 < untrained.loss / 32 < np.log(CLASSES) * 2
  assert trained.loss < 0.5 * untrained.loss
  # Chance is 3 of 32 hits; one replica sees only 8 of the 32 examples.
  assert trained.top1 >= 24
  assert trained.top1 <= trained.top5 <= 32


def _frozen_bn_tiny_resnet(cfg):
    model = tiny_resnet(cfg)
    for layer in model.layers:
      if isinstance(layer, DistributedBatchNormalization):
        layer.trainable = False
    return model


def test_accumulating_k_micro_batches_equals_one_k_times_larger_step(
    tmp_path):
  images, labels = _examples(32)
  big = _trainer(_config(tmp_path / "a", global_batch_size=32),
                 cpu_strategy(2), _frozen_bn_tiny_resnet)
  micro = _trainer(
      _config(tmp_path / "b", global_batch_size=16,
              batch_size_schedule="0:32"), cpu_strategy(2),
      _frozen_bn_tiny_resnet)
  _copy_weights(big, micro)
  before = _weights(big)
  assert micro.cfg.run.clock.global_batch_at_step(0) == 32  # 2 x 16
  _run_steps(big, _train_fn(images, labels, 32), 1)
  iterator = iter(micro.strategy.distribute_datasets_from_function(
      _train_fn(images, labels, 16)))
  micro.loops.accumulating_train(iterator, tf.constant(1), tf.constant(2))
  assert micro.step == 1
  for b, wb, wm in zip(before, _weights(big), _weights(micro)):
    np.testing.assert_allclose(wm, wb, rtol=2e-4, atol=2e-5)
  assert any(not np.allclose(b, w) for b, w in zip(before, _weights(big)))


def test_resume_continues_from_saved_step_with_identical_weights(tmp_path):
  images, labels = _examples(32)
  cfg = _config(tmp_path, train_steps=2, steps_per_loop=1)
  first = _trainer(cfg, cpu_strategy(2))
  first.fit(_train_fn(images, labels, 16))
  saved = _weights(first)
  resumed = _trainer(cfg, cpu_strategy(2))
  resumed.restore()
  assert resumed.step == 2
  for a, b in zip(saved, _weights(resumed)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(first.optimizer.variables, resumed.optimizer.variables):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  longer = _trainer(_config(tmp_path, train_steps=3),
                               cpu_strategy(2))
  longer.fit(_train_fn(images, labels, 16))
  assert longer.step == 3
  assert sorted(os.listdir(tmp_path)).count("checkpoint") == 1


def _eval_fn(images, labels, global_batch):
  def dataset_fn(ctx):
    batch = ctx.get_per_replica_batch_size(global_batch)
    mask = np.ones(len(images), np.float32)
    return tf.data.Dataset.from_tensor_slices(
        (images, labels, mask)).batch(batch)
  return dataset_fn


def test_a_finished_run_run_again_evaluates_its_final_weights_only(
    tmp_path):
  images, labels = _examples(32)
  train_fn, eval_fn = (_train_fn(images, labels, 16),
                       _eval_fn(images, labels, 16))
  cfg = _config(tmp_path, train_steps=2, steps_per_loop=1,
                bn_recompute_batches=2)
  first = _trainer(cfg, cpu_strategy(2))
  moving = first.fit(train_fn, eval_fn, eval_steps=2)
  again = _trainer(cfg, cpu_strategy(2))
  measured = ("step", "split", "loss", "top1", "top5", "examples")
  repeated = again.fit(train_fn, eval_fn, eval_steps=2)
  assert [repeated[k] for k in measured] == [moving[k] for k in measured]
  recomputed = _trainer(cfg.replace(bn_stats="recompute"), cpu_strategy(2))
  result = recomputed.fit(train_fn, eval_fn, eval_steps=2)
  assert recomputed.step == again.step == 2  # nothing trained
  for a, b in zip(first.model.trainable_variables,
                  recomputed.model.trainable_variables):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  # Its statistics are the final weights' over the next 2 training batches
  # (the input is at batch 2 of a 2-batch repeat: batches 0 and 1).
  from resnet_tpu.engines.tensorflow.bn_recompute import BNStatisticsRecomputer
  BNStatisticsRecomputer(first.model, first.strategy).recompute(
      iter(first.strategy.distribute_datasets_from_function(train_fn)), 2)
  bn = [v for v in first.model.non_trainable_variables
        if "moving" in v.name]
  assert bn
  for a, b in zip(bn, [v for v in recomputed.model.non_trainable_variables
                       if "moving" in v.name]):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
  assert result["loss"] != moving["loss"]
  with open(tmp_path / "metrics.jsonl") as f:
    evals = [json.loads(line) for line in f if '"eval"' in line]
  assert [(r["step"], r["loss"]) for r in evals] == [
      (2, moving["loss"]), (2, moving["loss"]), (2, result["loss"])]


def test_metrics_log_has_train_and_eval_lines_counting_every_example(
    tmp_path):
  images, labels = _examples(32)
  num_eval = 21  # not a multiple of the eval batch

  def eval_fn(ctx):
    batch = ctx.get_per_replica_batch_size(16)
    mask = np.zeros(32, np.float32)
    mask[:num_eval] = 1
    return tf.data.Dataset.from_tensor_slices(
        (images, labels, mask)).batch(batch)

  cfg = _config(tmp_path, train_steps=2, steps_per_loop=1, eval_every_steps=1)
  trainer = _trainer(cfg, cpu_strategy(2))
  last = trainer.fit(_train_fn(images, labels, 16), eval_fn, eval_steps=2)
  with open(tmp_path / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  assert [r["split"] for r in records] == ["train", "eval"] * 2
  for record in records:
    assert set(REQUIRED_KEYS) <= set(record)
  assert all(r["examples"] == num_eval for r in records
             if r["split"] == "eval")
  assert last == records[-1]
  assert os.listdir(tmp_path / "train") and os.listdir(tmp_path / "eval")


def test_evaluate_without_fit_scores_the_restored_checkpoint_as_fit_did(
    tmp_path):
  images, labels = _examples(32)

  def eval_fn(ctx):
    batch = ctx.get_per_replica_batch_size(16)
    return tf.data.Dataset.from_tensor_slices(
        (images, labels, np.ones(32, np.float32))).batch(batch)

  cfg = _config(tmp_path, train_steps=2)
  last = _trainer(cfg, cpu_strategy(2)).fit(_train_fn(images, labels, 16),
                                            eval_fn, eval_steps=2)
  fresh = _trainer(cfg, cpu_strategy(2))
  fresh.restore()
  assert fresh.step == 2
  again = fresh.evaluate(engine_lib.EvalInput(eval_fn, 2))
  assert fresh.step == last["step"] == 2
  for key in ("loss", "top1", "top5", "examples"):
    assert getattr(again, key) == pytest.approx(last[key], rel=1e-6), key
