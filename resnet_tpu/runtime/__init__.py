"""The process the run lives in: TensorFlow's private APIs, start-up settings,
host memory and the devices it finds."""
