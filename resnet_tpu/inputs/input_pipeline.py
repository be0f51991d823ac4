"""Sharded, parallel ImageNet input pipeline (Ying et al. 2018, §3.2).

Each host builds one pipeline per `tf.distribute.InputContext`:

  files -> shard by input_pipeline_id -> parallel interleave of TFRecordDataset
  (a stand-in for each record lost to a damaged file: shard_audit.py) ->
  [cache raw records] -> shuffle -> repeat -> one fused map (parse, crop
  box, decode-and-crop, resize, flip, cast to the transfer dtype; unusable
  records become weight-0 examples, one by one: record_guards.py) -> batch per
  replica -> labels checked -> prefetch

The fused map is ordered (deterministic=True) whatever --deterministic_input
says: the record index finds the rare record whose decode raised
(record_guards.fill_gaps).

Pipelines get whole files when there are at least as many files as pipelines;
otherwise every pipeline reads every file in one fixed order and keeps every
k-th record. Each optimisation of §3.2 has a switch in the config's
`InputConfig` (cfg.input), so the ablation of Ying et al. Figure 5 is
measurable (lab/bench_input.py). The files come listed: the pre-flight globs
--data_dir once (data_checks.find_data_files).

Records follow tensorflow/tpu `tools/datasets/imagenet_to_gcs.py`: files
`train-%05d-of-%05d` and `validation-%05d-of-%05d` whose `image/class/label` is
1-based (`label_offset` subtracts it).

Reproducibility: with `seed` set and `deterministic_input` the record order is
seeded and every augmentation is drawn by stateless ops from (seed,
input_pipeline_id, element index), so the batches are a pure function of the
config, and `start_step` resumes them exactly.
"""
import math
import os
from typing import Callable, Sequence

from absl import logging
import tensorflow as tf

from resnet_tpu.inputs import record_guards
from resnet_tpu.inputs import preprocessing
from resnet_tpu.inputs import shard_audit
from resnet_tpu.config import ConfigError
from resnet_tpu.config import InputConfig

SPLITS = ("train", "validation")
# uint8: what preprocessing.py returns, a quarter of the bytes of float32;
# the model casts on the device. float32/bfloat16: cast on the host.
DTYPES = ("uint8", "float32", "bfloat16")
READ_BUFFER_BYTES = 8 * 1024 * 1024
MAX_FILES_READ_AT_ONCE = 16
# The features of a record the pipeline reads (record_guards.parse).
FEATURES = (record_guards.IMAGE_FEATURE, record_guards.LABEL_FEATURE)

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]


def split_files(data_dir: str, split: str) -> list[str]:
  """Sorted TFRecord files of `split` in `data_dir`; ValueError if none."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  pattern = os.path.join(data_dir, f"{split}-*-of-*")
  files = sorted(tf.io.gfile.glob(pattern))
  if not files:
    raise ConfigError(
        f"--data_dir={data_dir!r} holds no '{split}-*-of-*' TFRecord files "
        f"(no TFRecord files match {pattern}); expected the imagenet_to_gcs "
        f"layout, e.g. {split}-00000-of-01024 (data/build_tfrecords.py or "
        "tensorflow/tpu imagenet_to_gcs.py writes it).")
  return files


def count_examples(files: Sequence[str]) -> int:
  """Records in `files`, read without parsing them; a damaged file counts
  the records before the damage (shard_audit.py)."""
  records = tf.data.TFRecordDataset(list(files),
                                    buffer_size=READ_BUFFER_BYTES,
                                    num_parallel_reads=tf.data.AUTOTUNE
                                    ).ignore_errors()
  count = records.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)
  return int(count)


def eval_steps(num_examples: int, global_batch_size: int) -> int:
  """Eval steps covering `num_examples`; the last batch is padded, masked."""
  if num_examples < 1 or global_batch_size < 1:
    raise ValueError("num_examples and global_batch_size must be positive, "
                     f"got {num_examples} and {global_batch_size}")
  return math.ceil(num_examples / global_batch_size)


def _parallelism(enabled: bool) -> int | None:
  return tf.data.AUTOTUNE if enabled else None


def _options(cfg: InputConfig, deterministic: bool) -> tf.data.Options:
  """tf.data options; static rewrites that would undo an ablation follow it."""
  options = tf.data.Options()
  options.deterministic = deterministic
  options.autotune.enabled = True
  if cfg.private_threadpool_size:
    options.threading.private_threadpool_size = cfg.private_threadpool_size
  options.experimental_optimization.map_parallelization = cfg.parallel_map
  options.experimental_optimization.inject_prefetch = cfg.prefetch
  return options


def _records(files: Sequence[str], ctx: tf.distribute.InputContext,
             cfg: InputConfig, seed: int | None, shard_files: bool,
             max_records: int | None = None,
             expected: dict[str, int] | None = None) -> tf.data.Dataset:
  """This pipeline's share of the (source, record) pairs, optionally cached.

  shard_files=True gives each pipeline whole files in a shuffled order;
  otherwise all pipelines read all files in one fixed order and keep every
  k-th record of its first `max_records`, which needs a deterministic
  interleave so that they agree. `expected`: records per file
  (manifest.json), to count the lost ones (shard_audit.py).
  """
  num_pipelines, pipeline_id = ctx.num_input_pipelines, ctx.input_pipeline_id
  files, indices = list(files), list(range(len(files)))
  if shard_files:
    files = files[pipeline_id::num_pipelines]
    indices = indices[pipeline_id::num_pipelines]
  names, read = shard_audit.reading(files, indices, READ_BUFFER_BYTES,
                                    expected)
  if shard_files:
    # Shuffled once, not every epoch, so cache() replays what reading gives.
    names = names.shuffle(len(files), seed=seed,
                          reshuffle_each_iteration=False)
  records = names.interleave(
      read, cycle_length=min(len(files), MAX_FILES_READ_AT_ONCE),
      block_length=1,
      num_parallel_calls=_parallelism(cfg.parallel_interleave),
      deterministic=None if shard_files else True)
  if not shard_files:
    if max_records is not None:
      records = records.take(max_records)
    records = records.shard(num_pipelines, pipeline_id)
  logging.info("input pipeline %d of %d: %d files, sharded by %s",
               pipeline_id, num_pipelines, len(files),
               "file" if shard_files else "record")
  return records.cache() if cfg.cache_dataset else records


def _train_map(cfg: InputConfig, image_size: int, dtype: str,
               seed: int | None, pipeline_id: int) -> Callable:
  """The one fused map of §3.2: parse, crop, decode, resize, flip, cast."""
  dtype = tf.dtypes.as_dtype(dtype)
  pipeline_seed = (None if seed is None else
                   tf.constant([seed, pipeline_id], tf.int64))

  def parse_and_preprocess(index, source_and_record):
    source, record = source_and_record
    image_bytes, label, parsed = record_guards.parse(record, cfg.label_offset)
    element_seed = (None if pipeline_seed is None else
                    tf.random.experimental.stateless_fold_in(pipeline_seed,
                                                             index))
    usable = parsed & record_guards.looks_like_jpeg(image_bytes)
    image = tf.cond(usable, lambda: preprocessing.preprocess_for_train(
        image_bytes, image_size, cfg.fused_decode_crop, element_seed, cfg),
                    lambda: _blank(image_size))
    fault = tf.where(usable, 0, record_guards.fault_label(source))
    return index, tf.cast(image, dtype), label, fault

  return parse_and_preprocess


def _blank(image_size: int) -> tf.Tensor:
  """Stands in for an unusable record's image (record_guards.py)."""
  return tf.zeros([image_size, image_size, 3], tf.uint8)


def _examples_per_pipeline(global_batch_size: int,
                           ctx: tf.distribute.InputContext) -> int:
  if ctx.num_replicas_in_sync % ctx.num_input_pipelines:
    raise ValueError(
        f"{ctx.num_replicas_in_sync} replicas do not split evenly over "
        f"{ctx.num_input_pipelines} input pipelines")
  return global_batch_size // ctx.num_input_pipelines


def train_dataset_fn(cfg: InputConfig, files: Sequence[str],
                     global_batch_size: int, *, image_size: int,
                     num_classes: int = 0, dtype: str = "uint8",
                     seed: int | None = None,
                     start_step: int = 0) -> DatasetFn:
  """Infinite training dataset_fn: (images [b, S, S, 3], labels int32 [b]).

  `files`: the train split's (data_checks.find_data_files). Images are raw
  0..255 pixels in `dtype` (uint8 by default; the model's first layer
  casts); b is the per-replica batch. num_classes > 0: every label is
  checked (record_guards.py).
  `start_step` skips the records of that many global steps before decoding
  anything, so with a seed and deterministic_input a resumed run sees
  exactly the batches the interrupted one would have seen.
  Unusable records and, when manifest.json lists every file, the records
  lost to damaged files arrive as weight-0 examples whose negative labels
  name their file (record_guards.py, shard_audit.py).
  """
  expected = shard_audit.expected_records(cfg.data_dir, files)

  def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    batch_size = ctx.get_per_replica_batch_size(global_batch_size)
    records = _records(files, ctx, cfg, seed,
                       shard_files=len(files) >= ctx.num_input_pipelines,
                       expected=expected)
    records = records.shuffle(cfg.shuffle_buffer_size, seed=seed,
                              reshuffle_each_iteration=True)
    records = records.repeat().enumerate()
    skipped = start_step * _examples_per_pipeline(global_batch_size, ctx)
    if skipped:
      records = records.skip(skipped)
    dataset = records.map(_train_map(cfg, image_size, dtype, seed,
                                     ctx.input_pipeline_id),
                          num_parallel_calls=_parallelism(cfg.parallel_map),
                          deterministic=True)
    dataset = record_guards.fill_gaps(dataset, skipped)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    dataset = record_guards.mark_train(dataset, num_classes,
                                       cfg.label_offset)
    if cfg.prefetch:
      dataset = dataset.prefetch(tf.data.AUTOTUNE)
    return dataset.with_options(_options(cfg, cfg.deterministic_input))

  return dataset_fn


def eval_dataset_fn(cfg: InputConfig, files: Sequence[str],
                    global_batch_size: int, num_examples: int, *,
                    image_size: int, num_classes: int = 0,
                    dtype: str = "uint8") -> DatasetFn:
  """Finite eval dataset_fn: (images, labels, mask float32 [b]), fixed order.

  `files`: the validation split's. The first `num_examples` records are
  evaluated (count_examples(files) of them for the whole split). Each
  pipeline yields exactly eval_steps(num_examples, global_batch_size)
  batches per replica it feeds,
  padded with zero images of mask 0. Records, not files, are sharded, so
  shards differ by at most one example and always fit that many steps.
  """
  steps = eval_steps(num_examples, global_batch_size)
  dtype = tf.dtypes.as_dtype(dtype)

  def parse_and_preprocess(source, record):
    del source  # eval counts no faults: an unusable record gets mask 0
    image_bytes, label, parsed = record_guards.parse(record, cfg.label_offset)
    usable = parsed & record_guards.looks_like_jpeg(image_bytes)
    image = tf.cond(usable, lambda: preprocessing.preprocess_for_eval(
        image_bytes, image_size, cfg.eval_crop_fraction),
                    lambda: _blank(image_size))
    return tf.cast(image, dtype), label, usable

  def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    batch_size = ctx.get_per_replica_batch_size(global_batch_size)
    num_padded = steps * _examples_per_pipeline(global_batch_size, ctx)
    records = _records(files, ctx, cfg, seed=None, shard_files=False,
                       max_records=num_examples)
    dataset = records.map(parse_and_preprocess,
                          num_parallel_calls=_parallelism(cfg.parallel_map))
    dataset = record_guards.guard_eval(dataset, num_classes,
                                       cfg.label_offset)
    padding = tf.data.Dataset.from_tensors(
        (tf.zeros([image_size, image_size, 3], dtype), tf.constant(0),
         tf.constant(0.0))).repeat()
    dataset = dataset.concatenate(padding).take(num_padded)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    if cfg.prefetch:
      dataset = dataset.prefetch(tf.data.AUTOTUNE)
    return dataset.with_options(_options(cfg, deterministic=True))

  return dataset_fn


def synthetic_dataset_fn(image_size: int, num_classes: int,
                         global_batch_size: int, dtype: str) -> DatasetFn:
  """One constant random batch, repeated: the model with no input cost."""
  if dtype not in DTYPES:
    raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")

  def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    batch_size = ctx.get_per_replica_batch_size(global_batch_size)
    seed = tf.constant([0, ctx.input_pipeline_id], tf.int64)
    images = tf.random.stateless_uniform(
        [batch_size, image_size, image_size, 3], seed, 0.0, 255.0)
    labels = tf.random.stateless_uniform([batch_size], seed, 0, num_classes,
                                         dtype=tf.int32)
    batch = (tf.cast(images, dtype), labels)
    return tf.data.Dataset.from_tensors(batch).repeat()

  return dataset_fn
