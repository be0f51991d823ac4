"""ResNet v1.5 (Goyal et al. 2017) as used by Ying et al. 2018."""
import keras
import numpy as np
import pytest

from resnet_tpu.model.distributed_batch_norm import DistributedBatchNormalization
from resnet_tpu.config import ModelConfig
from resnet_tpu.model.resnet import build_model
from resnet_tpu.model.resnet import build_resnet
from resnet_tpu.model.resnet import stem_max_pool

KERAS_RESNET50_PARAMS = 25_636_712  # keras.applications.ResNet50, 1000 classes
KERAS_CONV_BIASES = 26_560  # its conv biases; ours has none (BN follows)


@pytest.fixture(scope="module")
def resnet50():
  return build_resnet(50, 1000, 224)


def test_resnet50_has_keras_parameter_count_less_conv_biases(resnet50):
  assert resnet50.count_params() == KERAS_RESNET50_PARAMS - KERAS_CONV_BIASES
  trainable = sum(int(np.prod(v.shape)) for v in resnet50.trainable_variables)
  assert trainable == 25_557_032  # the 25.6M of the papers


def test_v1_5_downsamples_in_the_3x3_conv_of_the_bottleneck(resnet50):
  for stage in (2, 3, 4):
    block = f"stage{stage}_block1"
    assert resnet50.get_layer(block + "_conv1").strides == (1, 1)
    assert resnet50.get_layer(block + "_conv2").strides == (2, 2)
    assert resnet50.get_layer(block + "_proj").strides == (2, 2)
  assert resnet50.get_layer("stage1_block1_conv2").strides == (1, 1)
  assert resnet50.get_layer("stage4_block3_out").output.shape[1:3] == (7, 7)


def test_last_bn_of_each_residual_block_starts_at_zero_gamma(resnet50):
  bns = [l for l in resnet50.layers
         if isinstance(l, DistributedBatchNormalization)]
  zero = [l.name for l in bns if not np.any(l.gamma.numpy())]
  assert len(bns) == 53
  assert sorted(zero) == sorted(f"stage{s}_block{b}_bn3"
                                for s, n in zip((1, 2, 3, 4), (3, 4, 6, 3))
                                for b in range(1, n + 1))


def test_every_bn_uses_the_requested_group_size():
  model = build_resnet(18, 10, 32, bn_group_size=4)
  groups = {l.group_size for l in model.layers
            if isinstance(l, DistributedBatchNormalization)}
  assert groups == {4}


def test_bfloat16_policy_keeps_logits_float32():
  previous = keras.config.dtype_policy()
  keras.config.set_dtype_policy("mixed_bfloat16")
  try:
    model = build_resnet(18, 10, 32)
  finally:
    keras.config.set_dtype_policy(previous)
  assert model.get_layer("stem_conv").compute_dtype == "bfloat16"
  assert model.get_layer("logits").compute_dtype == "float32"
  out = model(np.zeros((2, 32, 32, 3), np.float32), training=True)
  assert out.dtype == "float32"


def test_v1_layout_downsamples_in_the_first_1x1_conv_as_keras_does():
  model = build_resnet(50, 1000, 224, layout="keras_v1")
  for stage in (2, 3, 4):
    block = f"stage{stage}_block1"
    assert model.get_layer(block + "_conv1").strides == (2, 2)
    assert model.get_layer(block + "_conv2").strides == (1, 1)
  assert model.count_params() == KERAS_RESNET50_PARAMS - KERAS_CONV_BIASES
  keras_model = keras.applications.ResNet50(weights=None)
  for ours, theirs in (("stage2_block1_conv1", "conv3_block1_1_conv"),
                       ("stage2_block1_conv2", "conv3_block1_2_conv")):
    assert (model.get_layer(ours).output.shape ==
            keras_model.get_layer(theirs).output.shape)


def test_conv_kernels_start_with_variance_1_over_fan_in_as_tensorflow_tpu():
  # tf.variance_scaling_initializer(): scale 1, fan_in, truncated normal;
  # Keras's he_normal would give 2 / fan_in.
  model = build_resnet(50, 10, 32)
  for name in ("stage4_block1_conv2", "stage3_block2_conv1", "stem_conv"):
    kernel = model.get_layer(name).kernel.numpy()
    fan_in = np.prod(kernel.shape[:-1])
    assert kernel.var() * fan_in == pytest.approx(1.0, rel=0.05), name
    # Truncated at 2 standard deviations of the underlying normal.
    assert np.abs(kernel).max() <= 2 / 0.8796 / np.sqrt(fan_in) * 1.001


def test_stem_max_pool_output_i_covers_inputs_2i_to_2i_plus_2():
  # One-hot inputs show the window of each output: SAME pads 0 before and 1
  # after an even side (tensorflow/tpu), so output 0 covers inputs 0..2.
  size = 8
  inputs = keras.Input((size, size, 1))
  pool = keras.Model(inputs, stem_max_pool(inputs))
  covered = np.zeros((size // 2, size), bool)
  for i in range(size):
    one_hot = np.zeros((1, size, size, 1), np.float32)
    one_hot[0, i, i] = 1.0
    pooled = np.asarray(pool(one_hot))[0, :, :, 0]
    assert (pooled > 0).sum(0).tolist() == (pooled > 0).sum(1).tolist()
    covered[:, i] = pooled.max(1) > 0
  windows = [list(np.flatnonzero(row)) for row in covered]
  assert windows == [[0, 1, 2], [2, 3, 4], [4, 5, 6], [6, 7]]


def test_conv_init_zero_gamma_and_input_normalization_follow_their_flags():
  """--conv_init, --zero_init_gamma, --input_normalization (the ladder's
  stock choices, issue 36) reach every conv, block and the input."""
  model = build_model(ModelConfig(
      resnet_depth=50, num_classes=10, image_size=64, conv_init="he_normal",
      zero_init_gamma=False, input_normalization="unit"))
  convs = [l for l in model.layers if isinstance(l, keras.layers.Conv2D)]
  gains = [np.std(l.kernel.numpy()) * np.sqrt(np.prod(l.kernel.shape[:-1]))
           for l in convs]
  assert np.median(gains) == pytest.approx(2 ** 0.5, rel=0.1)
  assert min(gains) > 1.2  # the stem too
  assert all(np.all(l.gamma.numpy() == 1) for l in model.layers
             if isinstance(l, keras.layers.BatchNormalization))
  normalize = model.get_layer("normalize")
  np.testing.assert_allclose(normalize.mean.numpy().ravel(), 0)
  np.testing.assert_allclose(normalize.variance.numpy().ravel(), 255 ** 2)
  default = build_model(ModelConfig(resnet_depth=50, num_classes=10,
                                    image_size=64))
  zero = [l.name for l in default.layers if l.name.endswith("_bn3") and
          not np.any(l.gamma.numpy())]
  assert len(zero) == 16  # each bottleneck's last BN
