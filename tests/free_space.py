"""Stops `make test` and CI before they start when the disk is too full.

  python3 tests/free_space.py SCRATCH_GB [VENV=GB ...]

A run installs each virtual environment not yet installed (VENV/.installed
missing) into the repository, and its tests write checkpoints and runs
under TMPDIR (SCRATCH_GB at the peak). Out of space half-way, pytest fails
every later test with "could not create numbered dir", as a CI run did; this
says instead, in one line, how much is needed where and how much is free.
Where the two folders share a disk their needs add up. Standard library
only: it runs before any virtual environment exists.
"""
import os
import shutil
import sys
import tempfile

GB = 1e9


def disk_needs(needs: list[tuple[str, float]]) -> dict[int, list]:
  """Per disk (st_dev) of the (folder, GB) needs: [its folders, the GB they
  need together, the GB free]."""
  disks: dict[int, list] = {}
  for folder, gb in needs:
    device = os.stat(folder).st_dev
    folders, total, _ = disks.get(device, ([], 0.0, 0.0))
    folders = folders + [folder] * (folder not in folders)
    disks[device] = [folders, total + gb, shutil.disk_usage(folder).free / GB]
  return disks


def shortfall(needs: list[tuple[str, float]]) -> str | None:
  """The message for the first disk with less free than needed, or None."""
  for folders, needed, free in disk_needs(needs).values():
    if needed > free:
      return (f"free_space: the tests need {needed:.1f} GB free on the disk "
              f"of {' and '.join(folders)}, and it has {free:.1f} GB. Free "
              "some (or point TMPDIR at a larger disk) and rerun.")
  return None


def needs_of(argv: list[str], root: str) -> list[tuple[str, float]]:
  """SCRATCH_GB for TMPDIR, then GB in root for each VENV=GB not installed."""
  if not argv:
    raise SystemExit(__doc__)
  needs = [(tempfile.gettempdir(), float(argv[0]))]
  for pair in argv[1:]:
    venv, gb = pair.split("=")
    if not os.path.exists(os.path.join(root, venv, ".installed")):
      needs.append((root, float(gb)))
  return needs


def main(argv: list[str]) -> int:
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  message = shortfall(needs_of(argv, root))
  if message:
    print(message, file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
