"""--precision=float16: mixed_float16 with dynamic loss scaling
(resnet_tpu/engines/tensorflow/loss_scale.py, issue 37). CPU shows what it can:
the scaling is exact, an overflowing step is skipped and halves the scale, the
scale grows after finite steps, LARS and the ring summation take it, and a
run resumes with its scale."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import cpu_strategy
from resnet_tpu import config as config_lib
from resnet_tpu.config import ConfigError
from resnet_tpu.config import TrainConfig
from resnet_tpu.train import loop_report
from resnet_tpu.engines.tensorflow.loss_scale import DynamicLossScale
from resnet_tpu.train.metrics_log import read_metrics
from resnet_tpu.engines.tensorflow.engine import TensorFlowEngine
from tiny_model import tiny_resnet


def _config(tmp_path, **overrides) -> TrainConfig:
  return TrainConfig.tiny(str(tmp_path), **{
      "use_synthetic_data": True, "num_classes": 10, "image_size": 32,
      "global_batch_size": 8, "train_steps": 2, "steps_per_loop": 1,
      "num_train_images": 1000, "checkpoint_every_steps": 0,
      "precision": "float16", **overrides})


def _data(steps, seed=0, scale=1.0):
  rng = np.random.RandomState(seed)
  images = (rng.uniform(0, 255, (8 * steps, 32, 32, 3)) * scale).astype(
      np.float32)
  return images, rng.randint(0, 10, 8 * steps).astype(np.int32)


def _dataset_fn(images, labels):
  def dataset_fn(ctx):
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(
        ctx.get_per_replica_batch_size(8), drop_remainder=True).repeat()
  return dataset_fn


def _steps(trainer, images, labels, steps):
  iterator = iter(trainer.strategy.distribute_datasets_from_function(
      _dataset_fn(images, labels)))
  trainer.loops.train(iterator, tf.constant(steps))


def _values(variables):
  return [v.numpy() for v in variables]


def test_the_model_computes_in_float16_with_float32_weights(tmp_path):
  trainer = TensorFlowEngine(_config(tmp_path), cpu_strategy(1))
  conv = next(layer for layer in trainer.model.layers
              if isinstance(layer, keras.layers.Conv2D))
  assert conv.compute_dtype == "float16"
  assert conv.kernel.dtype == "float32"
  assert trainer.model.output.dtype == "float32"  # the logits


@pytest.mark.parametrize("optimizer,summation", [("momentum", "auto"),
                                                 ("lars", "ring")])
def test_scaled_gradients_give_the_step_of_unscaled_ones(
    tmp_path, optimizer, summation):
  """Loss scaling changes nothing but underflow: a float32 model trained
  with S = 2**10 takes the same steps as without."""
  images, labels = _data(2)
  runs = []
  for tag, scale in (("plain", None), ("scaled", 2.0 ** 10)):
    cfg = _config(tmp_path / tag, precision="float32", optimizer=optimizer,
                  gradient_all_reduce=summation)
    trainer = TensorFlowEngine(cfg, cpu_strategy(2), model_fn=tiny_resnet)
    if scale:
      with trainer.strategy.scope():
        trainer.replica_step.loss_scale = DynamicLossScale(scale)
      trainer.model.set_weights(runs[0].model.get_weights())
    runs.append(trainer)
  for trainer in runs:
    _steps(trainer, images, labels, 2)
  plain, scaled = runs
  assert scaled.step == plain.step == 2
  for got, want in zip(_values(scaled.model.weights),
                       _values(plain.model.weights)):
    # S is a power of 2: scaling and unscaling are exact.
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_an_overflowing_step_is_skipped_and_halves_the_scale(tmp_path):
  cfg = _config(tmp_path, steps_per_loop=3, train_steps=3)
  trainer = TensorFlowEngine(cfg, cpu_strategy(2))
  with trainer.strategy.scope():
    # Big enough that float16 backward overflows, then finite at S / 2**k.
    trainer.replica_step.loss_scale.scale.assign(2.0 ** 40)
  before = _values(trainer.model.weights)
  images, labels = _data(1)
  _steps(trainer, images, labels, 1)
  assert trainer.step == 0  # not applied
  for got, want in zip(_values(trainer.model.weights), before):
    np.testing.assert_array_equal(got, want)
  assert float(trainer.loss_scale.scale.numpy()) == 2.0 ** 39


def test_the_scale_doubles_after_growth_steps_finite_steps(tmp_path):
  trainer = TensorFlowEngine(_config(tmp_path), cpu_strategy(2))
  trainer.loss_scale.growth_steps = 2
  start = float(trainer.loss_scale.scale.numpy())
  images, labels = _data(3)
  _steps(trainer, images, labels, 3)
  assert trainer.step == 3
  assert float(trainer.loss_scale.scale.numpy()) == 2 * start
  assert int(trainer.loss_scale.good_steps.numpy()) == 1


def test_a_run_counts_skipped_steps_and_resumes_with_its_scale(tmp_path):
  images, labels = _data(4)
  cfg = _config(tmp_path, train_steps=2, steps_per_loop=2)
  first = TensorFlowEngine(cfg, cpu_strategy(2))
  with first.strategy.scope():
    first.loss_scale.scale.assign(2.0 ** 40)
  first.fit(_dataset_fn(images, labels))
  records = read_metrics(str(tmp_path))
  assert sum(r["skipped_steps"] for r in records) >= 1
  scale = float(first.loss_scale.scale.numpy())
  assert scale < 2.0 ** 40
  again = TensorFlowEngine(cfg.replace(train_steps=first.step + 1),
                           cpu_strategy(2))
  again.restore()
  assert float(again.loss_scale.scale.numpy()) == scale


def test_float16_where_it_cannot_run_is_refused(tmp_path):
  with pytest.raises(ConfigError, match="--precision=float16 does not "
                     "support --batch_size_schedule"):
    config_lib.validate(_config(tmp_path, batch_size_schedule="0:16"))
  with pytest.raises(ConfigError, match="use --precision=bfloat16"):
    config_lib.validate(_config(tmp_path, strategy="tpu"))


def _nan_data(steps):
  images, labels = _data(steps)
  images[:] = np.nan
  return images, labels


@pytest.mark.parametrize("overrides", [
    {},  # float16: the first loop's skipped steps halve the scale to 1
    {"precision": "float32", "skip_nonfinite_steps": True}])
def test_a_loss_that_stays_nan_stops_the_run_instead_of_hanging(tmp_path,
                                                                overrides):
  images, labels = _nan_data(2)
  cfg = _config(tmp_path, train_steps=1000, steps_per_loop=2, **overrides)
  loops = []

  def bounded(record):  # the hang this test guards against, bounded
    loops.append(record)
    assert len(loops) < 10, "still training after 10 loops of skipped steps"

  # One replica: stopped this way under 2 CPU replicas, the run leaves a
  # collective behind that breaks the next strategy's first gradient
  # all-reduce in this process (seen in CI; a main.py run exits instead).
  trainer = TensorFlowEngine(cfg, cpu_strategy(1))
  if trainer.loss_scale is not None:
    with trainer.strategy.scope():
      trainer.loss_scale.scale.assign(4.0)  # two halvings to the floor
  with pytest.raises(loop_report.NonFiniteLossError,
                     match=r"last 3 host loops.*cannot pass step 0.*"
                           r"checkpoint is \S*ckpt-0\. Restart"):
    trainer.fit(_dataset_fn(images, labels), loop_callback=bounded)
  records = read_metrics(str(tmp_path))
  # The loops before the stop, each logged without a loss or top-1.
  assert [r["skipped_steps"] for r in records] == [2] * len(records)
  assert len(records) == loop_report.STALLED_LOOPS_LIMIT
  assert not any("loss" in r or "top1" in r for r in records)
