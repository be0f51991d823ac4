"""Specification of tools/evaluate.py on the export of a real training run."""
import csv
import json
import logging
import os
import shutil
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

from data.build_tfrecords import build
from data.build_tfrecords import image_example
from data.make_synthetic import make_synthetic
from resnet_tpu import config as config_lib
from resnet_tpu.config import TrainConfig
from resnet_tpu.train.metrics_log import read_metrics
from resnet_tpu.run import run
from resnet_tpu.runtime import compat
from tools import evaluate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = 4
# 4 classes x 3 = 12 validation images: not a multiple of EVAL_BATCH.
VALIDATION_PER_CLASS = 3
EVAL_BATCH = 8


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """ResNet-18 at 32 px, 4 steps on 2 CPU replicas, exported by run()."""
  root = tmp_path_factory.mktemp("evaluate")
  make_synthetic(str(root / "images"), num_classes=CLASSES,
                 images_per_class=4,
                 validation_images_per_class=VALIDATION_PER_CLASS,
                 image_size=40)
  data_dir = str(root / "data")
  build(str(root / "images" / "train"), data_dir, "train", 2)
  build(str(root / "images" / "validation"), data_dir, "validation", 2)
  # Each strategy numbers its collectives from one base; keep them apart
  # from other tests' strategies (as conftest.cpu_strategy does).
  compat.shift_collective_keys(tf.distribute.MirroredStrategy, 100000)
  cfg = TrainConfig.from_flat(
      model_dir=str(root / "model"), data_dir=data_dir, resnet_depth=18,
      num_classes=CLASSES, image_size=32, strategy="cpu", num_cpu_replicas=2,
      bn_group_size=2, global_batch_size=8, eval_batch_size=EVAL_BATCH,
      train_steps=4, steps_per_loop=4, num_train_images=16, warmup_epochs=0,
      eval_crop_fraction=0.6, export_dir=str(root / "export"))
  run(cfg)
  return cfg


def test_evaluate_cli_reproduces_in_training_eval_of_same_checkpoint(
    trained):
  result = subprocess.run(
      [sys.executable, "-m", "tools.evaluate",
       f"--saved_model={trained.run.export_dir}",
       f"--data_dir={trained.input.data_dir}",
       "--batch_size=5"],
      cwd=REPO, text=True, capture_output=True, timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  last_line = json.loads(result.stdout.strip().splitlines()[-1])
  in_training = [r for r in read_metrics(trained.model_dir)
                 if r["split"] == "eval"][-1]
  assert in_training["step"] == trained.run.train_steps
  assert last_line == {"top1": in_training["top1"],
                       "top5": in_training["top5"],
                       "examples": CLASSES * VALIDATION_PER_CLASS}
  assert in_training["examples"] == CLASSES * VALIDATION_PER_CLASS


def test_run_writes_config_json_of_the_trained_network(trained):
  config = config_lib.read_config(trained.model_dir)
  assert (config["resnet_depth"], config["image_size"],
          config["num_classes"], config["bn_group_size"]) == (18, 32, 4, 2)
  assert config["labels_file"] == os.path.join(trained.input.data_dir,
                                               "synsets.txt")


def test_undecodable_jpeg_is_reported_by_record_and_counted(
    trained, tmp_path, caplog):
  data_dir = tmp_path / "data"
  shutil.copytree(trained.input.data_dir, data_dir)
  bad_file = data_dir / "validation-00002-of-00003"
  with tf.io.TFRecordWriter(str(bad_file)) as writer:
    writer.write(image_example("good.JPEG", _jpeg(), 8, 8, "n00000000",
                               1).SerializeToString())
    writer.write(image_example("broken.JPEG", b"\xff\xd8\xffnot a jpeg", 8,
                               8, "n00000000", 1).SerializeToString())
  with caplog.at_level(logging.WARNING):
    result = evaluate.evaluate(trained.run.export_dir, str(data_dir),
                               batch_size=EVAL_BATCH)
  assert result["errors"] == 1
  assert result["examples"] == CLASSES * VALIDATION_PER_CLASS + 1
  assert f"{bad_file} record 1 (broken.JPEG)" in caplog.text


def _jpeg() -> bytes:
  image = tf.fill([8, 8, 3], tf.constant(90, tf.uint8))
  return tf.io.encode_jpeg(image).numpy()


def test_every_example_counts_whatever_the_batch_size(trained):
  for batch_size in (1, 100):
    result = evaluate.evaluate(trained.run.export_dir, trained.input.data_dir,
                               batch_size=batch_size)
    assert result["examples"] == CLASSES * VALIDATION_PER_CLASS
    assert "errors" not in result


def test_bad_paths_give_clear_errors(trained, tmp_path):
  with pytest.raises(ValueError, match="--saved_model=.* is not a SavedModel"):
    evaluate.evaluate(str(tmp_path / "missing"), trained.input.data_dir)
  with pytest.raises(ValueError, match="no TFRecord files match"):
    evaluate.evaluate(trained.run.export_dir, str(tmp_path))
  with pytest.raises(ValueError, match="--batch_size must be >= 1"):
    evaluate.evaluate(trained.run.export_dir, trained.input.data_dir,
                      batch_size=0)


def test_per_class_results_and_confusion_matrix_add_up(trained, tmp_path):
  out = tmp_path / "per_class"
  result = evaluate.evaluate(trained.run.export_dir, trained.input.data_dir,
                             batch_size=5, output_dir=str(out))
  rows = json.loads((out / "per_class.json").read_text())
  names = [r["name"] for r in rows]
  # synsets.txt's names, in class order (make_synthetic's class folders).
  assert names == sorted(os.listdir(
      os.path.join(os.path.dirname(trained.input.data_dir), "images",
                   "validation")))
  assert [r["examples"] for r in rows] == [VALIDATION_PER_CLASS] * CLASSES
  hits = sum(r["top1"] * r["examples"] for r in rows)
  assert hits == pytest.approx(result["top1"] * result["examples"])
  with open(out / "confusion_matrix.csv") as f:
    table = list(csv.reader(f))
  assert table[0][1:] == names and [r[0] for r in table[1:]] == names
  matrix = np.array([[int(v) for v in r[1:]] for r in table[1:]])
  assert matrix.sum() == result["examples"]
  assert np.trace(matrix) == round(hits)
  assert (out / "confusion_matrix.png").read_bytes()[:4] == b"\x89PNG"


def test_a_checkpoint_evaluates_as_its_export(trained):
  """--model_dir: the checkpoint's serving functions, built in memory."""
  from_export = evaluate.evaluate(trained.run.export_dir,
                                  trained.input.data_dir)
  served = evaluate.served_checkpoint(trained.model_dir)
  assert evaluate.evaluate("", trained.input.data_dir,
                           served=served) == from_export
  with pytest.raises(ValueError, match="--checkpoint=.* is not a checkpoint"):
    evaluate.served_checkpoint(trained.model_dir, "nope/ckpt-1")


def test_predict_prints_the_top_5_with_class_names(trained, tmp_path):
  from tools import predict
  folder = os.path.join(os.path.dirname(trained.input.data_dir), "images",
                        "validation")
  first_class = sorted(os.listdir(folder))[0]
  photos = os.path.join(folder, first_class)
  broken = tmp_path / "broken.jpg"
  broken.write_bytes(b"not a jpeg")
  output = tmp_path / "predictions.json"
  result = subprocess.run(
      [sys.executable, "-m", "tools.predict",
       f"--saved_model={trained.run.export_dir}", f"--json_output={output}",
       photos, str(broken)],
      cwd=REPO, text=True, capture_output=True, timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  predictions = json.loads(output.read_text())
  jpegs = sorted(os.listdir(photos))
  assert [p["path"] for p in predictions] == [
      os.path.join(photos, n) for n in jpegs] + [str(broken)]
  assert "error" in predictions[-1] and "1 of" in result.stderr
  served = evaluate.served_export(trained.run.export_dir)
  for prediction in predictions[:-1]:
    top = prediction["top"]
    assert len(top) == min(5, CLASSES)
    assert [t["name"] for t in top] == [served.names[t["class"]]
                                        for t in top]
    probabilities = [t["probability"] for t in top]
    assert probabilities == sorted(probabilities, reverse=True)
    assert sum(probabilities) == pytest.approx(1.0, abs=1e-5)
    # The same image through serve_jpeg directly.
    with open(prediction["path"], "rb") as f:
      direct = served.serve_jpeg(image_bytes=tf.constant([f.read()]))
    assert top[0]["class"] == int(tf.argmax(direct["probabilities"][0]))
    assert f"1. {top[0]['name']}" in result.stdout
  with pytest.raises(ValueError, match="does not exist"):
    predict.image_paths([str(tmp_path / "missing.jpg")])


def test_predict_takes_every_format_training_takes(trained, tmp_path):
  """PNG, BMP and GIF, by name and in a folder, score as training's
  records hold them: re-encoded to JPEG as build_tfrecords does (issue 50:
  a PNG was 'not classified: Graph execution error')."""
  from data.build_tfrecords import to_rgb_jpeg
  from tools import predict
  from PIL import Image  # matplotlib's dependency
  image = np.random.default_rng(0).integers(0, 256, (40, 40, 3),
                                            dtype=np.uint8)
  for name in ("photo.bmp", "photo.gif", "photo.png"):
    Image.fromarray(image).save(tmp_path / name)
  served = evaluate.served_export(trained.run.export_dir)
  results = predict.predict(served, predict.image_paths([str(tmp_path)]))
  assert [os.path.basename(r["path"]) for r in results] == [
      "photo.bmp", "photo.gif", "photo.png"]
  for result in results:
    assert "top" in result, result
    with open(result["path"], "rb") as f:
      want = served.serve_jpeg(image_bytes=tf.constant(
          [to_rgb_jpeg(f.read())[0]]))["probabilities"].numpy()[0]
    top = result["top"][0]
    assert top["class"] == int(np.argmax(want))
    assert top["probability"] == pytest.approx(float(np.max(want)), rel=1e-5)


def test_the_readme_s_serving_request_reaches_serve_jpeg(trained, tmp_path):
  """The body tools.serving_request writes, decoded as TensorFlow
  Serving's REST API decodes it ({"b64": ...} -> bytes, one instance a
  row), through the loaded SavedModel's serve_jpeg: the photo's
  prediction (issue 50)."""
  import base64  # pylint: disable=g-import-not-at-top
  from tools import predict  # pylint: disable=g-import-not-at-top
  from PIL import Image  # matplotlib's dependency
  photo = tmp_path / "photo.png"
  Image.fromarray(np.random.default_rng(1).integers(
      0, 256, (40, 40, 3), dtype=np.uint8)).save(photo)
  request = tmp_path / "request.json"
  with open(request, "w") as f:
    subprocess.run([sys.executable, "-m", "tools.serving_request",
                    str(photo)], cwd=REPO, stdout=f, check=True, timeout=120)
  body = json.loads(request.read_text())
  loaded = tf.saved_model.load(trained.run.export_dir)
  signature = loaded.signatures[body["signature_name"]]
  (name, spec), = signature.structured_input_signature[1].items()
  rows = [base64.b64decode(instance[name]["b64"])
          for instance in body["instances"]]
  assert spec.dtype == tf.string and len(rows) == 1
  response = signature(**{name: tf.constant(rows)})
  served = evaluate.served_export(trained.run.export_dir)
  want = predict.predict(served, [str(photo)])[0]["top"][0]
  assert int(response["top5_classes"][0, 0]) == want["class"]
  assert float(tf.reduce_max(response["probabilities"][0])) == (
      pytest.approx(want["probability"], rel=1e-5))


def _stored_with_orientation(upright_image: np.ndarray, orientation: int,
                             path) -> None:
  """Writes the JPEG a camera stores for `upright_image` held with EXIF
  `orientation`: the pixels turned so that PIL's exif_transpose (what
  photo viewers do) shows them upright."""
  from PIL import Image  # matplotlib's dependency
  undo = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
          4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
          6: Image.Transpose.ROTATE_90, 7: Image.Transpose.TRANSVERSE,
          8: Image.Transpose.ROTATE_270}
  stored = Image.fromarray(upright_image).transpose(undo[orientation])
  exif = Image.Exif()
  exif[0x0112] = orientation
  stored.save(path, "JPEG", quality=100, exif=exif.tobytes())


@pytest.mark.parametrize("orientation", range(2, 9))
def test_predict_turns_a_photo_upright_by_its_exif_orientation(
    tmp_path, orientation):
  from PIL import Image, ImageOps
  from tools import predict
  rows, cols = np.mgrid[0:24, 0:40]
  image = np.stack([rows * 10, cols * 6, rows * cols // 4], -1).astype(
      np.uint8)  # every turn and mirror of it differs
  path = tmp_path / "portrait.jpg"
  _stored_with_orientation(image, orientation, path)
  data = path.read_bytes()
  assert predict.exif_orientation(data) == orientation
  got = tf.io.decode_jpeg(predict.as_training_jpeg(data)).numpy()
  assert got.shape == image.shape
  # Two JPEG encodings' rounding (chroma subsampling): a few levels; any
  # other turn or mirror of this gradient is off by tens.
  assert np.abs(got.astype(int) - image).mean() < 5
  viewer = np.asarray(ImageOps.exif_transpose(Image.open(path)))
  assert np.abs(got.astype(int) - viewer).mean() < 5
  stored = tf.io.decode_jpeg(data).numpy()
  if stored.shape == image.shape:  # a flip or half turn, not applied
    assert np.abs(stored.astype(int) - image).mean() > 20


def test_a_portrait_photo_gets_the_class_of_the_same_photo_upright(
    trained, tmp_path):
  """The user's path end to end: a folder with the photo upright, the
  same photo stored sideways with its EXIF tag, and a .webp, which is
  named as skipped. (This tiny network is nearly blind to a quarter turn,
  so the turn itself is proved on pixels, by the test above.)"""
  from PIL import Image
  from tools import predict
  folder = os.path.join(os.path.dirname(trained.input.data_dir), "images",
                        "validation")
  first_class = sorted(os.listdir(folder))[0]
  name = sorted(os.listdir(os.path.join(folder, first_class)))[0]
  image = np.asarray(Image.open(os.path.join(folder, first_class, name))
                     .convert("RGB"))
  Image.fromarray(image).save(tmp_path / "upright.jpg", quality=100)
  _stored_with_orientation(image, 6, tmp_path / "portrait.jpg")
  (tmp_path / "notes.webp").write_bytes(b"RIFF....WEBP")
  served = evaluate.served_export(trained.run.export_dir)
  with mock.patch.object(predict.logging, "warning") as warning:
    paths = predict.image_paths([str(tmp_path)])
  assert [os.path.basename(p) for p in paths] == ["portrait.jpg",
                                                  "upright.jpg"]
  warning.assert_called_once()
  assert str(tmp_path / "notes.webp") in warning.call_args.args
  portrait, upright = predict.predict(served, paths)
  assert portrait["top"][0]["class"] == upright["top"][0]["class"]
  assert portrait["top"][0]["probability"] == pytest.approx(
      upright["top"][0]["probability"], abs=0.02)
