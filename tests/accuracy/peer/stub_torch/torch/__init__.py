"""A stand-in for `torch`, just enough for stormlog to import on a machine without PyTorch.

stormlog's profiler modules (`stormlog.profiler`, `stormlog.device_collectors`, ...) run
`import torch` at import time and use `torch.device` / `torch.Tensor` in annotations. The
peer comparison never profiles a live process: it builds stormlog's `ProfileResult` and
telemetry objects from recorded counters and runs `stormlog.analyzer.MemoryAnalyzer` on
them. So this stub holds no GPU state; every runtime query says there is no CUDA device
(`is_available()` is False, `device_count()` is 0) and anything that would need one raises.
"""

__version__ = "0.0.0+stormlog-peer-stub"


def _no_gpu(name):
    def raiser(*_args, **_kwargs):
        raise RuntimeError(
            f"torch.{name} called on the stormlog-peer torch stub: the peer comparison "
            "feeds recorded counters to stormlog's analyzer and never profiles a live GPU"
        )

    return raiser


from . import cuda  # noqa: E402,F401
from . import backends  # noqa: E402,F401
from . import version  # noqa: E402,F401


class device:  # noqa: N801 - torch's own spelling
    """`torch.device("cuda:0")` / `torch.device("cuda", 0)`: type and index only."""

    def __init__(self, type_or_spec="cpu", index=None):
        spec = str(type_or_spec)
        if ":" in spec and index is None:
            spec, idx = spec.split(":", 1)
            index = int(idx)
        self.type = spec
        self.index = index

    def __repr__(self):
        suffix = "" if self.index is None else f", index={self.index}"
        return f"device(type='{self.type}'{suffix})"


class Tensor:
    """Only a type for annotations and isinstance checks; no tensor is ever made."""


def __getattr__(name):
    raise AttributeError(
        f"the stormlog-peer torch stub has no torch.{name}; the analyzer path does not need it"
    )
