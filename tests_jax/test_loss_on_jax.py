"""train/loss.py's specification (tests/test_loss.py) run on JAX: the one
loss and accuracy of both engines' steps, checked under each engine."""
from tests.test_loss import (  # noqa: F401  (collected here, on JAX)
    test_cross_entropy_with_label_smoothing_and_padding_weighs_nothing,
    test_top5_counts_the_five_highest_logits,
    test_with_fewer_than_five_classes_top5_is_every_class)
