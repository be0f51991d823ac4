"""Benchmarks, export, evaluation and plots; run as `python -m tools.<name>`.

Importing resnet_tpu first sets its CPU kernel defaults before TensorFlow
loads (resnet_tpu/cpu_kernels.py).
"""
import resnet_tpu  # noqa: F401
