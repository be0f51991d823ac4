"""Every requirements*.txt pins published wheels that install together.

requirements/wheels.json records what each pinned wheel declares on PyPI
(`python -m requirements.wheel_metadata` rewrites it after a pin changes);
these tests check the pins against it offline. `make check-requirements` asks
pip to resolve each file for real.
"""
import os

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from requirements import wheel_metadata

FILES = {os.path.basename(p): wheel_metadata.read_pins(p)
         for p in wheel_metadata.requirement_files()}
WHEELS = wheel_metadata.load()
TENSORFLOWS = ("tensorflow", "tensorflow-cpu", "tensorflow-tpu",
               "tensorflow-intel")
# One file per target, each with its TensorFlow; add-ons are installed
# beside the targets named here and pin no TensorFlow. The JAX suite's
# environment (.venv-jax) is a target: JAX, and TensorFlow for tf.data.
TARGETS = ("requirements-gpu.txt", "requirements-tpu.txt", "requirements.txt",
           "requirements-jax.txt")
ADD_ONS = {"requirements-dev.txt": ("requirements.txt",
                                    "requirements-tpu.txt"),
           "requirements-lint.txt": (),
           # An environment of its own: what the GPU bench carries beside
           # the H200 image's JAX and torch.
           "requirements-bench-gpu.txt": (),
           "requirements-tpu-pod.txt": ("requirements-tpu.txt",)}


def _pythons(name: str) -> list[str]:
  """The Python minor versions that file `name` claims to support."""
  claim = SpecifierSet(FILES[name]["requires_python"])
  return [p for p in wheel_metadata.PYTHONS if claim.contains(p)]


def _declared(name: str, python: str) -> list[tuple[str, Requirement]]:
  """(pinned package, requirement) pairs that apply on Linux x86_64.

  Pins without a record declare nothing here (the record test names them).
  """
  declared = []
  for package, (version, extras) in FILES[name]["pins"].items():
    wheel = WHEELS.get(f"{package}=={version}", {"requires_dist": []})
    for text in wheel["requires_dist"]:
      requirement = Requirement(text)
      environment = {"python_version": python,
                     "python_full_version": python + ".0",
                     "sys_platform": "linux", "platform_system": "Linux",
                     "platform_machine": "x86_64", "os_name": "posix",
                     "implementation_name": "cpython",
                     "platform_python_implementation": "CPython"}
      if requirement.marker is None or any(
          requirement.marker.evaluate({**environment, "extra": extra})
          for extra in ("",) + extras):
        declared.append((package, requirement))
  return declared


def _tensorflow(name: str) -> str:
  """The one TensorFlow distribution that file `name` pins."""
  found = [p for p in FILES[name]["pins"] if p in TENSORFLOWS]
  assert len(found) == 1, f"{name} pins {found}, not one TensorFlow"
  return found[0]


def test_there_is_one_requirements_file_per_target_and_add_on():
  assert set(TARGETS) <= set(FILES) <= set(TARGETS) | set(ADD_ONS)
  for add_on in set(FILES) & set(ADD_ONS):
    assert not set(FILES[add_on]["pins"]) & set(TENSORFLOWS), add_on


def _combined(add_on: str, target: str) -> dict:
  """The pins and Pythons of `add_on` installed beside `target`."""
  pythons = (SpecifierSet(FILES[add_on]["requires_python"])
             & SpecifierSet(FILES[target]["requires_python"]))
  return {"pins": {**FILES[target]["pins"], **FILES[add_on]["pins"]},
          "requires_python": str(pythons)}


@pytest.mark.parametrize("add_on,target", [
    (a, t) for a, targets in sorted(ADD_ONS.items()) if a in FILES
    for t in targets])
def test_every_add_on_installs_beside_its_targets(add_on, target,
                                                  monkeypatch):
  assert not set(FILES[add_on]["pins"]) & set(FILES[target]["pins"])
  combined = f"{add_on}+{target}"
  monkeypatch.setitem(FILES, combined, _combined(add_on, target))
  assert set(_pythons(target)) <= set(_pythons(combined)), (
      f"{add_on} does not cover every Python of {target}")
  test_every_pin_falls_inside_the_ranges_its_other_pins_declare(combined)


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_file_states_the_pythons_it_supports(name):
  assert FILES[name]["requires_python"], (
      f"{name} lacks a '# requires-python: SPEC' line")
  assert _pythons(name), f"{name} claims no Python in {wheel_metadata.PYTHONS}"


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_pin_names_a_published_wheel_whose_metadata_was_recorded(name):
  unrecorded = [f"{p}=={v}" for p, (v, _) in FILES[name]["pins"].items()
                if f"{p}=={v}" not in WHEELS]
  assert not unrecorded, (
      f"{name}: {unrecorded} not in requirements/wheels.json; a version that "
      "PyPI does not publish, or run python -m requirements.wheel_metadata")


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_pin_falls_inside_the_ranges_its_other_pins_declare(name):
  pins = FILES[name]["pins"]
  outside = {
      f"{r.name}=={pins[canonicalize_name(r.name)][0]} outside "
      f"{package}'s {r.specifier} (Python {python})"
      for python in _pythons(name) for package, r in _declared(name, python)
      if canonicalize_name(r.name) in pins and not r.specifier.contains(
          pins[canonicalize_name(r.name)][0], prereleases=True)}
  assert not outside, f"{name}: {sorted(outside)}"


@pytest.mark.parametrize("name", TARGETS)
def test_every_file_pins_the_keras_tensorboard_numpy_and_libtpu_its_tensorflow_declares(
    name):
  tensorflow = _tensorflow(name)
  required = {canonicalize_name(r.name) for python in _pythons(name)
              for package, r in _declared(name, python)
              if package == tensorflow}
  unpinned = [p for p in ("keras", "tensorboard", "numpy", "libtpu")
              if p in required and p not in FILES[name]["pins"]]
  assert not unpinned, f"{name} leaves {unpinned} to the resolver"


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_pin_has_a_wheel_for_every_python_its_file_claims(name):
  missing = []
  for package, (version, _) in FILES[name]["pins"].items():
    wheel = WHEELS.get(f"{package}=={version}")
    if wheel is None:
      continue  # the record test names it
    for python in _pythons(name):
      if not SpecifierSet(wheel["requires_python"] or "").contains(python):
        missing.append(f"{package}=={version} Requires-Python "
                       f"{wheel['requires_python']} excludes {python}")
      elif wheel["wheel_pythons"] is not None and (
          python not in wheel["wheel_pythons"]):
        missing.append(f"{package}=={version} has no cp{python} wheel")
  assert not missing, f"{name}: {missing}"


def test_tpu_requirements_install_on_the_python_3_10_of_tpu_vm_images():
  assert "3.10" in _pythons("requirements-tpu.txt")


@pytest.mark.parametrize("name", TARGETS)
def test_no_file_installs_a_second_tensorflow_beside_its_own(name):
  tensorflow = _tensorflow(name)
  pulled = {f"{package} requires {r}" for python in _pythons(name)
            for package, r in _declared(name, python)
            if canonicalize_name(r.name) in TENSORFLOWS
            and canonicalize_name(r.name) != tensorflow}
  assert not pulled, f"{name} would install {sorted(pulled)}"


def test_tpu_requirements_install_tensorflow_tpu_with_the_libtpu_it_names():
  assert _tensorflow("requirements-tpu.txt") == "tensorflow-tpu"
  assert "libtpu" in FILES["requirements-tpu.txt"]["pins"]


def test_gpu_requirements_are_requirements_txt_with_tensorflows_cuda_extra():
  cpu, gpu = (FILES["requirements.txt"], FILES["requirements-gpu.txt"])
  version, extras = gpu["pins"]["tensorflow"]
  assert extras == ("and-cuda",)
  assert any("extra ==" in r and "and-cuda" in r
             for r in WHEELS[f"tensorflow=={version}"]["requires_dist"])
  runtime = {p: v for p, v in gpu["pins"].items()
             if not p.startswith("nvidia-")}
  assert {**runtime, "tensorflow": (version, ())} == cpu["pins"]
  assert gpu["requires_python"] == cpu["requires_python"]


def test_gpu_requirements_pin_every_cuda_wheel_of_the_cuda_extra():
  """At the lowest version TensorFlow's extra allows: its build's CUDA."""
  gpu = FILES["requirements-gpu.txt"]["pins"]
  declared = {canonicalize_name(r.name): r.specifier
              for package, r in _declared("requirements-gpu.txt", "3.11")
              if package == "tensorflow" and r.name.startswith("nvidia-")}
  assert declared and set(declared) == {p for p in gpu
                                        if p.startswith("nvidia-")}
  for package, specifier in declared.items():
    lowest = next(s.version for s in specifier if s.operator == ">=")
    assert gpu[package][0] == lowest, package


# make test's environments, pinned whole (issue 50): the requirements files
# each constraints file resolves.
CONSTRAINTS = {"constraints.txt": ("requirements.txt", "requirements-dev.txt"),
               "constraints-jax.txt": ("requirements-jax.txt",)}


@pytest.mark.parametrize("constraints,requirements", CONSTRAINTS.items())
def test_constraints_pin_everything_and_agree_with_the_requirements(
    constraints, requirements):
  pinned = wheel_metadata.read_pins(os.path.join(wheel_metadata.REPO,
                                                 constraints))["pins"]
  for name in requirements:
    for package, (version, _) in FILES[name]["pins"].items():
      assert pinned.get(package, (None,))[0] == version, (
          f"{constraints} has {package} {pinned.get(package)}, {name} "
          f"{version}: run make constraints")
  # The transitive ones that floated before, among them.
  if constraints == "constraints.txt":
    assert {"protobuf", "h5py", "ml-dtypes", "grpcio"} <= set(pinned)


def test_make_installs_take_the_constraints():
  with open(os.path.join(wheel_metadata.REPO, "Makefile")) as f:
    makefile = f.read()
  for constraints in CONSTRAINTS:
    assert f"-c {constraints}" in makefile, constraints
