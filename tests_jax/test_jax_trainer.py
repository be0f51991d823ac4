"""The JAX trainer in this process (issue 49), on 2 of the session's virtual
CPU devices, fed numpy batches as jax_input.py feeds it:

- --skip_nonfinite_steps: a run that meets a batch whose loss is NaN trains
  as if that batch had never been in the data, bit for bit, as
  tests/test_reliability.py shows on TensorFlow;
- --profile_steps: the profiler records the host loops of the range, and
  writes the TensorBoard profile where the TensorFlow path writes it.
"""
import glob
import os

import jax
import keras
import numpy as np

from resnet_tpu.config import TrainConfig
from resnet_tpu.parallel.bn_all_reduce_jax import build_mesh
from resnet_tpu.train.jax_trainer import JaxTrainer
from resnet_tpu.train.metrics_log import read_metrics

IMAGE = 32
CLASSES = 10
BATCH = 8


def _trainer(model_dir: str, **flags) -> JaxTrainer:
  """A tiny run's trainer on 2 devices, its weights drawn from seed 0."""
  cfg = TrainConfig(model_dir=model_dir).replace(
      backend="jax", resnet_depth=18, image_size=IMAGE, num_classes=CLASSES,
      global_batch_size=BATCH, num_train_images=BATCH * 10,
      warmup_epochs=0, checkpoint_every_steps=0, checkpoint_every_minutes=0,
      **flags)
  keras.utils.set_random_seed(0)
  return JaxTrainer(cfg, build_mesh(1, jax.devices()[:2]))


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
