"""Under KERAS_BACKEND=jax the engine-neutral packages and the GPU bench
import no TensorFlow and none of the project's TensorFlow modules (issue
48), and work where TensorFlow is not installed, as on the H200: .venv
has TensorFlow for JAX training's input and files (issue 49), so the probe
blocks its import."""
import os
import subprocess
import sys


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The network, the optimizers and the JAX step, with everything they
# import.
ENGINE_NEUTRAL = (
    "resnet_tpu.model.resnet", "resnet_tpu.model.distributed_batch_norm",
    "resnet_tpu.model.batch_statistics", "resnet_tpu.model.bfloat16_convs",
    "resnet_tpu.model.keras_weights", "resnet_tpu.optim.optimizers",
    "resnet_tpu.optim.lars", "resnet_tpu.optim.rmsprop_warmup",
    "resnet_tpu.optim.schedules", "resnet_tpu.engines.jax.step",
    "resnet_tpu.parallel.jax.bn_all_reduce",
    "resnet_tpu.engines.jax.processes", "lab.bench_gpu")
# Modules that belong to TensorFlow's engine.
TF_MODULES = ("tensorflow", "tf_keras",
              "resnet_tpu.model.tensorflow.batch_norm",
              "resnet_tpu.optim.tensorflow.optimizers",
              "resnet_tpu.parallel.tensorflow.bn_all_reduce",
              "resnet_tpu.parallel.tensorflow.gradient_all_reduce",
              "resnet_tpu.runtime.compat")

PROBE = """
import sys

class NoTensorFlow:  # as where it is not installed
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] == "tensorflow":
      raise ModuleNotFoundError(f"No module named {{name!r}}")

sys.meta_path.insert(0, NoTensorFlow())
{imports}
from resnet_tpu.model.resnet import build_model
from resnet_tpu.config import ModelConfig
build_model(ModelConfig(resnet_depth=18, image_size=32, num_classes=4))
print("\\n".join(sorted(sys.modules)))
"""


def test_no_tensorflow_under_jax():
  """In a fresh process (this one's imports are cached): import them all
  and build the network."""
  env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=ROOT)
  imports = "\n".join(f"import {module}" for module in ENGINE_NEUTRAL)
  loaded = subprocess.run(
      [sys.executable, "-c", PROBE.format(imports=imports)], env=env,
      check=True, capture_output=True, text=True, timeout=300).stdout.split()
  assert set(ENGINE_NEUTRAL) <= set(loaded)
  tf_loaded = [m for m in loaded
               if m in TF_MODULES or m.startswith("tensorflow.")]
  assert not tf_loaded, f"imported under JAX: {tf_loaded}"
