"""Measure: running candidates on the device (RPC servers and runner, MPS, measurement windows, the
measure callbacks, the GPU's identity, the serving report)."""
