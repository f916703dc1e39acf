"""Device calls: the worker's side and the device daemon's side."""
