"""The loss and accuracy of a batch, written once in keras.ops for both
engines' steps (engines/tensorflow/step.py, engines/jax/step.py).

Softmax cross-entropy with label smoothing (Ying et al. 2018; Mikami et al.
2018 §3); top-1 and top-5 hits, top-5 meaning every class where there are
fewer than 5; padded examples (label -1, the eval set's last batch) weigh
nothing.
"""
import keras
from keras import ops


def losses_and_hits(logits, labels, num_classes: int,
                    label_smoothing: float = 0.0):
  """Per-example loss, top-1 and top-5 hits, and weight (0 for label -1),
  each float32 of shape [batch]."""
  logits = ops.cast(logits, "float32")
  weight = ops.cast(labels >= 0, "float32")
  labels = ops.maximum(labels, 0)
  one_hot = ops.one_hot(labels, num_classes)
  per_example = keras.losses.categorical_crossentropy(
      one_hot, logits, from_logits=True, label_smoothing=label_smoothing)
  top1 = ops.cast(ops.in_top_k(labels, logits, 1), "float32")
  top5 = ops.cast(ops.in_top_k(labels, logits, min(5, num_classes)),
                  "float32")
  return per_example * weight, top1 * weight, top5 * weight, weight
