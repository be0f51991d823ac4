"""Across replicas: BN and gradient all-reduces, strategy, TPU placement.

Subgroup collectives (replica_groups.py) and where replicas sit on a TPU
slice (topology.py, tpu_layout.py) serve both engines. Each engine's own
collectives sit in its folder: tensorflow/ (the tf.distribute strategy, the
group all-reduce of distributed BN, Ying et al. 2018 §3.1, and gradient
summation, §3.3 and Mikami et al. 2018) and jax/ (the device mesh and BN's
group psum).
"""
