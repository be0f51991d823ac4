"""The network: ResNet v1.5, distributed BN, bfloat16 convolutions.

resnet.py builds it; distributed_batch_norm.py sums BN statistics over
replica groups (Ying et al. 2018 §3.1); bfloat16_convs.py runs bfloat16 on
any device. Written in keras.ops for TensorFlow and JAX alike; each engine's
own piece of BN sits in its folder (tensorflow/, jax/). Recomputing the
statistics (Akiba et al. 2017) and their moving average are TensorFlow's
engine's (engines/tensorflow/).
"""
