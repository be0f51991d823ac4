"""The network: ResNet v1.5, distributed BN, bfloat16 convolutions.

resnet.py builds it; distributed_batch_norm.py sums BN statistics over
replica groups (Ying et al. 2018 §3.1); bn_recompute.py recomputes them
(Akiba et al. 2017); bfloat16_convs.py runs bfloat16 on any device.
Written in keras.ops for TensorFlow and JAX alike; each engine's own piece of
BN is batch_norm_tf.py or batch_norm_jax.py, and moving_statistics.py and
bn_recompute.py are TensorFlow's.
"""
