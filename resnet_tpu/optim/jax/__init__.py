"""How JAX's replicas meet an optimizer: the step's psum has summed the
gradients before it (optimizers.py)."""
