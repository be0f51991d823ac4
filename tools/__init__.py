"""Export, evaluation, plots, the accelerator check: `python -m tools.<name>`.

Quiets TensorFlow's C++ start-up logs before any tool loads it
(resnet_tpu/runtime/process_setup.py). Export, evaluate and the accelerator
check run on any host and leave TensorFlow's oneDNN default.
"""
from resnet_tpu.runtime import process_setup

process_setup.quiet_tensorflow_logs()
