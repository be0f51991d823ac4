"""float64 on JAX for the tests, on every JAX make test installs:
jax.enable_x64 in JAX 0.10 and later, jax.experimental.enable_x64 in 0.6.2
(the last JAX for Python 3.10), which has no jax.enable_x64."""
import contextlib

import jax


def enable_x64(on: bool = True) -> contextlib.AbstractContextManager:
  """A context in which JAX computes in float64 (`on`) or not."""
  if hasattr(jax, "enable_x64"):
    return jax.enable_x64(on)
  from jax import experimental  # pylint: disable=g-import-not-at-top
  return experimental.enable_x64(on)
