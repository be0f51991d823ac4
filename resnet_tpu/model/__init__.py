"""The network: ResNet v1.5, distributed BN, bfloat16 convolutions.

resnet.py builds it; distributed_batch_norm.py sums BN statistics over
replica groups (Ying et al. 2018 §3.1); bn_recompute.py recomputes them
(Akiba et al. 2017); bfloat16_convs.py runs bfloat16 on any device.
"""
