#!/usr/bin/env python3
"""Start-up time gpucollect's Python hook adds to a program that imports no framework.

Writes the hook's files (collector/src/capture/python/, the same files gpucollect embeds) into a
temporary directory and times `PYTHON -c pass` with and without that directory first on
PYTHONPATH, alternating, RUNS times each. Prints the medians and the difference.

Usage: scripts/bench-python-hook.py [RUNS] (env PYTHON: the interpreter, default python3)
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
runs = int(sys.argv[1]) if len(sys.argv) > 1 else 100
python = os.environ.get("PYTHON", "python3")
hook = tempfile.mkdtemp(prefix="gpucollect-bench-")
try:
    src = os.path.join(root, "collector/src/capture/python")
    for name in os.listdir(src):
        if name.endswith(".py"):
            shutil.copy(os.path.join(src, name), hook)
    plain_env = dict(os.environ)
    old = plain_env.pop("PYTHONPATH", "")
    hook_env = dict(plain_env, PYTHONPATH=hook + (":" + old if old else ""))
    if old:
        plain_env["PYTHONPATH"] = old
    plain, hooked = [], []
    for _ in range(runs):
        for env, times in ((plain_env, plain), (hook_env, hooked)):
            t = time.perf_counter()
            subprocess.run([python, "-c", "pass"], env=env, check=True)
            times.append(time.perf_counter() - t)
    a, b = statistics.median(plain) * 1e3, statistics.median(hooked) * 1e3
    print(f"{python} -c pass, {runs} runs each: plain {a:.2f} ms, with the hook {b:.2f} ms, "
          f"added {b - a:+.2f} ms (median)")
finally:
    shutil.rmtree(hook)
