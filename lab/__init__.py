"""The lab beside the product: benchmarks, studies, the all-reduce cost model
and the profilers (dev/); run as `python -m lab.<name>`.

Quiets TensorFlow's C++ start-up logs before any of them loads it
(resnet_tpu/runtime/process_setup.py); the CPU benchmarks choose oneDNN's
kernels themselves. Their smokes run in `make test`, their tiny runs in
`make test-lab`.
"""
from resnet_tpu.runtime import process_setup

process_setup.quiet_tensorflow_logs()
