"""README stays true to the code: a front page of at most about 200 lines
whose tables are generated or checked against the tree (the install matrix,
flags, flagfiles, the paper map, make targets), and docs/ pages that hold
the rest (the module list in docs/layout.md, every page on the map)."""
import ast
import json
import os
import re

from flag_reference import flag_table
from module_list import module_table
from lab.study_report import TEXT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The sections of the front page, in order.
SECTIONS = ("Status", "Quickstart", "Install", "Results", "Paper map",
            "Recipes", "Flag reference", "Map")
FRONT_PAGE_LINES = 200
# The install matrix's rows: the machines a user installs on.
MACHINES = ("CPU development", "TPU VM", "GPU host", "no TensorFlow")


def _read(name: str) -> str:
  with open(os.path.join(ROOT, name)) as f:
    return f.read()


def _section(title: str, name: str = "README.md") -> str:
  text = _read(name)
  start = text.index(f"\n## {title}\n")
  end = text.find("\n## ", start + 1)
  return text[start:end if end > 0 else None]


def _docs() -> list[str]:
  return sorted(os.path.join("docs", name)
                for name in os.listdir(os.path.join(ROOT, "docs"))
                if name.endswith(".md"))


def test_readme_sections_are_in_order():
  readme = _read("README.md")
  positions = [readme.index(f"\n## {title}\n") for title in SECTIONS]
  assert positions == sorted(positions)


def test_readme_is_a_front_page():
  assert len(_read("README.md").splitlines()) <= FRONT_PAGE_LINES


def test_the_install_matrix_names_an_existing_file_per_machine_and_engine():
  rows = [line for line in _section("Install").splitlines()
          if line.startswith("| ") and "---" not in line]
  header = [c.strip() for c in rows[0].strip("|").split("|")]
  assert header == ["machine", "TensorFlow", "JAX"]
  cells = {}
  for row in rows[1:]:
    machine, *engines = [c.strip() for c in row.strip("|").split("|")]
    cells[machine] = engines
  assert [next(m for m in cells if m.startswith(machine))
          for machine in MACHINES] == list(cells)
  for machine, engines in cells.items():
    named = re.findall(r"`(requirements/[\w.-]+\.txt)`", " ".join(engines))
    assert named, machine
    assert all(re.search(r"`requirements/", cell) for cell in engines
               if cell), machine
    for path in named:
      assert os.path.exists(os.path.join(ROOT, path)), (
          f"README's install matrix names {path}, which does not exist")


def test_the_map_links_every_doc_and_every_link_exists():
  text = _read("README.md")
  linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", _section("Map")))
  assert linked == set(_docs())
  for name in ["README.md"] + _docs():
    folder = os.path.dirname(name)
    for target in re.findall(r"\]\(([^)#:]+?)(?:#[\w-]*)?\)", _read(name)):
      path = os.path.normpath(os.path.join(ROOT, folder, target))
      assert os.path.exists(path), f"{name} links {target}, which is missing"
  assert "Why not tensorflow-addons" in _read("docs/layout.md")
  assert "why not tensorflow-addons" in text

def test_the_flag_reference_is_the_generated_table():
  assert flag_table() in _read("docs/flags.md"), (
      "docs/flags.md is stale: paste `python -m tests.flag_reference`")
  assert "(docs/flags.md)" in _section("Flag reference")


def test_the_module_list_is_the_generated_table():
  assert module_table() in _read("docs/layout.md"), (
      "docs/layout.md's module list is stale: paste "
      "`python -m tests.module_list`")


def test_every_flagfile_is_listed_and_every_listed_flagfile_exists():
  listed = set(re.findall(r"`([\w.-]+\.cfg)`", _section("Recipes")))
  on_disk = set(os.listdir(os.path.join(ROOT, "flags")))
  assert listed == on_disk


def test_every_module_named_in_the_readme_and_docs_exists():
  for name in ["README.md"] + _docs():
    for path in re.findall(
        r"`((?:resnet_tpu|tools|lab|tests|tests_jax|data)/[\w/]+\.py)`",
        _read(name)):
      assert os.path.exists(os.path.join(ROOT, path)), (name, path)


def _docstring(path: str) -> str:
  with open(os.path.join(ROOT, path)) as f:
    return ast.get_docstring(ast.parse(f.read())) or ""


def test_paper_map_modules_cite_their_section():
  rows = [line for line in _section("Paper map").splitlines()
          if line.startswith("| ") and "`resnet_tpu/" in line]
  assert len(rows) >= 10
  for row in rows:
    paper = row.split("|")[1].strip()  # e.g. "Ying §3.1", "Akiba"
    author, _, section = paper.partition(" ")
    for path in re.findall(r"`(resnet_tpu/[\w/]+\.py)`", row):
      docstring = _docstring(path)
      assert author.split(",")[0] in docstring, (path, author)
      if section.startswith("§"):
        assert section in docstring, (path, section)


def test_each_of_ying_sections_3_1_to_3_3_has_one_home():
  for section, module in (
      ("§3.1", "resnet_tpu/parallel/tensorflow/bn_all_reduce.py"),
      ("§3.2", "resnet_tpu/inputs/input_pipeline.py"),
      ("§3.3", "resnet_tpu/parallel/tensorflow/gradient_all_reduce.py")):
    assert f"| Ying {section} |" in _section("Paper map")
    assert f"`{module}`" in _section("Paper map")
    assert section in _docstring(module).splitlines()[0], module


def test_quickstart_targets_exist():
  makefile = _read("Makefile")
  for target in ("demo", "test", "bench", "test-tpu-build"):
    assert re.search(rf"^{target}:", makefile, re.M), target
  quickstart = _section("Quickstart")
  block = quickstart[quickstart.index("```sh\n") + 6:]
  commands = [line.split("#")[0].strip()
              for line in block[:block.index("```")].splitlines()]
  assert [c for c in commands if c] == ["make demo", "make test"]
  for version in ("3.10", "3.11", "3.12"):
    assert version in quickstart, version
  assert "make test" in _read(".ci/run")


# Every study lab/study.py writes (lab/study_report.TEXT): the papers'
# claims, lr's choice of LR rules, the stock-Keras baseline and the crop.
STUDY_FILES = tuple(text.file_name for text in TEXT.values())


def _study_figures() -> tuple[set[str], list[dict]]:
  """Every figure the committed studies measured, as the README prints them:
  top-1 % (mean, min, max, and the gap between two means) and steps/s, and
  the settings they were measured at (a crop's min area, an LR scale)."""
  studies = []
  folder = os.path.join(ROOT, "bench_results", "studies")
  for name in sorted(os.listdir(folder)):
    if name.endswith(".json"):
      with open(os.path.join(folder, name)) as f:
        studies.append(json.load(f))
  figures = set()
  for study in studies:
    means = [p["top1_mean"] for p in study["points"]]
    for p in study["points"]:
      figures |= {f"{100 * p[k]:.1f}" for k in ("top1_mean", "top1_min",
                                                "top1_max")}
      figures |= {f"{p['steps_per_sec']:.2f}",
                  f"{p.get('train_loss', 0):.2f}"}  # the first design: none
      figures |= {f"{v:g}" for _, v in p["point"] if isinstance(v, float)}
    figures |= {f"{100 * abs(a - b):.1f}" for a in means for b in means}
    for verdict in study.get("verdicts", []):
      figures |= {f"{abs(verdict[k]):.{digits}f}" for k in (
          "gap_points", "pooled_spread_points") for digits in (1, 2)}
    for run in study["runs"]:  # settings, e.g. a crop's min area
      figures |= {f"{v:g}" for v in run["settings"].values()
                  if isinstance(v, float)}
    figures |= {f"{v:g}" for v in (study.get("chosen_lr_scales")
                                   or {}).values()}
    for check in study.get("baseline_convergence", []):
      figures |= {f"{abs(check['gain_points']):.1f}",
                  f"{100 * check['top1_at_75']:.1f}",
                  f"{100 * check['final_top1']:.1f}"}
  return figures, studies


def test_results_on_real_data_quote_only_what_the_committed_studies_measured():
  """The front page's table, docs/studies.md's and the studies' own README
  (bench_results/studies/README.md, the full tables)."""
  full = _read(os.path.join("bench_results", "studies", "README.md"))
  figures, studies = _study_figures()
  assert studies and {s["name"] for s in studies} <= set(STUDY_FILES)
  for study in studies:
    assert f"Run {study['date']}" in full
    assert study["machine"].split(",")[1].strip() in full  # "2 cores"
    assert f"TensorFlow {tf_version(study)}" in full
  section = _section("Results")
  assert "(bench_results/studies/README.md)" in section
  studies_doc = _read("docs/studies.md")
  assert "(../bench_results/studies/README.md)" in studies_doc
  rows = "\n".join(line for line in (section + studies_doc + full).splitlines()
                   if line.startswith("| ") and "---" not in line)
  quoted = re.findall(r"\d+\.\d+", re.sub(r"§\d+(\.\d+)?", "", rows))
  assert quoted and not [q for q in quoted if q not in figures], (
      "README quotes figures no committed study measured: "
      f"{[q for q in quoted if q not in figures]}")


def tf_version(study: dict) -> str:
  return re.search(r"TensorFlow (\S+),", study["machine"]).group(1)


def test_the_code_carries_a_licence_and_readme_names_it():
  licence = _read("LICENSE")
  assert licence.split()[:4] == ["Apache", "License", "Version", "2.0,"]
  assert "END OF TERMS AND CONDITIONS" in licence
  assert "Apache License 2.0 ([LICENSE](LICENSE))" in " ".join(
      _read("README.md").split())
