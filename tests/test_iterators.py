"""Input iterators never stall a run when they go away (issue 38):
evaluations share one iterator, and finished iterators are dropped on a
thread of their own (resnet_tpu/engines/tensorflow/iterators.py, with
inputs/iterator_release.py's release, which JAX's host pipelines use too:
tests_jax/test_host_batches.py). The stall itself is measured, old path
against new, by lab/bench_eval.py."""
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import cpu_strategy
from resnet_tpu.config import TrainConfig
from resnet_tpu.engines.tensorflow import iterators
from resnet_tpu.engines.tensorflow.engine import EvalInput
from resnet_tpu.engines.tensorflow.engine import TensorFlowEngine
from tiny_model import tiny_resnet

IMAGE, CLASSES = 32, 10


class _Tracked:
  deleted_on: list[str] = []

  def __del__(self):
    time.sleep(0.2)  # as a tf.data iterator's deletion waits
    _Tracked.deleted_on.append(threading.current_thread().name)


def _join_release_threads():
  for thread in threading.enumerate():
    if thread.name == "release_input_iterators":
      # Not a daemon: a daemon inside TensorFlow's C++ at interpreter
      # shutdown aborts the process.
      assert not thread.daemon
      thread.join(timeout=60)


def test_release_deletes_its_items_on_a_thread_of_its_own():
  _Tracked.deleted_on = []
  owned = [_Tracked(), None, _Tracked()]
  iterators.release(owned)
  assert owned == []
  assert any(t.name == "release_input_iterators"
             for t in threading.enumerate())
  _join_release_threads()
  assert _Tracked.deleted_on == ["release_input_iterators"] * 2


def _data(n=32):
  rng = np.random.RandomState(0)
  return (rng.uniform(0, 255, (n, IMAGE, IMAGE, 3)).astype(np.float32),
          rng.randint(0, CLASSES, n).astype(np.int32))


def _eval_fn(num_real, batches=None):
  """32 examples in global batches of 16, of which `num_real` count."""
  images, labels = _data()
  mask = (np.arange(32) < num_real).astype(np.float32)

  def dataset_fn(ctx):
    data = tf.data.Dataset.from_tensor_slices((images, labels, mask)).batch(
        ctx.get_per_replica_batch_size(16))
    return data.take(batches) if batches else data
  return dataset_fn


def _train_fn(ctx):
  images, labels = _data()
  return tf.data.Dataset.from_tensor_slices((images, labels)).batch(
      ctx.get_per_replica_batch_size(16), drop_remainder=True).repeat()


def _trainer(tmp_path, **overrides) -> TensorFlowEngine:
  cfg = TrainConfig.tiny(str(tmp_path), **{
      "use_synthetic_data": True, "num_classes": CLASSES,
      "image_size": IMAGE, "global_batch_size": 16, "eval_batch_size": 16,
      "train_steps": 2, "steps_per_loop": 1, "num_train_images": 10_000,
      **overrides})
  return TensorFlowEngine(cfg, cpu_strategy(2), model_fn=tiny_resnet)


def test_evaluations_share_one_iterator_and_each_reads_the_whole_set_once(
    tmp_path):
  trainer = _trainer(tmp_path)
  eval_fn = _eval_fn(num_real=21)  # the last batch partly padding
  first = trainer.evaluate(EvalInput(eval_fn, 2))
  iterator = trainer._eval_input.iterator
  again = [trainer.evaluate(EvalInput(eval_fn, 2)) for _ in range(3)]
  assert trainer._eval_input.iterator is iterator
  for record in again:
    assert record.examples == first.examples == 21
    for key in ("loss", "top1", "top5"):
      assert getattr(record, key) == pytest.approx(getattr(first, key),
                                            rel=1e-6), key
  # Another eval set (or length) gets an iterator of its own.
  half = trainer.evaluate(EvalInput(eval_fn, 1))
  assert trainer._eval_input.iterator is not iterator
  assert half.examples == 16
  trainer.close_inputs()
  assert trainer._eval_input is None


def test_an_eval_set_shorter_than_eval_steps_is_refused(tmp_path):
  trainer = _trainer(tmp_path)
  with pytest.raises(ValueError, match="eval_steps=2 reads 4"):
    trainer.evaluate(EvalInput(_eval_fn(num_real=32, batches=1), 2))


def test_fit_hands_release_the_last_reference_to_each_iterator(
    tmp_path, monkeypatch):
  """Whatever else holds an iterator when release gets it would delete it
  on the training thread instead (the stall of issue 38)."""
  released, extra = [], []
  real_release = iterators.release

  def checking_release(owned: list) -> None:
    for item in owned:
      # Three references: `owned`, `item` and getrefcount's argument.
      extra.append(sys.getrefcount(item) - 3)
      released.append(type(item).__name__)
    del item
    real_release(owned)

  monkeypatch.setattr(iterators, "release", checking_release)
  trainer = _trainer(tmp_path, eval_every_steps=1)
  trainer.fit(_train_fn, _eval_fn(num_real=32), eval_steps=2)
  assert released.count("DistributedIterator") == 2  # training, eval
  assert extra == [0, 0]  # nothing else holds them
  assert trainer._eval_input is None
  _join_release_threads()
