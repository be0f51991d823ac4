"""Guards of the input pipeline against bad records (README "Reliability").

ImageNet-scale data has a few broken files: truncated downloads, PNGs or text
saved as .JPEG, bit rot. One of them must not crash a pod-scale run hours in,
nor may it vanish silently. Each training record therefore passes through:

1. `looks_like_jpeg`: a cheap byte test (JPEG start-of-image marker at the
   start, end-of-image marker near the end) decides whether to decode at all;
   a record that fails it becomes a zero image labelled UNDECODABLE_LABEL.
   It stays in its batch, so batches keep their records and a resumed run
   still reads exactly the batches an uninterrupted one would. The trainer
   gives such examples weight 0 and counts them (metrics.jsonl
   `undecodable_images`, a warning in the log).
2. `Dataset.ignore_errors(log_warning=True)` after batching: a record that
   passes the byte test and still fails to parse or decode drops its batch
   with a logged warning (rare; later batches of that pipeline shift by one).
   Guarding whole batches keeps the map fused with the batch, as §3.2 wants.
3. `checked_label`: a label outside [0, num_classes) after subtracting
   label_offset stops training with an error naming both flags, instead of
   training silently on an all-zero one-hot target.

The guards take (images, labels, decodable) batches or single examples.

`is_progressive_jpeg` is not a guard: progressive JPEGs train correctly, but
the fused decode-and-crop (§3.2) saves nothing on them; the data builder and
the pre-flight check (preflight.py) use it to say so.
"""
from typing import Callable

import tensorflow as tf

# The label of an example whose image could not be decoded (weight 0).
UNDECODABLE_LABEL = -1
_START_OF_IMAGE = b"\xff\xd8\xff"
# Bytes at the end searched for the end-of-image marker FFD9; some encoders
# append a short trailer after it.
EOI_SEARCH_BYTES = 1024
# Start-of-frame markers (ITU-T T.81 Table B.1): all SOFn, and the
# progressive ones (SOF2, SOF6, SOF10, SOF14).
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_PROGRESSIVE_SOF_MARKERS = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
_START_OF_SCAN = 0xDA


def looks_like_jpeg(image_bytes: tf.Tensor) -> tf.Tensor:
  """Whether `image_bytes` (scalar string) starts and ends like a JPEG.

  Catches empty strings, other formats and truncated files. Entropy-coded
  JPEG data never holds FFD9 (0xFF is byte-stuffed), so a truncated file has
  no end marker near its end.
  """
  length = tf.strings.length(image_bytes)
  tail = tf.io.decode_raw(
      tf.strings.substr(image_bytes, tf.maximum(length - EOI_SEARCH_BYTES, 0),
                        EOI_SEARCH_BYTES), tf.uint8)
  has_end = tf.reduce_any((tail[:-1] == 0xFF) & (tail[1:] == 0xD9))
  return (tf.strings.substr(image_bytes, 0, 3) == _START_OF_IMAGE) & has_end


def is_progressive_jpeg(data: bytes) -> bool:
  """Whether JPEG `data` has a progressive frame header (SOF2/6/10/14).

  Walks the marker segments from the start of the image to the first SOFn;
  False for data that is not a JPEG or has no frame header before a scan.
  """
  if not data.startswith(_START_OF_IMAGE):
    return False
  i = 2
  while i + 4 <= len(data) and data[i] == 0xFF:
    marker = data[i + 1]
    if marker == 0xFF:  # fill byte before a marker
      i += 1
      continue
    if marker in _SOF_MARKERS:
      return marker in _PROGRESSIVE_SOF_MARKERS
    if marker == _START_OF_SCAN:
      return False
    i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
  return False


def checked_label(label: tf.Tensor, num_classes: int,
                  label_offset: int) -> tf.Tensor:
  """`label` (after the offset), asserted to lie in [0, num_classes)."""
  in_range = tf.reduce_all((label >= 0) & (label < num_classes))
  check = tf.debugging.Assert(in_range, [
      f"A training or eval label is outside [0, --num_classes={num_classes}) "
      f"after subtracting --label_offset={label_offset}; labels:", label])
  with tf.control_dependencies([check]):
    return tf.identity(label)


def guard_train(dataset: tf.data.Dataset, num_classes: int,
                label_offset: int) -> tf.data.Dataset:
  """(image, label, decodable) -> (image, label or UNDECODABLE_LABEL).

  Drops elements (examples or batches) whose parse or decode raised, with a
  logged warning, and, when num_classes > 0, checks every label.
  """
  def mark(image, label, decodable):
    if num_classes:
      label = checked_label(label, num_classes, label_offset)
    return image, tf.where(decodable, label, UNDECODABLE_LABEL)

  return _guard(dataset, mark)


def guard_eval(dataset: tf.data.Dataset, num_classes: int,
               label_offset: int) -> tf.data.Dataset:
  """(image, label, decodable) -> (image, label, mask): like guard_train,
  an undecodable image gets mask 0 (not evaluated)."""
  def mark(image, label, decodable):
    if num_classes:
      label = checked_label(label, num_classes, label_offset)
    return image, label, tf.cast(decodable, tf.float32)

  return _guard(dataset, mark)


def _guard(dataset: tf.data.Dataset, mark: Callable) -> tf.data.Dataset:
  # Explicitly ordered: tf.data would otherwise parallelise this map under
  # the pipeline's deterministic=False and let elements cross epochs.
  return dataset.ignore_errors(log_warning=True).map(
      mark, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
