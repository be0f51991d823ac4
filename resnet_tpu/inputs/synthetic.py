"""--use_synthetic_data on the JAX engine: one random batch, repeated.

The model with no input cost, as input_pipeline.synthetic_dataset_fn gives
the TensorFlow engine, drawn with numpy instead of tf.random so a JAX run
needs no TensorFlow for it (files.py). Each host (process) draws its own
share of the global batch from a seed of its index; the values differ from
TensorFlow's, the kind does not (uniform pixels in [0, 255), uniform
labels).
"""
from typing import Iterator

import ml_dtypes
import numpy as np


def host_batches(image_size: int, num_classes: int, batch_size: int,
                 dtype: str, host: int = 0
                 ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """(images, labels, faults) without end: host `host`'s `batch_size`
  images of image_size² × 3 in `dtype` (uint8, float32, bfloat16), their
  labels, and no unusable or lost record (host_batches.train_batches' form)."""
  rng = np.random.default_rng([0, host])
  pixels = rng.uniform(0.0, 255.0, [batch_size, image_size, image_size, 3])
  images = pixels.astype(getattr(ml_dtypes, dtype, None) or np.dtype(dtype))
  labels = rng.integers(0, num_classes, [batch_size], dtype=np.int32)
  faults = np.zeros(2)
  while True:
    yield images, labels, faults
