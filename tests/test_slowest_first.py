"""slowest_first.py: its lists name test files that exist, each once, and
`order` runs them first, the rest in the order collected."""
import os
from types import SimpleNamespace

import slowest_first

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_each_listed_file_exists_once_in_its_suite():
  for suite, folder in ((slowest_first.TENSORFLOW_SUITE, "tests"),
                        (slowest_first.JAX_SUITE, "tests_jax")):
    assert len(set(suite)) == len(suite)
    for path in suite:
      assert path.startswith(folder + "/"), path
      assert os.path.isfile(os.path.join(ROOT, path)), path


def test_the_listed_files_go_first_and_the_rest_keep_their_order():
  items = [SimpleNamespace(nodeid=f"{path}::test_{i}") for path, i in (
      ("tests/a.py", 1), ("tests/slow.py", 1), ("tests/b.py", 1),
      ("tests/slower.py", 1), ("tests/slow.py", 2), ("tests/a.py", 2))]
  slowest_first.order(items, ("tests/slower.py", "tests/slow.py"))
  assert [item.nodeid for item in items] == [
      "tests/slower.py::test_1", "tests/slow.py::test_1",
      "tests/slow.py::test_2", "tests/a.py::test_1", "tests/b.py::test_1",
      "tests/a.py::test_2"]
