"""The input hand-off of a JAX run: tf.data batches as numpy on the host.

The pipeline is the TensorFlow path's (input_pipeline.py, Ying et al. 2018
§3.2), one per host (process), each feeding its share of every global batch
from its own shard of the files, as big_vision and flax feed JAX on TPU VMs;
the trainer puts each share on the host's devices, split over its replicas
(step.JaxTrainStep.shard_batch, two batches ahead: prefetch.py). Training
batches carry their fault counts (record_guards.fault_counts, the same
counts the TensorFlow step sums), computed in the tf.data pipeline, so a
JAX run names its unusable and lost records as the TensorFlow one does.
Every array is handed over without a copy (compat.tensor_buffer), as
flax's imagenet input does (issue 60). A pipeline's tf.data iterator, when
its pass ends or its reader closes it, is dropped beside the run
(inputs/iterator_release.py), as TensorFlow's engine drops its own:
deleting it where it ended made a JAX run's end wait up to 10 s for the
autotune thread's wake-up (where prefetch.py's close gave up and warned).
"""
from typing import Iterator

import numpy as np
import tensorflow as tf

from resnet_tpu.inputs import record_guards
from resnet_tpu.inputs.input_pipeline import DatasetFn
from resnet_tpu.inputs.iterator_release import release
from resnet_tpu.runtime import compat


def host_context(num_hosts: int = 1, host: int = 0
                 ) -> tf.distribute.InputContext:
  """Host `host`'s pipeline of `num_hosts`: 1/num_hosts of every global
  batch."""
  return tf.distribute.InputContext(num_input_pipelines=num_hosts,
                                    input_pipeline_id=host,
                                    num_replicas_in_sync=num_hosts)


def train_batches(dataset_fn: DatasetFn, num_sources: int,
                  context: tf.distribute.InputContext = host_context()
                  ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """(images, labels, faults): this host's share of each global batch,
  without end; `faults` is [unusable, lost, per source...] (num_sources of
  them), this host's counts."""
  def with_faults(images, labels):
    unusable, lost, by_source = record_guards.fault_counts(labels,
                                                           num_sources)
    return images, labels, tf.concat([[unusable, lost], by_source], 0)

  yield from _numpy_batches(dataset_fn(context).map(with_faults))


def eval_batches(dataset_fn: DatasetFn,
                 context: tf.distribute.InputContext = host_context()
                 ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """(images, labels, mask): this host's share of each global batch of one
  pass over the eval set (mask 0 on the padding); every host yields the
  same number of batches (input_pipeline.eval_dataset_fn)."""
  yield from _numpy_batches(dataset_fn(context))


def _numpy_batches(dataset: tf.data.Dataset) -> Iterator[tuple]:
  """Each element of `dataset` as numpy arrays; its iterator, at the end
  of the pass or when the caller closes this generator, released on a
  thread of its own."""
  owned = [iter(dataset)]
  try:
    for batch in owned[0]:
      yield tuple(compat.tensor_buffer(t) for t in batch)
  finally:
    release(owned)
