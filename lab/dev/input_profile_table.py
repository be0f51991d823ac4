"""Where the input pipeline's CPU cycles go: `perf` profiles grouped by stage.

Profile the input workloads of lab/dev/profile_step.py while their loop runs
(attach after "profiling window starts" so that data generation and warm-up
are left out), then group each profile's symbols:

  python -m lab.dev.profile_step --workload=input --seconds=30 &
  # once it logs "profiling window starts":
  perf record -F 999 -p $! -o /tmp/input.perf -- sleep 20
  (the same for --workload=input_full_decode and --workload=input_ceiling)
  python -m lab.dev.input_profile_table /tmp/input.perf /tmp/input_ceiling.perf

Prints a markdown table: the share of samples per stage for each profile.
Explains bench_input's two headline ratios (Ying et al. 2018 §3.2).
"""
import os
import re
import subprocess
import sys

# (stage, test on (shared object, symbol)); the first match wins.
STAGES = (
    ("JPEG entropy decoding (decode_mcu)",
     lambda dso, sym: sym.startswith("decode_mcu")),
    ("JPEG IDCT, upsampling, colour conversion",
     lambda dso, sym: re.search(
         r"jsimd|idct|upsample|ycc|decompress_|process_data|jpeg|"
         r"read_markers|fill_bit_buffer", sym) is not None),
    ("bilinear resize", lambda dso, sym: "resize_image" in sym),
    ("casts and rounding around the resize",
     lambda dso, sym: re.search(r"TensorConversionOp|scalar_sum_op|"
                                r"scalar_left", sym) is not None),
    ("random flip (reverse)", lambda dso, sym: "Reverse" in sym),
    ("memory copies, malloc/free",
     lambda dso, sym: re.search(r"mem(move|cpy|set)|malloc|free|_int_|"
                                r"consolidate", sym) is not None),
    ("OS kernel (scheduling, faults, syscalls)",
     lambda dso, sym: "kernel" in dso),
    ("TensorFlow runtime (executor, thread pools, tf.data)",
     lambda dso, sym: "libtensorflow_framework" in dso or
     re.search(r"ThreadPool|RunQueue|data::", sym) is not None),
)
OTHER = "other"
_LINE = re.compile(r"\s*([\d.]+)%\s+(\S+)\s+\[.\]\s+(.*)")


def stage_shares(report: str) -> dict[str, float]:
  """Percent of samples per stage from `perf report --sort dso,symbol`."""
  shares = {name: 0.0 for name, _ in STAGES}
  shares[OTHER] = 0.0
  for line in report.splitlines():
    match = _LINE.match(line)
    if not match:
      continue
    percent, dso, symbol = float(match[1]), match[2], match[3].strip()
    stage = next((name for name, test in STAGES if test(dso, symbol)), OTHER)
    shares[stage] += percent
  if not any(shares.values()):
    raise ValueError("no `perf report` sample lines found (expected lines "
                     "like ' 47.75%  libtensorflow_cc.so.2  [.] decode_mcu')")
  return shares


def perf_report(path: str) -> str:
  """`perf report` of one profile, one line per (shared object, symbol)."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no such perf profile")
  return subprocess.run(
      ["perf", "report", "-i", path, "--no-children", "--sort", "dso,symbol",
       "--stdio", "-g", "none", "--percent-limit", "0"],
      capture_output=True, text=True, check=True).stdout


def markdown(shares: dict[str, dict[str, float]]) -> str:
  names = list(shares)
  lines = ["| stage | " + " | ".join(names) + " |",
           "|---|" + "---:|" * len(names)]
  for stage in next(iter(shares.values())):
    lines.append(f"| {stage} | " + " | ".join(
        f"{shares[n][stage]:.1f}%" for n in names) + " |")
  return "\n".join(lines) + "\n"


def main(paths: list[str]) -> None:
  if not paths:
    sys.exit(__doc__)
  try:
    shares = {os.path.basename(p): stage_shares(perf_report(p))
              for p in paths}
  except (OSError, ValueError, subprocess.CalledProcessError) as error:
    sys.exit(f"input_profile_table: {error}")
  print(markdown(shares))


if __name__ == "__main__":
  main(sys.argv[1:])
