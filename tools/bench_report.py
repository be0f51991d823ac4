"""Assembles bench_results/REPORT.md from the benchmarks' markdown parts.

  python -m tools.bench_report --output_dir=bench_results

Run by `make bench` after its benchmarks, and by `make bench-cpu-kernels` and
`make profile-ops`.
"""
import json
import os
import sys

from tools import bench_common

OP_PROFILES = ("op_profile_ours_ours_v1_layout_keras.md",
               "op_profile_bn_group1_bn_group4_bn_group8.md")
PARTS = ("train.md", "cpu_kernels.md", *OP_PROFILES[:1], "bn_groups.md",
         *OP_PROFILES[1:], "collectives.md", "input.md", "allreduce_sim.md")
RERUN = "make bench"
# Parts that `make bench` does not write, and the command that does.
SEPARATE = {"cpu_kernels.md": "make bench-cpu-kernels",
            **dict.fromkeys(OP_PROFILES, "make profile-ops")}
# The targets of the benchmark issue: key -> (comparison, bound).
TARGETS = {
    "ours_vs_keras_fp32": (">=", 1.00),
    "ours_vs_keras_bf16": (">=", 1.00),
    "mfu_bf16": (">=", 0.30),
    "bn_group4_vs_group1": ("<=", 1.10),
    "input_full_vs_decode_ceiling": (">=", 0.85),
    "input_fused_vs_full_decode": (">=", 1.20),
}


def target_cell(key: str, value: float) -> tuple[str, str]:
  """('>= 1.00', 'yes'/'NO') for a key with a target, else ('', '')."""
  if key not in TARGETS:
    return "", ""
  comparison, bound = TARGETS[key]
  met = value >= bound if comparison == ">=" else value <= bound
  return f"{comparison} {bound:.2f}", "yes" if met else "**NO**"


def report(output_dir: str) -> str:
  with open(os.path.join(output_dir, "summary.json")) as f:
    summary = json.load(f)
  m = bench_common.machine()
  features = ", ".join(f"{name} {'yes' if present else 'no'}"
                       for name, present in m["cpu_features"].items())
  lines = [
      "# resnet-tpu benchmark report",
      "",
      f"Measured {m['date']} on {m['cores']} cores of {m['cpu']} "
      f"({features}), TensorFlow {m['tensorflow']}, oneDNN CPU kernels "
      f"{'on' if m['onednn_kernels'] else 'off'} (resnet_tpu/cpu_kernels.py)."
      f" Rerun: `{RERUN}`. Every ratio compares variants measured "
      "alternately in the same run.",
      "",
      "## Headline ratios (bench_results/summary.json)",
      "",
      "| key | value | target | met |",
      "|---|---:|---:|:---:|",
  ]
  for key, value in sorted(summary.items()):
    target, met = target_cell(key, value)
    lines.append(f"| `{key}` | {value:.3f} | {target} | {met} |")
  for part in PARTS:
    path = os.path.join(output_dir, part)
    if os.path.exists(path):
      with open(path) as f:
        lines += ["", f.read().rstrip()]
    else:
      rerun = SEPARATE.get(part)
      lines += ["", f"({part} missing: run `{rerun}`.)" if rerun else
                f"({part} missing: its benchmark did not run.)"]
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
