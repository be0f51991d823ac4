"""Across JAX's devices: the device mesh, whose rows are the BN groups, and
BN's group psum (bn_all_reduce.py; Ying et al. 2018 §3.1)."""
