"""README and docs/studies.md quote the studies' verdicts as their JSON gives
them (issue 51).

Each row of the results table (README's "Results", docs/studies.md's in
full) names the criteria it quotes (ROWS): its verdict cell must give their
verdicts and its gap cell their gaps and pooled seed spreads to two digits.
Where README's recipe table and the results text after either table speak
of flags/small_images.cfg against stock Keras, they must use the
confirmatory study's verdict (CONFIRM): "beats" only if it held.
"""
import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDIES = os.path.join(ROOT, "bench_results", "studies")
CONFIRM = ("confirm.json", "flags/small_images.cfg's choices beat stock "
           "Keras with its built-in equivalents")
RECIPE = "flags/small_images.cfg's choices beat stock Keras"
# A results row (its first cell's start) -> the (file, criterion) it quotes.
ROWS = {
    "a. BN over 8 replicas": [("a_distributed_bn.json",
                               "BN group 8 beats group 1")],
    "b. momentum / LARS / RMSprop warm-up": [
        ("b_large_batch.json", f"{opt} keeps batch 8's top-1 at 256")
        for opt in ("momentum", "lars", "rmsprop_warmup")],
    "b in the papers' regime": [("b_regime.json",
                                 "momentum keeps batch 32's top-1 at 128")],
    "b in the regime: LARS does": [("b_regime.json",
                                    "lars keeps batch 32's top-1 at 128")],
    "b in the regime: LARS beats momentum": [("b_regime.json",
                                              "lars beats momentum at 128")],
    "c. a growing batch": [("c_batch_size_control.json",
                            "growing beats the final batch, equal epochs")],
    "c. the same at equal steps": [
        ("c_batch_size_control.json",
         "growing beats the final batch, equal steps")],
    "crop: min area 0.35": [("crop_small_images.json",
                             "min area 0.35 beats the Inception crop")],
    "crop: the whole image": [("crop_small_images.json",
                               "the whole image beats min area 0.35")],
    "baseline:": [("baseline_stock_keras.json",
                   "the project's path beats stock Keras")],
    "ladder: zero-init": [("ladder.json",
                           "zero_gamma helps the project's path")],
    "ladder: its conv init": [("ladder.json",
                               "conv_init helps the project's path")],
    "ladder: with the same choices": [
        ("ladder.json", "the project's path beats stock Keras with every "
         "one of its network choices (equal settings)")],
    "recipe check 1": [("recipe_small_images.json", RECIPE)],
    "recipe check 2": [("recipe_long.json", RECIPE)],
    "recipe check 3": [("recipe_revised.json", RECIPE)],
    "recipe check 4": [("recipe_crop.json", RECIPE)],
    "confirmatory": [CONFIRM],
}
WORDS = {"held": "**held**", "not held": "**not held**",
         "not decided at this size": "not decided"}


def _verdict(file: str, criterion: str) -> dict:
  with open(os.path.join(STUDIES, file)) as f:
    verdicts = json.load(f)["verdicts"]
  found = [v for v in verdicts if v["criterion"] == criterion]
  assert len(found) == 1, (file, criterion)
  return found[0]


# Where a results table stands: the file, and the heading its text follows.
RESULTS = (("README.md", "\n## Results\n"),
           ("docs/studies.md", "# Results on real data\n"))


def _read(name: str) -> str:
  with open(os.path.join(ROOT, name)) as f:
    return f.read()


def _results(name: str, heading: str) -> str:
  return _read(name).split(heading, 1)[1].split("\n## ", 1)[0]


def _results_rows(name: str, heading: str) -> dict[str, list[str]]:
  section = _results(name, heading)
  rows = {}
  for line in section.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if line.startswith("| ") and len(cells) == 3 and not set(
        cells[0]) <= set("-"):
      rows[cells[0]] = cells
  return rows


@pytest.mark.parametrize("where", RESULTS, ids=lambda where: where[0])
@pytest.mark.parametrize("start", list(ROWS))
def test_each_results_row_quotes_its_json_verdicts(start, where):
  rows = [cells for first, cells in _results_rows(*where).items()
          if first.startswith(start)]
  assert len(rows) == 1, f"{where[0]} has {len(rows)} rows starting {start!r}"
  _, verdict_cell, gap_cell = rows[0]
  verdicts = [_verdict(*quoted) for quoted in ROWS[start]]
  words = {WORDS[v["verdict"]] for v in verdicts}
  assert len(words) == 1, "a row quotes one verdict"
  word = words.pop()
  assert verdict_cell == word or verdict_cell.startswith(word + " ("), (
      start, verdict_cell, word)
  assert gap_cell == " / ".join(
      f"{v['gap_points']:+.2f} ({v['pooled_spread_points']:.2f})"
      for v in verdicts), start


@pytest.mark.parametrize("where", RESULTS, ids=lambda where: where[0])
def test_every_results_row_is_checked(where):
  unchecked = [first for first in _results_rows(*where)
               if first != "claim (paper)"
               and not any(first.startswith(s) for s in ROWS)]
  assert not unchecked


def _recipe_sentences() -> list[str]:
  """Where README and docs/studies.md speak of the recipe against stock
  Keras: README's recipe table's small_images.cfg row and the results text
  after each results table."""
  recipe = [line for line in _read("README.md").splitlines()
            if line.startswith("| `small_images.cfg`")]
  prose = [_results(*where).rsplit("|\n", 1)[1] for where in RESULTS]
  assert len(recipe) == 1 and all(text.strip() for text in prose)
  return recipe + prose


def test_readme_says_beats_only_where_the_confirmatory_verdict_held():
  verdict = _verdict(*CONFIRM)["verdict"]
  for text in _recipe_sentences():
    claims = re.findall(r"small_images\.cfg`?[^.|]*?\b(beats|ties|trails|"
                        r"held|not held|not decided)\b", text)
    assert claims, text[:200]
    for word in claims:
      if verdict == "held":
        assert word in ("beats", "held"), (word, text[:200])
      else:
        assert word not in ("beats", "held"), (word, text[:200])
