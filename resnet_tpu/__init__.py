"""resnet-tpu: supercomputer-scale ResNet-50 training (Ying et al. 2018).

Importing the package before TensorFlow turns on TensorFlow's oneDNN CPU
kernels unless TF_ENABLE_ONEDNN_OPTS is set (cpu_kernels.py).
"""
from resnet_tpu import cpu_kernels

cpu_kernels.default_onednn_on()
