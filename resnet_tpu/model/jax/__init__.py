"""JAX's piece of distributed BN: the group sum as a psum over the device
mesh's BN axis (batch_norm.py; Ying et al. 2018 §3.1)."""
