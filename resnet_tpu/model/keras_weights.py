"""keras.applications' ResNet weights in this project's network.

--resnet_layout=keras_v1 --input_normalization=caffe builds the network of
keras.applications.ResNet50
(and 101, 152): He et al. 2016's v1, as keras-team/keras
keras/src/applications/resnet.py builds it. `convert` copies its weights
layer by layer. Three differences are of form only, and are folded exactly:
- Keras's convs carry biases. A BN follows every conv, and a bias b only
  shifts what BN subtracts: BN(conv + b) with moving mean m equals BN(conv)
  with moving mean m - b (in training the batch mean absorbs b as well).
- Keras feeds BGR images minus the Caffe means (`preprocess_input`). This
  network takes RGB and subtracts the same means itself
  (resnet.input_normalization), so the stem conv's input channels are
  reversed instead of the images.
- Keras's BN epsilon (1.001e-5) may differ from --bn_epsilon: the difference
  moves into the moving variance, so var + epsilon stays Keras's.
"""
import keras
import numpy as np

from resnet_tpu.model.resnet import LAYERS


def layer_pairs(depth: int) -> list[tuple[str, str, str, str]]:
  """(our conv, our BN, Keras's conv, Keras's BN) for every conv of a
  bottleneck ResNet of `depth`; Keras's stage k+1 is our stage k."""
  pairs = [("stem_conv", "stem_bn", "conv1_conv", "conv1_bn")]
  for stage, blocks in enumerate(LAYERS[depth][1], start=1):
    for block in range(1, blocks + 1):
      ours, theirs = f"stage{stage}_block{block}", f"conv{stage + 1}_block{block}"
      if block == 1:
        pairs.append((ours + "_proj", ours + "_proj_bn",
                      theirs + "_0_conv", theirs + "_0_bn"))
      for conv in (1, 2, 3):
        pairs.append((f"{ours}_conv{conv}", f"{ours}_bn{conv}",
                      f"{theirs}_{conv}_conv", f"{theirs}_{conv}_bn"))
  return pairs


def _layer(model: keras.Model, name: str, which: str) -> keras.layers.Layer:
  try:
    return model.get_layer(name)
  except ValueError:
    raise ValueError(f"{which} has no layer {name!r}: not the ResNet of the "
                     "other side (depth or layout differ).") from None


def _assign(variable, value: np.ndarray, name: str) -> None:
  if tuple(variable.shape) != value.shape:
    raise ValueError(f"{name}: shape {tuple(variable.shape)} here, "
                     f"{value.shape} in the Keras model.")
  variable.assign(value.astype(variable.dtype))


def convert(keras_model: keras.Model, model: keras.Model, depth: int) -> bool:
  """Sets `model` (built with --resnet_layout=keras_v1,
  --input_normalization=caffe and `depth`) to the
  weights of `keras_model` (keras.applications.ResNet<depth>). Returns
  whether the classifier was converted too (Keras's `predictions` layer,
  absent with include_top=False). ValueError names a layer that is missing
  or of another shape."""
  for conv, bn, keras_conv, keras_bn in layer_pairs(depth):
    kernel, bias = _layer(keras_model, keras_conv, "the Keras model").get_weights()
    if conv == "stem_conv":
      kernel = kernel[:, :, ::-1, :]  # BGR input channels -> RGB
    theirs = _layer(keras_model, keras_bn, "the Keras model")
    gamma, beta, mean, variance = theirs.get_weights()
    mine = _layer(model, bn, "this network")
    variance = variance + theirs.epsilon - mine.epsilon
    if np.any(variance <= 0):
      raise ValueError(f"{bn}: --bn_epsilon={mine.epsilon} exceeds Keras's "
                       f"{theirs.epsilon} by more than a moving variance.")
    _assign(_layer(model, conv, "this network").kernel, kernel, conv)
    for variable, value in ((mine.gamma, gamma), (mine.beta, beta),
                            (mine.moving_mean, mean - bias),
                            (mine.moving_variance, variance)):
      _assign(variable, value, bn)
  if "predictions" not in [layer.name for layer in keras_model.layers]:
    return False
  kernel, bias = keras_model.get_layer("predictions").get_weights()
  logits = model.get_layer("logits")
  _assign(logits.kernel, kernel, "logits")
  _assign(logits.bias, bias, "logits")
  return True
