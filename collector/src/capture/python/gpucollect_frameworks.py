# gpucollect's framework capture, imported by gpucollect's sitecustomize only after `torch` or
# `cupy` has been imported by the traced program. It says on stderr, once per process and
# framework, what capture is active or why none is.
import sys

_announced = set()


def _say(name, line):
    if name in _announced:
        return
    _announced.add(name)
    sys.stderr.write("gpucollect: %s\n" % line)
    sys.stderr.flush()


def activate(name, module):
    """Called right after `name` (torch or cupy) has been imported successfully."""
    _say(
        name,
        "%s imported: tensor-level capture is not active (this build records %s's CUDA "
        "allocations, its reserve, only)" % (name, name),
    )
