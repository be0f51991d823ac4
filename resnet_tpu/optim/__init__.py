"""Gradients to updates: optimizers, LARS, RMSprop warm-up, LR schedules.

Every schedule is a function of the epoch (the TF-free clock.py), so a
batch-size schedule (Mikami et al. 2018) keeps its shape in epochs. Written
in keras.ops for TensorFlow and JAX; tensorflow/ and jax/ hold how each
engine's replicas meet an optimizer.
"""
