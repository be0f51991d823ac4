"""Hides TensorFlow from every Python process whose PYTHONPATH holds this
folder, the processes it starts included (without_tensorflow.py's finder):
the GPU bench's parent, its workers and its main.py run, as on the H200's
image."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
# pylint: disable-next=g-import-not-at-top,wrong-import-position
from without_tensorflow import WithoutTensorFlow

del sys.path[0]
sys.meta_path[:] = [WithoutTensorFlow(f) for f in sys.meta_path]
