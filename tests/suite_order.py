"""The suite's heaviest files first, so that the two pytest-xdist workers
(--dist loadfile: a file to a worker at a time, make test) end together.

pytest-xdist's default order (--loadscope-reorder) puts the files with the
most tests first, so a file of one or two long tests (the two-host runs)
started last and ran alone at the end: the JAX suite's two workers had
1596 s of tests and took 906 s (measured, 2 cores). make test turns that
order off (--no-loadscope-reorder) and each suite's conftest.py names its
heaviest files here, measured from `pytest --durations` on 2 cores.
"""
import pytest


def heaviest_first(items: list[pytest.Item],
                   heaviest: tuple[str, ...]) -> None:
  """Sorts `items` in place: the files named in `heaviest` (file names,
  heaviest first) before all others, each file's tests and the other
  files in their collected order."""
  rank = {name: i for i, name in enumerate(heaviest)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
