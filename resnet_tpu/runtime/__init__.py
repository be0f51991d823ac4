"""The process: private TF APIs, start-up settings, host memory, devices.

compat.py holds every private TensorFlow and Keras API the project calls;
process_setup.py and cpu_kernels.py what an entry point sets before
TensorFlow loads; device_check.py what the process runs on.
"""
