"""keras.applications' ResNet weights converted into --resnet_layout=keras_v1
(resnet_tpu/model/keras_weights.py, tools/convert_keras_weights.py; issue
37): the same logits as Keras on the same images, with no download."""
import json
import os

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

from resnet_tpu import config as config_lib
from resnet_tpu import export
from resnet_tpu import run as run_lib
from resnet_tpu import warm_start
from resnet_tpu.config import ConfigError
from resnet_tpu.config import ModelConfig
from resnet_tpu.config import TrainConfig
from resnet_tpu.model import keras_weights
from resnet_tpu.model.resnet import build_model
from tools import convert_keras_weights

SIZE = 64


def _randomised(include_top: bool = True) -> keras.Model:
  """ResNet50(weights=None) with every weight random, the conv biases and
  the BN statistics too (Keras initialises those to 0 and 0/1, which would
  let a converter that drops them pass)."""
  model = keras.applications.ResNet50(
      weights=None, include_top=include_top, classifier_activation=None,
      input_shape=(SIZE, SIZE, 3))
  rng = np.random.default_rng(0)
  for layer in model.layers:
    if isinstance(layer, keras.layers.BatchNormalization):
      channels = layer.gamma.shape
      layer.set_weights([rng.uniform(0.5, 1.0, channels),
                         rng.normal(0, 0.1, channels),
                         rng.normal(0, 0.5, channels),
                         rng.uniform(1.0, 3.0, channels)])
    elif isinstance(layer, (keras.layers.Conv2D, keras.layers.Dense)):
      kernel, bias = layer.get_weights()
      layer.set_weights([kernel, rng.normal(0, 0.5, bias.shape)])
  return model


def _save_keras2_h5(model: keras.Model, path: str) -> None:
  """The layout of the published ImageNet files (Keras 2's save_weights to
  .h5): attributes layer_names and, per layer group, weight_names."""
  with h5py.File(path, "w") as f:
    f.attrs["layer_names"] = [layer.name.encode() for layer in model.layers]
    f.attrs["backend"], f.attrs["keras_version"] = b"tensorflow", b"2.2.4"
    for layer in model.layers:
      group = f.create_group(layer.name)
      names = [f"{layer.name}/{w.name}:0" for w in layer.weights]
      group.attrs["weight_names"] = [n.encode() for n in names]
      for name, value in zip(names, layer.get_weights()):
        group.create_dataset(name, data=value)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """Keras's random ResNet-50 saved to a weights file and converted."""
  folder = tmp_path_factory.mktemp("keras")
  source = _randomised()
  path = str(folder / "resnet50_weights_tf_dim_ordering_tf_kernels.h5")
  _save_keras2_h5(source, path)
  out = str(folder / "converted")
  convert_keras_weights.convert(path, out, 50, SIZE)
  return source, out


def _images() -> np.ndarray:
  return np.random.default_rng(1).uniform(
      0, 255, (4, SIZE, SIZE, 3)).astype(np.float32)


def test_converted_weights_give_keras_s_logits_on_the_same_images(converted):
  source, out = converted
  record = config_lib.read_config(out)
  assert record["resnet_layout"] == "keras_v1"
  model = export.restore_inference_model(record,
                                         tf.train.latest_checkpoint(out))
  images = _images()
  theirs = source(keras.applications.resnet.preprocess_input(images.copy()),
                  training=False).numpy()
  mine = model(images, training=False).numpy()
  tolerance = 1e-4 * np.abs(theirs).max()
  # The images' logits differ from one another far beyond the tolerance.
  assert np.abs(theirs - theirs.mean(axis=0)).max() > 100 * tolerance
  np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=tolerance)


def test_another_bn_epsilon_moves_into_the_moving_variance(converted):
  source, _ = converted
  images = _images()
  theirs = source(keras.applications.resnet.preprocess_input(images.copy()),
                  training=False).numpy()
  model = build_model(ModelConfig(resnet_depth=50, resnet_layout="keras_v1",
                                  input_normalization="caffe",
                                  image_size=SIZE, bn_epsilon=0.1))
  keras_weights.convert(source, model, 50)
  np.testing.assert_allclose(model(images, training=False).numpy(), theirs,
                             rtol=1e-4, atol=1e-4 * np.abs(theirs).max())
  too_large = build_model(ModelConfig(resnet_depth=50, image_size=SIZE,
                                      resnet_layout="keras_v1",
                                      input_normalization="caffe",
                                      bn_epsilon=5))
  with pytest.raises(ValueError, match="stem_bn: --bn_epsilon=5.0 exceeds "
                     "Keras's 1.001e-05 by more than a moving variance"):
    keras_weights.convert(source, too_large, 50)


def test_the_converted_backbone_fine_tunes_with_another_class_count(
    converted, tmp_path):
  source, out = converted
  cfg = TrainConfig.tiny(str(tmp_path), resnet_depth=50, image_size=SIZE,
                         resnet_layout="keras_v1", num_classes=7,
                         input_normalization="caffe",
                         init_checkpoint=out)
  model = build_model(cfg.model)
  warm_start.warm_start(cfg, model)
  images = _images()
  features = keras.Model(model.input, model.get_layer("avg_pool").output)
  keras_features = keras.Model(source.input, source.get_layer("avg_pool").output)
  np.testing.assert_allclose(
      features(images).numpy(),
      keras_features(keras.applications.resnet.preprocess_input(images.copy())
                     ).numpy(), rtol=1e-4, atol=1e-4)
  assert model.get_layer("logits").kernel.shape == (2048, 7)


def test_a_v1_5_run_is_refused_the_keras_layout(converted, tmp_path):
  _, out = converted
  cfg = TrainConfig.tiny(str(tmp_path), resnet_depth=50, image_size=SIZE,
                         use_synthetic_data=True, init_checkpoint=out)
  with pytest.raises(ConfigError, match="--resnet_layout=keras_v1 there, "
                     "v1.5 here; --input_normalization=caffe there, "
                     "imagenet here"):
    run_lib.run(cfg)


def test_a_file_without_the_classifier_leaves_it_fresh(tmp_path):
  path = str(tmp_path / "notop.weights.h5")
  _randomised(include_top=False).save_weights(path)
  out = str(tmp_path / "converted")
  convert_keras_weights.convert(path, out, 50, SIZE, include_top=False)
  model = export.restore_inference_model(config_lib.read_config(out),
                                         tf.train.latest_checkpoint(out))
  assert not np.any(model.get_layer("logits").bias.numpy())
  with pytest.raises(ValueError, match=r"--keras_weights=.* is not a "
                     r"keras.applications ResNet-50 weights file with the "
                     r"classifier \(--include_top=True\)"):
    convert_keras_weights.convert(path, str(tmp_path / "again"), 50, SIZE)
  with pytest.raises(ValueError, match="--keras_weights=.*missing.h5 does "
                     "not exist"):
    convert_keras_weights.convert(str(tmp_path / "missing.h5"),
                                  str(tmp_path / "again"), 50, SIZE)
  with pytest.raises(ValueError, match="--output_dir=.* already holds a "
                     "checkpoint"):
    convert_keras_weights.convert(path, out, 50, SIZE, include_top=False)


def _md5(path) -> str:
  import hashlib  # pylint: disable=g-import-not-at-top
  return hashlib.md5(open(path, "rb").read()).hexdigest()


def test_imagenet_weights_are_fetched_through_get_file_checked_and_cached(
    tmp_path):
  """--keras_weights=imagenet from a local origin (nothing downloads in a
  test): the file is fetched once, checked against its md5, cached."""
  mirror = tmp_path / "mirror"
  mirror.mkdir()
  name = convert_keras_weights.weights_file_name(50, include_top=False)
  assert name == "resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5"
  _save_keras2_h5(_randomised(include_top=False), str(mirror / name))
  md5 = _md5(mirror / name)
  cache = str(tmp_path / "cache")
  os.mkdir(cache)  # get_file falls back to /tmp/.keras without it
  path = convert_keras_weights.fetch_imagenet_weights(
      50, False, f"file://{mirror}", md5=md5, cache_dir=cache)
  assert path == f"{cache}/models/{name}" and _md5(path) == md5
  (mirror / name).unlink()  # cached: not fetched again
  assert convert_keras_weights.fetch_imagenet_weights(
      50, False, f"file://{mirror}", md5=md5, cache_dir=cache) == path
  out = str(tmp_path / "converted")
  convert_keras_weights.convert(path, out, 50, SIZE, include_top=False)
  assert tf.train.latest_checkpoint(out)


def test_imagenet_weights_that_fail_their_check_or_fetch_are_named(tmp_path):
  mirror = tmp_path / "mirror"
  mirror.mkdir()
  name = convert_keras_weights.weights_file_name(50, include_top=True)
  (mirror / name).write_bytes(b"not the weights")
  cache = str(tmp_path / "cache")
  os.mkdir(cache)
  # Keras's own md5 of the real file: this one fails it.
  with pytest.raises(ValueError, match=rf"fetching file://{mirror}/{name} "
                     "failed .*pass its path as --keras_weights"):
    convert_keras_weights.fetch_imagenet_weights(
        50, True, f"file://{mirror}", cache_dir=cache)
  with pytest.raises(ValueError, match=r"fetching file://.*/none/resnet101"
                     r"_weights_tf_dim_ordering_tf_kernels.h5 failed"):
    convert_keras_weights.fetch_imagenet_weights(
        101, True, f"file://{tmp_path}/none", cache_dir=cache)


def test_the_converted_imagenet_network_names_its_classes(tmp_path):
  """--class_index: Keras's imagenet_class_index.json (a made-up one of
  the same shape, fetched from a local origin) becomes the converted
  run's synsets.txt, which evaluate and predict print."""
  from tools import evaluate  # pylint: disable=g-import-not-at-top
  index = tmp_path / "imagenet_class_index.json"
  index.write_text(json.dumps({str(i): [f"n{i:08d}", f"thing_{i}"]
                               for i in range(1000)}))
  cache = str(tmp_path / "cache")
  os.mkdir(cache)
  fetched = convert_keras_weights.fetched(
      "imagenet_class_index.json", f"file://{index}", _md5(index),
      "--class_index=imagenet", cache)
  weights = str(tmp_path / "resnet50_weights_tf_dim_ordering_tf_kernels.h5")
  _save_keras2_h5(_randomised(), weights)
  out = str(tmp_path / "converted")
  convert_keras_weights.convert(weights, out, 50, SIZE, class_index=fetched)
  labels = config_lib.read_config(out)["labels_file"]
  assert labels == f"{out}/synsets.txt"
  names = evaluate.class_names(labels, 1000)
  assert names[0] == "n00000000 thing_0" and names[281] == (
      "n00000281 thing_281")
  index.write_text(json.dumps({"0": ["n0", "only"]}))
  with pytest.raises(ValueError, match="does not list classes 0-999"):
    convert_keras_weights.write_class_list(str(index), str(tmp_path / "x"))


def test_a_local_weights_file_converts_without_fetching_class_names(
    converted, tmp_path):
  """--class_index=auto fetches names only with --keras_weights=imagenet:
  a file given by path converts offline, without synsets.txt."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  weights = str(tmp_path / "weights.h5")
  _save_keras2_h5(converted[0], weights)
  out = str(tmp_path / "out")
  done = subprocess.run(
      [sys.executable, "-m", "tools.convert_keras_weights",
       f"--keras_weights={weights}", f"--output_dir={out}",
       f"--image_size={SIZE}"], cwd=root, capture_output=True, text=True,
      timeout=300, env=dict(os.environ, https_proxy="http://0.0.0.0:9"))
  assert done.returncode == 0, done.stderr[-2000:]
  assert config_lib.read_config(out)["labels_file"] == ""
  assert not os.path.exists(os.path.join(out, "synsets.txt"))
