"""TensorFlow's piece of distributed BN: the group sum in tf.distribute's
replica context (batch_norm.py; Ying et al. 2018 §3.1)."""
