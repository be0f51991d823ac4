"""Make targets install what they need (issue 50): the targets that read
Debian's dataset-fashion-mnist depend on the step that installs it, and that
step installs the package into the folder the lab reads."""
import os
import re

from lab import study_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _makefile() -> str:
  with open(os.path.join(ROOT, "Makefile")) as f:
    return f.read()


def _prerequisites(target: str) -> list[str]:
  match = re.search(rf"^{re.escape(target)}:([^\n]*)$", _makefile(), re.M)
  assert match, f"no target {target}"
  return match.group(1).split()


def test_every_target_that_reads_fashion_mnist_installs_it_first():
  targets = re.findall(r"^(bench[\w-]*|study[\w-]*):", _makefile(),
                       re.M)
  # These time synthetic input only.
  targets = [t for t in targets if t not in ("bench-gpu", "bench-gpu-wheels",
                                             "bench-collectives",
                                             "bench-cpu-kernels",
                                             "bench-compile-cache",
                                             "bench-engines-cpu")]
  assert {"bench", "bench-eval-stall"} <= set(targets)
  assert len(targets) >= 9
  for target in targets:
    assert "fashion-mnist" in _prerequisites(target), target


def test_the_engines_bench_makes_the_demo_data_where_it_is_missing(tmp_path):
  """make bench-engines-cpu times the demo on its own data (make demo-data)."""
  import subprocess
  done = subprocess.run(
      ["make", "-n", "bench-engines-cpu", f"DEMO_DATA={tmp_path}/none"],
      cwd=ROOT, capture_output=True, text=True, check=True)
  assert "data.make_synthetic" in done.stdout
  assert (f"lab.bench_engines_cpu --data_dir={tmp_path}/none/tfrecords"
          in done.stdout)


def test_the_install_step_targets_the_folder_the_lab_reads():
  makefile = _makefile()
  assert (f"FASHION_MNIST_DIR := {study_data.FASHION_MNIST_DIR}\n"
          in makefile)
  recipe = makefile.split("\nfashion-mnist:\n", 1)[1].split("\n\n", 1)[0]
  assert "test -d $(FASHION_MNIST_DIR)" in recipe
  assert "apt-get install -y -qq dataset-fashion-mnist" in recipe
  # Where it cannot install, one line says how, and the target fails.
  assert "sudo apt-get install dataset-fashion-mnist" in recipe
  assert "exit 1" in recipe
