"""Dynamic loss scaling's rule, on either engine (--precision=float16).

The loss is multiplied by a scale S before the backward pass and the
gradients divided by S (Micikevicius et al. 2018, "Mixed Precision
Training", §3.2). A step whose loss or summed gradients are not finite is
skipped and S halves (to no less than 1); after GROWTH_STEPS finite steps in
a row S doubles: keras.optimizers.LossScaleOptimizer's dynamic rule and
defaults. TensorFlow keeps S in replica-local variables (loss_scale.py);
the JAX step carries it in its TrainState (engines/jax/step.py). Both take the
next S from `next_scale`, written in keras.ops.
"""
from keras import ops

INITIAL_SCALE = 2.0 ** 15
GROWTH_STEPS = 2000


def next_scale(scale, good_steps, finite, growth_steps: int):
  """(S, finite steps since S last changed) after a step that was
  `finite` (a boolean scalar, the same on every replica)."""
  good = ops.where(finite, good_steps + 1, ops.zeros_like(good_steps))
  grow = good >= growth_steps
  scale = ops.where(finite, ops.where(grow, scale * 2.0, scale),
                    ops.maximum(scale / 2.0, 1.0))
  return scale, ops.where(grow, ops.zeros_like(good), good)
