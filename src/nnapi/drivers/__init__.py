"""Drivers behind the HAL: the reference CPU driver and sample drivers."""
