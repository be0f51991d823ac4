"""A Keras model's FLOPs by the convention of model FLOP utilisation: the
multiply-adds of its Conv2D and Dense layers, 2 FLOPs each, and a training
step 3 times the forward pass (the backward pass takes the gradients of the
inputs and of the kernels; Chowdhery et al. 2022, "PaLM", appendix B).
Counted from the layers, not from a compiled program: XLA's cost analysis
scores a library call (cuDNN's convolutions, cuBLAS's matmuls on a GPU) as
-1 or leaves it out (jax-ml/jax#16008, #22249)."""
import keras
import numpy as np


def forward_flops(model: keras.Model) -> int:
  """FLOPs of one image's forward pass through the Conv2D and Dense layers."""
  flops = 0
  for layer in model.layers:
    if isinstance(layer, keras.layers.Conv2D):
      height, width = layer.output.shape[1:3]
      flops += 2 * height * width * int(np.prod(layer.kernel.shape))
    elif isinstance(layer, keras.layers.Dense):
      flops += 2 * int(np.prod(layer.kernel.shape))
  return flops


def training_flops(model: keras.Model, batch_size: int) -> int:
  """FLOPs of one training step on `batch_size` images."""
  return 3 * batch_size * forward_flops(model)
