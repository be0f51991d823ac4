"""The JAX engine in this process (issue 49), on 2 of the session's virtual
CPU devices, fed numpy batches as engines/jax/host_batches.py feeds it:

- --skip_nonfinite_steps: a run that meets a batch whose loss is NaN trains
  as if that batch had never been in the data, bit for bit, as
  tests/test_reliability.py shows on TensorFlow;
- --profile_steps: the profiler records the host loops of the range, and
  writes the TensorBoard profile where the TensorFlow path writes it;
- batch-size control (Mikami et al. 2018): a step of two stacked
  micro-batches applies the mean of the two batches' gradients (each the
  one-batch step's, L2 included) and leaves the BN moving statistics where
  the two batches' forward passes in turn leave them;
- --bn_stats=recompute (Akiba et al. 2017): the recomputed statistics of
  the first BN layer are the mean and variance of its input over every
  image of the batches;
- storage as tests/test_storage_errors.py shows it on TensorFlow: a
  checkpoint that cannot be written ends the run in one line naming the
  last good one, which restores, in either checkpoint store (the wall-clock
  cadence is the loop's: tests/test_loop.py);
- --precision=float16 as tests/test_float16.py shows it on TensorFlow:
  float16 compute on float32 weights, exact scaling, an overflowing step
  skipped with S halved, S doubled after its growth steps, S resumed from
  either checkpoint store, and a loss that stays NaN stops the run.
"""
import glob
import os

import jax
import keras
import numpy as np
import pytest

from resnet_tpu import files
from resnet_tpu.config import TrainConfig
from resnet_tpu.optim.optimizers import build_optimizer
from resnet_tpu.model.resnet import build_model
from resnet_tpu.parallel.jax.bn_all_reduce import build_mesh
from resnet_tpu.engines.jax import step as jax_step
from resnet_tpu.train import loop_report
from resnet_tpu.train.checkpoints import storage
from resnet_tpu.engines.jax.engine import JaxEngine
from resnet_tpu.train.metrics_log import read_metrics

IMAGE = 32
CLASSES = 10
BATCH = 8


def _trainer(model_dir: str, **flags) -> JaxEngine:
  """A tiny run's trainer on 2 devices, its weights drawn from seed 0."""
  cfg = TrainConfig(model_dir=model_dir).replace(
      backend="jax", resnet_depth=18, image_size=IMAGE, num_classes=CLASSES,
      global_batch_size=BATCH, num_train_images=BATCH * 10,
      **{"warmup_epochs": 0, "checkpoint_every_steps": 0,
         "checkpoint_every_minutes": 0, **flags})
  keras.utils.set_random_seed(0)
  return JaxEngine(cfg, build_mesh(1, jax.devices()[:2]))


def _batches(count: int, nan_at: int | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.RandomState(0)
  images = rng.uniform(0, 255, (count, BATCH, IMAGE, IMAGE, 3))
  if nan_at is not None:
    images[nan_at, 0, 0, 0, 0] = np.nan
  labels = rng.randint(0, CLASSES, (count, BATCH))
  return images.astype(np.float32), labels.astype(np.int32)


def _input(images: np.ndarray, labels: np.ndarray):
  """trainer.fit's train_input: the batches after the first `start`."""
  def train_input(start: int):
    for i in range(start, len(images)):
      yield images[i], labels[i], np.zeros(2)
  return train_input


def test_skip_nonfinite_steps_trains_as_if_the_bad_batch_was_never_there(
    tmp_path):
  images, labels = _batches(5, nan_at=2)
  skipping = _trainer(str(tmp_path / "skip"), skip_nonfinite_steps=True,
                      train_steps=4, steps_per_loop=4)
  clean = _trainer(str(tmp_path / "clean"), train_steps=4, steps_per_loop=4)
  keep = [0, 1, 3, 4]
  skipping.fit(_input(images, labels))
  clean.fit(_input(images[keep], labels[keep]))

  assert skipping.step == clean.step == 4
  assert skipping.input_batches == 5
  for got, want in zip(jax.tree.leaves(jax.device_get(skipping.state)),
                       jax.tree.leaves(jax.device_get(clean.state))):
    np.testing.assert_array_equal(got, want)
  assert [r["skipped_steps"] for r in read_metrics(tmp_path / "skip")] == [
      1, 0]


def test_profile_steps_records_the_loops_of_the_range(tmp_path):
  images, labels = _batches(6)
  trainer = _trainer(str(tmp_path), train_steps=6, steps_per_loop=6,
                     profile_steps="3,4")
  trainer.fit(_input(images, labels))
  assert [r["step"] for r in read_metrics(tmp_path)] == [2, 4, 6]
  traces = glob.glob(os.path.join(tmp_path, "plugins", "profile", "*",
                                  "*.xplane.pb"))
  assert len(traces) == 1 and os.path.getsize(traces[0]) > 0, traces


@pytest.mark.parametrize("store", ["tensorflow", "npz"])
def test_a_checkpoint_that_cannot_be_written_ends_the_run_in_one_line(
    tmp_path, monkeypatch, store):
  """Either store (engines/jax/tf_checkpoints.py where TensorFlow is installed,
  engines/jax/npz_checkpoints.py where it is not): ckpt-1 is written, ckpt-2's
  first file cannot be."""
  if store == "npz":
    monkeypatch.setattr(files, "tensorflow_installed", lambda: False)
  blocked = tmp_path / ("ckpt-2.index" if store == "tensorflow"
                        else "ckpt-2.npz.partial")

  def block_the_second_save(record):
    if record["step"] == 1:
      os.makedirs(blocked)

  flags = dict(train_steps=4, steps_per_loop=1, checkpoint_every_steps=1)
  trainer = _trainer(str(tmp_path), **flags)
  with pytest.raises(storage.StorageError) as error:
    trainer.fit(_input(*_batches(4)), loop_callback=block_the_second_save)
  message = str(error.value)
  last = f"{tmp_path}/ckpt-1{'.npz' if store == 'npz' else ''}"
  assert "\n" not in message and message.startswith(
      f"Writing a checkpoint to {tmp_path}"), message
  assert f"The last good checkpoint is {last};" in message, message
  again = _trainer(str(tmp_path), **flags)
  again.restore()
  assert again.step == 1


def _close(got, want, rtol: float = 1e-5) -> None:
  for g, w in zip(jax.tree.leaves(jax.device_get(got)),
                  jax.tree.leaves(jax.device_get(want))):
    g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
    assert np.linalg.norm(g - w) <= rtol * max(np.linalg.norm(w), 1e-12), (
        np.linalg.norm(g - w), np.linalg.norm(w))


def test_a_step_of_two_micro_batches_applies_their_mean_gradient():
  cfg = TrainConfig(model_dir="").replace(
      resnet_depth=18, image_size=IMAGE, num_classes=CLASSES,
      bn_group_size=2, zero_init_gamma=False, weight_decay=1e-4)
  keras.utils.set_random_seed(0)
  model = build_model(cfg.model, cfg.distribution)
  optimizer = build_optimizer("momentum", 0.1)
  step = jax_step.JaxTrainStep(
      model, optimizer, build_mesh(2, jax.devices()[:4]),
      jax_step.LossConfig(CLASSES, BATCH, 0.1, cfg.optim.weight_decay))
  start = jax.device_get(step.state())
  images, labels = _batches(2)

  got, sums = step.accumulated_step(step.replicate(start),
                                    *step.shard_micro_batches(images, labels))
  first_grads, first_stats, first_sums = step.gradients(
      step.replicate(start), *step.shard_batch(images[0], labels[0]))
  after_first = step.replicate(start._replace(non_trainable=first_stats))
  second_grads, stats, second_sums = step.gradients(
      after_first, *step.shard_batch(images[1], labels[1]))
  mean = jax.tree.map(lambda a, b: (a + b) / 2, first_grads, second_grads)
  trainable, optimizer_values = optimizer.stateless_apply(
      step.replicate(start).optimizer, mean, step.replicate(start).trainable)

  _close(got.trainable, trainable)
  _close(got.optimizer, optimizer_values)
  _close(got.non_trainable, stats)
  assert float(sums["examples"]) == 2 * BATCH
  np.testing.assert_allclose(float(sums["loss"]),
                             float(first_sums[0] + second_sums[0]),
                             rtol=1e-5)


def test_recomputed_bn_statistics_are_those_of_the_batches():
  cfg = TrainConfig(model_dir="").replace(
      resnet_depth=18, image_size=IMAGE, num_classes=CLASSES,
      bn_group_size=2, precision="float32")
  keras.utils.set_random_seed(0)
  model = build_model(cfg.model, cfg.distribution)
  step = jax_step.JaxTrainStep(model, build_optimizer("momentum", 0.1),
                               build_mesh(2, jax.devices()[:4]),
                               jax_step.LossConfig(CLASSES, BATCH))
  images, _ = _batches(3)
  step.write_back(step.recompute_statistics(step.state(), iter(images)))

  stem = keras.Model(model.input, model.get_layer("stem_conv").output)
  inputs = np.concatenate([np.asarray(stem(x), np.float64) for x in images])
  bn = model.get_layer("stem_bn")
  np.testing.assert_allclose(np.asarray(bn.moving_mean),
                             inputs.mean(axis=(0, 1, 2)), rtol=1e-4,
                             atol=1e-4)
  np.testing.assert_allclose(np.asarray(bn.moving_variance),
                             inputs.var(axis=(0, 1, 2)), rtol=1e-3,
                             atol=1e-4)


# --precision=float16 on JAX: the TensorFlow path's tests/test_float16.py.


def _with_scale(trainer: JaxEngine, scale: float,
                growth_steps: int = 2000) -> JaxEngine:
  """`trainer` with its step scaling the loss by `scale` (float32 models
  too: the scaling alone, without float16's underflow)."""
  step = trainer.step_fn
  trainer.step_fn = jax_step.JaxTrainStep(
      trainer.model, trainer.optimizer, step.mesh, step.loss,
      loss_scale=(scale, growth_steps))
  trainer.reload_weights()
  return trainer


def _one_step(trainer: JaxEngine, images, labels) -> None:
  trainer.state, _ = trainer.step_fn.step(
      trainer.state, *trainer.step_fn.shard_batch(images, labels))


def _scale(trainer: JaxEngine) -> tuple[float, int]:
  scale, good_steps = jax.device_get(trainer.state.loss_scale)
  return float(scale), int(good_steps)


def test_float16_computes_in_float16_with_float32_weights(tmp_path):
  trainer = _trainer(str(tmp_path), precision="float16")
  conv = next(layer for layer in trainer.model.layers
              if isinstance(layer, keras.layers.Conv2D))
  assert (conv.compute_dtype, conv.kernel.dtype) == ("float16", "float32")
  assert _scale(trainer) == (2.0 ** 15, 0)


def test_scaled_gradients_give_the_step_of_unscaled_ones(tmp_path):
  """S = 2**10 is a power of 2: scaling and unscaling are exact."""
  images, labels = _batches(2)
  plain = _trainer(str(tmp_path / "plain"), train_steps=2)
  scaled = _with_scale(_trainer(str(tmp_path / "scaled"), train_steps=2),
                       2.0 ** 10)
  for trainer in (plain, scaled):
    trainer.fit(_input(images, labels))
  assert plain.step == scaled.step == 2
  _close(scaled.state.trainable, plain.state.trainable, rtol=1e-6)


def test_an_overflowing_step_is_skipped_and_halves_the_scale(tmp_path):
  trainer = _trainer(str(tmp_path), precision="float16")
  state = jax.device_get(trainer.state)
  # Big enough that the float16 backward pass overflows.
  trainer.state = trainer.step_fn.replicate(state._replace(
      loss_scale=[np.float32(2.0 ** 40), np.int32(0)]))
  images, labels = _batches(1)
  _one_step(trainer, images[0], labels[0])
  after = jax.device_get(trainer.state)
  for got, want in zip(jax.tree.leaves(after[:3]), jax.tree.leaves(state[:3])):
    np.testing.assert_array_equal(got, want)  # weights, BN, step count
  assert _scale(trainer) == (2.0 ** 39, 0)


def test_the_scale_doubles_after_growth_steps_finite_steps(tmp_path):
  trainer = _with_scale(_trainer(str(tmp_path), precision="float16"),
                        2.0 ** 10, growth_steps=2)
  images, labels = _batches(3)
  for i in range(3):
    _one_step(trainer, images[i], labels[i])
  assert _scale(trainer) == (2.0 ** 11, 1)


@pytest.mark.parametrize("store", ["tensorflow", "npz"])
def test_a_run_counts_skipped_steps_and_resumes_with_its_scale(
    tmp_path, monkeypatch, store):
  if store == "npz":
    monkeypatch.setattr(files, "tensorflow_installed", lambda: False)
  first = _with_scale(_trainer(str(tmp_path), precision="float16",
                               train_steps=2, steps_per_loop=2), 2.0 ** 40)
  first.fit(_input(*_batches(40)))
  assert sum(r["skipped_steps"] for r in read_metrics(tmp_path)) >= 1
  scale = _scale(first)
  assert scale[0] < 2.0 ** 40
  again = _trainer(str(tmp_path), precision="float16", train_steps=3)
  again.restore()
  assert again.step == 2
  assert _scale(again) == scale


@pytest.mark.parametrize("flags", [
    {"precision": "float16"},  # skipped steps halve S to its floor of 1
    {"skip_nonfinite_steps": True}])
def test_a_loss_that_stays_nan_stops_the_run_instead_of_hanging(tmp_path,
                                                                flags):
  loops = []

  def bounded(record):  # the hang this test guards against, bounded
    loops.append(record)
    assert len(loops) < 10, "still training after 10 loops of skipped steps"

  trainer = _trainer(str(tmp_path), train_steps=1000,
                     steps_per_loop=2, **flags)
  if trainer.state.loss_scale:  # two halvings to the floor
    trainer.state = trainer.step_fn.replicate(jax.device_get(
        trainer.state)._replace(loss_scale=[np.float32(4.0), np.int32(0)]))
  images, labels = _batches(40)
  images[:] = np.nan
  with pytest.raises(loop_report.NonFiniteLossError,
                     match=r"last 3 host loops.*cannot pass step 0.*"
                           r"checkpoint is \S*ckpt-0\. Restart"):
    trainer.fit(_input(images, labels), loop_callback=bounded)
  records = read_metrics(tmp_path)
  assert [r["skipped_steps"] for r in records] == [2, 2, 2]
  assert not any("loss" in r or "top1" in r for r in records)
