"""resnet-tpu: supercomputer-scale ResNet-50 training (Ying et al. 2018).

Importing the package changes nothing in the process: the entry points
choose TensorFlow's logs and CPU kernels before it loads
(process_setup.py).
"""
