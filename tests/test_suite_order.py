"""make test's file order (suite_order.py): the heaviest files first, the
rest as collected, and every file each suite names exists."""
import ast
import os
import types

import suite_order

TESTS = os.path.dirname(os.path.abspath(__file__))


def _item(path: str) -> types.SimpleNamespace:
  return types.SimpleNamespace(path=types.SimpleNamespace(
      name=os.path.basename(path.split("::")[0])), nodeid=path)


def test_named_files_come_first_in_their_order_the_rest_as_collected():
  items = [_item(n) for n in ("a.py::1", "b.py::1", "slow.py::1", "c.py::1",
                              "slow.py::2", "slower.py::1")]
  suite_order.heaviest_first(items, ("slower.py", "slow.py"))
  assert [i.nodeid for i in items] == ["slower.py::1", "slow.py::1",
                                       "slow.py::2", "a.py::1", "b.py::1",
                                       "c.py::1"]


def _heaviest(conftest: str) -> tuple[str, ...]:
  with open(conftest) as f:
    tree = ast.parse(f.read())
  (value,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
              and any(getattr(t, "id", "") == "HEAVIEST"
                      for t in node.targets)]
  return ast.literal_eval(value)


def test_each_suite_names_files_it_has():
  for folder in (TESTS, os.path.join(os.path.dirname(TESTS), "tests_jax")):
    names = _heaviest(os.path.join(folder, "conftest.py"))
    assert len(names) >= 5
    missing = [n for n in names if not os.path.exists(os.path.join(folder, n))]
    assert not missing, (folder, missing)
