"""TensorFlow's engine: the replica step and host loops under a strategy.

startup.py starts the tf.distribute strategy, engine.py serves the loop
(train/engine.py), step.py is the replica step, host_loops.py runs many
of them per host call; iterators, the float16 loss scale, BN recomputation
and the moving statistics' average are its own.
"""
