"""Build: compiling candidates (local worker pools, the build service and its protocol, NVRTC, CPU counts)."""
