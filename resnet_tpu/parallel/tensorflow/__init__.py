"""Across tf.distribute's replicas: the strategy (strategy.py), BN's group
all-reduce (bn_all_reduce.py; Ying et al. 2018 §3.1) and the gradient
summation (gradient_all_reduce.py; §3.3, Mikami et al. 2018)."""
