"""The test session's own set-up: the order its files start in
(schedule.py) and the JAX compilation cache its main.py runs share
(main_runs.py)."""
import os
import types

from main_runs import SESSION_JAX_CACHE
from main_runs import env
from schedule import longest_first


def _items(*nodes: str) -> list:
  return [types.SimpleNamespace(path=types.SimpleNamespace(
      name=node.split("::")[0]), node=node) for node in nodes]


def test_listed_files_start_first_longest_first_and_keep_their_order():
  items = _items("a.py::1", "b.py::1", "long.py::1", "c.py::1",
                 "longest.py::1", "long.py::2", "longest.py::2")
  items.sort(key=lambda item: item.node.split("::")[0])  # collected
  longest_first(items, ("longest.py", "long.py"))
  assert [item.node for item in items] == [
      "longest.py::1", "longest.py::2", "long.py::1", "long.py::2",
      "a.py::1", "b.py::1", "c.py::1"]


def test_main_py_runs_share_the_sessions_jax_compilation_cache():
  folder = os.environ[SESSION_JAX_CACHE]
  assert os.path.isdir(folder)
  child = env()
  assert child["JAX_COMPILATION_CACHE_DIR"] == folder
  assert SESSION_JAX_CACHE not in child
