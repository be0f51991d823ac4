"""TensorFlow's oneDNN CPU kernels: on for runs whose model is on CPU devices.

TensorFlow ships two sets of CPU kernels for convolutions, batch norm, pooling
and matmul: Eigen's (a convolution is im2col + GEMM) and oneDNN's JIT-compiled
primitives. By default it switches oneDNN on only on x86 CPUs with
neural-network features such as AVX-512 VNNI/BF16 or AMX (TensorFlow
community RFC 400); on others, such as AVX2 CPUs, it runs Eigen's. On an
AVX2 AMD EPYC, oneDNN trains our float32 ResNet-50 and the 8-replica BN
benchmark faster (`python -m lab.dev.bench_cpu_kernels`; figures in
bench_results/REPORT.md), so `--cpu_onednn=auto` turns it on for CPU runs
(process_setup.apply_cpu_kernel_choice) and leaves TensorFlow's default on
TPU and GPU hosts, where it was never measured. `TF_ENABLE_ONEDNN_OPTS=0` or
`1` set by the user wins. bfloat16 convolutions stay Eigen's either way on
CPUs without AVX-512 (TensorFlow's oneDNN bf16 needs it);
resnet_tpu/model/bfloat16_convs.py widens them to float32 kernels instead.
"""
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"


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
  from resnet_tpu.runtime import compat
  return compat.onednn_enabled()
