"""The runtime: device discovery, Model -> HAL model, compilation and execution plumbing.

The runtime never computes an operation itself; it hands HAL objects to drivers.
"""
