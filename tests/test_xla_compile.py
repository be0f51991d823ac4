"""Every replica step a TPU runs compiles with XLA (jit_compile, one CPU).

TPUStrategy compiles each step with XLA; xla_compile.py lowers the same
step to HLO on one CPU device. ResNet-18 at 32 px is the real network, in
float32 and bfloat16; tests/tiny_model.py stands in for the rest of the
matrix (optimizers, accumulation, skip-non-finite, eval), whose step code
is the same whatever the network.
"""
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import cpu_strategy
from resnet_tpu.parallel.tensorflow import bn_all_reduce
from tools import xla_compile
from resnet_tpu.config import TrainConfig
from resnet_tpu.engines.tensorflow.engine import TensorFlowEngine
from tiny_model import tiny_resnet

IMAGE = 32
CLASSES = 10
BATCH = 4


def _config(tmp_path, **overrides) -> TrainConfig:
  """Label smoothing and L2 on (both in the loss of momentum SGD)."""
  return TrainConfig.tiny(str(tmp_path), **{
      "use_synthetic_data": True, "num_classes": CLASSES,
      "image_size": IMAGE, "global_batch_size": BATCH,
      "eval_batch_size": BATCH, "train_steps": 1, "steps_per_loop": 1,
      "base_learning_rate": 0.1, "label_smoothing": 0.1,
      "weight_decay": 1e-4, **overrides})


def _batch(seed=0):
  rng = np.random.RandomState(seed)
  images = rng.uniform(0, 255, (BATCH, IMAGE, IMAGE, 3)).astype(np.float32)
  labels = rng.randint(0, CLASSES, BATCH).astype(np.int32)
  return tf.constant(images), tf.constant(labels)


def _trainer(tmp_path, model_fn=tiny_resnet, **overrides) -> TensorFlowEngine:
  return TensorFlowEngine(_config(tmp_path, **overrides), cpu_strategy(1),
                          model_fn=model_fn)


def _lower_train_step(trainer, run=False) -> xla_compile.CompiledStep:
  return xla_compile.compile_replica_step(
      trainer.strategy, trainer.replica_step.train, _batch(), run=run)


def test_resnet18_float32_step_with_local_bn_lowers_to_hlo(tmp_path):
  trainer = _trainer(tmp_path, model_fn=None)  # build_model: ResNet-18
  assert trainer.replica_step.decayed  # the L2 term is in the loss
  compiled = _lower_train_step(trainer)
  assert compiled.hlo.startswith("HloModule")
  # 20 convs of ResNet-18 forward, and their backward convs.
  assert compiled.op_count("convolution") >= 40
  # BN group size 1: one fused training kernel per BN layer, as XLA's op.
  assert compiled.op_count("batch-norm-training") == 20
  assert compiled.op_count("batch-norm-grad") == 20


def test_resnet18_bfloat16_step_lowers_with_bfloat16_convolutions(tmp_path):
  # --bfloat16_conv_kernels=native: what `auto` resolves to on a TPU.
  trainer = _trainer(tmp_path, model_fn=None, precision="bfloat16",
                     bfloat16_conv_kernels="native")
  compiled = _lower_train_step(trainer)
  bf16_convs = len(re.findall(r"= bf16\[[^\]]*\]\S* convolution\(",
                              compiled.hlo))
  assert bf16_convs >= 40


@pytest.mark.parametrize("variant", [
    dict(precision="bfloat16"),
    dict(optimizer="lars"),
    dict(optimizer="rmsprop_warmup"),
    dict(label_smoothing=0.0, weight_decay=0.0),
])
def test_train_step_variant_lowers_to_hlo(tmp_path, variant):
  compiled = _lower_train_step(_trainer(tmp_path, **variant))
  assert compiled.op_count("convolution") >= 2


def test_xla_compiled_step_makes_the_same_update_as_the_graph_step(tmp_path):
  xla = _trainer(tmp_path / "xla")
  graph = _trainer(tmp_path / "graph")
  for source, target in zip(xla.model.variables, graph.model.variables):
    target.assign(source)
  before = [v.numpy() for v in xla.model.variables]
  compiled = _lower_train_step(xla, run=True)
  step = tf.function(lambda *a: graph.strategy.run(graph.replica_step.train,
                                                   args=a))
  sums = step(*_batch())
  np.testing.assert_allclose(compiled.outputs.loss, sums.loss.numpy(),
                             rtol=1e-5)
  for b, a, g in zip(before, xla.model.variables, graph.model.variables):
    np.testing.assert_allclose(a.numpy(), g.numpy(), rtol=1e-5, atol=1e-6)
  assert sum(not np.allclose(b, a.numpy())
             for b, a in zip(before, xla.model.variables)) >= 4
  assert xla.step == graph.step == 1


def test_xla_compiled_skip_step_leaves_no_trace_of_a_nan_batch(tmp_path):
  """--skip_nonfinite_steps: the branch in cross-replica context (merge_call),
  which TPUStrategy takes too (it synchronises through merge_call, as
  MirroredStrategy does on CPU)."""
  trainer = _trainer(tmp_path, skip_nonfinite_steps=True)
  before = [v.numpy() for v in trainer.model.variables]
  images, labels = _batch()
  nan_images = tf.tensor_scatter_nd_update(images, [[0, 0, 0, 0]], [np.nan])
  compiled = xla_compile.compile_replica_step(
      trainer.strategy, trainer.replica_step.train, (nan_images, labels),
      run=True)
  assert compiled.op_count("conditional") >= 1  # apply or put back
  assert compiled.outputs.nonfinite > 0
  assert trainer.step == 0
  for b, v in zip(before, trainer.model.variables):
    np.testing.assert_array_equal(b, v.numpy())


def test_batch_size_control_accumulation_steps_lower_to_hlo(tmp_path):
  trainer = _trainer(tmp_path, global_batch_size=BATCH,
                     batch_size_schedule=f"0:{2 * BATCH}")
  step = trainer.replica_step
  assert step.accumulators
  accumulate = xla_compile.compile_replica_step(
      trainer.strategy, step.accumulate, _batch() + (tf.constant(2),))
  assert accumulate.op_count("convolution") >= 2
  apply = xla_compile.compile_replica_step(trainer.strategy,
                                           step.apply_accumulated)
  assert apply.hlo.startswith("HloModule")


def test_eval_step_lowers_to_hlo(tmp_path):
  trainer = _trainer(tmp_path)
  compiled = xla_compile.compile_replica_step(
      trainer.strategy, trainer.replica_step.eval,
      _batch() + (tf.ones([BATCH]),))
  assert compiled.op_count("convolution") == 1  # forward only
  assert compiled.op_count("batch-norm-training") == 0  # moving statistics


def test_tpu_cross_replica_sum_has_no_xla_cpu_kernel():
  """The TPU BN group path cannot be compiled on CPU: XLA says so."""
  with pytest.raises(xla_compile.XlaCompileError) as raised:
    xla_compile.compile_replica_step(
        cpu_strategy(1), lambda x: bn_all_reduce.tpu_group_all_reduce(
            x, [[0]]), (tf.ones([3]),))
  message = raised.value.xla_message
  assert "Detected unsupported operations" in message
  assert ("No registered 'CrossReplicaSum' OpKernel for XLA_CPU_JIT "
          "devices") in message
  assert raised.value.stage == "hlo"


class _NumpyIdentity(keras.layers.Layer):
  """The identity, computed by NumPy on the host: a PyFunc op, which XLA
  cannot compile."""

  def call(self, x):
    y = tf.numpy_function(lambda a: a, [x], x.dtype, stateful=False)
    return tf.ensure_shape(y, x.shape)


def _model_with_numpy_function(cfg):
  model = tiny_resnet(cfg)
  inputs = keras.Input(model.input.shape[1:])
  return keras.Model(inputs, model(_NumpyIdentity()(inputs)))


def test_a_step_with_a_numpy_function_fails_the_compile_check(tmp_path):
  """Break-check: an op XLA cannot compile makes the check fail."""
  trainer = _trainer(tmp_path, model_fn=_model_with_numpy_function)
  with pytest.raises(xla_compile.XlaCompileError) as raised:
    _lower_train_step(trainer)
  assert "No registered 'PyFuncStateless' OpKernel" in raised.value.xla_message


def test_the_step_is_an_xla_must_compile_function():
  """A run (run=True) is XLA's program: TensorFlow may not fall back."""
  step = xla_compile.jit_replica_step(cpu_strategy(1), tf.identity)
  function = step.get_concrete_function(tf.ones([2])).function_def
  assert function.attr["_XlaMustCompile"].b


def test_a_multi_replica_strategy_is_refused():
  with pytest.raises(ValueError, match="one-device strategy"):
    xla_compile.compile_replica_step(cpu_strategy(2), tf.identity,
                                     (tf.ones([2]),))
