"""bfloat16 on JAX as on TensorFlow (Ying et al. §3): convolutions and
activations in bfloat16, weights, BN statistics and logits in float32."""
import keras
import numpy as np

from resnet_tpu.config import ModelConfig
from resnet_tpu.model import bfloat16_convs
from resnet_tpu.model.distributed_batch_norm import DistributedBatchNormalization
from resnet_tpu.model.resnet import build_model
from resnet_tpu.model.resnet import dtype_policy
from resnet_tpu.optim.optimizers import build_optimizer
from resnet_tpu.parallel.jax.bn_all_reduce import build_mesh
from resnet_tpu.engines.jax.step import JaxTrainStep
from resnet_tpu.engines.jax.state import LossConfig


def _model(**overrides):
  return build_model(ModelConfig(resnet_depth=18, image_size=32,
                                 num_classes=10, precision="bfloat16",
                                 **overrides))


def test_bfloat16_compute_float32_weights_statistics_and_logits():
  model = _model(bfloat16_conv_kernels="native")
  convs = [l for l in model.layers if isinstance(l, keras.layers.Conv2D)]
  bns = [l for l in model.layers
         if isinstance(l, DistributedBatchNormalization)]
  assert len(convs) == 20 and len(bns) == 20
  assert {l.compute_dtype for l in convs + bns} == {"bfloat16"}
  assert {v.dtype for v in model.variables} == {"float32"}
  assert model.get_layer("logits").compute_dtype == "float32"
  images = np.random.RandomState(0).uniform(0, 255, (4, 32, 32, 3))
  assert model(images.astype("float32")).dtype == "float32"


def test_a_bfloat16_step_on_8_devices_updates_float32_statistics():
  model = _model(bn_group_size=2)
  step = JaxTrainStep(model, build_optimizer("lars", 1.0), build_mesh(2),
                      LossConfig(10, 16))
  rng = np.random.RandomState(0)
  images = rng.uniform(0, 255, (16, 32, 32, 3)).astype("float32")
  state, sums = step.step(step.state(), *step.shard_batch(
      images, rng.randint(0, 10, 16).astype("int32")))
  assert np.isfinite(float(sums["loss"]))
  step.write_back(state)
  bn = model.get_layer("stem_bn")
  assert bn.moving_mean.dtype == "float32"
  assert not np.allclose(bn.moving_mean.numpy(), 0.0)


def test_float32_kernels_give_the_bfloat16_convolution():
  """--bfloat16_conv_kernels=float32 on JAX: bfloat16 operands widened,
  float32 sums, output rounded to bfloat16, as the native kernel."""
  rng = np.random.RandomState(0)
  x = rng.randn(2, 8, 8, 16).astype("float32")
  outputs = {}
  with dtype_policy("bfloat16"):
    for widened in (False, True):
      conv = bfloat16_convs.Conv2D(8, 3, float32_kernels=widened,
                                   use_bias=False)
      conv.build(x.shape)
      conv.kernel.assign(rng.randn(3, 3, 16, 8).astype("float32")
                         if not outputs else outputs["kernel"])
      outputs["kernel"] = conv.kernel.numpy()
      outputs[widened] = np.asarray(conv(x), np.float32)
  assert conv(x).dtype == "bfloat16"
  np.testing.assert_allclose(outputs[True], outputs[False], rtol=2e-2,
                             atol=2e-2)


def test_bfloat16_kernels_resolve_for_jax_devices():
  assert bfloat16_convs.model_device_types() == ["CPU"]
