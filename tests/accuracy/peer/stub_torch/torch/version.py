"""`torch.version` of the stub: no CUDA or ROCm build."""

cuda = None
hip = None
