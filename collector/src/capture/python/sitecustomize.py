# gpucollect's sitecustomize: written by gpucollect into a private directory that it puts first
# on PYTHONPATH for the traced program (and so for its Python children). It does three things
# and nothing else:
#   1. installs a sys.meta_path finder that activates framework capture right after `torch` or
#      `cupy` has been imported (gpucollect_frameworks is imported only then);
#   2. runs the sitecustomize this one hides, if there is one further along sys.path;
#   3. nothing more: a program that never imports torch or cupy runs as it would without it.
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


class _GpucollectFrameworkFinder:
    """Finds nothing itself; for `torch` and `cupy` it asks the other finders for the spec and
    wraps the loader so that capture is activated after the module has executed."""

    _names = frozenset(("torch", "cupy"))

    def __init__(self):
        self._busy = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self._names or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            import importlib.util

            spec = importlib.util.find_spec(fullname)
        except Exception:
            return None
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ActivatingLoader(spec.loader, fullname)
        return spec

    def invalidate_caches(self):
        pass


class _ActivatingLoader:
    def __init__(self, inner, name):
        self._inner = inner
        self._name = name

    def __getattr__(self, attr):
        return getattr(self._inner, attr)

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        # Only a successful import activates; a failing one raises above, as it would anyway.
        try:
            _gpucollect_frameworks().activate(self._name, module)
        except Exception as e:  # capture must never break the program
            sys.stderr.write(
                "gpucollect: framework capture for %s failed to start: %s: %s\n"
                % (self._name, type(e).__name__, e)
            )


def _gpucollect_frameworks():
    """gpucollect_frameworks from this file's directory (even if the program changed sys.path)."""
    module = sys.modules.get("gpucollect_frameworks")
    if module is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "gpucollect_frameworks", _HERE + "/gpucollect_frameworks.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpucollect_frameworks"] = module
        spec.loader.exec_module(module)
    return module


def _gpucollect_run_hidden_sitecustomize():
    import importlib.machinery
    import importlib.util

    here = _HERE
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    # The program sees its own sitecustomize under that name, as it would without gpucollect.
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if not any(type(f).__name__ == "_GpucollectFrameworkFinder" for f in sys.meta_path):
    sys.meta_path.insert(0, _GpucollectFrameworkFinder())
# An exception here reaches site.py, which reports it as it reports any sitecustomize error.
_gpucollect_run_hidden_sitecustomize()
