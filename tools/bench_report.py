"""Assembles bench_results/REPORT.md from the benchmarks' markdown parts.

  python -m tools.bench_report --output_dir=bench_results

Run by `make bench` after every tools/bench_*.py and tools/allreduce_sim.py.
"""
import json
import os
import sys

from tools import bench_common

PARTS = ("train.md", "bn_groups.md", "collectives.md", "input.md",
         "allreduce_sim.md")
RERUN = "make bench"


def report(output_dir: str) -> str:
  with open(os.path.join(output_dir, "summary.json")) as f:
    summary = json.load(f)
  m = bench_common.machine()
  lines = [
      "# resnet-tpu benchmark report",
      "",
      f"Measured {m['date']} on {m['cores']} cores of {m['cpu']}, "
      f"TensorFlow {m['tensorflow']}. Rerun: `{RERUN}`. Every ratio compares "
      "variants measured alternately in the same run.",
      "",
      "## Headline ratios (bench_results/summary.json)",
      "",
      "| key | value |",
      "|---|---:|",
  ]
  lines += [f"| `{k}` | {v:.3f} |" for k, v in sorted(summary.items())]
  for part in PARTS:
    path = os.path.join(output_dir, part)
    if os.path.exists(path):
      with open(path) as f:
        lines += ["", f.read().rstrip()]
    else:
      lines += ["", f"({part} missing: its benchmark did not run.)"]
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
