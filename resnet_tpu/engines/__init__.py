"""Each engine's own code: the step, host loops, checkpoints and start-up.

tensorflow/ runs the step under a tf.distribute strategy, jax/ under a
device mesh; both serve the one training loop (train/loop.py) through
train/engine.py's interface, and neither imports the other.
"""
