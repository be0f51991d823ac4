"""Assembles bench_results/REPORT.md from the benchmarks' JSON and markdown.

  python -m lab.bench_report --output_dir=bench_results

Run by `make bench` after its benchmarks, and by `make bench-collectives`,
`make bench-cpu-kernels` and `make profile-ops` after theirs. It measures
nothing: the headline table comes from summary.json and the `headline_ranges`
and `machine` fields of the benchmarks' JSON files, each section from a
benchmark's markdown, so a committed run can be re-rendered.
"""
import glob
import json
import os
import re
import sys

RERUN = "make bench"
# (markdown part, section title, command that writes it); `make bench` first.
PARTS = (
    ("train.md", "Training step, MFU, host memory, host loop "
     "(lab/bench_train.py)", RERUN),
    ("bn_groups.md", "Distributed batch norm, Ying et al. §3.1 "
     "(lab/bench_bn_groups.py)", RERUN),
    ("input.md", "Input pipeline, Ying et al. §3.2, Fig. 5 "
     "(lab/bench_input.py)", RERUN),
    ("allreduce_sim.md", "All-reduce cost model, Ying et al. §3.3 and "
     "Mikami et al. (lab/allreduce_sim.py)", RERUN),
    ("eval.md", "Evaluation, checkpoint saves and the end of a run "
     "(lab/bench_eval.py)", RERUN),
    ("eval_stall.md", "Developer: evaluation iterators before and after "
     "issue 38's fix (lab/bench_eval.py)", "make bench-eval-stall"),
    ("collectives.md", "Developer: BN group all-reduce, collective vs masked "
     "(lab/dev/bench_collectives.py)", "make bench-collectives"),
    ("cpu_kernels.md", "Developer: CPU kernels, oneDNN vs Eigen "
     "(lab/dev/bench_cpu_kernels.py)", "make bench-cpu-kernels"),
    ("engines_cpu.md", "The CPU demo on TensorFlow and on JAX "
     "(lab/bench_engines_cpu.py)", "make bench-engines-cpu"),
    ("op_profile_ours_ours_v1_layout_keras.md", "Developer: op time of the "
     "ResNet-50 steps (lab/dev/op_profile.py)", "make profile-ops"),
    ("op_profile_bn_group1_bn_group4_bn_group8.md", "Developer: op time of "
     "the BN-group steps (lab/dev/op_profile.py)", "make profile-ops"),
)
# What each summary.json key compares (a ratio of medians), in report order.
MEANINGS = {
    "ours_vs_keras_fp32": "images/s, our ResNet-50 v1.5 / "
                          "keras.applications.ResNet50, float32",
    "ours_vs_keras_bf16": "the same in bfloat16",
    "mfu_bf16": "model FLOP utilisation of our bfloat16 step "
                "(of the bfloat16 matmul peak, matmul_peak_bf16_gflop_s)",
    "matmul_peak_bf16_gflop_s": "GFLOP/s (not a ratio), the bfloat16 "
                                "2048^2 matmul peak mfu_bf16 divides by, "
                                "this run on the CPU named below",
    "matmul_peak_fp32_gflop_s": "GFLOP/s (not a ratio), the float32 matmul "
                                "peak of the same run",
    "bn_group4_vs_group1": "step time, bn_group_size 4 / 1, "
                           "8 CPU replicas",
    "statistics_local_vs_broadcast": "step time, BN moving statistics "
                                     "replica-local / broadcast from "
                                     "replica 0, group 4, 8 CPU replicas",
    "input_full_vs_decode_ceiling": "images/s, full input pipeline / "
                                    "decode-only ceiling",
    "input_fused_vs_full_decode": "images/s, fused decode-and-crop / "
                                  "full decode",
    "collectives_bn_step_masked_over_collective":
        "BN step time, masked / collective group all-reduce",
    "collectives_group_all_reduce_masked_over_collective":
        "1M-float group all-reduce time, masked / collective",
    "onednn_vs_eigen_fp32": "images/s, our float32 step on oneDNN / Eigen "
                            "CPU kernels",
    "eval_vs_train_images_per_sec": "images/s, evaluation / training, 8 CPU "
                                    "replicas",
    "eval_seconds_max_over_median": "seconds, slowest repeated evaluation / "
                                    "their median, 8 CPU replicas",
    "eval_seconds_old_over_new": "seconds per evaluation, one iterator per "
                                 "evaluation (before) / one per run",
    "last_step_to_return_s": "seconds (not a ratio) from the last step to "
                             "the return of run(), final eval included",
    "last_step_to_return_s_old": "the same with the iterators of before",
    "save_blocks_s": "seconds (not a ratio) a checkpoint save blocks "
                     "training, narrow ResNet",
    "resnet50_save_blocks_s": "seconds (not a ratio) a ResNet-50 save "
                              "blocks, 1 replica",
}


def _payloads(output_dir: str) -> dict[str, dict]:
  """Every benchmark JSON file of `output_dir` (not summary.json), by name."""
  payloads = {}
  for path in sorted(glob.glob(os.path.join(output_dir, "*.json"))):
    name = os.path.basename(path)
    if name != "summary.json":
      with open(path) as f:
        payloads[name] = json.load(f)
  return payloads


def headline_table(summary: dict[str, float],
                   payloads: dict[str, dict]) -> list[str]:
  ranges = {}
  for payload in payloads.values():
    ranges.update(payload.get("headline_ranges", {}))
  lines = ["| ratio | compares | median | min-max over repetitions |",
           "|---|---|---:|---:|"]
  order = [k for k in MEANINGS if k in summary] + sorted(
      k for k in summary if k not in MEANINGS)
  for key in order:
    value = summary[key]
    spread = (f"{ranges[key][0]:.3f}-{ranges[key][1]:.3f}" if key in ranges
              else "")
    lines.append(f"| `{key}` | {MEANINGS.get(key, '')} | {value:.3f} | "
                 f"{spread} |")
  return lines


def _describe(machine: dict) -> str:
  # Sorted: files written by older runs list them in another order.
  features = ", ".join(
      f"{name} {'yes' if present else 'no'}"
      for name, present in sorted(machine["cpu_features"].items()))
  return (f"{machine['cores']} cores of {machine['cpu']} ({features}), "
          f"TensorFlow {machine['tensorflow']}, oneDNN CPU kernels "
          f"{'on' if machine['onednn_kernels'] else 'off'}, "
          f"{machine['date']}")


def machine_lines(payloads: dict[str, dict]) -> list[str]:
  """The machine of the run, from the JSON files that record it."""
  machines = {name: p["machine"] for name, p in payloads.items()
              if "machine" in p}
  described = {name: _describe(m) for name, m in machines.items()}
  if not described:
    return ["Machine: not recorded."]
  if len(set(described.values())) == 1:
    return [f"Measured on {next(iter(described.values()))}."]
  return ["Measured on:"] + [f"- {name}: {text}"
                             for name, text in described.items()]


def _demoted(text: str) -> str:
  """`text` with its headings moved below the report's `##` sections."""
  levels = [len(m) for m in re.findall(r"^(#+) ", text, re.M)]
  shift = 3 - min(levels) if levels else 0
  return re.sub(r"^(#+) ", lambda m: "#" * (len(m[1]) + shift) + " ", text,
                flags=re.M)


def report(output_dir: str) -> str:
  with open(os.path.join(output_dir, "summary.json")) as f:
    summary = json.load(f)
  payloads = _payloads(output_dir)
  developer = ", ".join(dict.fromkeys(
      f"`{command}`" for _, _, command in PARTS if command != RERUN))
  lines = [
      "# resnet-tpu benchmark report",
      "",
      *machine_lines(payloads),
      f"Rerun: `{RERUN}`; the developer sections: {developer}. Every ratio "
      "compares variants measured alternately in the same run.",
      "",
      "## Headline ratios (bench_results/summary.json)",
      "",
      *headline_table(summary, payloads),
  ]
  for part, title, command in PARTS:
    lines += ["", f"## {title}", ""]
    path = os.path.join(output_dir, part)
    if os.path.exists(path):
      with open(path) as f:
        lines.append(_demoted(f.read().rstrip()))
    else:
      lines.append(f"({part} missing: run `{command}`.)")
  return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
  output_dir = "bench_results"
  for arg in argv[1:]:
    if arg.startswith("--output_dir="):
      output_dir = arg.split("=", 1)[1]
  text = report(output_dir)
  with open(os.path.join(output_dir, "REPORT.md"), "w") as f:
    f.write(text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
