"""SavedModel export for serving, free of the collectives of distributed BN.

A run writes `<model_dir>/config.json` (config.write_config), so the
export and evaluation tools need only --model_dir to rebuild the network.
`export_saved_model` builds that network OUTSIDE any distribution strategy in
float32 (even after bfloat16 training: the checkpoint variables are float32),
restores only the model weights of a checkpoint and saves a SavedModel in
inference mode. Distributed BN (Ying et al. 2018, §3.1) normalises with its
moving statistics there, so the graph holds no collective op and loads with
plain `tf.saved_model.load` in a process that never imported resnet_tpu.

Signatures (each returns `logits` float32 [N, C], `probabilities` float32
[N, C] and `top5_classes` int32 [N, min(5, C)], class ids 0-based):
  serving_default  images: float32 [N, S, S, 3], raw RGB pixels in 0..255
  serve_uint8      images: uint8 [N, S, S, 3]
  serve_jpeg       image_bytes: string [N], encoded JPEGs, preprocessed exactly
                   as the training-time eval (preprocessing.preprocess_for_eval
                   with the run's --eval_crop_fraction)
The loaded object's `serve` function accepts both float32 and uint8 images.
It also carries `image_size`, `num_classes` and `label_offset` (int variables;
label_offset is what the run subtracted from TFRecord labels),
`eval_crop_fraction` (a float variable) and, when the
data_dir of the run had one, `labels_file`: an asset copied from the
`synsets.txt` of data/build_tfrecords.py (`<class id>\\t<synset>` per line).
"""

from absl import logging
import keras
import tensorflow as tf

from resnet_tpu import config as config_lib
from resnet_tpu.inputs import class_list
from resnet_tpu.inputs import preprocessing
from resnet_tpu.config import TrainConfig
from resnet_tpu.model.resnet import build_model
from resnet_tpu.train.checkpoints import paths
from resnet_tpu.train.checkpoints.tf_files import weights_module

# Written by data/build_tfrecords.py next to the TFRecords.
LABELS_FILE = class_list.SYNSETS_FILE
TOP_K = 5


def labels_file(data_dir: str) -> str:
  """The synsets.txt of `data_dir` when it exists, else ""."""
  return class_list.path(data_dir)


def eval_crop_fraction(config: dict) -> float:
  """The run's --eval_crop_fraction; runs older than the flag get 0.875.

  Those runs evaluated with image_size / (image_size + 32), which is 0.875
  at 224 px and too tight below (preprocessing.py).
  """
  return float(config.get("eval_crop_fraction",
                          preprocessing.EVAL_CROP_FRACTION))


def checkpoint_path(model_dir: str, checkpoint: str = "") -> str:
  """`checkpoint` if given, else the latest checkpoint of `model_dir`
  (TensorFlow's, or the .npz of a JAX run without TensorFlow)."""
  path = checkpoint or paths.latest(model_dir)
  if not path:
    raise config_lib.ConfigError(
        f"--model_dir={model_dir!r} holds no checkpoint; train first or pass "
        "--checkpoint.")
  npz = path.endswith(paths.NPZ_SUFFIX)
  if not tf.io.gfile.exists(path if npz else path + ".index"):
    raise config_lib.ConfigError(
        f"--checkpoint={path!r} is not a checkpoint (expected {path}.index, "
        f"e.g. {model_dir}/ckpt-100, or a .npz file: {model_dir}/"
        "ckpt-100.npz).")
  return path


def config_from_record(record: dict) -> TrainConfig:
  """The TrainConfig of a config.json record (fields it lacks: defaults)."""
  names = {"model_dir", *config_lib.FLAG_FIELDS}
  return TrainConfig.from_flat(
      **{k: v for k, v in record.items() if k in names})


def restore_inference_model(config: dict, path: str) -> keras.Model:
  """The float32 network of `config` with the model weights of `path`.

  Built outside any strategy; the optimizer state in the checkpoint is
  ignored, but every model variable must be restored.
  """
  cfg = config_from_record(config).replace(precision="float32")
  model = build_model(cfg.model, cfg.distribution)
  if path.endswith(paths.NPZ_SUFFIX):
    _restore_npz(model, path, config)
    return model
  # A JAX run's checkpoint holds the weights in model order
  # (engines/jax/tf_checkpoints.py); read here through the same layout.
  saved = (weights_module(model.trainable_variables,
                          model.non_trainable_variables)
           if config.get("backend") == "jax" else model)
  try:
    tf.train.Checkpoint(model=saved).restore(
        path).expect_partial().assert_existing_objects_matched()
  except (AssertionError, ValueError) as error:
    raise config_lib.ConfigError(
        f"checkpoint {path} does not match the ResNet-"
        f"{config['resnet_depth']} of {config_lib.CONFIG_FILE}: "
        f"{error}") from error
  return model


def _restore_npz(model: keras.Model, path: str, config: dict) -> None:
  """Sets `model`'s variables from the .npz checkpoint of a JAX run
  without TensorFlow (engines/jax/npz_checkpoints.py: each group's arrays in the
  Keras model's variable order)."""
  arrays = paths.read_npz(path)
  for group, variables in (("trainable", model.trainable_variables),
                           ("non_trainable", model.non_trainable_variables)):
    count = sum(name.startswith(f"{group}_") for name in arrays)
    for i, variable in enumerate(variables):
      value = arrays.get(paths.npz_key(group, i))
      if count != len(variables) or value is None or (
          value.shape != tuple(variable.shape)):
        raise config_lib.ConfigError(
            f"checkpoint {path} does not match the ResNet-"
            f"{config['resnet_depth']} of {config_lib.CONFIG_FILE}: its "
            f"{count} {group} arrays are not the network's "
            f"{len(variables)} (the first to differ: {variable.path}).")
      variable.assign(value)


class ServingModule(tf.Module):
  """The exported object: a Keras model and its three serving functions."""

  def __init__(self, model: keras.Model, config: dict):
    super().__init__(name="resnet_serving")
    self.model = model
    self._size = config["image_size"]
    self._crop_fraction = eval_crop_fraction(config)
    self.image_size = tf.Variable(self._size, trainable=False)
    self.num_classes = tf.Variable(config["num_classes"], trainable=False)
    self.label_offset = tf.Variable(config["label_offset"], trainable=False)
    self.eval_crop_fraction = tf.Variable(self._crop_fraction,
                                          trainable=False)
    labels = config.get("labels_file", "")
    if labels and tf.io.gfile.exists(labels):
      self.labels_file = tf.saved_model.Asset(labels)
    elif labels:
      logging.warning("Labels file %s not found; exporting without it.",
                      labels)

  def _outputs(self, images: tf.Tensor) -> dict:
    logits = tf.cast(self.model(images, training=False), tf.float32)
    k = min(TOP_K, logits.shape[-1])
    return {"logits": logits,
            "probabilities": tf.nn.softmax(logits),
            "top5_classes": tf.math.top_k(logits, k).indices}

  @tf.function
  def serve(self, images: tf.Tensor) -> dict:
    """Images [N, S, S, 3] in 0..255, float32 or uint8 -> outputs."""
    return self._outputs(tf.cast(images, tf.float32))

  @tf.function
  def serve_jpeg(self, image_bytes: tf.Tensor) -> dict:
    """Encoded JPEGs [N] -> the eval preprocessing -> outputs."""
    size, fraction = self._size, self._crop_fraction
    images = tf.map_fn(
        lambda b: preprocessing.preprocess_for_eval(b, size, fraction),
        image_bytes,
        fn_output_signature=tf.TensorSpec([size, size, 3], tf.uint8))
    return self._outputs(tf.cast(images, tf.float32))

  def serving_signatures(self) -> dict:
    """serving_default (float32), serve_uint8 and serve_jpeg."""
    shape = [None, self._size, self._size, 3]
    return {
        "serving_default": self.serve.get_concrete_function(
            tf.TensorSpec(shape, tf.float32, name="images")),
        "serve_uint8": self.serve.get_concrete_function(
            tf.TensorSpec(shape, tf.uint8, name="images")),
        "serve_jpeg": self.serve_jpeg.get_concrete_function(
            tf.TensorSpec([None], tf.string, name="image_bytes")),
    }


def export_saved_model(model_dir: str, export_dir: str,
                       checkpoint: str = "") -> str:
  """Exports the latest (or the named) checkpoint of a run; returns its path."""
  config = config_lib.read_config(model_dir)
  path = checkpoint_path(model_dir, checkpoint)
  module = ServingModule(restore_inference_model(config, path), config)
  tf.saved_model.save(module, export_dir,
                      signatures=module.serving_signatures())
  logging.info("Exported %s (ResNet-%d, %dpx, eval crop %.3f, %d classes) "
               "to %s", path, config["resnet_depth"], config["image_size"],
               eval_crop_fraction(config), config["num_classes"], export_dir)
  return path
