"""The order the suite's test files start in (both suites' conftest.py).

pytest-xdist's --dist loadfile gives each worker a file at a time, and by
default starts the files with the most tests first; a file of a few long
tests (the demo on both engines: 12 tests, 5 minutes) then starts late and
leaves one worker running alone at the end. Started longest first (with
--no-loadscope-reorder, as make test runs them), the two workers end
together: the longest-processing-time rule.
"""
import pytest


def longest_first(items: list[pytest.Item], files: tuple[str, ...]) -> None:
  """Sorts `items` so that the test files named in `files` (file names,
  longest first) come first, in that order, and every other file after
  them in collection order; a file's own tests keep their order."""
  rank = {name: i for i, name in enumerate(files)}
  items.sort(key=lambda item: rank.get(item.path.name, len(files)))
