"""The declared requirements of every wheel that requirements/*.txt pin.

`python -m requirements.wheel_metadata` asks PyPI, through pip's dry run, for
each pinned wheel's Requires-Python and Requires-Dist, and for which CPython
versions a Linux x86_64 wheel exists. It writes wheels.json beside this file;
tests/test_requirements.py checks every pin against it offline.

`--resolve` (make check-requirements, run by CI) instead resolves every
install set (INSTALL_SETS: the files a user installs together) for every
Python it claims, and `--constraints` (make constraints) writes
constraints/test-py<X.Y>.txt, everything make test's .venv resolves on
Python X.Y. All three install nothing: pip's dry run for a `--python-version`
on Linux x86_64, whatever Python runs pip.
"""
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import NamedTuple

from absl import app
from absl import flags
from absl import logging
from packaging.markers import Marker
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.path.join(REPO, "requirements")
RECORD = os.path.join(FOLDER, "wheels.json")
CONSTRAINTS = os.path.join(FOLDER, "constraints")
# Recorded although no file pins it: the newest tensorflow-tpu, not chosen
# (libtpu~=0.0.14 and tensorboard~=2.20.0; see tpu-vm-tensorflow.txt).
EXTRA_PINS = ("tensorflow-tpu==2.20.0",)
PYTHONS = ("3.9", "3.10", "3.11", "3.12", "3.13")
# Linux x86_64 hosts (TPU VMs included) back to glibc 2.17: pip's --platform
# does not widen a manylinux_2_X tag to older ones by itself.
PLATFORMS = tuple(f"manylinux_2_{m}_x86_64" for m in range(17, 36)) + (
    "manylinux2014_x86_64", "linux_x86_64")
# What users install together, one fresh environment each, and the test
# environments: (files, pip options, the Pythons CI resolves it for: the
# stock python3 of the machines it is for; tests/test_requirements.py checks
# every other Python a file claims against wheels.json).
TEST_SET = ("cpu.txt", "test-tools.txt", "test-jax.txt")
STOCK = ("3.10", "3.11", "3.12")  # Ubuntu 22.04, Debian 12, Ubuntu 24.04
INSTALL_SETS = {
    "CPU, TensorFlow": (("cpu.txt",), (), STOCK),
    "make test": (TEST_SET, (), STOCK),
    "GPU host, TensorFlow": (("gpu-tensorflow.txt",), (), ("3.10", "3.12")),
    "GPU host, JAX": (("gpu-jax.txt",), (), STOCK),
    # TPU VM images carry 3.10; 3.11 and 3.12 get a newer JAX (docs/tpu.md).
    "TPU VM, TensorFlow": (("tpu-vm-tensorflow.txt",), (), ("3.10",)),
    "TPU pod worker 0, TensorFlow": (("tpu-vm-tensorflow.txt",
                                      "tpu-pod.txt"), (), ("3.10",)),
    "make test-tpu-build": (("tpu-vm-tensorflow.txt", "test-tools.txt"), (),
                            ("3.10",)),
    "TPU VM, JAX": (("tpu-vm-jax.txt",), (), STOCK),
    # The H200 image: Python 3.12 with JAX and no TensorFlow.
    "JAX without TensorFlow": (("jax-without-tensorflow.txt",), (),
                               ("3.12",)),
    "make bench-gpu": (("bench-gpu.txt",), ("--no-deps",), ("3.12",)),
    "make lint": (("lint.txt",), (), ("3.11",)),
}
flags.DEFINE_bool("resolve", False, "Resolve every install set with pip for "
                  "every Python it claims; record nothing.")
flags.DEFINE_bool("constraints", False, "Write constraints/test-py<X.Y>.txt "
                  "for every Python make test's set claims.")
_PIN = re.compile(r"^([A-Za-z0-9._-]+)(\[[A-Za-z0-9_,.-]+\])?==([^\s;#]+)"
                  r"\s*(?:;\s*(.+))?$")


class Pin(NamedTuple):
  """One requirement line: name[extras]==version, for the Pythons `marker`
  allows (every Python where it is None)."""
  name: str
  version: str
  extras: tuple[str, ...]
  marker: Marker | None


def requirement_files() -> list[str]:
  """Paths of requirements/*.txt, sorted."""
  return sorted(os.path.join(FOLDER, f) for f in os.listdir(FOLDER)
                if f.endswith(".txt"))


def read_pins(path: str) -> dict:
  """{"requires_python": spec or None, "lines": [Pin, ...]}.

  Every requirement line must be an exact `name[extras]==version` pin,
  optionally with an environment marker (`; python_version < "3.11"`); the
  `# requires-python: SPEC` comment states the Pythons the file supports.
  """
  lines, requires_python = [], None
  for number, line in enumerate(open(path), 1):
    comment = re.match(r"#\s*requires-python:\s*(\S+)", line.strip())
    if comment:
      requires_python = comment.group(1)
    text = line.split("#")[0].strip()
    if not text:
      continue
    match = _PIN.match(text)
    if not match:
      raise ValueError(f"{os.path.basename(path)}:{number}: {text!r} is not "
                       "an exact pin name==version [; marker]")
    name, extras, version, marker = match.groups()
    extras = tuple(sorted(extras.strip("[]").split(","))) if extras else ()
    lines.append(Pin(canonicalize_name(name), version, extras,
                     Marker(marker) if marker else None))
  return {"requires_python": requires_python, "lines": lines}


def environment(python: str) -> dict[str, str]:
  """Marker variables of CPython `python` on Linux x86_64."""
  return {"python_version": python, "python_full_version": python + ".0",
          "sys_platform": "linux", "platform_system": "Linux",
          "platform_machine": "x86_64", "os_name": "posix",
          "implementation_name": "cpython",
          "platform_python_implementation": "CPython"}


def pins_on(parsed: dict, python: str) -> dict[str, tuple[str, tuple]]:
  """{name: (version, extras)} of a read_pins() result on `python`.

  Raises ValueError where two lines pin one name for the same Python.
  """
  pins = {}
  for pin in parsed["lines"]:
    if pin.marker is None or pin.marker.evaluate(environment(python)):
      if pin.name in pins:
        raise ValueError(f"{pin.name} pinned twice for Python {python}")
      pins[pin.name] = (pin.version, pin.extras)
  return pins


def pythons(*parsed: dict) -> list[str]:
  """The Pythons of PYTHONS that every one of `parsed` claims."""
  claim = SpecifierSet()
  for one in parsed:
    claim &= SpecifierSet(one["requires_python"] or "")
  return [p for p in PYTHONS if claim.contains(p)]


def load() -> dict:
  """The committed record: {"name==version": {...}}."""
  with open(RECORD) as f:
    return json.load(f)["wheels"]


def _pip_dry_run(args: list[str], python: str,
                 explain: str = "") -> list[dict] | None:
  """pip's report of what `pip install ARGS` would install, or None.

  Wheels only, for CPython `python` on Linux x86_64, whatever runs pip.
  Where it fails and `explain` names the attempt, pip's errors are logged.
  """
  with tempfile.TemporaryDirectory() as target:
    report = os.path.join(target, "report.json")
    command = [sys.executable, "-m", "pip", "install", "--dry-run",
               "--ignore-installed", "--quiet", "--report", report,
               "--only-binary=:all:", "--python-version", python,
               "--target", target] + args
    for platform in PLATFORMS:
      command += ["--platform", platform]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
      if explain:
        logging.warning("%s: %s", explain, " ".join(
            line for line in run.stderr.splitlines()
            if line.startswith("ERROR")))
      return None
    with open(report) as f:
      return json.load(f)["install"]


def _dry_run(pin: str, python: str) -> dict | None:
  """pip's report on installing `pin` alone for `python`, or None."""
  install = _pip_dry_run(["--no-deps", pin], python)
  return install[0] if install else None


def _resolve_set(files: tuple[str, ...], options: tuple[str, ...],
                 python: str) -> list[dict] | None:
  """pip's install report for one install set on `python`, or None.

  The files' markers are evaluated here, for `python`: pip evaluates them
  for the Python that runs it, whatever --python-version says.
  """
  pins = {}
  for name in files:
    pins.update(pins_on(read_pins(os.path.join(FOLDER, name)), python))
  lines = [f"{n}[{','.join(e)}]=={v}" if e else f"{n}=={v}"
           for n, (v, e) in sorted(pins.items())]
  return _pip_dry_run(list(options) + lines, python,
                      f"{' + '.join(files)} on {python}")


def resolve() -> bool:
  """Resolves every install set for its target Pythons, 4 at a time."""
  jobs = {}
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    for label, (files, options, targets) in INSTALL_SETS.items():
      for python in targets:
        jobs[(label, python)] = pool.submit(_resolve_set, files, options,
                                           python)
  failed = []
  for (label, python), job in jobs.items():
    install = job.result()
    logging.info("%s on Python %s: %s", label, python,
                 f"{len(install)} packages" if install else "FAILED")
    if install is None:
      failed.append(f"{label} on Python {python}")
  if failed:
    logging.error("pip cannot install: %s (rerun one with pip install "
                  "--dry-run to see why)", "; ".join(failed))
  return not failed


def constraints_path(python: str) -> str:
  """constraints/test-py<python>.txt: make test's .venv, pinned whole."""
  return os.path.join(CONSTRAINTS, f"test-py{python}.txt")


def write_constraints() -> bool:
  """Writes constraints_path(p) for every Python TEST_SET claims."""
  parsed = [read_pins(os.path.join(FOLDER, f)) for f in TEST_SET]
  ok = True
  for python in pythons(*parsed):
    install = _resolve_set(TEST_SET, (), python)
    if install is None:
      logging.error("make test's set does not resolve on Python %s", python)
      ok = False
      continue
    pins = sorted(f"{i['metadata']['name']}=={i['metadata']['version']}"
                  for i in install)
    with open(constraints_path(python), "w") as f:
      f.write(f"# Every package make test's .venv resolves on Python "
              f"{python} ({' + '.join(TEST_SET)}),\n# pinned; installs take "
              "it with -c. Rewrite after a pin changes: make constraints.\n")
      f.write("".join(p + "\n" for p in sorted(pins, key=str.lower)))
    logging.info("Wrote %s (%d packages)", constraints_path(python),
                 len(pins))
  return ok


def _record(pin: str, extras: set[str]) -> dict:
  """Requires-Python, Requires-Dist (requested extras only), wheel Pythons."""
  install = next(filter(None, (_dry_run(pin, p)
                              for p in ("3.11", "3.10", "3.12", "3.13"))),
                 None)
  if install is None:
    raise ValueError(f"{pin}: no Linux x86_64 wheel on PyPI")
  metadata = install["metadata"]
  requires = [r for r in metadata.get("requires_dist", [])
              if "extra ==" not in r
              or any(f"extra == '{e}'" in r or f'extra == "{e}"' in r
                     for e in extras)]
  wheel = install["download_info"]["url"].rsplit("/", 1)[1]
  python_tag = wheel.split("-")[-3]
  wheel_pythons = None  # a py3 wheel: any Python its Requires-Python allows
  if python_tag.startswith("cp"):
    wheel_pythons = [p for p in PYTHONS if _dry_run(pin, p)]
  return {"requires_python": metadata.get("requires_python"),
          "requires_dist": requires, "wheel_pythons": wheel_pythons}


def main(argv: list[str]) -> None:
  del argv
  if flags.FLAGS.resolve:
    sys.exit(0 if resolve() else 1)
  if flags.FLAGS.constraints:
    sys.exit(0 if write_constraints() else 1)
  wanted: dict[str, set[str]] = {pin: set() for pin in EXTRA_PINS}
  for path in requirement_files():
    for pin in read_pins(path)["lines"]:
      wanted.setdefault(f"{pin.name}=={pin.version}", set()).update(
          pin.extras)
  wheels = {}
  for pin in sorted(wanted):
    logging.info("%s", pin)
    wheels[pin] = _record(pin, wanted[pin])
  with open(RECORD, "w") as f:
    json.dump({"about": __doc__.splitlines()[0], "wheels": wheels}, f,
              indent=1)
    f.write("\n")
  logging.info("Wrote %s (%d wheels)", RECORD, len(wheels))


if __name__ == "__main__":
  app.run(main)
