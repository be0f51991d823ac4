"""keras.applications' ImageNet ResNet weights as a run this project starts from.

  python -m tools.convert_keras_weights --keras_weights=imagenet \
      --output_dir=gs://bucket/keras_resnet50 [--depth=50] [--image_size=224]
  python main.py --flagfile=flags/... --resnet_layout=keras_v1 \
      --input_normalization=caffe --init_checkpoint=gs://bucket/keras_resnet50 --num_classes=N ...

--keras_weights is a weights file: `imagenet` fetches keras.applications'
own file through keras.utils.get_file, from --keras_weights_origin (Keras's
bucket; a mirror on a host without that network), checked against Keras's
md5 and cached in ~/.keras/models; or a path to a file downloaded
elsewhere. With the classifier ("..._tf_kernels.h5", 1,000 ImageNet
classes in synset order, which is this project's label order) the output
gets a synsets.txt naming them, from Keras's class index (--class_index,
fetched the same way), which predict, evaluate and the export print; or
without it (--noinclude_top, "..._notop.h5": the classifier stays freshly
initialised, so fine-tune it with another --num_classes or train it). The
output folder holds a checkpoint and a config.json, as a run's model_dir
does: the network built with --resnet_layout=keras_v1 and
--input_normalization=caffe, Keras's BN momentum and epsilon, and the
weights converted exactly (resnet_tpu/model/keras_weights.py).
tools.evaluate and tools.export_savedmodel read it as they read a run.
"""
import json
import os
import sys

from absl import app
from absl import flags
from absl import logging
import keras
import tensorflow as tf

if not __package__:  # run as a file: the repository's root on the path
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))

from resnet_tpu import config as config_lib
from resnet_tpu.config import TrainConfig
from resnet_tpu.model import keras_weights
from resnet_tpu.model.resnet import build_model

FLAGS = flags.FLAGS
KERAS_RESNETS = {50: "ResNet50", 101: "ResNet101", 152: "ResNet152"}
IMAGENET_CLASSES = 1000
# Where keras.applications fetches its ResNet weights, and their md5 (with
# the classifier, without): BASE_WEIGHTS_PATH and WEIGHTS_HASHES of
# keras-team/keras v3.15.1, keras/src/applications/resnet.py.
KERAS_WEIGHTS_ORIGIN = (
    "https://storage.googleapis.com/tensorflow/keras-applications/resnet/")
KERAS_WEIGHTS_MD5 = {
    50: ("2cb95161c43110f7111970584f804107",
         "4d473c1dd8becc155b73f8504c6f6626"),
    101: ("f1aeb4b969a6efcfb50fad2f0c20cfc5",
          "88cf7a10940856eca736dc7b7e228a21"),
    152: ("100835be76be38e30d865e96f2aaae62",
          "ee4c566cf9a93f14d82f913c2dc6dd0c"),
}


def define_flags() -> None:
  flags.DEFINE_string("keras_weights", None, "keras.applications ResNet "
                      "weights file (.h5 or .weights.h5), or imagenet: "
                      "Keras's own, fetched from --keras_weights_origin.")
  flags.DEFINE_string("keras_weights_origin", KERAS_WEIGHTS_ORIGIN,
                      "Where --keras_weights=imagenet fetches the file "
                      "from (a URL of the folder; file:// for a local "
                      "mirror).")
  flags.DEFINE_string("output_dir", None, "Folder to write the checkpoint "
                      "and config.json into (local or gs://).")
  flags.DEFINE_enum("depth", "50", [str(d) for d in KERAS_RESNETS],
                    "ResNet depth of the weights file.")
  flags.DEFINE_integer("image_size", 224, "--image_size of the runs that "
                       "will start from it (the weights fit any size).")
  flags.DEFINE_string("class_index", "auto", "The classes' names: "
                      "imagenet fetches Keras's imagenet_class_index.json "
                      "(as decode_predictions does), or its path; '' for "
                      "none; auto: imagenet with --keras_weights=imagenet, "
                      "else none (nothing fetched for a local file). "
                      "Written as synsets.txt beside the checkpoint.")
  flags.DEFINE_bool("include_top", True, "The file holds the 1,000-class "
                    "classifier (false for the _notop files).")


# Keras's ImageNet class index, as decode_predictions fetches it: its URL
# and md5 (keras-team/keras v3.15.1,
# keras/src/applications/imagenet_utils.py: CLASS_INDEX_PATH).
CLASS_INDEX_URL = ("https://storage.googleapis.com/download.tensorflow.org/"
                   "data/imagenet_class_index.json")
CLASS_INDEX_MD5 = "c2c37ea517e94d9795004a39431a14cb"


def weights_file_name(depth: int, include_top: bool) -> str:
  """keras.applications' name of the ResNet-<depth> ImageNet file."""
  top = "" if include_top else "_notop"
  return f"resnet{depth}_weights_tf_dim_ordering_tf_kernels{top}.h5"


def fetched(name: str, url: str, md5: str, flag: str,
            cache_dir: str | None = None) -> str:
  """`url` through keras.utils.get_file, as keras.applications fetches
  (cached in ~/.keras/models, not fetched again; checked against `md5`);
  ValueError names `flag`, the URL and what failed."""
  try:
    return keras.utils.get_file(name, url, cache_subdir="models",
                                file_hash=md5, cache_dir=cache_dir)
  except Exception as error:  # pylint: disable=broad-except
    reason = (str(error).strip().splitlines() or [""])[0]
    raise ValueError(
        f"{flag}: fetching {url} failed ({type(error).__name__}: {reason}). "
        f"Download it elsewhere and pass its path as {flag.split('=')[0]}."
        ) from None


def fetch_imagenet_weights(depth: int, include_top: bool,
                           origin: str = KERAS_WEIGHTS_ORIGIN,
                           md5: str = "", cache_dir: str | None = None
                           ) -> str:
  """--keras_weights=imagenet: Keras's weights file of `origin` (a folder
  URL), checked against KERAS_WEIGHTS_MD5 (unless `md5`); returns its
  path (`fetched`)."""
  name = weights_file_name(depth, include_top)
  return fetched(name, origin.rstrip("/") + "/" + name,
                 md5 or KERAS_WEIGHTS_MD5[depth][0 if include_top else 1],
                 "--keras_weights=imagenet", cache_dir)


def write_class_list(class_index_path: str, output_dir: str) -> str:
  """synsets.txt of the converted network's 1,000 classes from Keras's
  class index ({"0": ["n01440764", "tench"], ...}): `<i>\t<synset>
  <name>` a line, the names predict and evaluate print. Returns its
  path."""
  with tf.io.gfile.GFile(class_index_path) as f:
    index = json.load(f)
  if sorted(index, key=int) != [str(i) for i in range(IMAGENET_CLASSES)]:
    raise ValueError(f"--class_index={class_index_path} does not list "
                     f"classes 0-{IMAGENET_CLASSES - 1} (Keras's "
                     "imagenet_class_index.json).")
  path = os.path.join(output_dir, "synsets.txt")
  tf.io.gfile.makedirs(output_dir)
  with tf.io.gfile.GFile(path, "w") as f:
    f.write("".join(f"{i}\t{index[str(i)][0]} {index[str(i)][1]}\n"
                    for i in range(IMAGENET_CLASSES)))
  return path


def keras_model(path: str, depth: int, image_size: int,
                include_top: bool) -> keras.Model:
  """keras.applications.ResNet<depth> with the weights of `path`, returning
  logits; ValueError names a file that is missing or of another network."""
  if not tf.io.gfile.exists(path):
    raise ValueError(f"--keras_weights={path} does not exist.")
  builder = getattr(keras.applications, KERAS_RESNETS[depth])
  try:
    return builder(weights=path, include_top=include_top,
                   classifier_activation=None,
                   input_shape=(image_size, image_size, 3))
  except (ValueError, OSError) as error:
    raise ValueError(
        f"--keras_weights={path} is not a keras.applications ResNet-{depth} "
        f"weights file {'with' if include_top else 'without'} the "
        f"classifier (--include_top={include_top}): {error}") from None


def converted_config(output_dir: str, depth: int, image_size: int,
                     keras_bn: keras.layers.Layer) -> TrainConfig:
  """The config of the converted network: Keras's layout and BN."""
  return TrainConfig.from_flat(
      output_dir, resnet_depth=depth, resnet_layout="keras_v1",
      input_normalization="caffe", num_classes=IMAGENET_CLASSES, image_size=image_size,
      bn_momentum=float(keras_bn.momentum), bn_epsilon=float(keras_bn.epsilon),
      use_synthetic_data=True, train_steps=1)


def convert(path: str, output_dir: str, depth: int = 50,
            image_size: int = 224, include_top: bool = True,
            class_index: str = "") -> str:
  """Writes the converted checkpoint and config.json (with synsets.txt
  from `class_index`, Keras's imagenet_class_index.json, when given);
  returns the checkpoint's path. ValueError names what is wrong with the
  inputs."""
  if tf.train.latest_checkpoint(output_dir):
    raise ValueError(f"--output_dir={output_dir} already holds a checkpoint.")
  source = keras_model(path, depth, image_size, include_top)
  cfg = converted_config(output_dir, depth, image_size,
                         source.get_layer("conv1_bn"))
  model = build_model(cfg.model)
  if not keras_weights.convert(source, model, depth):
    logging.warning("No classifier in %s: the logits layer keeps its fresh "
                    "initialisation; fine-tune with another --num_classes.",
                    path)
  checkpoint = tf.train.CheckpointManager(
      tf.train.Checkpoint(model=model), output_dir, max_to_keep=1).save(
          checkpoint_number=0)
  labels = (write_class_list(class_index, output_dir)
            if class_index and include_top else "")
  config_lib.write_config(cfg, labels)
  return checkpoint


def main(argv: list[str]) -> None:
  del argv
  try:
    if not FLAGS.keras_weights or not FLAGS.output_dir:
      raise ValueError("Set --keras_weights and --output_dir.")
    path = FLAGS.keras_weights
    if path == "imagenet":
      path = fetch_imagenet_weights(int(FLAGS.depth), FLAGS.include_top,
                                    FLAGS.keras_weights_origin)
    class_index = FLAGS.class_index
    if class_index == "auto":
      class_index = "imagenet" if FLAGS.keras_weights == "imagenet" else ""
    if class_index == "imagenet":
      class_index = fetched("imagenet_class_index.json", CLASS_INDEX_URL,
                            CLASS_INDEX_MD5, "--class_index=imagenet")
    checkpoint = convert(path, FLAGS.output_dir, int(FLAGS.depth),
                         FLAGS.image_size, FLAGS.include_top, class_index)
  except ValueError as error:
    raise app.UsageError(str(error)) from error
  print(f"Wrote {checkpoint}. Fine-tune from it with --resnet_layout=keras_v1 "
        f"--input_normalization=caffe --resnet_depth={FLAGS.depth} --image_size={FLAGS.image_size} "
        f"--init_checkpoint={FLAGS.output_dir}", flush=True)


if __name__ == "__main__":
  define_flags()
  app.run(main)
