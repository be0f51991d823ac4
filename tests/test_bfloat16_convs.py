"""bfloat16 convs on float32 kernels (resnet_tpu/model/bfloat16_convs.py)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from resnet_tpu.model import bfloat16_convs
from resnet_tpu.model.bfloat16_convs import Conv2D
from resnet_tpu.config import TrainConfig
from resnet_tpu.model.resnet import build_resnet
from resnet_tpu.model.resnet import build_model
from resnet_tpu.model.resnet import dtype_policy

BF16_EPS = 2.0**-8  # half a bfloat16 ulp, relative


def _round_bf16(x) -> np.ndarray:
  return tf.cast(tf.cast(x, tf.bfloat16), tf.float64).numpy()


def _layers(strides=1, padding="same"):
  """Ours (float32 kernels) and Keras's Conv2D, same bfloat16 weights."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 9, 9, 16)).astype(np.float32)
  kernel = (rng.normal(size=(3, 3, 16, 8)) * 0.2).astype(np.float32)
  with dtype_policy("bfloat16"):
    ours = Conv2D(8, 3, strides=strides, padding=padding, use_bias=False,
                  float32_kernels=True)
    theirs = keras.layers.Conv2D(8, 3, strides=strides, padding=padding,
                                 use_bias=False)
  for layer in (ours, theirs):
    layer.build(x.shape)
    layer.kernel.assign(kernel)
  return ours, theirs, x, kernel


def _conv_op_dtypes(layer, x) -> list[tf.DType]:
  graph = tf.function(layer).get_concrete_function(
      tf.TensorSpec(x.shape, tf.float32)).graph
  return [op.get_attr("T") for op in graph.get_operations()
          if op.type == "Conv2D"]


@pytest.mark.parametrize("strides,padding", [(1, "same"), (2, "valid")])
def test_outputs_are_rounded_float32_sums_of_bfloat16_products(strides,
                                                               padding):
  ours, theirs, x, kernel = _layers(strides, padding)
  y = ours(x)
  assert y.dtype == tf.bfloat16
  # Reference: exact (float64) conv of the bfloat16-rounded operands.
  exact = tf.nn.conv2d(_round_bf16(x), _round_bf16(kernel), strides,
                       padding.upper()).numpy()
  ours_y = tf.cast(y, tf.float64).numpy()
  np.testing.assert_allclose(ours_y, exact, rtol=2 * BF16_EPS, atol=1e-6)
  # Float32 sums round to the same bfloat16 as exact sums almost always.
  assert np.mean(ours_y == _round_bf16(exact)) > 0.98
  theirs_y = tf.cast(theirs(x), tf.float64).numpy()
  np.testing.assert_allclose(ours_y, theirs_y, rtol=4 * BF16_EPS, atol=1e-6)


def test_gradients_match_keras_bfloat16_conv():
  ours, theirs, x, _ = _layers()
  upstream = np.random.default_rng(1).normal(size=(2, 9, 9, 8))
  grads = []
  for layer in (ours, theirs):
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
      tape.watch(xt)
      y = tf.cast(layer(xt), tf.float32)
      loss = tf.reduce_sum(y * upstream.astype(np.float32))
    dx, dkernel = tape.gradient(loss, [xt, layer.kernel])
    assert dkernel.dtype == tf.float32  # the variable's dtype
    grads.append((dx.numpy(), dkernel.numpy()))
  for ours_g, theirs_g in zip(*grads):
    scale = np.abs(theirs_g).max()
    np.testing.assert_allclose(ours_g, theirs_g, rtol=0,
                               atol=4 * BF16_EPS * scale)


def test_float32_kernels_run_float32_convs_native_runs_bfloat16():
  ours, theirs, x, _ = _layers()
  assert _conv_op_dtypes(ours, x) == [tf.float32]
  assert _conv_op_dtypes(theirs, x) == [tf.bfloat16]
  with dtype_policy("bfloat16"):
    native = Conv2D(8, 3, float32_kernels=False)
  assert _conv_op_dtypes(native, x) == [tf.bfloat16]


def test_float32_policy_is_keras_conv():
  x = np.random.default_rng(2).normal(size=(2, 9, 9, 16)).astype(np.float32)
  ours = Conv2D(8, 3, use_bias=False, float32_kernels=True)
  theirs = keras.layers.Conv2D(8, 3, use_bias=False)
  ours.build(x.shape)
  theirs.build(x.shape)
  theirs.kernel.assign(ours.kernel)
  np.testing.assert_array_equal(ours(x).numpy(), theirs(x).numpy())
  assert _conv_op_dtypes(ours, x) == [tf.float32]


def test_config_round_trip():
  layer = Conv2D(8, 3, float32_kernels=True, name="c")
  clone = keras.layers.deserialize(keras.layers.serialize(layer))
  assert isinstance(clone, Conv2D) and clone.float32_kernels


@pytest.mark.parametrize("setting,devices,native_cpu,expected", [
    ("auto", ["CPU"], False, True),
    ("auto", ["CPU"], True, False),
    ("auto", ["TPU"], False, False),
    ("auto", ["GPU"], False, False),
    ("auto", ["CPU", "GPU"], False, False),
    ("native", ["CPU"], False, False),
    ("float32", ["TPU"], True, True),
])
def test_auto_widens_only_on_cpus_without_bfloat16(setting, devices,
                                                   native_cpu, expected):
  assert bfloat16_convs.use_float32_kernels(setting, devices,
                                            native_cpu) is expected


def test_native_bfloat16_cpu_flags():
  assert bfloat16_convs.cpu_has_native_bfloat16(frozenset({"amx_bf16"}))
  assert bfloat16_convs.cpu_has_native_bfloat16(frozenset({"avx512_bf16"}))
  assert not bfloat16_convs.cpu_has_native_bfloat16(
      frozenset({"avx2", "fma", "avx512f"}))


def test_model_device_types_follow_the_strategy():
  with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
    assert bfloat16_convs.model_device_types() == ["CPU"]


@pytest.mark.parametrize("precision,setting,expected", [
    ("bfloat16", "float32", True),
    ("bfloat16", "native", False),
    ("float32", "float32", False),
])
def test_build_model_passes_the_setting(tmp_path, precision, setting,
                                        expected):
  cfg = TrainConfig.from_flat(model_dir=str(tmp_path), resnet_depth=18,
                              num_classes=10, image_size=32,
                              precision=precision,
                              bfloat16_conv_kernels=setting)
  convs = [l for l in build_model(cfg.model).layers
           if isinstance(l, Conv2D)]
  assert len(convs) == 20  # 17 convs + 3 projections in ResNet-18
  assert all(c.float32_kernels is expected for c in convs)


def test_resnet_logits_match_native_bfloat16():
  """A whole bfloat16 ResNet-18 agrees with Keras's bfloat16 kernels."""
  images = np.random.default_rng(3).uniform(
      0, 255, size=(4, 32, 32, 3)).astype(np.float32)
  with dtype_policy("bfloat16"):
    widened = build_resnet(18, 10, 32, float32_kernels=True)
    native = build_resnet(18, 10, 32, float32_kernels=False)
  # Non-zero last gammas, so every residual branch contributes.
  weights = [w + 0.1 if w.ndim == 1 else w for w in widened.get_weights()]
  widened.set_weights(weights)
  native.set_weights(weights)
  a = widened(images, training=True).numpy()
  b = native(images, training=True).numpy()
  assert a.dtype == np.float32
  np.testing.assert_allclose(a, b, rtol=0, atol=0.05 * np.abs(b).max())
  assert not np.array_equal(a, np.zeros_like(a))
