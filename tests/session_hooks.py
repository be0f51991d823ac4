"""pytest hooks both suites' conftest.py take: the test session's JAX
compilation cache (main_runs.SESSION_JAX_CACHE), made before the session's
tests and removed after them."""
import os
import shutil
import tempfile

import pytest

from main_runs import SESSION_JAX_CACHE

_OWN_JAX_CACHE = pytest.StashKey[str]()  # set in the process that made it


def pytest_configure(config: pytest.Config) -> None:
  """The session's cache folder, made by its first process (pytest-xdist's
  workers, and a pytest that a test starts, inherit its environment)."""
  if not os.environ.get(SESSION_JAX_CACHE):
    path = tempfile.mkdtemp(prefix="jax_cache_")
    os.environ[SESSION_JAX_CACHE] = config.stash[_OWN_JAX_CACHE] = path


def pytest_unconfigure(config: pytest.Config) -> None:
  """The folder goes with the session that made it."""
  path = config.stash.get(_OWN_JAX_CACHE, "")
  if path:
    os.environ.pop(SESSION_JAX_CACHE, None)
    shutil.rmtree(path, ignore_errors=True)
