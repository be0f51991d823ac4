"""How TensorFlow's replicas meet an optimizer: a replica-local step
counter and the gradient all-reduce of --gradient_all_reduce
(optimizers.py)."""
