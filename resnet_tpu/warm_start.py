"""Fine-tuning: a new run starts from another run's network weights.

--init_checkpoint names a model_dir (its latest checkpoint) or a checkpoint
prefix in one, local or gs://. Only the network's weights are taken: the
backbone's convolutions, BN scales, offsets and moving statistics, and the
classifier when the number of classes is the same. The optimizer state, the
step and the input position start afresh, as in tensorflow/models'
fine-tuning (`init_checkpoint`) and Goyal et al.'s transfer experiments.
With another --num_classes the classifier keeps its fresh initialisation.

The source network is rebuilt from the config.json beside the checkpoint
and restored completely, then copied layer by layer, in order, into the
run's network (under any strategy and BN group size: replica-local moving
statistics get the same values on every replica). A different --bn_epsilon
is folded into the moving variances, so that variance + epsilon, and the
network's inference, stay the source's (as keras_weights.py does for Keras's
epsilon). A network of another depth or layout is refused before start-up,
naming both sides.

On JAX the checkpoint is read by a TensorFlow engine process
(runtime/tensorflow_process.py), which writes the source network's weights
to a .npz (`write_weights`); the JAX run loads them into the same network
built on JAX and copies it as above (`warm_start_from_weights`).
`fine_tune` takes the engine's way. Either engine's runs can seed either.
"""
import dataclasses
import os
import tempfile
from typing import Callable, Sequence

from absl import logging
import keras
import numpy as np
import tensorflow as tf

from resnet_tpu import config as config_lib
from resnet_tpu import export
from resnet_tpu.config import ConfigError
from resnet_tpu.config import TrainConfig
from resnet_tpu.model.resnet import build_model
from resnet_tpu.runtime import tensorflow_process
from resnet_tpu.train.checkpoints import paths


@dataclasses.dataclass(frozen=True)
class Source:
  """The checkpoint --init_checkpoint names and its run's config.json."""
  checkpoint: str
  config: dict


def find_source(init_checkpoint: str) -> Source:
  """Resolves --init_checkpoint; ConfigError when it is not a checkpoint of
  a run (no checkpoint, no config.json beside it)."""
  if tf.io.gfile.isdir(init_checkpoint):
    model_dir = init_checkpoint
    path = paths.latest(model_dir)
    if not path:
      raise ConfigError(f"--init_checkpoint={init_checkpoint!r} holds no "
                        "checkpoint (a run's model_dir or a checkpoint "
                        "prefix such as <model_dir>/ckpt-1000).")
  else:
    model_dir, path = os.path.dirname(init_checkpoint), init_checkpoint
    npz = path.endswith(paths.NPZ_SUFFIX)
    if not tf.io.gfile.exists(path if npz else path + ".index"):
      raise ConfigError(f"--init_checkpoint={init_checkpoint!r} is neither "
                        f"a folder nor a checkpoint prefix ({path}.index "
                        "does not exist) nor a JAX run's .npz checkpoint.")
  try:
    record = config_lib.read_config(model_dir)
  except ConfigError as error:
    raise ConfigError(f"--init_checkpoint={init_checkpoint!r}: {error}") \
        from None
  return Source(path, record)


def check_compatible(cfg: TrainConfig, source: Source) -> None:
  """Raises ConfigError when the source network cannot seed this one."""
  mine = cfg.flat()
  theirs = export.config_from_record(source.config).flat()
  differ = [f"--{key}={theirs[key]} there, {mine[key]} here"
            for key in ("resnet_depth", "resnet_layout",
                        "input_normalization", "image_size")
            if theirs[key] != mine[key]]
  if differ:
    raise ConfigError(
        f"--init_checkpoint={source.checkpoint!r} is another network "
        f"({'; '.join(differ)}); fine-tuning keeps the depth, the layout, "
        "the input normalisation and the image size of the network it "
        "starts from.")


def _weighted(model: keras.Model) -> list[keras.layers.Layer]:
  return [layer for layer in model.layers if layer.weights]


def copy_weights(source: keras.Model, target: keras.Model) -> list[str]:
  """Copies every layer's weights from `source` into `target`, in order;
  the last layer (the classifier) only when its shapes match. Returns the
  names of the layers left as initialised; ConfigError names a layer whose
  weights differ in number or shape."""
  theirs, mine = _weighted(source), _weighted(target)
  if len(theirs) != len(mine):
    raise ConfigError(
        f"The checkpoint's network has {len(theirs)} layers with weights, "
        f"this run's {len(mine)}: not the same network.")
  kept = []
  for index, (src, dst) in enumerate(zip(theirs, mine)):
    shapes = ([tuple(w.shape) for w in src.weights],
              [tuple(w.shape) for w in dst.weights])
    if shapes[0] != shapes[1]:
      if index == len(mine) - 1:  # the classifier of another class count
        kept.append(dst.name)
        continue
      raise ConfigError(
          f"Layer {dst.name} has weights of shapes {shapes[1]} here, "
          f"{shapes[0]} in the checkpoint ({src.name}).")
    for s, d in zip(src.weights, dst.weights):
      d.assign(keras.ops.cast(s, d.dtype))
    if isinstance(dst, keras.layers.BatchNormalization):
      fold_epsilon(src, dst)
  return kept


def fold_epsilon(source: keras.layers.BatchNormalization,
                 target: keras.layers.BatchNormalization) -> None:
  """Moves the difference of the two layers' epsilons into `target`'s
  moving variance (already copied from `source`): its inference is then
  the source's. ConfigError when the variance would not stay positive."""
  if source.epsilon == target.epsilon:
    return
  variance = (keras.ops.convert_to_numpy(target.moving_variance) +
              source.epsilon - target.epsilon)
  if (variance <= 0).any():
    raise ConfigError(
        f"{target.name}: --bn_epsilon={target.epsilon} exceeds the "
        f"checkpoint's {source.epsilon} by more than a moving variance; "
        "fine-tune with --bn_epsilon at most the checkpoint's.")
  target.moving_variance.assign(variance)


def warm_start(cfg: TrainConfig, target: keras.Model,
               build: Callable[[TrainConfig], keras.Model] | None = None
               ) -> None:
  """Sets `target`'s weights from cfg's --init_checkpoint (see above);
  `build` builds the source network from its config (default: the
  ResNet builder, as the export does)."""
  source = find_source(cfg.run.init_checkpoint)
  check_compatible(cfg, source)
  source_cfg = export.config_from_record(source.config)
  if build is None:
    network = export.restore_inference_model(source.config,
                                             source.checkpoint)
  else:
    network = build(source_cfg.replace(precision="float32"))
    tf.train.Checkpoint(model=network).restore(
        source.checkpoint).expect_partial().assert_existing_objects_matched()
  _copy_and_log(cfg, source, network, target)


def write_weights(init_checkpoint: str, path: str) -> None:
  """Writes the weights of --init_checkpoint's network (float32, in Keras's
  weight order) to the .npz `path`: the TensorFlow side of a JAX run's
  fine-tuning."""
  source = find_source(init_checkpoint)
  network = export.restore_inference_model(source.config, source.checkpoint)
  np.savez(path, *network.get_weights())


def warm_start_from_weights(cfg: TrainConfig, target: keras.Model,
                            weights: Sequence[np.ndarray]) -> None:
  """Sets `target`'s weights from `weights` (write_weights' of cfg's
  --init_checkpoint) through the source's network, built on this engine."""
  source = find_source(cfg.run.init_checkpoint)
  source_cfg = export.config_from_record(source.config).replace(
      precision="float32")
  network = build_model(source_cfg.model, source_cfg.distribution)
  network.set_weights(list(weights))
  _copy_and_log(cfg, source, network, target)


def source_weights(init_checkpoint: str) -> list[np.ndarray]:
  """The weights of --init_checkpoint's network, read in a TensorFlow
  process (write_weights): the source of a JAX run's fine-tuning."""
  with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "weights.npz")
    code = tensorflow_process.in_tensorflow("warm_start.write_weights",
                                            init_checkpoint, path)
    if code:
      raise ConfigError(
          f"--init_checkpoint={init_checkpoint!r}: reading its network "
          f"failed (its TensorFlow process exited {code}; its error is "
          "above).")
    with np.load(path) as saved:
      return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def fine_tune(cfg: TrainConfig, target: keras.Model,
              build: Callable[[TrainConfig], keras.Model] | None = None
              ) -> None:
  """Sets `target`'s weights from cfg's --init_checkpoint: read in this
  process on TensorFlow (warm_start), in a TensorFlow one from JAX."""
  if keras.backend.backend() == "tensorflow":
    warm_start(cfg, target, build)
  else:
    warm_start_from_weights(cfg, target,
                            source_weights(cfg.run.init_checkpoint))


def _copy_and_log(cfg: TrainConfig, source: Source, network: keras.Model,
                  target: keras.Model) -> None:
  fresh = copy_weights(network, target)
  logging.info("Fine-tuning from %s: network weights restored%s; optimizer, "
               "step and input start afresh.", source.checkpoint,
               f", {', '.join(fresh)} freshly initialised "
               f"({source.config['num_classes']} classes there, "
               f"{cfg.model.num_classes} here)" if fresh else "")
