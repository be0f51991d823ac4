"""tests/free_space.py: `make test` and CI stop before start-up, in one line,
when the disk cannot hold what they install and write."""
import os
import shutil
import subprocess
import sys

from tests import free_space

GB = 1e9


def test_two_folders_on_one_disk_need_the_sum_of_their_needs(tmp_path):
  (tmp_path / "venvs").mkdir()
  free = shutil.disk_usage(tmp_path).free / GB
  half = [(str(tmp_path), 0.6 * free)]
  both = half + [(str(tmp_path / "venvs"), 0.6 * free)]
  assert free_space.shortfall(half) is None
  message = free_space.shortfall(both)
  assert f"need {1.2 * free:.1f} GB free on the disk of {tmp_path} and " \
      f"{tmp_path / 'venvs'}" in message


def test_an_installed_environment_needs_nothing_more(tmp_path):
  (tmp_path / ".venv").mkdir()
  (tmp_path / ".venv" / ".installed").touch()
  needs = free_space.needs_of(["3", ".venv=2.4", ".venv-jax=2.8"],
                              str(tmp_path))
  assert [gb for _, gb in needs] == [3.0, 2.8]
  assert needs[1][0] == str(tmp_path)


def test_too_little_space_prints_one_line_and_exits_1(tmp_path):
  env = dict(os.environ, TMPDIR=str(tmp_path))
  script = os.path.join(os.path.dirname(__file__), "free_space.py")
  free = shutil.disk_usage(tmp_path).free / GB
  short = subprocess.run([sys.executable, script, str(2 * free)], env=env,
                         capture_output=True, text=True, timeout=60)
  assert short.returncode == 1
  assert short.stderr.count("\n") == 1
  assert f"disk of {tmp_path}, and it has" in short.stderr
  enough = subprocess.run([sys.executable, script, "0.001"], env=env,
                          capture_output=True, text=True, timeout=60)
  assert (enough.returncode, enough.stderr) == (0, "")


def test_make_test_and_ci_check_the_space_before_installing_anything():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(root, "Makefile")) as f:
    makefile = f.read()
  with open(os.path.join(root, ".ci", "run")) as f:
    ci_commands = [line for line in f if line.startswith(("make", "run "))]
  assert "\ntest: free-space test-tf test-jax\n" in makefile
  assert ci_commands[0] == "make free-space-ci || exit\n"
