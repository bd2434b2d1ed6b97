"""`torch.backends` of the stub: no MPS."""


class mps:  # noqa: N801 - torch's own spelling
    @staticmethod
    def is_available():
        return False

    @staticmethod
    def is_built():
        return False
