"""README stays true to the code: flag table, flagfiles, make targets."""
import os
import re

from tools.flag_reference import flag_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(name: str) -> str:
  with open(os.path.join(ROOT, name)) as f:
    return f.read()


def test_readme_flag_reference_is_the_generated_table():
  assert flag_table() in _read("README.md"), (
      "README flag reference is stale: paste `python -m tools.flag_reference`")


def test_every_flagfile_is_listed_and_every_listed_flagfile_exists():
  readme = _read("README.md")
  listed = set(re.findall(r"`([\w.-]+\.cfg)`", readme))
  on_disk = set(os.listdir(os.path.join(ROOT, "flags")))
  assert listed == on_disk


def test_every_module_named_in_the_feature_table_exists():
  for path in re.findall(r"`((?:resnet_tpu|tools|data)/\w+\.py)`",
                         _read("README.md")):
    assert os.path.exists(os.path.join(ROOT, path)), path


def test_quickstart_targets_exist():
  makefile = _read("Makefile")
  for target in ("demo", "test", "bench"):
    assert re.search(rf"^{target}:", makefile, re.M), target
  assert "make test" in _read(".ci/run")
