"""Benchmarks, studies, the all-reduce cost model, profilers: the lab.

Beside the product, not in it; run as `python -m lab.<name>`. The profilers
and the A/B runs behind machine-specific defaults are in dev/.

Quiets TensorFlow's C++ start-up logs before any of them loads it
(resnet_tpu/runtime/process_setup.py); the CPU benchmarks choose oneDNN's
kernels themselves. Their smokes run in `make test`, their tiny runs in
`make test-lab`.
"""
from resnet_tpu.runtime import process_setup

process_setup.quiet_tensorflow_logs()
