"""Across replicas: subgroup collectives, the BN and gradient all-reduces, the
tf.distribute strategy and where replicas sit on a TPU slice (Ying et al.
2018 §3.1, §3.3)."""
