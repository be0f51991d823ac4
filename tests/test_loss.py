"""The one loss and accuracy of both engines' steps (train/loss.py), in
keras.ops: checked here on TensorFlow against numbers worked by hand, and
on JAX through tests_jax/test_engines.py, where the two engines' steps
agree in float64."""
import numpy as np
import pytest

from resnet_tpu.train.loss import losses_and_hits


def _log_softmax(logits: np.ndarray) -> np.ndarray:
  shifted = logits - logits.max(axis=1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def test_cross_entropy_with_label_smoothing_and_padding_weighs_nothing():
  logits = np.array([[2.0, 0.5, -1.0, 0.0],
                     [0.1, 0.2, 0.3, 0.4],
                     [5.0, 5.0, 5.0, 5.0]], np.float32)
  labels = np.array([0, 3, -1], np.int32)  # the last: eval padding
  loss, top1, _, weight = (np.asarray(v) for v in losses_and_hits(
      logits, labels, num_classes=4, label_smoothing=0.1))
  targets = np.full((2, 4), 0.1 / 4) + 0.9 * np.eye(4)[[0, 3]]
  want = -(targets * _log_softmax(logits[:2])).sum(axis=1)
  np.testing.assert_allclose(loss[:2], want, rtol=1e-5)
  assert loss[2] == 0.0 and weight.tolist() == [1.0, 1.0, 0.0]
  assert top1.tolist() == [1.0, 1.0, 0.0]


def test_top5_counts_the_five_highest_logits():
  logits = np.arange(8, dtype=np.float32)[None].repeat(3, axis=0)
  labels = np.array([7, 3, 2], np.int32)  # ranks 1, 5 and 6
  _, top1, top5, _ = (np.asarray(v) for v in losses_and_hits(
      logits, labels, num_classes=8))
  assert top1.tolist() == [1.0, 0.0, 0.0]
  assert top5.tolist() == [1.0, 1.0, 0.0]


@pytest.mark.parametrize("num_classes", [1, 3, 4])
def test_with_fewer_than_five_classes_top5_is_every_class(num_classes):
  """k is min(5, classes), so no engine's kernel decides what k above the
  class count means (TensorFlow's and JAX's both count every class today:
  dropping the min() passes here on both, a top-4 fails)."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, num_classes)).astype(np.float32)
  labels = rng.integers(0, num_classes, size=6).astype(np.int32)
  labels[-1] = -1
  _, _, top5, weight = (np.asarray(v) for v in losses_and_hits(
      logits, labels, num_classes=num_classes))
  assert top5.tolist() == weight.tolist() == [1.0] * 5 + [0.0]
