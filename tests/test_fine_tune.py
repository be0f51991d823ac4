"""--init_checkpoint: a new run starts from another run's network weights,
with a fresh classifier for another class count (resnet_tpu/warm_start.py,
issue 37)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import cpu_strategy
from resnet_tpu.engines.tensorflow import startup as tf_startup
from resnet_tpu import run as run_lib
from resnet_tpu import warm_start
from resnet_tpu.config import ConfigError
from resnet_tpu.config import TrainConfig
from resnet_tpu.engines.tensorflow.engine import TensorFlowEngine

CLASSES = 4


def _config(model_dir, **overrides) -> TrainConfig:
  return TrainConfig.tiny(str(model_dir), **{
      "use_synthetic_data": True, "num_classes": CLASSES, "resnet_depth": 18,
      "image_size": 32, "train_steps": 2, "steps_per_loop": 2,
      "global_batch_size": 8, "num_train_images": 32, **overrides})


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """A ResNet-18 trained 2 steps (its BN statistics moved from 0 and 1)."""
  cfg = _config(tmp_path_factory.mktemp("pretrained"))
  run_lib.run(cfg)
  trainer = TensorFlowEngine(cfg, cpu_strategy(1))
  trainer.restore()
  return cfg, [v.numpy() for v in trainer.model.weights]


def _fresh(cfg):
  trainer = TensorFlowEngine(cfg, cpu_strategy(2))
  warm_start.warm_start(cfg, trainer.model)
  return trainer


def test_the_backbone_and_its_statistics_come_from_the_checkpoint(
    pretrained, tmp_path):
  source_cfg, source = pretrained
  cfg = _config(tmp_path, num_classes=7, bn_group_size=2,
                init_checkpoint=source_cfg.model_dir)
  trainer = _fresh(cfg)
  mine = trainer.model.weights
  assert len(mine) == len(source)
  for theirs, var in zip(source[:-2], mine[:-2]):  # all but the classifier
    np.testing.assert_array_equal(var.numpy(), theirs, err_msg=var.path)
  assert any("moving_mean" in v.path and np.any(v.numpy() != 0)
             for v in mine)
  kernel, bias = mine[-2:]  # the classifier: fresh, 7 classes
  assert kernel.shape[-1] == 7 and not np.any(bias.numpy())
  assert trainer.step == 0


def test_the_same_classes_keep_the_classifier_too(pretrained, tmp_path):
  source_cfg, source = pretrained
  checkpoint = tf.train.latest_checkpoint(source_cfg.model_dir)
  trainer = _fresh(_config(tmp_path, init_checkpoint=checkpoint))
  for theirs, var in zip(source, trainer.model.weights):
    np.testing.assert_array_equal(var.numpy(), theirs)


def test_a_run_fine_tunes_then_resumes_its_own_checkpoints(pretrained,
                                                           tmp_path):
  source_cfg, _ = pretrained
  cfg = _config(tmp_path, num_classes=7,
                init_checkpoint=source_cfg.model_dir)
  run_lib.run(cfg)
  again = TensorFlowEngine(cfg, cpu_strategy(1))
  again.restore()
  assert again.step == 2  # its own run, not the source's


def test_another_network_is_refused_before_startup(pretrained, tmp_path,
                                                    monkeypatch):
  source_cfg, _ = pretrained

  def no_strategy(*args, **kwargs):
    raise AssertionError("started")

  monkeypatch.setattr(tf_startup, "create_strategy", no_strategy)
  with pytest.raises(ConfigError, match=r"--init_checkpoint=.* is another "
                     r"network \(--resnet_depth=18 there, 34 here\)"):
    run_lib.run(_config(tmp_path, resnet_depth=34,
                        init_checkpoint=source_cfg.model_dir))
  with pytest.raises(ConfigError, match=r"--init_checkpoint='.*nothing' is "
                     "neither a folder nor a checkpoint prefix"):
    run_lib.run(_config(tmp_path, init_checkpoint=str(tmp_path / "nothing")))
  (tmp_path / "empty").mkdir()
  with pytest.raises(ConfigError, match=r"--init_checkpoint='.*empty' holds "
                     "no checkpoint"):
    run_lib.run(_config(tmp_path, init_checkpoint=str(tmp_path / "empty")))


def test_freeze_bn_keeps_the_checkpoint_s_bn_while_the_convs_train(
    pretrained, tmp_path):
  source_cfg, source = pretrained
  cfg = _config(tmp_path, num_classes=7, freeze_bn=True,
                init_checkpoint=source_cfg.model_dir)
  run_lib.run(cfg)
  trainer = TensorFlowEngine(cfg, cpu_strategy(1))
  trainer.restore()
  assert trainer.step == 2
  bn_weights = {id(w) for layer in trainer.model.layers
                if isinstance(layer, keras.layers.BatchNormalization)
                for w in layer.weights}
  bn = [(v, theirs) for v, theirs in zip(trainer.model.weights, source)
        if id(v) in bn_weights]
  assert len(bn) == 4 * 20  # gamma, beta, mean, variance of ResNet-18's BNs
  for var, theirs in bn:
    np.testing.assert_array_equal(var.numpy(), theirs, err_msg=var.path)
  kernels = [(v, theirs) for v, theirs in zip(trainer.model.weights, source)
             if v.path.endswith("conv1/kernel")]
  assert kernels and all(np.any(v.numpy() != theirs) for v, theirs in kernels)


def test_freeze_bn_needs_a_checkpoint_and_its_statistics(tmp_path):
  with pytest.raises(ConfigError, match="--freeze_bn .* set --init_checkpoint"):
    run_lib.run(_config(tmp_path, freeze_bn=True))
  with pytest.raises(ConfigError, match="--freeze_bn .* --bn_stats=recompute"):
    run_lib.run(_config(tmp_path, freeze_bn=True, bn_stats="recompute",
                        init_checkpoint=str(tmp_path)))


def _resnet18(bn_epsilon):
  from resnet_tpu.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from resnet_tpu.model.resnet import build_model  # pylint: disable=g-import-not-at-top
  return build_model(ModelConfig(resnet_depth=18, image_size=32,
                                 num_classes=4, bn_epsilon=bn_epsilon))


def test_another_bn_epsilon_is_folded_into_the_moving_variances():
  """Warm start keeps the source's inference when --bn_epsilon differs:
  variance + epsilon is the source's (issue 50)."""
  source, target = _resnet18(1e-5), _resnet18(1e-3)
  rng = np.random.RandomState(0)
  for variable in source.non_trainable_variables:
    if "moving_variance" in variable.path:  # small: epsilon matters
      variable.assign(rng.uniform(2e-3, 1e-2, variable.shape))
  images = rng.uniform(0, 255, (2, 32, 32, 3)).astype(np.float32)
  warm_start.copy_weights(source, target)
  np.testing.assert_allclose(target(images, training=False),
                             source(images, training=False),
                             rtol=1e-4, atol=1e-5)
  bn = target.get_layer("stem_bn")
  np.testing.assert_allclose(
      bn.moving_variance.numpy(),
      source.get_layer("stem_bn").moving_variance.numpy() + 1e-5 - 1e-3,
      rtol=1e-6)


def test_an_epsilon_larger_than_a_moving_variance_is_refused():
  source, target = _resnet18(1e-5), _resnet18(2.0)
  with pytest.raises(ConfigError, match=r"stem_bn: --bn_epsilon=2.0 exceeds"):
    warm_start.copy_weights(source, target)
