"""Every requirements/*.txt pins published wheels that install together.

requirements/wheels.json records what each pinned wheel declares on PyPI
(`python -m requirements.wheel_metadata` rewrites it after a pin changes);
these tests check the pins against it offline, for every Python each file
claims, its environment markers evaluated for that Python.
`make check-requirements` (CI) asks pip to resolve every install set.
"""
import os
import subprocess

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from requirements import wheel_metadata

FILES = {os.path.basename(p): wheel_metadata.read_pins(p)
         for p in wheel_metadata.requirement_files()}
WHEELS = wheel_metadata.load()
TENSORFLOWS = ("tensorflow", "tensorflow-cpu", "tensorflow-tpu",
               "tensorflow-intel")
# One file per target, each with its one TensorFlow (the JAX targets read
# their input with tensorflow-cpu); add-ons are installed beside the targets
# named here and pin no TensorFlow.
TARGETS = ("cpu.txt", "gpu-tensorflow.txt", "tpu-vm-tensorflow.txt",
           "gpu-jax.txt", "tpu-vm-jax.txt")
NO_TENSORFLOW = ("jax-without-tensorflow.txt",)
ADD_ONS = {"test-tools.txt": ("cpu.txt", "tpu-vm-tensorflow.txt"),
           "test-jax.txt": ("cpu.txt",),
           "lint.txt": (),
           # An environment of its own: what the GPU bench carries beside
           # the H200 image's JAX and torch.
           "bench-gpu.txt": (),
           "tpu-pod.txt": ("tpu-vm-tensorflow.txt",)}
JAX_FILES = ("test-jax.txt", "gpu-jax.txt", "tpu-vm-jax.txt",
             "jax-without-tensorflow.txt")


def _pythons(name: str) -> list[str]:
  """The Python minor versions that file `name` claims to support."""
  return wheel_metadata.pythons(FILES[name])


def _pins(name: str, python: str) -> dict[str, tuple[str, tuple]]:
  """{package: (version, extras)} that file `name` installs on `python`."""
  return wheel_metadata.pins_on(FILES[name], python)


def _cases(names=None) -> list[tuple[str, str]]:
  """(file, Python) for every Python each file claims."""
  return [(n, p) for n in sorted(names or FILES) for p in _pythons(n)]


def _declared(pins: dict, python: str) -> list[tuple[str, Requirement]]:
  """(pinned package, requirement) pairs that apply on Linux x86_64.

  Pins without a record declare nothing here (the record test names them).
  """
  declared = []
  for package, (version, extras) in pins.items():
    wheel = WHEELS.get(f"{package}=={version}", {"requires_dist": []})
    for text in wheel["requires_dist"]:
      requirement = Requirement(text)
      environment = wheel_metadata.environment(python)
      if requirement.marker is None or any(
          requirement.marker.evaluate({**environment, "extra": extra})
          for extra in ("",) + extras):
        declared.append((package, requirement))
  return declared


def _tensorflow(pins: dict) -> str:
  """The one TensorFlow distribution that `pins` holds."""
  found = [p for p in pins if p in TENSORFLOWS]
  assert len(found) == 1, f"{found}, not one TensorFlow"
  return found[0]


def test_there_is_one_requirements_file_per_target_and_add_on():
  assert set(FILES) == set(TARGETS) | set(NO_TENSORFLOW) | set(ADD_ONS)
  for name in set(ADD_ONS) | set(NO_TENSORFLOW):
    assert not {line.name for line in FILES[name]["lines"]} & set(
        TENSORFLOWS), name


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_file_states_the_pythons_it_supports(name):
  assert FILES[name]["requires_python"], (
      f"{name} lacks a '# requires-python: SPEC' line")
  assert _pythons(name), f"{name} claims no Python in {wheel_metadata.PYTHONS}"


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_line_applies_to_a_python_the_file_claims_and_none_twice(name):
  used = set()
  for python in _pythons(name):  # pins_on raises on a package pinned twice
    pins = _pins(name, python)
    used |= {(p, v) for p, (v, _) in pins.items()}
  dead = [f"{line.name}=={line.version}; {line.marker}"
          for line in FILES[name]["lines"]
          if (line.name, line.version) not in used]
  assert not dead, f"{name}: no Python it claims installs {dead}"


def test_a_marker_is_read_for_the_python_it_names():
  cpu = FILES["cpu.txt"]
  assert _pins("cpu.txt", "3.10")["keras"][0] == "3.12.4"
  assert _pins("cpu.txt", "3.11")["keras"][0] == "3.15.1"
  assert {line.name for line in cpu["lines"]}.issuperset({"keras"})


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_pin_names_a_published_wheel_whose_metadata_was_recorded(name):
  unrecorded = [f"{line.name}=={line.version}" for line in
                FILES[name]["lines"]
                if f"{line.name}=={line.version}" not in WHEELS]
  assert not unrecorded, (
      f"{name}: {unrecorded} not in requirements/wheels.json; a version that "
      "PyPI does not publish, or run python -m requirements.wheel_metadata")


def _outside(pins: dict, python: str) -> set[str]:
  """Pins outside a range that another pin declares, on `python`."""
  return {
      f"{r.name}=={pins[canonicalize_name(r.name)][0]} outside "
      f"{package}'s {r.specifier} (Python {python})"
      for package, r in _declared(pins, python)
      if canonicalize_name(r.name) in pins and not r.specifier.contains(
          pins[canonicalize_name(r.name)][0], prereleases=True)}


@pytest.mark.parametrize("name,python", _cases())
def test_every_pin_falls_inside_the_ranges_its_other_pins_declare(
    name, python):
  outside = _outside(_pins(name, python), python)
  assert not outside, f"{name}: {sorted(outside)}"


@pytest.mark.parametrize("add_on,target", [
    (a, t) for a, targets in sorted(ADD_ONS.items()) for t in targets])
def test_every_add_on_installs_beside_its_targets(add_on, target):
  assert set(_pythons(target)) <= set(_pythons(add_on)), (
      f"{add_on} does not cover every Python of {target}")
  for python in _pythons(target):
    pins = _pins(add_on, python)
    assert not set(pins) & set(_pins(target, python))
    outside = _outside({**_pins(target, python), **pins}, python)
    assert not outside, f"{add_on} beside {target}: {sorted(outside)}"


@pytest.mark.parametrize("name,python", _cases(TARGETS))
def test_every_file_pins_the_keras_tensorboard_numpy_and_libtpu_its_tensorflow_declares(
    name, python):
  pins = _pins(name, python)
  tensorflow = _tensorflow(pins)
  required = {canonicalize_name(r.name)
              for package, r in _declared(pins, python)
              if package == tensorflow}
  unpinned = [p for p in ("keras", "tensorboard", "numpy", "libtpu")
              if p in required and p not in pins]
  assert not unpinned, f"{name} leaves {unpinned} to the resolver"


@pytest.mark.parametrize("name,python", _cases())
def test_every_pin_has_a_wheel_for_every_python_its_file_claims(name, python):
  missing = []
  for package, (version, _) in _pins(name, python).items():
    wheel = WHEELS.get(f"{package}=={version}")
    if wheel is None:
      continue  # the record test names it
    if not wheel_metadata.SpecifierSet(
        wheel["requires_python"] or "").contains(python):
      missing.append(f"{package}=={version} Requires-Python "
                     f"{wheel['requires_python']} excludes {python}")
    elif wheel["wheel_pythons"] is not None and (
        python not in wheel["wheel_pythons"]):
      missing.append(f"{package}=={version} has no cp{python} wheel")
  assert not missing, f"{name}: {missing}"


def test_make_test_and_make_demo_install_on_the_stock_python_of_debian_and_ubuntu():
  """Python 3.10 (Ubuntu 22.04), 3.11 (Debian 12), 3.12 (Ubuntu 24.04)."""
  for name in wheel_metadata.TEST_SET:
    assert set(wheel_metadata.STOCK) <= set(_pythons(name)), name
  assert wheel_metadata.INSTALL_SETS["make test"][2] == wheel_metadata.STOCK


def test_tpu_requirements_install_on_the_python_3_10_of_tpu_vm_images():
  """Both engines' (JAX's last for 3.10 is 0.6.2), and make test holds JAX
  there too."""
  for name in ("tpu-vm-tensorflow.txt", "tpu-vm-jax.txt", "gpu-jax.txt",
               "test-jax.txt"):
    assert "3.10" in _pythons(name), name
  for name in ("tpu-vm-jax.txt", "gpu-jax.txt", "test-jax.txt"):
    assert _pins(name, "3.10")["jax"][0] == "0.6.2", name
  assert _pins("tpu-vm-jax.txt", "3.10")["keras"][0] == "3.12.4"


@pytest.mark.parametrize("name,python", _cases(TARGETS))
def test_no_file_installs_a_second_tensorflow_beside_its_own(name, python):
  pins = _pins(name, python)
  tensorflow = _tensorflow(pins)
  pulled = {f"{package} requires {r}" for package, r in _declared(pins,
                                                                  python)
            if canonicalize_name(r.name) in TENSORFLOWS
            and canonicalize_name(r.name) != tensorflow}
  assert not pulled, f"{name} would install {sorted(pulled)}"


def test_tpu_requirements_install_tensorflow_tpu_with_the_libtpu_it_names():
  for python in _pythons("tpu-vm-tensorflow.txt"):
    pins = _pins("tpu-vm-tensorflow.txt", python)
    assert _tensorflow(pins) == "tensorflow-tpu"
    assert "libtpu" in pins


@pytest.mark.parametrize("name,python", [
    (n, p) for n, p in _cases(JAX_FILES) if "jax" in _pins(n, p)])
def test_every_jax_file_pins_the_jax_and_jaxlib_of_one_release(name, python):
  """jax pins its jaxlib exactly; the JAX files agree for each Python, but
  tpu-vm-jax.txt stops at 0.10.2 (its header says why)."""
  pins = _pins(name, python)
  jax = pins["jax"][0]
  tested = _pins("test-jax.txt", python)["jax"][0]
  if name == "tpu-vm-jax.txt" and tested == "0.11.2":
    assert jax == "0.10.2"
  else:
    assert jax == tested
  declared = [r for package, r in _declared(pins, python)
              if package == "jax" and r.name == "jaxlib"]
  assert declared and all(r.specifier.contains(jax) for r in declared)
  if "jaxlib" in pins:
    assert pins["jaxlib"][0] == jax


@pytest.mark.parametrize("name,python", _cases(
    ("gpu-tensorflow.txt", "gpu-jax.txt", "tpu-vm-jax.txt",
     "jax-without-tensorflow.txt")))
def test_every_host_file_pins_the_keras_of_cpu_txt_for_its_python(
    name, python):
  assert _pins(name, python)["keras"] == _pins("cpu.txt", python)["keras"]


def test_gpu_requirements_are_cpu_txt_with_tensorflows_cuda_extra():
  assert _pythons("gpu-tensorflow.txt") == _pythons("cpu.txt")
  for python in _pythons("cpu.txt"):
    cpu, gpu = _pins("cpu.txt", python), _pins("gpu-tensorflow.txt", python)
    version, extras = gpu["tensorflow"]
    assert extras == ("and-cuda",)
    assert any("extra ==" in r and "and-cuda" in r
               for r in WHEELS[f"tensorflow=={version}"]["requires_dist"])
    runtime = {p: v for p, v in gpu.items() if not p.startswith("nvidia-")}
    assert {**runtime, "tensorflow": (version, ())} == cpu


def test_gpu_requirements_pin_every_cuda_wheel_of_the_cuda_extra():
  """At the lowest version TensorFlow's extra allows: its build's CUDA."""
  gpu = _pins("gpu-tensorflow.txt", "3.11")
  declared = {canonicalize_name(r.name): r.specifier
              for package, r in _declared(gpu, "3.11")
              if package == "tensorflow" and r.name.startswith("nvidia-")}
  assert declared and set(declared) == {p for p in gpu
                                        if p.startswith("nvidia-")}
  for package, specifier in declared.items():
    lowest = next(s.version for s in specifier if s.operator == ">=")
    assert gpu[package][0] == lowest, package


# make test's environment, pinned whole per Python (issue 50).
@pytest.mark.parametrize("python", wheel_metadata.pythons(
    *(FILES[n] for n in wheel_metadata.TEST_SET)))
def test_constraints_pin_everything_and_agree_with_the_requirements(python):
  path = wheel_metadata.constraints_path(python)
  assert os.path.exists(path), f"no {path}: run make constraints"
  pinned = wheel_metadata.pins_on(wheel_metadata.read_pins(path), python)
  for name in wheel_metadata.TEST_SET:
    for package, (version, _) in _pins(name, python).items():
      assert pinned.get(package, (None,))[0] == version, (
          f"{os.path.basename(path)} has {package} {pinned.get(package)}, "
          f"{name} {version}: run make constraints")
  # The transitive ones that floated before, among them.
  assert {"protobuf", "h5py", "ml-dtypes", "grpcio"} <= set(pinned)
  assert ("scipy" in pinned) == ("jax" in pinned)  # JAX's


def _make_venv(python: str, tmp_path) -> subprocess.CompletedProcess:
  """`make -n venv PYTHON=python` in a copy of the Makefile: the commands
  make would run, none run."""
  return subprocess.run(
      ["make", "-n", "-f", os.path.join(wheel_metadata.REPO, "Makefile"),
       "-C", wheel_metadata.REPO, f"VENV={tmp_path}/venv", "venv",
       f"PYTHON={python}"], capture_output=True, text=True, timeout=60)


def test_make_builds_the_venv_from_python3_with_its_pythons_constraints(
    tmp_path):
  """The Python make test runs is python3, whatever its version: no search
  for a second one, and that Python's pins."""
  fake = tmp_path / "python3"
  fake.write_text("#!/bin/sh\necho 3.11\n")
  fake.chmod(0o755)
  done = _make_venv(str(fake), tmp_path)
  assert done.returncode == 0, done.stderr
  assert f"{fake} -m venv" in done.stdout
  assert "-c requirements/constraints/test-py3.11.txt" in done.stdout
  for name in wheel_metadata.TEST_SET:
    assert f"-r requirements/{name}" in done.stdout
  assert "3.12" not in done.stdout and "pyenv" not in done.stdout


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.12"])
def test_make_test_jax_runs_on_every_stock_python(version, tmp_path):
  fake = tmp_path / "python3"
  fake.write_text(f"#!/bin/sh\necho {version}\n")
  fake.chmod(0o755)
  done = subprocess.run(
      ["make", "-n", "-C", wheel_metadata.REPO, f"VENV={tmp_path}/venv",
       "test-jax", f"PYTHON={fake}"], capture_output=True, text=True,
      timeout=60)
  assert done.returncode == 0, done.stderr
  assert "-m pytest" in done.stdout and "tests_jax" in done.stdout


def test_make_stops_in_one_line_on_a_python_without_pinned_test_sets(
    tmp_path):
  fake = tmp_path / "python3"
  fake.write_text("#!/bin/sh\necho 3.9\n")
  fake.chmod(0o755)
  done = subprocess.run(
      ["make", "-C", wheel_metadata.REPO, f"VENV={tmp_path}/venv", "venv",
       f"PYTHON={fake}"], capture_output=True, text=True, timeout=60)
  assert done.returncode != 0
  assert "Python 3.9" in done.stderr and "3.10-3.13" in done.stderr
  assert not (tmp_path / "venv").exists()
