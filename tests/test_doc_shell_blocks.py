"""Every shell block of README.md and docs/*.md is run or checked (issue 59).

A block (```sh, ```bash, ```shell or ```console) is parsed by `bash -n`,
then split into simple commands, each checked by what it runs:

- `python main.py ...`: every flag a defined training flag with a valid
  value, its --flagfile an existing file (absl parses the line as main.py
  would, without starting a run);
- `python -m tools.NAME` (or data., lab.): the module exists and its
  `--helpfull` lists every flag the line gives (the values are parsed too);
- `pip install -r requirements/X.txt`: the file exists; a pip install of
  anything but requirements files fails, so no pin lives only in a doc;
- `make T`: T is a target of the Makefile;
- `docker run`: TensorFlow Serving's image with a version tag; `curl`: the
  local server that command starts;
- a newer Python from the deadsnakes PPA (3.10-3.13 only, which the
  requirements files take), virtual environments, `pip list | grep`, the
  restart loop's shell words.

Any other command fails the test, so a new block cannot slip in unchecked:
teach `_check` how to check it. Blocks cheap enough to run at tiny scale
are run by the test named in RUN_BY, as written but for the placeholders.
"""
import os
import re
import shlex
import subprocess
import sys

from absl import flags
import pytest

from data.make_synthetic import make_synthetic
from resnet_tpu import flags as resnet_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHELLS = ("sh", "bash", "shell", "console")
FENCE = re.compile(r"^```(\S*)\n(.*?)^```", re.M | re.S)
# A block run at tiny scale, by its file and first command: the test that
# runs it.
RUN_BY = {("docs/fine-tuning.md", "python -m tools.convert_keras_weights"):
          "tests/test_readme_fine_tune.py",
          ("docs/data.md", "python -m data.build_tfrecords"):
          "tests/test_doc_shell_blocks.py"}
SEPARATORS = {"&&", "||", ";", "|", "&"}
REDIRECTS = {">", ">>", "<", "2>"}
# Shell words of the restart loop (docs/spot-and-resuming.md).
SHELL_WORDS = {"while", "do", "done", "true", "then", "fi", "if"}
SERVING_IMAGE = re.compile(r"tensorflow/serving:\d+\.\d+\.\d+(-gpu)?")
HELP_FLAG = re.compile(r"^\s+(?:-\S+,)?--(?:\[no\])?(\w+):", re.M)
PYTHON = re.compile(r"python3?|python3\.1[0-3]")
DEADSNAKES = ["add-apt-repository", "-y", "ppa:deadsnakes/ppa"]


def _docs() -> list[str]:
  return ["README.md"] + sorted(
      os.path.join("docs", name) for name in os.listdir(
          os.path.join(ROOT, "docs")) if name.endswith(".md"))


def _blocks() -> list[tuple[str, int, str, str]]:
  """(file, index, language, text) of every fenced block."""
  found = []
  for name in _docs():
    with open(os.path.join(ROOT, name)) as f:
      text = f.read()
    for index, match in enumerate(FENCE.finditer(text)):
      found.append((name, index, match.group(1), match.group(2)))
  return found


def _shell_blocks() -> list[tuple[str, int, str]]:
  return [(name, index, text) for name, index, language, text in _blocks()
          if language in SHELLS]


def commands(block: str) -> list[list[str]]:
  """The simple commands of a block: continuation lines joined, comments
  dropped, split at && || ; | &, redirections and their files left out."""
  found = []
  for line in block.replace("\\\n", " ").splitlines():
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens, command = list(lexer), []
    for token in tokens:
      if token in SEPARATORS:
        found.append(command)
        command = []
      else:
        command.append(token)
    found.append(command)
  cleaned = []
  for command in found:
    while command and command[0] in SHELL_WORDS:
      command = command[1:]
    kept, skip = [], False
    for token in command:
      if skip:
        skip = False
      elif token in REDIRECTS:
        skip = True
      else:
        kept.append(token)
    if kept:
      cleaned.append(kept)
  return cleaned


def _flag_names(args: list[str]) -> list[str]:
  return [a[2:].split("=", 1)[0] for a in args if a.startswith("--")]


def check_main(args: list[str]) -> None:
  """absl parses the line as main.py would: unknown flags, bad values and
  a missing --flagfile raise."""
  for arg in args:
    if arg.startswith("--flagfile="):
      path = arg.split("=", 1)[1]
      assert os.path.isfile(os.path.join(ROOT, path)), f"no flagfile {path}"
  flag_values = flags.FlagValues()
  resnet_flags.define_flags(flag_values)
  cwd = os.getcwd()
  os.chdir(ROOT)  # flagfiles are named from the repository root
  try:
    flag_values(["main.py"] + args)
  finally:
    os.chdir(cwd)


def _module_path(module: str) -> str:
  return os.path.join(ROOT, *module.split(".")) + ".py"


def check_module(module: str, args: list[str]) -> None:
  """The module exists; its --helpfull, after the line's own flags (so
  their values are parsed first), lists every flag the line gives."""
  assert module.split(".")[0] in ("tools", "data", "lab"), module
  assert os.path.isfile(_module_path(module)), f"no module {module}"
  given = [a for a in args if a.startswith("--")]
  done = subprocess.run(
      [sys.executable, "-m", module] + given + ["--helpfull"], cwd=ROOT,
      capture_output=True, text=True, timeout=300)
  assert "Flags parsing error" not in done.stderr, (
      f"python -m {module} {' '.join(given)}: {done.stderr[-1500:]}")
  defined = set(HELP_FLAG.findall(done.stdout))
  assert defined, f"python -m {module} --helpfull: {done.stderr[-1500:]}"
  for name in _flag_names(given):
    bare = name[2:] if name.startswith("no") and name not in defined else name
    assert bare in defined, f"python -m {module} has no --{name}"


def check_pip(args: list[str]) -> None:
  if args[:1] == ["list"] or args[:2] == ["uninstall", "-y"]:
    return
  assert args[0] == "install", args
  files = [args[i + 1] for i, a in enumerate(args) if a == "-r"]
  assert files and len(args) == 1 + 2 * len(files), (
      f"pip install {' '.join(args[1:])}: install sets live in requirements/ "
      "files, where make check-requirements resolves them")
  for path in files:
    assert path.startswith("requirements/"), path
    assert os.path.isfile(os.path.join(ROOT, path)), f"no file {path}"


def check_make(args: list[str]) -> None:
  with open(os.path.join(ROOT, "Makefile")) as f:
    makefile = f.read()
  assert len(args) == 1, args
  assert re.search(rf"^{re.escape(args[0])}:", makefile, re.M), (
      f"make {args[0]}: no such target in the Makefile")


def check_docker(args: list[str]) -> None:
  assert args[0] == "run", args
  images = [a for a in args if a.startswith("tensorflow/serving")]
  assert len(images) == 1 and SERVING_IMAGE.fullmatch(images[0]), (
      f"docker run: pin TensorFlow Serving's image with its version: {args}")


def check_curl(args: list[str]) -> None:
  urls = [a for a in args if "://" in a]
  assert len(urls) == 1 and urls[0].startswith(
      "http://localhost:8501/v1/models/"), urls


def check_sudo(args: list[str]) -> None:
  """The deadsnakes PPA and a Python from it, with its venv module."""
  if args == DEADSNAKES:
    return
  assert args[:3] == ["apt-get", "install", "-y"] and args[3:], args
  for package in args[3:]:
    assert re.fullmatch(r"python3\.1[0-3](-venv)?", package), package


def _check(command: list[str], venvs: set[str]) -> None:
  word, args = command[0], command[1:]
  if PYTHON.fullmatch(word):
    if args[:2] == ["-m", "venv"]:
      venvs.add(args[2])
      return
    assert word in ("python", "python3"), command
    if args[:1] == ["main.py"]:
      return check_main(args[1:])
    assert args[:1] == ["-m"], command
    return check_module(args[1], args[2:])
  if word in (".", "source"):
    assert args[0].endswith("/bin/activate") and args[0][:-len(
        "/bin/activate")] in venvs, f"{command}: activate the venv made here"
    return
  if word == "grep" and args[:1] == ["-iE"]:
    return  # after `pip list |`
  if re.fullmatch(r"\w+=\$\?", word) or word in ("[", "exit"):
    return  # the restart loop's exit-code test
  checks = {"pip": check_pip, "make": check_make, "docker": check_docker,
            "curl": check_curl, "sudo": check_sudo}
  assert word in checks, (
      f"{command}: no check for this command; teach _check how to check it")
  checks[word](args)


def test_every_fenced_block_has_a_language_the_check_knows():
  blocks = _blocks()
  assert len(_shell_blocks()) >= 8
  unknown = [(name, index, language) for name, index, language, _ in blocks
             if language not in SHELLS]
  assert not unknown, f"blocks this test cannot check: {unknown}"


@pytest.mark.parametrize("name,index,block", _shell_blocks(),
                         ids=lambda v: str(v).split("\n")[0][:40])
def test_shell_block_parses_and_each_command_is_checked(name, index, block):
  done = subprocess.run(["bash", "-n"], input=block, capture_output=True,
                        text=True)
  assert done.returncode == 0, f"{name} block {index}: {done.stderr}"
  found = commands(block)
  assert found, f"{name} block {index} has no command"
  venvs = set()
  for command in found:
    try:
      _check(command, venvs)
    except (AssertionError, flags.Error) as error:
      raise AssertionError(
          f"{name} block {index}: {shlex.join(command)}: {error}") from error


def test_blocks_run_at_tiny_scale_are_run_by_their_test():
  firsts = {(name, shlex.join(commands(block)[0][:3])): name
            for name, _, block in _shell_blocks()}
  for (name, first), test in RUN_BY.items():
    assert (name, first) in firsts, (name, first)
    with open(os.path.join(ROOT, test)) as f:
      assert name in f.read() or name.replace("docs/", "") in f.read(), test


def test_the_data_block_runs_at_tiny_scale(tmp_path):
  """docs/data.md's commands as written, on 3 classes of synthetic photos
  in ImageNet's layout (class folders for train; a flat validation folder
  with one synset a line, in file-name order), fewer shards."""
  made = tmp_path / "made"
  make_synthetic(str(made), num_classes=3, images_per_class=4,
                 validation_images_per_class=2, image_size=40)
  imagenet = tmp_path / "imagenet"
  imagenet.mkdir()
  (made / "train").rename(imagenet / "train")
  flat = imagenet / "val"
  flat.mkdir()
  for synset in sorted(os.listdir(made / "validation")):
    for image in os.listdir(made / "validation" / synset):
      (made / "validation" / synset / image).rename(flat / image)
  (imagenet / "val_labels.txt").write_text("".join(
      name.split("_")[0] + "\n" for name in sorted(os.listdir(flat))))
  block = next(text for name, _, text in _shell_blocks()
               if name == "docs/data.md")
  block = (block.replace("/data/imagenet", str(imagenet))
           .replace("/data/tfrecords", str(tmp_path / "tfrecords"))
           .replace("--num_shards=1024", "--num_shards=4")
           .replace("--num_shards=128", "--num_shards=2"))
  found = commands(block)
  assert [c[:3] for c in found] == [
      ["python", "-m", "data.build_tfrecords"]] * 2 + [
          ["python", "-m", "data.verify_tfrecords"]]
  for command in found:
    done = subprocess.run([sys.executable] + command[1:], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (
        f"{shlex.join(command)}\n{done.stderr[-3000:]}")
  written = sorted(os.listdir(tmp_path / "tfrecords"))
  assert [n for n in written if n.startswith("train-")] == [
      f"train-0000{i}-of-00004" for i in range(4)]
  assert [n for n in written if n.startswith("validation-")] == [
      f"validation-0000{i}-of-00002" for i in range(2)]
