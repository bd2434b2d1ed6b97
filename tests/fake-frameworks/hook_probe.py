"""Reports, one line per process on stdout, what gpucollect's Python hook did in it.

Usage: hook_probe.py MODE [children]
  MODE `torch`: import (fake) torch; `none`: import nothing; `broken`: import a torch whose
  import raises ImportError (broken/torch; the error is caught).
  `children`: also start a multiprocessing spawn child, a forkserver child and a subprocess,
  each running this probe with the same MODE.
Line: probe pid=<pid> kind=<main|spawn|forkserver|subprocess> finder=<0|1> active=<0|1>
      user_site=<0|1> hook_dir=<dir of gpucollect's sitecustomize or ->
"""
import os
import sys


def report(kind, mode):
    if mode == "torch":
        import torch  # noqa: F401
    elif mode == "broken":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "broken"))
        try:
            import torch  # noqa: F401
        except ImportError:
            pass
    finder = any(type(f).__name__ == "_GpucollectFrameworkFinder" for f in sys.meta_path)
    active = "gpucollect_frameworks" in sys.modules
    user = os.environ.get("GPUCOLLECT_TEST_USER_SITECUSTOMIZE") == "ran"
    hook_dir = "-"
    for p in os.environ.get("PYTHONPATH", "").split(":"):
        if os.path.isfile(os.path.join(p, "gpucollect_frameworks.py")):
            hook_dir = p
            break
    print(
        "probe pid=%d kind=%s finder=%d active=%d user_site=%d hook_dir=%s"
        % (os.getpid(), kind, finder, active, user, hook_dir),
        flush=True,
    )


def _child(kind, mode):
    report(kind, mode)


def main():
    mode = sys.argv[1]
    kind = sys.argv[3] if len(sys.argv) > 3 else "main"
    report(kind, mode)
    if len(sys.argv) > 2 and sys.argv[2] == "children":
        import multiprocessing as mp
        import subprocess

        for method in ("spawn", "forkserver"):
            p = mp.get_context(method).Process(target=_child, args=(method, mode))
            p.start()
            p.join()
            assert p.exitcode == 0, (method, p.exitcode)
        subprocess.run(
            [sys.executable, os.path.abspath(__file__), mode, "-", "subprocess"], check=True
        )


if __name__ == "__main__":
    main()
