"""A run's files that must survive it: TensorFlow's checkpoint files
(tf_files.py, which a JAX run writes too, through tf.Variable twins), the
checkpoint names both engines read, .npz included (paths.py), and writes and
reads that fail in one line naming the file, or are retried when the error
may pass (storage.py)."""
