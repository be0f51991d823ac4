"""Benchmarks, export, evaluation and plots; run as `python -m tools.<name>`.

Quiets TensorFlow's C++ start-up logs before any tool loads it
(resnet_tpu/runtime/process_setup.py). The CPU benchmarks choose oneDNN's kernels
themselves; export, evaluate and the accelerator check run on any host and
leave TensorFlow's default.
"""
from resnet_tpu.runtime import process_setup

process_setup.quiet_tensorflow_logs()
