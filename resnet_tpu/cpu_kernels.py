"""TensorFlow's oneDNN CPU kernels, on by default for our programs.

TensorFlow ships two sets of CPU kernels for convolutions, batch norm, pooling
and matmul: Eigen's (a convolution is im2col + GEMM) and oneDNN's JIT-compiled
primitives. By default it switches oneDNN on only on x86 CPUs with
neural-network features such as AVX-512 VNNI/BF16 or AMX (TensorFlow
community RFC 400); on others, such as the AVX2 AMD EPYC this project is
developed on, it runs Eigen's. On that machine oneDNN's kernels train our
float32 ResNet-50 and the 8-replica BN benchmark faster than Eigen's
(`python -m tools.dev.bench_cpu_kernels`; figures in
bench_results/REPORT.md), so our entry points turn them on unless the user
chose:
`TF_ENABLE_ONEDNN_OPTS=0` keeps Eigen's kernels. bfloat16 convolutions stay
Eigen's either way on CPUs without AVX-512 (TensorFlow's oneDNN bf16 needs it);
resnet_tpu/bfloat16_convs.py widens them to these float32 kernels instead.

TensorFlow reads the switch once, when it loads, so `import resnet_tpu` must
come before `import tensorflow`: main.py, tools/__init__.py,
tests/conftest.py and the notebook do that. Nothing changes on TPU or GPU.
"""
import os
import sys

ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"


def default_onednn_on() -> None:
  """Sets TF_ENABLE_ONEDNN_OPTS=1 unless the user set it (before TF loads)."""
  if "tensorflow" not in sys.modules:
    os.environ.setdefault(ONEDNN_ENV, "1")


def cpu_flags() -> frozenset[str]:
  """The feature flags of /proc/cpuinfo (empty where it cannot be read)."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        # x86 names the line "flags", aarch64 "Features".
        if line.startswith(("flags", "Features")):
          return frozenset(line.split(":", 1)[1].split())
  except OSError:
    pass
  return frozenset()


def onednn_enabled() -> bool:
  """Whether the TensorFlow loaded in this process runs oneDNN's kernels."""
  # pylint: disable-next=g-import-not-at-top (TensorFlow loads after us)
  from resnet_tpu import compat
  return compat.onednn_enabled()
