"""The input hand-off of a JAX run: tf.data batches as numpy on the host.

The pipeline is the TensorFlow path's (input_pipeline.py, Ying et al. 2018
§3.2), built for one host feeding the whole global batch, as big_vision and
flax feed JAX on TPU VMs; the trainer puts each batch on the devices, split
over the replicas (jax_step.JaxTrainStep.shard_batch). Training batches
carry their fault counts (record_guards.fault_counts, the same counts the
TensorFlow step sums), so a JAX run names its unusable and lost records as
the TensorFlow one does.
"""
from typing import Iterator

import numpy as np
import tensorflow as tf

from resnet_tpu.inputs import record_guards
from resnet_tpu.inputs.input_pipeline import DatasetFn


def one_host_context() -> tf.distribute.InputContext:
  """One pipeline that yields whole global batches."""
  return tf.distribute.InputContext(num_input_pipelines=1,
                                    input_pipeline_id=0,
                                    num_replicas_in_sync=1)


def train_batches(dataset_fn: DatasetFn, num_sources: int
                  ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """(images, labels, faults) global batches without end; `faults` is
  [unusable, lost, per source...] (num_sources of them)."""
  for images, labels in dataset_fn(one_host_context()):
    unusable, lost, by_source = record_guards.fault_counts(labels,
                                                           num_sources)
    faults = np.concatenate([[unusable.numpy(), lost.numpy()],
                             by_source.numpy()])
    yield images.numpy(), labels.numpy(), faults


def eval_batches(dataset_fn: DatasetFn
                 ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """(images, labels, mask) global batches of one pass over the eval set
  (mask 0 on the padding of the last)."""
  for images, labels, mask in dataset_fn(one_host_context()):
    yield images.numpy(), labels.numpy(), mask.numpy()
