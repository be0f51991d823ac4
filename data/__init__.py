"""Dataset builders; run as `python -m data.<name>`.

Quiets TensorFlow's C++ start-up logs before a builder loads it
(resnet_tpu/runtime/process_setup.py).
"""
from resnet_tpu.runtime import process_setup

process_setup.quiet_tensorflow_logs()
