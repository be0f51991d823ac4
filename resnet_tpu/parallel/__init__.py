"""Across replicas: BN and gradient all-reduces, strategy, TPU placement.

Subgroup collectives (replica_groups.py), the group all-reduce of
distributed BN (Ying et al. 2018 §3.1), gradient summation (§3.3; Mikami et
al. 2018), the tf.distribute strategy, and where replicas sit on a TPU slice;
on JAX, the device mesh and BN's group psum (bn_all_reduce_jax.py).
"""
