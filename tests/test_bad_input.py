"""Bad input fails early with a message naming the flag or file, and a few
broken images in the data never crash training (docs/reliability.md).

run.run is called with the TensorFlow start-up's create_strategy replaced:
by a function that fails where a check must come before strategy start-up,
by 2 CPU replicas where training must go on.
"""
import logging
import os

from absl import flags
import numpy as np
import pytest
import tensorflow as tf

from conftest import cpu_strategy
from resnet_tpu import config as config_lib
from resnet_tpu import flags as resnet_flags
from resnet_tpu.inputs import input_pipeline
from resnet_tpu import data_checks
from resnet_tpu.engines.tensorflow import startup as tf_startup
from resnet_tpu import run as run_lib
from resnet_tpu.engines.tensorflow import engine as engine_lib
from resnet_tpu.config import ConfigError
from resnet_tpu.config import InputConfig
from resnet_tpu.config import TrainConfig
from resnet_tpu.parallel.tensorflow.strategy import Distribution
from resnet_tpu.train.metrics_log import read_metrics
from test_input_pipeline import imagenet_to_gcs_record
from test_resume_exact import write_random_split
from tiny_model import tiny_resnet

CLASSES = 10


def _config(tmp_path, data_dir="", **overrides) -> TrainConfig:
  return TrainConfig.tiny(str(tmp_path / "model"), **{
      "data_dir": str(data_dir), "use_synthetic_data": not data_dir,
      "num_classes": CLASSES, "train_steps": 4, "steps_per_loop": 4,
      "num_train_images": 32, **overrides})


def _train_fn(data_dir, global_batch_size: int, seed=None,
              **overrides) -> input_pipeline.DatasetFn:
  """The training input of data_dir's 32 px images, labels checked."""
  return input_pipeline.train_dataset_fn(
      InputConfig(data_dir=str(data_dir), **overrides),
      input_pipeline.split_files(str(data_dir), "train"), global_batch_size,
      image_size=32, num_classes=CLASSES, seed=seed)


def _no_strategy(*args, **kwargs):
  raise AssertionError("the strategy started before the input was checked")


@pytest.fixture
def before_startup(monkeypatch):
  monkeypatch.setattr(tf_startup, "create_strategy", _no_strategy)


def _write(path, records: list[bytes]) -> None:
  with tf.io.TFRecordWriter(str(path)) as writer:
    for record in records:
      writer.write(record)


def _jpeg(seed: int = 0) -> bytes:
  image = np.random.default_rng(seed).integers(0, 256, (40, 40, 3),
                                               dtype=np.uint8)
  return tf.io.encode_jpeg(image).numpy()


# --- before start-up -------------------------------------------------------

@pytest.mark.parametrize("overrides,flag", [
    (dict(image_size=16), "--image_size"),
    (dict(global_batch_size=6, num_cpu_replicas=4), "--global_batch_size"),
    (dict(bn_group_size=3), "--bn_group_size"),
    (dict(skip_nonfinite_steps=True, batch_size_schedule="0:16"),
     "--skip_nonfinite_steps"),
])
def test_bad_sizes_fail_before_startup_naming_the_flag(
    tmp_path, before_startup, overrides, flag):
  with pytest.raises(ConfigError, match=flag):
    run_lib.run(_config(tmp_path, **overrides))


def test_missing_or_empty_data_dir_fails_naming_it(tmp_path, before_startup):
  with pytest.raises(ConfigError, match="--data_dir=.*not a directory"):
    run_lib.run(_config(tmp_path, tmp_path / "nowhere"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(ConfigError, match="--data_dir=.*no 'train-\\*-of-\\*'"):
    run_lib.run(_config(tmp_path, tmp_path / "empty"))


def test_files_that_are_not_tfrecords_fail_naming_the_file(tmp_path,
                                                           before_startup):
  for name in ("train-00000-of-00001", "validation-00000-of-00001"):
    (tmp_path / name).write_text("image,label\ncat.jpg,1\n" * 20)
  with pytest.raises(ConfigError,
                     match="train-00000-of-00001 .*is not a TFRecord file"):
    run_lib.run(_config(tmp_path, tmp_path))


def test_records_missing_features_fail_naming_them(tmp_path, before_startup):
  only_image = tf.train.Example(features=tf.train.Features(feature={
      "image/encoded": tf.train.Feature(
          bytes_list=tf.train.BytesList(value=[_jpeg()]))}))
  for split in ("train", "validation"):
    _write(tmp_path / f"{split}-00000-of-00001",
           [only_image.SerializeToString()])
  with pytest.raises(ConfigError, match=r"lacks the features "
                     r"\['image/class/label'\]"):
    run_lib.run(_config(tmp_path, tmp_path))


def test_first_label_outside_num_classes_fails_naming_both_flags(
    tmp_path, before_startup):
  for split in ("train", "validation"):
    _write(tmp_path / f"{split}-00000-of-00001",
           [imagenet_to_gcs_record(0, _jpeg())])  # 0-based data, offset 1
  with pytest.raises(ConfigError, match=r"--label_offset=1 .*\[0, "
                     r"--num_classes=10\)"):
    run_lib.run(_config(tmp_path, tmp_path))


@pytest.mark.parametrize("progressive", [True, False])
def test_progressive_training_jpegs_are_named_before_startup(
    tmp_path, caplog, progressive):
  image = np.random.default_rng(0).integers(0, 256, (40, 40, 3),
                                            dtype=np.uint8)
  jpeg = tf.io.encode_jpeg(image, progressive=progressive).numpy()
  for split in ("train", "validation"):
    _write(tmp_path / f"{split}-00000-of-00001",
           [imagenet_to_gcs_record(1, jpeg)])
  with caplog.at_level(logging.WARNING):
    data_checks.check_data_dir(_config(tmp_path, tmp_path),
                               data_checks.find_data_files(str(tmp_path)))
  warned = "is a progressive JPEG" in caplog.text
  assert warned == progressive
  if progressive:
    assert "train-00000-of-00001" in caplog.text
    assert "--progressive_to_baseline" in caplog.text


def test_model_dir_of_another_network_fails_before_startup(tmp_path,
                                                           before_startup):
  old = _config(tmp_path, resnet_depth=50)
  config_lib.write_config(old)
  tf.train.Checkpoint(step=tf.Variable(1)).save(
      os.path.join(old.model_dir, "ckpt"))
  with pytest.raises(ConfigError, match=r"--model_dir=.*another network "
                     r"\(--resnet_depth=50 there, 18 here\)"):
    run_lib.run(_config(tmp_path))


def test_checkpoint_that_does_not_restore_fails_naming_model_dir(tmp_path):
  engine_lib.TensorFlowEngine(_config(tmp_path), cpu_strategy(1),
                              model_fn=tiny_resnet).save()
  other = engine_lib.TensorFlowEngine(_config(tmp_path, num_classes=5),
                                      cpu_strategy(1), model_fn=tiny_resnet)
  with pytest.raises(ConfigError, match=r"--model_dir=.*: cannot restore "
                     r".*ckpt-0 into this run \(.*--num_classes=5"):
    other.restore()


def test_flagfile_with_an_unknown_flag_fails_naming_it(tmp_path):
  flagfile = tmp_path / "run.cfg"
  flagfile.write_text("--resnet_depth=18\n--resnet_dept=50\n")
  flag_values = flags.FlagValues()
  resnet_flags.define_flags(flag_values)
  with pytest.raises(flags.UnrecognizedFlagError, match="resnet_dept"):
    flag_values(["main.py", f"--flagfile={flagfile}"])


# --- while training --------------------------------------------------------

def test_label_outside_num_classes_in_a_later_record_stops_the_input(
    tmp_path):
  records = [imagenet_to_gcs_record(label, _jpeg()) for label in (1, 2, 11)]
  _write(tmp_path / "train-00000-of-00001", records)
  dataset = _train_fn(tmp_path, 3)(tf.distribute.InputContext())
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"outside \[0, --num_classes=10\) after "
                     r"subtracting --label_offset=1"):
    next(iter(dataset))


def _broken_jpegs() -> dict[str, bytes]:
  good = _jpeg(1)
  return {"truncated": good[:len(good) // 2], "empty": b"",
          "png": tf.io.encode_png(np.zeros((8, 8, 3), np.uint8)).numpy(),
          "text": b"<html>404 Not Found</html>"}


def test_unusable_examples_are_counted_and_skipped_not_a_crash(
    tmp_path, caplog):
  write_random_split(tmp_path, "validation", 8, 1)
  good = [imagenet_to_gcs_record(1 + i % CLASSES, _jpeg(i))
          for i in range(28)]
  bad = [imagenet_to_gcs_record(1, jpeg) for jpeg in _broken_jpegs().values()]
  _write(tmp_path / "train-00000-of-00002", good[:14] + bad[:2])
  _write(tmp_path / "train-00001-of-00002", bad[2:] + good[14:])
  # 4 steps of 8 read the 32 records exactly once.
  run_lib.run(_config(tmp_path, tmp_path, shuffle_buffer_size=32),
              model_fn=tiny_resnet,
              distribution=Distribution(cpu_strategy(2)))
  train = [r for r in read_metrics(tmp_path / "model")
           if r["split"] == "train"]
  assert sum(r["unusable_examples"] for r in train) == len(bad)
  assert sum(r["examples"] for r in train) == len(good)
  for name in ("train-00000-of-00002", "train-00001-of-00002"):
    assert f"{name}: 2 unusable record(s)" in caplog.text


def test_jpeg_that_passes_the_byte_check_but_fails_to_decode_weighs_0(
    tmp_path):
  good = _jpeg(2)
  header_damaged = good[:20] + bytes(100) + good[120:]
  records = [imagenet_to_gcs_record(label, jpeg) for label, jpeg in
             ((1, good), (2, header_damaged), (3, good))]
  _write(tmp_path / "train-00000-of-00001", records)
  dataset = _train_fn(tmp_path, 1, seed=0, shuffle_buffer_size=1)(
      tf.distribute.InputContext())
  labels = [int(label[0]) for _, label in dataset.take(6)]
  # The damaged record (label 1) takes its place with label -1 (weight 0).
  assert labels == [0, -1, 2, 0, -1, 2]


def _unparseable_records() -> dict[str, bytes]:
  two_labels = tf.train.Example.FromString(
      imagenet_to_gcs_record(1, _jpeg()))
  two_labels.features.feature["image/class/label"].int64_list.value.append(2)
  no_label = tf.train.Example.FromString(imagenet_to_gcs_record(1, _jpeg()))
  del no_label.features.feature["image/class/label"]
  return {"no label": no_label.SerializeToString(),
          "two labels": two_labels.SerializeToString(),
          "not an Example": b"<html>404 Not Found</html>",
          "a broken Example": b"\n\x05abc" + _jpeg()}


@pytest.mark.parametrize("kind", list(_unparseable_records()))
def test_an_unparseable_record_is_one_weight_0_example_its_batch_intact(
    tmp_path, kind):
  """8 records, the 6th unparseable, batches of 4: the other 7 all train."""
  records = [imagenet_to_gcs_record(1 + i, _jpeg(i)) for i in range(8)]
  records[5] = _unparseable_records()[kind]
  _write(tmp_path / "train-00000-of-00001", records)
  dataset = _train_fn(tmp_path, 4, seed=0, shuffle_buffer_size=1)(
      tf.distribute.InputContext())
  labels = [int(label) for _, batch in dataset.take(2) for label in batch]
  # Known files name themselves (-2: file 0); a broken Example cannot.
  bad = -1 if kind == "a broken Example" else -2
  assert labels == [0, 1, 2, 3, 4, bad, 6, 7]


def test_an_unparseable_record_in_a_run_is_counted_in_metrics_naming_it(
    tmp_path, caplog):
  write_random_split(tmp_path, "validation", 8, 1)
  records = [imagenet_to_gcs_record(1 + i, _jpeg(i)) for i in range(8)]
  records[5] = _unparseable_records()["no label"]
  path = tmp_path / "train-00000-of-00001"
  _write(path, records)
  with caplog.at_level(logging.WARNING):
    run_lib.run(_config(tmp_path, tmp_path, train_steps=1, steps_per_loop=1,
                        num_train_images=8, shuffle_buffer_size=8),
                model_fn=tiny_resnet,
                distribution=Distribution(cpu_strategy(2)))
  train = [r for r in read_metrics(tmp_path / "model")
           if r["split"] == "train"]
  assert [(r["unusable_examples"], r["examples"]) for r in train] == [(1, 7)]
  assert f"{path}: 1 unusable record(s) in the steps up to 1" in caplog.text


def test_num_classes_other_than_the_data_s_class_list_fails_naming_both(
    tmp_path, before_startup):
  """A forgotten --num_classes (issue 50: 10 on 4-class data trained with
  rc 0) stops before start-up, naming both numbers."""
  for split in ("train", "validation"):
    _write(tmp_path / f"{split}-00000-of-00001",
           [imagenet_to_gcs_record(1, _jpeg())])
  (tmp_path / "synsets.txt").write_text(
      "".join(f"{i}\tclass_{i}\n" for i in range(4)))
  with pytest.raises(ConfigError, match=r"--num_classes=10, but \S*synsets"
                     r"\.txt lists 4 classes: set --num_classes=4"):
    run_lib.run(_config(tmp_path, tmp_path))
  # The same data with its class count passes the check.
  from resnet_tpu import data_checks  # pylint: disable=g-import-not-at-top
  data_checks.check_classes(_config(tmp_path, tmp_path, num_classes=4))
