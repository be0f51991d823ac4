"""The declared requirements of every wheel that requirements*.txt pin.

`python -m requirements.wheel_metadata` asks PyPI, through pip's dry run, for
each pinned wheel's Requires-Python and Requires-Dist, and for which CPython
versions a Linux x86_64 wheel exists. It writes wheels.json beside this file;
tests/test_requirements.py checks every pin against it offline.

`--resolve` (make check-requirements) instead resolves each file for real for
the lowest and highest Python it claims. Both install nothing, but pip
downloads every wheel whose index serves no separate metadata file (over a
gigabyte for the TensorFlow wheels), so neither runs in CI.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

from absl import app
from absl import flags
from absl import logging
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(REPO, "requirements", "wheels.json")
# Recorded although no file pins it: the newest tensorflow-tpu, not chosen
# (libtpu~=0.0.14 and tensorboard~=2.20.0; see requirements-tpu.txt).
EXTRA_PINS = ("tensorflow-tpu==2.20.0",)
PYTHONS = ("3.9", "3.10", "3.11", "3.12", "3.13")
# Linux x86_64 hosts (TPU VMs included) back to glibc 2.17: pip's --platform
# does not widen a manylinux_2_X tag to older ones by itself.
PLATFORMS = tuple(f"manylinux_2_{m}_x86_64" for m in range(17, 36)) + (
    "manylinux2014_x86_64", "linux_x86_64")
flags.DEFINE_bool("resolve", False, "Resolve each requirements file with pip "
                  "for the lowest and highest Python it claims; record "
                  "nothing.")
_PIN = re.compile(r"^([A-Za-z0-9._-]+)(\[[A-Za-z0-9_,.-]+\])?==([^\s;#]+)$")


def requirement_files() -> list[str]:
  """Paths of the repository's requirements*.txt, sorted."""
  return sorted(os.path.join(REPO, f) for f in os.listdir(REPO)
                if re.fullmatch(r"requirements(-[a-z0-9-]+)?\.txt", f))


def read_pins(path: str) -> dict:
  """{"requires_python": spec or None, "pins": {name: (version, extras)}}.

  Every requirement line must be an exact `name[extras]==version` pin; the
  `# requires-python: SPEC` comment states the Pythons the file supports.
  """
  pins, requires_python = {}, None
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
                       "an exact pin name==version")
    name, extras, version = match.groups()
    extras = tuple(sorted(extras.strip("[]").split(","))) if extras else ()
    pins[canonicalize_name(name)] = (version, extras)
  return {"requires_python": requires_python, "pins": pins}


def load() -> dict:
  """The committed record: {"name==version": {...}}."""
  with open(RECORD) as f:
    return json.load(f)["wheels"]


def _pip_dry_run(args: list[str], python: str,
                 quiet: bool = True) -> list[dict] | None:
  """pip's report of what `pip install ARGS` would install, or None.

  Wheels only, for CPython `python` on Linux x86_64, whatever runs pip.
  """
  with tempfile.TemporaryDirectory() as target:
    report = os.path.join(target, "report.json")
    command = [sys.executable, "-m", "pip", "install", "--dry-run",
               "--ignore-installed", "--quiet", "--report", report,
               "--only-binary=:all:", "--python-version", python,
               "--target", target] + args
    for platform in PLATFORMS:
      command += ["--platform", platform]
    if subprocess.run(command, capture_output=quiet).returncode != 0:
      return None
    with open(report) as f:
      return json.load(f)["install"]


def _dry_run(pin: str, python: str) -> dict | None:
  """pip's report on installing `pin` alone for `python`, or None."""
  install = _pip_dry_run(["--no-deps", pin], python)
  return install[0] if install else None


def resolve() -> bool:
  """Resolves every requirements file for its lowest and highest Python."""
  ok = True
  for path in requirement_files():
    claim = SpecifierSet(read_pins(path)["requires_python"])
    pythons = [p for p in PYTHONS if claim.contains(p)]
    for python in sorted({pythons[0], pythons[-1]}):
      install = _pip_dry_run(["-r", path], python, quiet=False)
      logging.info("%s on Python %s: %s", os.path.basename(path), python,
                   f"{len(install)} packages" if install else "FAILED")
      ok = ok and install is not None
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
  wanted: dict[str, set[str]] = {pin: set() for pin in EXTRA_PINS}
  for path in requirement_files():
    for name, (version, extras) in read_pins(path)["pins"].items():
      wanted.setdefault(f"{name}=={version}", set()).update(extras)
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
