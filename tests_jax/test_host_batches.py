"""The JAX engine's input hand-off (issue 60): tf.data's batches as numpy
without a copy, their fault counts computed in the pipeline, and a thread
that keeps two batches on the devices ahead of the step."""
import os
import sys
import threading
import time
import weakref

import jax
import numpy as np
import pytest
import tensorflow as tf

from resnet_tpu.config import InputConfig
from resnet_tpu.engines.jax import host_batches
from resnet_tpu.engines.jax.prefetch import AHEAD
from resnet_tpu.engines.jax.prefetch import DevicePrefetch
from resnet_tpu.inputs import input_pipeline
from resnet_tpu.inputs import record_guards

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "tests"))
import damaged_shards  # noqa: E402  pylint: disable=wrong-import-position

SETTLE_S = 0.3


class Counted:
  """Batches 0, 1, ... (one array each), counting those read; raises
  `error` after `fail_after` of them, ends after `end_after`."""

  def __init__(self, end_after=None, fail_after=None, error=None):
    self.read, self.end_after = 0, end_after
    self.fail_after, self.error = fail_after, error

  def __iter__(self):
    return self

  def __next__(self):
    if self.read == self.fail_after:
      raise self.error
    if self.read == self.end_after:
      raise StopIteration
    self.read += 1
    return np.full([8, 2], self.read - 1, np.float32)


def _settled(source: Counted, expected: int) -> int:
  """source.read once it reaches `expected`, and a while after."""
  deadline = time.time() + 10
  while source.read < expected and time.time() < deadline:
    time.sleep(0.01)
  time.sleep(SETTLE_S)
  return source.read


def test_the_prefetch_thread_reads_at_most_two_batches_ahead():
  source = Counted()
  with DevicePrefetch(source, lambda batch: batch) as batches:
    assert _settled(source, AHEAD) == AHEAD == 2
    next(batches)
    assert _settled(source, AHEAD + 1) == AHEAD + 1
    next(batches)
    next(batches)
    assert _settled(source, AHEAD + 3) == AHEAD + 3


def test_prefetched_batches_arrive_on_the_devices_in_order_unchanged():
  sharding = jax.sharding.NamedSharding(
      jax.sharding.Mesh(np.array(jax.devices()), ("batch",)),
      jax.sharding.PartitionSpec("batch"))
  got = list(DevicePrefetch(Counted(end_after=5),
                            lambda batch: jax.device_put(batch, sharding)))
  assert all(isinstance(g, jax.Array) and g.sharding == sharding
             for g in got)
  np.testing.assert_array_equal(
      np.stack([np.asarray(g) for g in got]),
      np.stack(list(Counted(end_after=5))))


def test_an_input_error_is_raised_in_the_caller_after_the_batches_before_it():
  error = ValueError("a bad shard")
  batches = DevicePrefetch(Counted(fail_after=3, error=error),
                           lambda batch: batch)
  assert [int(next(batches)[0, 0]) for _ in range(3)] == [0, 1, 2]
  with pytest.raises(ValueError) as raised:
    next(batches)
  assert raised.value is error
  batches._thread.join(10)  # pylint: disable=protected-access
  assert not batches.running
  with pytest.raises(ValueError):  # and again: nothing swallows it
    next(batches)


def test_an_error_of_the_transfer_is_raised_in_the_caller():
  def put(batch):
    raise RuntimeError("device lost")
  with DevicePrefetch(Counted(), put) as batches:
    with pytest.raises(RuntimeError, match="device lost"):
      next(batches)


def test_close_stops_the_thread_and_ends_the_batches():
  batches = DevicePrefetch(Counted(), lambda batch: batch)
  next(batches)
  batches.close()
  assert not batches.running
  assert "device-prefetch" not in [t.name for t in threading.enumerate()]
  with pytest.raises(StopIteration):
    next(batches)


def test_the_end_of_the_input_ends_the_thread():
  batches = DevicePrefetch(Counted(end_after=3), lambda batch: batch)
  assert len(list(batches)) == 3
  assert not batches.running


def test_fault_counts_from_tf_data_equal_the_eager_ones_on_a_damaged_file(
    tmp_path):
  damaged_shards.corrupt_second_file(tmp_path)
  files = input_pipeline.split_files(str(tmp_path), "train")
  dataset_fn = input_pipeline.train_dataset_fn(
      InputConfig(data_dir=str(tmp_path), shuffle_buffer_size=64), files,
      global_batch_size=4, image_size=8)
  lost = 0
  num_sources = 2 * len(files)  # shard_audit.DataFaults.num_sources
  batches = host_batches.train_batches(dataset_fn, num_sources)
  for images, labels, faults in (next(batches) for _ in range(6)):
    unusable, lost_here, by_source = record_guards.fault_counts(
        tf.constant(labels), num_sources)
    np.testing.assert_array_equal(faults, np.concatenate(
        [[unusable.numpy(), lost_here.numpy()], by_source.numpy()]))
    assert images.shape == (4, 8, 8, 3)
    lost += lost_here.numpy()
  assert lost >= 4  # a pass's 4 lost records among 24 read


def _released_iterators(monkeypatch) -> list:
  """(type name, dropped) of each item host_batches hands to release:
  dropped when release's list held its last reference, so that the real
  release's thread is the one that deletes it."""
  released = []

  def release(owned):
    names = [type(item).__name__ for item in owned]
    refs = [weakref.ref(item) for item in owned]
    owned.clear()
    released.extend((name, ref() is None) for name, ref in zip(names, refs))
  monkeypatch.setattr(host_batches, "release", release)
  return released


def test_a_closed_or_finished_pipeline_leaves_its_iterator_to_release(
    monkeypatch):
  # Deleting a tf.data iterator waits for its autotune thread's wake-up
  # (inputs/iterator_release.py), so the reader's thread must not delete
  # it: release's list holds the last reference.
  released = _released_iterators(monkeypatch)
  batched = lambda _: tf.data.Dataset.range(8).batch(2).map(
      lambda i: (tf.cast(i, tf.float32), tf.cast(i, tf.int32)))
  train = host_batches.train_batches(batched, num_sources=1)
  next(train)
  train.close()
  evaluation = host_batches.eval_batches(batched)
  assert [batch[1].tolist() for batch in evaluation] == [
      [0, 1], [2, 3], [4, 5], [6, 7]]
  assert released == [("OwnedIterator", True)] * 2
