"""Guards of the input pipeline against bad records (docs/reliability.md).

ImageNet-scale data has a few broken records: truncated downloads, PNGs or
text saved as .JPEG, bit rot, a record without its label. One of them must
not crash a pod-scale run hours in, nor may it vanish silently, nor take good
records down with it. Every training record is therefore used, or counted
one by one as unusable, before batching:

1. `parse` reads a tf.train.Example natively without raising: a record that
   does not start like one, has no image or no label, or two of either, is
   unusable. `looks_like_jpeg`, a cheap byte test (JPEG start-of-image marker
   at the start, end-of-image marker near the end), decides whether to
   decode at all.
2. An unusable record becomes a zero image whose label, `fault_label(source)`,
   names its file (shard_audit.py: records lost to a damaged file arrive the
   same way). It stays in its batch, so batches keep their records and a
   resumed run still reads exactly the batches an uninterrupted one would.
3. `fill_gaps`: the rare record that passes both tests and still fails to
   parse or decode raises in the per-record map; `ignore_errors` drops it
   there, and a scan over the record index puts a zero image labelled
   UNUSABLE_LABEL (file unknown) in its place. No guard sits after batching.
4. The training step gives every negative label weight 0 and counts it per
   source in its summed StepSums (`fault_counts`), so metrics.jsonl's
   `unusable_examples` and `lost_records` cover every worker, and a warning
   names each file (shard_audit.DataFaults).
5. `checked_label`: a label of a usable record outside [0, num_classes)
   after subtracting label_offset stops training with an error naming both
   flags, instead of training silently on an all-zero one-hot target.

`is_progressive_jpeg` is not a guard: progressive JPEGs train correctly, but
the fused decode-and-crop (§3.2) saves nothing on them; the data builder and
the pre-flight check (preflight.py) use it to say so.
"""
import tensorflow as tf

IMAGE_FEATURE = "image/encoded"
LABEL_FEATURE = "image/class/label"
# The label of an unusable example whose file is unknown (weight 0).
UNUSABLE_LABEL = -1
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


def fault_label(source: tf.Tensor) -> tf.Tensor:
  """The label of an unusable example of `source` (shard_audit.py): < -1."""
  return -2 - source


def parse(record: tf.Tensor, label_offset: int
          ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
  """(image bytes, label - label_offset, parsed) of a serialized
  tf.train.Example; parsed is False, and nothing raises, for a record
  without exactly one image and one label or that does not start like an
  Example (its first field, tag 0x0A); a malformed one that does can still
  raise (`fill_gaps` catches it)."""
  def parse_example():
    features = tf.io.parse_single_example(record, {
        IMAGE_FEATURE: tf.io.RaggedFeature(tf.string),
        LABEL_FEATURE: tf.io.RaggedFeature(tf.int64)})
    images, labels = features[IMAGE_FEATURE], features[LABEL_FEATURE]
    ok = (tf.size(images) == 1) & (tf.size(labels) == 1)
    label = tf.concat([labels, [label_offset]], 0)[0] - label_offset
    return tf.concat([images, [""]], 0)[0], tf.cast(label, tf.int32), ok

  like_example = ((tf.strings.length(record) == 0) |
                  (tf.strings.substr(record, 0, 1) == "\n"))
  return tf.cond(like_example, parse_example,
                 lambda: (tf.constant(""), tf.constant(0), tf.constant(False)))


def fill_gaps(dataset: tf.data.Dataset, first_index: int) -> tf.data.Dataset:
  """(index, image, label, fault) in index order from `first_index`: the
  elements whose map raised are dropped, and replaced by a zero image with
  fault UNUSABLE_LABEL (module docstring, 3)."""
  def fill(next_index, element):
    index, image, label, fault = element
    missing = tf.cast(index - next_index, tf.int32)
    blanks = tf.zeros(tf.concat([[missing], tf.shape(image)], 0), image.dtype)
    return index + 1, (
        tf.concat([blanks, image[None]], 0),
        tf.concat([tf.zeros([missing], tf.int32), label[None]], 0),
        tf.concat([tf.fill([missing], UNUSABLE_LABEL), fault[None]], 0))

  return dataset.ignore_errors().scan(
      tf.constant(first_index, tf.int64), fill).unbatch()


def mark_train(dataset: tf.data.Dataset, num_classes: int,
               label_offset: int) -> tf.data.Dataset:
  """Batches of (image, label, fault) -> (image, label or fault); when
  num_classes > 0, checks the labels of usable records."""
  def mark(images, labels, faults):
    usable = tf.equal(faults, 0)
    if num_classes:
      labels = checked_label(tf.where(usable, labels, 0), num_classes,
                             label_offset)
    return images, tf.where(usable, labels, faults)

  return dataset.map(mark, num_parallel_calls=tf.data.AUTOTUNE,
                     deterministic=True)


def fault_counts(labels: tf.Tensor, num_sources: int
                 ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
  """float32 (unusable, lost, per source) counts of a batch's labels; a
  static shape, so the step compiles with XLA."""
  source = -2 - labels
  attributed = labels < UNUSABLE_LABEL
  lost = attributed & tf.equal(source % 2, 1)
  unusable = (labels < 0) & ~lost
  by_source = tf.math.unsorted_segment_sum(
      tf.ones_like(labels, tf.float32),
      tf.where(attributed, source, num_sources), num_sources + 1)
  count = lambda mask: tf.reduce_sum(tf.cast(mask, tf.float32))
  return count(unusable), count(lost), by_source[:num_sources]


def guard_eval(dataset: tf.data.Dataset, num_classes: int,
               label_offset: int) -> tf.data.Dataset:
  """(image, label, usable) examples -> (image, label, mask): an unusable
  record gets mask 0 (not evaluated); one whose decode raised is dropped,
  before batching."""
  def mark(image, label, usable):
    if num_classes:
      label = checked_label(tf.where(usable, label, 0), num_classes,
                            label_offset)
    return image, label, tf.cast(usable, tf.float32)

  # Explicitly ordered: tf.data would otherwise parallelise this map under
  # the pipeline's deterministic=False.
  return dataset.ignore_errors(log_warning=True).map(
      mark, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
