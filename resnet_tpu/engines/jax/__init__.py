"""JAX's engine: the jitted step over a device mesh, its processes.

startup.py finds the devices and builds the mesh, engine.py serves the
loop (train/engine.py), step.py is the shard_map step over state.py's
TrainState; processes.py and watchdog.py are its hosts' agreement and
bound, tf_checkpoints.py and npz_checkpoints.py its two checkpoint stores,
host_batches.py the numpy hand-off from tf.data, prefetch.py the thread
that keeps two batches on the devices ahead of the step.
"""
