"""The JAX suite's own set-up: every test compiles into the session's JAX
compilation cache (conftest.session_compilation_cache), whatever the test
before it left the cache pointing at. The two tests run in this order (a
file runs on one worker, top to bottom)."""
import os

import jax

from main_runs import SESSION_JAX_CACHE
from resnet_tpu.engines.jax import startup


def test_a_test_that_points_the_cache_elsewhere(tmp_path):
  assert jax.config.jax_compilation_cache_dir == os.environ[
      SESSION_JAX_CACHE]
  startup.use_compilation_cache(str(tmp_path))  # as run.run does
  assert jax.config.jax_compilation_cache_dir == str(tmp_path)


def _session_cache_probe(x):
  return x * 3.25 + 1.0


def test_the_next_test_compiles_into_the_sessions_cache_again():
  folder = os.environ[SESSION_JAX_CACHE]
  assert jax.config.jax_compilation_cache_dir == folder
  x = jax.numpy.ones(7)
  kept_from = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  try:  # a program that compiles in milliseconds is kept too
    jax.jit(_session_cache_probe)(x).block_until_ready()
  finally:
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      kept_from)
  assert [name for name in os.listdir(folder)
          if name.startswith("jit__session_cache_probe-")]
