"""Every benchmark of `make bench` runs at its tiniest setting, so none can
rot, and REPORT.md renders what the run wrote.

No timing is asserted here: performance lives in `make bench`. The developer
profilers (lab/dev) are smoke-tested in tests/lab.
"""
import json
import os
import subprocess
import sys

import pytest

from test_study import fake_fashion_mnist  # a made-up Fashion-MNIST

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
HEADLINES = {"train.json": ("ours_vs_keras_fp32", "ours_vs_keras_bf16",
                            "mfu_bf16"),
             "bn_groups.json": ("bn_group4_vs_group1",
                                "statistics_local_vs_broadcast"),
             "eval.json": ("eval_vs_train_images_per_sec",
                           "last_step_to_return_s",
                           "resnet50_save_blocks_s"),
             # make bench-eval-stall: the iterators of before, beside.
             "eval_stall.json": ("eval_seconds_old_over_new",
                                 "last_step_to_return_s_old")}


def _run(module: str, output_dir, *args, timeout=600):
  result = subprocess.run(
      [sys.executable, "-m", module, f"--output_dir={output_dir}", *args],
      cwd=ROOT, capture_output=True, text=True, timeout=timeout)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench")
  _run("lab.bench_train", out, "--tiny",
       f"--scratch_dir={out}/scratch_train")
  _run("lab.bench_bn_groups", out, "--tiny",
       f"--scratch_dir={out}/scratch_bn")
  (out / "idx").mkdir()
  fake_fashion_mnist(out / "idx")
  for variants in ("long_lived", "long_lived,per_evaluation"):
    _run("lab.bench_eval", out, "--tiny", f"--variants={variants}",
         f"--scratch_dir={out}/scratch_eval", f"--cache_dir={out}/cache_eval",
         f"--fashion_mnist_dir={out}/idx")
  _run("lab.bench_report", out)
  return out


def test_training_benchmarks_write_the_summary_keys(results):
  with open(results / "summary.json") as f:
    summary = json.load(f)
  for key in (key for keys in HEADLINES.values() for key in keys):
    assert isinstance(summary[key], float) and summary[key] > 0, key


def test_each_headline_ratio_has_its_range_over_repetitions(results):
  summary = json.loads((results / "summary.json").read_text())
  report = (results / "REPORT.md").read_text()
  for name, keys in HEADLINES.items():
    ranges = json.loads((results / name).read_text())["headline_ranges"]
    for key in keys:
      # --tiny runs one repetition: its pair of samples is the median pair.
      assert ranges[key] == pytest.approx([summary[key]] * 2), key
      assert (f" | {summary[key]:.3f} | {ranges[key][0]:.3f}-"
              f"{ranges[key][1]:.3f} |") in report, key


def test_the_report_names_the_peak_the_mfu_divides_by_and_the_cpu(results):
  summary = json.loads((results / "summary.json").read_text())
  train = json.loads((results / "train.json").read_text())
  peak = train["models"]["summary"]["matmul_bfloat16"]["median"] / 1e9
  assert summary["matmul_peak_bf16_gflop_s"] == pytest.approx(peak)
  report = (results / "REPORT.md").read_text()
  rows = [line for line in report.splitlines() if line.startswith("| `")]
  names = [row.split("`")[1] for row in rows]
  assert names.index("matmul_peak_bf16_gflop_s") == (
      names.index("mfu_bf16") + 1)
  assert f"| {peak:.3f} |" in rows[names.index("matmul_peak_bf16_gflop_s")]
  features = ", ".join(
      f"{name} {'yes' if present else 'no'}"
      for name, present in sorted(train["machine"]["cpu_features"].items()))
  assert f"({features})" in report


def test_report_holds_every_table(results):
  text = (results / "REPORT.md").read_text()
  for heading in ("ours vs keras.applications.ResNet50",
                  "Model FLOP utilisation", "Host loop",
                  "Distributed BN: group size",
                  "Evaluation and the end of a run"):
    assert heading in text
  today = (results / "eval.md").read_text()
  assert "| one iterator per run (today) |\n" in today
  assert "before" not in today  # make bench leaves the old iterators out
  assert ("| one iterator per run (today) | one per evaluation (before) |"
          in (results / "eval_stall.md").read_text())
  assert "| ratio | compares | median | min-max over repetitions |" in text


def test_alternate_gives_slow_variants_only_the_first_repetitions():
  from tools import bench_common
  calls = []
  variants = {name: (lambda name=name: calls.append(name) or len(calls))
              for name in ("a", "slow", "b")}
  runs = bench_common.alternate(variants, 3, fewer={"slow": 1})
  assert calls == ["a", "slow", "b", "a", "b", "a", "b"]
  assert runs == {"a": [1, 4, 6], "slow": [2], "b": [3, 5, 7]}


def test_paired_range_pairs_the_samples_of_one_repetition():
  from tools import bench_common
  # A variant with fewer repetitions pairs with the first ones.
  assert bench_common.paired_range([2.0, 6.0, 3.0], [1.0, 2.0]) == [2.0, 3.0]


def test_report_takes_machine_and_ranges_from_the_run_and_names_missing_parts(
    tmp_path):
  machine = {"cores": 2, "cpu": "Some CPU", "cpu_features": {"avx2": True},
             "tensorflow": "2.0", "onednn_kernels": False,
             "date": "1999-01-01"}
  (tmp_path / "summary.json").write_text('{"bn_group4_vs_group1": 1.2}')
  (tmp_path / "bn_groups.json").write_text(json.dumps(
      {"machine": machine,
       "headline_ranges": {"bn_group4_vs_group1": [1.1, 1.3]}}))
  _run("lab.bench_report", tmp_path)
  text = (tmp_path / "REPORT.md").read_text()
  assert ("Measured on 2 cores of Some CPU (avx2 yes), TensorFlow 2.0, "
          "oneDNN CPU kernels off, 1999-01-01.") in text
  assert ("| `bn_group4_vs_group1` | step time, bn_group_size 4 / 1, 8 CPU "
          "replicas | 1.200 | 1.100-1.300 |") in text
  assert "(cpu_kernels.md missing: run `make bench-cpu-kernels`.)" in text
  assert "(train.md missing: run `make bench`.)" in text


def test_bench_results_holds_one_run_and_the_studies():
  names = set(os.listdir(os.path.join(ROOT, "bench_results")))
  folders = {n for n in names
             if os.path.isdir(os.path.join(ROOT, "bench_results", n))}
  assert folders <= {"studies"}, folders  # make study's output
  studies = os.path.join(ROOT, "bench_results", "studies")
  if "studies" in folders:
    from lab.study_report import TEXT  # every study lab/study.py writes
    assert set(os.listdir(studies)) <= {"README.md"} | {
        text.file_name + ext for text in TEXT.values()
        for ext in (".md", ".json", ".png")}, os.listdir(studies)
  assert {"REPORT.md", "summary.json", "train.json", "train.md",
          "bn_groups.json", "bn_groups.md", "input.json", "input.md",
          "allreduce_sim.json", "allreduce_sim.md", "eval.json",
          "eval.md"} <= names


def test_bench_models_keeps_its_trainers_until_the_process_ends(monkeypatch):
  """Freeing a traced trainer mid-run can stall for minutes in tf.data's
  iterator destructors (bench_common.exit_without_teardown)."""
  import gc
  import weakref
  from lab import bench_train

  class FakeTrainer:
    model = None
    seconds = 1.0

  trainers = []

  def step_timer(cfg, model_fn, steps):
    trainer = FakeTrainer()
    trainers.append(weakref.ref(trainer))
    return trainer, lambda: trainer.seconds  # as bench_train's timers

  monkeypatch.setattr(bench_train, "step_timer", step_timer)
  monkeypatch.setattr(bench_train, "forward_flops", lambda model: 1)
  monkeypatch.setattr(bench_train, "matmul_flops_per_second",
                      lambda dtype, size: lambda: 1.0)
  monkeypatch.setattr(bench_train, "_with_glibc_malloc", lambda s: s())
  bench_train.bench_models(32, 2, {"float32": 1, "bfloat16": 1}, 1, 1, 8,
                           "unused")
  gc.collect()
  # ours, keras and v1 layout in float32; ours, keras, native in bfloat16.
  assert len(trainers) == 6
  assert all(ref() is not None for ref in trainers)
