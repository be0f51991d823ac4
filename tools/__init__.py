"""Export, evaluation, plots, the accelerator check: `python -m tools.<name>`.

Quiets TensorFlow's C++ start-up logs before any tool loads it
(resnet_tpu/runtime/process_setup.py). Export, evaluate and the accelerator
check run on any host and leave TensorFlow's oneDNN default. Every tool
runs on Keras's TensorFlow engine (SavedModels, tf.data, TensorFlow's
checkpoints), whatever KERAS_BACKEND the shell has: a JAX user's shell
exports KERAS_BACKEND=jax, and the tools read that run's files all the
same.
"""
from resnet_tpu.runtime import process_setup

process_setup.quiet_tensorflow_logs()
process_setup.choose_backend("tensorflow")
