# gpucollect's framework capture, imported by gpucollect's sitecustomize only after `torch` or
# `cupy` has been imported by the traced program. It says on stderr, once per process and
# framework, which capture is active or why none is.
#
# PyTorch, trace tracker (preferred): the C++ shim gpucollect_torch_tracker.cpp (next to this
# file) is compiled once per torch version, C++ ABI and shim source against the installed
# torch's own headers (torch/include) and cached (XDG_CACHE_HOME or ~/.cache, gpucollect/);
# once CUDA is initialised it attaches a trace tracker to the caching allocator
# (attachAllocatorTraceTracker) that calls the injection library's gpucollect_framework_trace
# in the allocating thread, which records each tensor with that thread's native and Python
# stacks. Without a C++ compiler, torch's headers or libc10_cuda.so, or when the build or the
# attach fails, the Python fallback runs instead and the line saying so says why.
#
# PyTorch, Python fallback: once CUDA is initialised, the caching allocator's own history is
# switched on (torch.cuda.memory._record_memory_history) and a daemon thread pulls the new
# entries of torch.cuda.memory._snapshot()["device_traces"] every GPUCOLLECT_POOL_INTERVAL_MS,
# at exit and on OOM, handing each tensor allocation and free to the injection library
# (gpucollect_framework_alloc/_free, through ctypes), which writes them into the ring with the
# CUDA events.
import os
import sys
import threading

_announced = set()
_MAX_ENTRIES = 100000
_TAIL = 8


def _say(name, line):
    if name in _announced:
        return
    _announced.add(name)
    sys.stderr.write("gpucollect: %s\n" % line)
    sys.stderr.flush()


def activate(name, module):
    """Called right after `name` (torch or cupy) has been imported successfully."""
    if name == "torch":
        _say(name, "torch: " + _start_torch(module))
    elif name == "cupy":
        _say(name, "cupy: " + _start_cupy(module))


class _Handover:
    """The injection library's framework functions (the process's own copy of the library
    that CUDA_INJECTION64_PATH names: loading it again returns the same one)."""

    def __init__(self, path):
        import ctypes

        lib = ctypes.CDLL(path)
        self._ctypes = ctypes
        self._alloc = lib.gpucollect_framework_alloc
        self._alloc.restype = ctypes.c_int
        self._alloc.argtypes = [
            ctypes.c_uint32,
            ctypes.c_uint64,
            ctypes.c_uint64,
            ctypes.c_uint64,
            ctypes.c_uint64,
            ctypes.c_uint32,
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.POINTER(ctypes.c_uint32),
            ctypes.c_uint32,
        ]
        self._free = lib.gpucollect_framework_free
        self._free.restype = ctypes.c_int
        self._free.argtypes = [ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64]
        self._lost = lib.gpucollect_framework_lost
        self._lost.restype = ctypes.c_int
        self._lost.argtypes = [ctypes.c_char_p]
        depth = os.environ.get("GPUCOLLECT_STACK_DEPTH", "32")
        self.max_frames = int(depth) if depth.isdigit() else 32
        if os.environ.get("GPUCOLLECT_PYTHON_FRAMES") == "0":
            self.max_frames = 0

    def alloc(self, device, addr, size, stream, pool, frames, torch=False):
        """frames: (function, file, line) innermost first. torch: a block of PyTorch's caching
        allocator, `size` its request rounded up to 512 bytes (the collector completes a large
        block the allocator left unsplit); otherwise `size` is the block's."""
        c = self._ctypes
        frames = frames[: self.max_frames]
        n = len(frames)
        names = (c.c_char_p * n)(*[f[0].encode("utf-8", "replace") for f in frames])
        files = (c.c_char_p * n)(*[f[1].encode("utf-8", "replace") for f in frames])
        lines = (c.c_uint32 * n)(*[max(0, int(f[2])) & 0xFFFFFFFF for f in frames])
        return self._alloc(
            device, addr, size, stream & (2**64 - 1), pool, n, names, files, lines, int(torch)
        )

    def free(self, device, addr, stream, pool):
        return self._free(device, addr, stream & (2**64 - 1), pool)

    def lost(self, message):
        return self._lost(message.encode("utf-8", "replace"))


def _handover():
    path = os.environ.get("CUDA_INJECTION64_PATH")
    if not path:
        return None, "CUDA_INJECTION64_PATH is not set (not run by gpucollect?)"
    try:
        return _Handover(path), None
    except (OSError, AttributeError) as e:
        return None, "the injection library %s cannot be used: %s" % (path, e)


def _entry_key(e):
    return (e.get("action"), e.get("addr"), e.get("size"), e.get("stream"), e.get("time_us"))


def _frames(e):
    out = []
    for f in e.get("frames") or ():
        out.append((str(f.get("name", "")), str(f.get("filename", "")), f.get("line", 0) or 0))
    return out


class _TorchPuller:
    """Reads new entries of torch's allocation history and hands them over."""

    def __init__(self, torch, handover, interval_s, max_entries):
        self.torch = torch
        self.handover = handover
        self.interval_s = interval_s
        self.max_entries = max_entries
        self.lock = threading.Lock()
        self.last = {}  # device -> key of the last entry handed over
        self.wraps = 0
        self.entries = 0  # history entries read
        self.events = 0  # tensor allocations and frees handed over
        self.read_s = 0.0  # spent in _snapshot()
        self.handover_s = 0.0  # spent finding new entries and handing them over
        self.started = False
        self.stop = threading.Event()

    def start(self):
        with self.lock:
            if self.started:
                return
            self.started = True
        self.torch.cuda.memory._record_memory_history(
            enabled="all", stacks="python", max_entries=self.max_entries
        )
        t = threading.Thread(target=self._run, name="gpucollect-torch", daemon=True)
        t.start()
        import atexit

        atexit.register(self.pull)
        if os.environ.get("GPUCOLLECT_FRAMEWORK_STATS") == "1":
            atexit.register(self._stats)
        observe = getattr(self.torch._C, "_cuda_attach_out_of_memory_observer", None)
        if observe is not None:
            observe(lambda device, alloc, device_alloc, device_free: self.pull())

    def _run(self):
        while not self.stop.wait(self.interval_s):
            self.pull()

    def pull(self):
        import time

        with self.lock:
            t0 = time.thread_time()  # CPU time: not the waits for the GIL
            try:
                traces = self.torch.cuda.memory._snapshot().get("device_traces") or []
            except Exception:
                return
            t1 = time.thread_time()
            for device, entries in enumerate(traces):
                self._device(device, entries)
            self.read_s += t1 - t0
            self.handover_s += time.thread_time() - t1

    def _stats(self):
        # Registered after the final pull, so it runs before it (atexit is last in, first out).
        self.pull()
        sys.stderr.write(
            "gpucollect: torch: %d history entries read, %d tensor events handed over, "
            "snapshots %.3f s, handover %.3f s\n"
            % (self.entries, self.events, self.read_s, self.handover_s)
        )

    def _device(self, device, entries):
        if not entries:
            return
        # The last entries handed over (several: entries carry no sequence number, and two
        # may look alike when a block is reused within a microsecond). Searched from the end,
        # where they are unless the ring wrapped: the cost is that of the new entries.
        tail = self.last.get(device)
        start = 0
        if tail is not None:
            k = len(tail)
            start = None
            for end in range(len(entries), k - 1, -1):
                if _entry_key(entries[end - 1]) == tail[-1] and [
                    _entry_key(e) for e in entries[end - k : end]
                ] == tail:
                    start = end
                    break
            if start is None:
                # The entries handed over last have been overwritten: the ring wrapped between
                # two reads, and what it held in between is gone.
                start = 0
                self.wraps += 1
                self.handover.lost(
                    "torch's allocation history (max_entries=%d) wrapped between two reads on "
                    "device %d: tensor events were lost (%d time(s) in this process); raise "
                    "GPUCOLLECT_TORCH_MAX_ENTRIES or lower --sample-interval-ms"
                    % (self.max_entries, device, self.wraps)
                )
        h = self.handover
        self.entries += len(entries) - start
        for e in entries[start:]:
            action = e.get("action")
            if action == "alloc":
                self.events += 1
                h.alloc(
                    device,
                    e.get("addr", 0),
                    torch_block_size(e.get("size", 0)),
                    e.get("stream", 0),
                    0,
                    _frames(e),
                    torch=True,
                )
            elif action in ("free_requested", "free"):
                # memory_allocated() drops at the request; a block a side stream used is
                # completed (back in the cache) later. Histories without requests say "free".
                self.events += 1
                h.free(device, e.get("addr", 0), e.get("stream", 0), 0)
        self.last[device] = [_entry_key(e) for e in entries[-_TAIL:]]


def torch_block_size(requested):
    """The block PyTorch's caching allocator hands out for a request (`round_size`): at least
    512 bytes, a multiple of 512. memory_allocated() counts blocks, while the history's and the
    trace tracker's `alloc` entries carry the request. The collector completes a large block the
    allocator left unsplit (at most 1 MiB would have remained) from its segment's layout. Not
    modelled: roundup_power2_divisions."""
    if requested <= 0:
        return 0
    return max(512, (requested + 511) // 512 * 512)


_SHIM = "gpucollect_torch_tracker.cpp"
# Set in a process whose build failed, for its children: the reason.
_BUILD_FAILED = "GPUCOLLECT_TORCH_TRACKER_BUILD_FAILED"


def _cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gpucollect")


def _compiler():
    import shutil

    cxx = os.environ.get("CXX")
    if cxx:
        import shlex

        words = shlex.split(cxx)
        if words and shutil.which(words[0]):
            return words, None
        return None, "no C++ compiler: CXX=%s is not found" % cxx
    for name in ("c++", "g++"):
        path = shutil.which(name)
        if path:
            return [path], None
    return None, "no C++ compiler (c++ or g++ on PATH, or CXX)"


def _cuda_include_dirs():
    """CUDA runtime headers, which torch's own headers include (cuda_runtime_api.h and the
    crt/ headers it includes): the toolkit's, or those of the NVIDIA wheels next to torch
    (CUDA 12: nvidia-cuda-runtime-cu12, crt/ in nvidia-cuda-nvcc-cu12; CUDA 13: both in
    nvidia/cu13, crt/ from nvidia-cuda-crt)."""
    dirs = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            dirs.append(os.path.join(os.environ[var], "include"))
    dirs.append("/usr/local/cuda/include")
    for path in sys.path:
        for sub in ("cuda_runtime", "cuda_nvcc", "cu13"):
            dirs.append(os.path.join(path or os.curdir, "nvidia", sub, "include"))
    seen = []
    for d in dirs:
        useful = os.path.isfile(os.path.join(d, "cuda_runtime_api.h")) or os.path.isfile(
            os.path.join(d, "crt", "host_config.h")
        )
        if useful and d not in seen:
            seen.append(d)
    return seen


def _build_tracker(torch):
    """The path of the shim built for this torch (from the cache, or compiled now), or None
    and why not."""
    import hashlib

    root = os.path.dirname(os.path.abspath(getattr(torch, "__file__", "") or ""))
    include = os.path.join(root, "include")
    header = os.path.join(include, "c10", "cuda", "CUDACachingAllocator.h")
    if not os.path.isfile(header):
        return None, "this torch has no C++ headers (%s is missing)" % header
    lib_dir = os.path.join(root, "lib")
    if not os.path.isfile(os.path.join(lib_dir, "libc10_cuda.so")):
        return None, "this torch has no libc10_cuda.so in %s (a CPU-only build?)" % lib_dir
    cxx, why = _compiler()
    if cxx is None:
        return None, why
    # A build that failed in this run (an earlier process of it) fails again: its children
    # (spawned workers) do not each try it.
    failed = os.environ.get(_BUILD_FAILED)
    if failed:
        return None, failed
    here = os.path.dirname(os.path.abspath(__file__))
    source = os.path.join(here, _SHIM)
    with open(source, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    version = str(getattr(torch, "__version__", "unknown"))
    abi = getattr(getattr(torch, "_C", None), "_GLIBCXX_USE_CXX11_ABI", None)
    abi_key = "abi-unknown" if abi is None else "abi%d" % int(bool(abi))
    safe = "".join(c if c.isalnum() or c in ".+-_" else "_" for c in version)
    cache = _cache_dir()
    # Named like gpucollect's other libraries, so reports count its frames as gpucollect's.
    target = os.path.join(
        cache, "libgpucollect_torch_tracker-%s-%s-%s.so" % (safe, abi_key, digest)
    )
    if os.path.isfile(target):
        return target, None
    try:
        os.makedirs(cache, exist_ok=True)
    except OSError as e:
        return None, "cannot create the cache directory %s: %s" % (cache, e)
    try:
        why = _build_locked(torch, cxx, source, include, lib_dir, abi, target, cache)
    except OSError as e:
        why = "the trace tracker cannot be built in %s: %s" % (cache, e)
    if why is not None:
        os.environ[_BUILD_FAILED] = why
        return None, why
    return target, None


def _build_locked(torch, cxx, source, include, lib_dir, abi, target, cache):
    """Compiles the shim into `target` unless another process just did; None when it is
    there, else why not."""
    import fcntl
    import subprocess

    # One build at a time (spawned workers import torch together); the others wait and use it.
    with open(target + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isfile(target):
            return None
        sys.stderr.write(
            "gpucollect: torch: building the trace tracker for torch %s (once per torch "
            "version) into %s\n" % (getattr(torch, "__version__", "unknown"), cache)
        )
        sys.stderr.flush()
        tmp = "%s.%d.tmp" % (target, os.getpid())
        flags = []
        if abi is not None:
            flags.append("-D_GLIBCXX_USE_CXX11_ABI=%d" % int(bool(abi)))
        for d in [include] + _cuda_include_dirs():
            flags += ["-I", d]
        libs = ["-L", lib_dir, "-Wl,-rpath," + lib_dir, "-lc10_cuda"]
        if os.path.isfile(os.path.join(lib_dir, "libc10.so")):
            libs.append("-lc10")
        libs.append("-ldl")
        # C++17 is what PyTorch 2.x's headers asked for, later releases C++20.
        errors = []
        for std in ("c++17", "c++20"):
            cmd = list(cxx) + ["-shared", "-fPIC", "-O2", "-std=" + std, "-fvisibility=hidden"]
            cmd += flags + [source, "-o", tmp] + libs
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            except subprocess.SubprocessError as e:
                return "the trace tracker's build failed: %s" % e
            if out.returncode == 0 and os.path.isfile(tmp):
                os.replace(tmp, target)
                return None
            if os.path.exists(tmp):
                os.unlink(tmp)
            lines = (out.stderr or out.stdout or "").splitlines()
            line = next((l for l in lines if "error" in l), lines[0] if lines else "").strip()
            if line not in [e[1] for e in errors]:
                errors.append((std, line))
    why = "the trace tracker's build failed (%s: %s)" % (
        cxx[0],
        "; ".join("-std=%s: %s" % e for e in errors) if len(errors) > 1 else errors[0][1],
    )
    if any("No such file" in e[1] and ("cuda" in e[1] or "crt/" in e[1]) for e in errors):
        why += (
            "; torch's headers include the CUDA runtime's: set CUDA_HOME to a CUDA toolkit, or "
            "pip install the wheels that carry them (CUDA 12: nvidia-cuda-runtime-cu12 and "
            "nvidia-cuda-nvcc-cu12; CUDA 13: nvidia-cuda-runtime and nvidia-cuda-crt)"
        )
    return why


class _Tracker:
    """The loaded shim: attach() hooks it into the caching allocator."""

    def __init__(self, path, injection):
        import ctypes

        self._ctypes = ctypes
        self._lib = ctypes.CDLL(path)
        self._attach = self._lib.gpucollect_torch_tracker_attach
        self._attach.restype = ctypes.c_int
        self._attach.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        self._injection = injection

    def attach(self):
        """None when attached, else why not."""
        c = self._ctypes
        error = c.create_string_buffer(512)
        rc = self._attach(self._injection.encode(), error, len(error))
        if rc == 1:
            return None
        return error.value.decode("utf-8", "replace") or "attach returned %d" % rc


def _torch_tracker(torch):
    """A loaded _Tracker, or None and why not."""
    injection = os.environ.get("CUDA_INJECTION64_PATH")
    if not injection:
        return None, "CUDA_INJECTION64_PATH is not set"
    path, why = _build_tracker(torch)
    if path is None:
        return None, why
    try:
        return _Tracker(path, injection), None
    except (OSError, AttributeError) as e:
        return None, "the trace tracker %s cannot be loaded: %s" % (path, e)


def _after_cuda_init(cuda, start):
    """Runs `start` once CUDA is initialised: now if it is, else right after torch's own
    torch.cuda._lazy_init (torch's C++ calls it by name before the first CUDA use)."""
    original = cuda._lazy_init

    def _lazy_init(*args, **kwargs):
        result = original(*args, **kwargs)
        try:
            start()
        except Exception as e:
            sys.stderr.write("gpucollect: torch: tensor capture failed to start: %s\n" % e)
        return result

    cuda._lazy_init = _lazy_init
    if getattr(cuda, "is_initialized", lambda: False)():
        start()


def _start_torch(torch):
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return "no tensor-level capture: this torch has no torch.cuda"
    if not hasattr(cuda, "_lazy_init"):
        return "no tensor-level capture: this torch has no torch.cuda._lazy_init"
    handover, why = _handover()
    if handover is None:
        return "no tensor-level capture: " + why
    tracker, no_tracker = _torch_tracker(torch)
    if tracker is not None:
        state = {"done": False}

        def attach():
            if state["done"]:
                return
            state["done"] = True
            why = tracker.attach()
            if why is not None:
                sys.stderr.write(
                    "gpucollect: torch: %s\n" % _start_fallback(torch, handover, "not attached: " + why)
                )

        _after_cuda_init(cuda, attach)
        return (
            "tensor-level capture through the caching allocator's trace tracker (C++, in the "
            "allocating thread), from CUDA initialisation on"
        )
    return _start_fallback(torch, handover, no_tracker)


def _start_fallback(torch, handover, no_tracker):
    """Starts the Python fallback; returns the line that says so, and why the trace tracker
    is not used."""
    cuda = torch.cuda
    why = "; no C++ trace tracker: " + no_tracker
    memory = getattr(cuda, "memory", None)
    if not all(hasattr(memory, f) for f in ("_record_memory_history", "_snapshot")):
        return (
            "no tensor-level capture: this torch has no torch.cuda.memory._record_memory_history "
            "(PyTorch 2.1 or later has it); only its CUDA reserve is traced" + why
        )
    interval_ms = os.environ.get("GPUCOLLECT_POOL_INTERVAL_MS", "50")
    interval_s = (int(interval_ms) if interval_ms.isdigit() and int(interval_ms) > 0 else 50) / 1e3
    max_entries = os.environ.get("GPUCOLLECT_TORCH_MAX_ENTRIES", "")
    max_entries = int(max_entries) if max_entries.isdigit() and int(max_entries) > 0 else _MAX_ENTRIES
    puller = _TorchPuller(torch, handover, interval_s, max_entries)
    # History records nothing for a device whose allocator is not initialised yet: switch it
    # on right after CUDA initialisation.
    _after_cuda_init(cuda, puller.start)
    return (
        "tensor-level capture through torch.cuda.memory history (Python fallback: pulled every "
        "%g ms, max_entries=%d), from CUDA initialisation on%s" % (interval_s * 1e3, max_entries, why)
    )


def _python_frames(frame, skip_dir):
    """(function, file, line) of `frame` and its callers, innermost first, from the first frame
    whose file is not under `skip_dir` (the framework's own Python code)."""
    while frame is not None and frame.f_code.co_filename.startswith(skip_dir):
        frame = frame.f_back
    out = []
    while frame is not None:
        code = frame.f_code
        out.append((code.co_name, code.co_filename, frame.f_lineno or 0))
        frame = frame.f_back
    return out


def _start_cupy(cupy):
    cuda = getattr(cupy, "cuda", None)
    base = getattr(cuda, "MemoryHook", None)
    if base is None:
        return "no pool-level capture: this cupy has no cupy.cuda.MemoryHook"
    handover, why = _handover()
    if handover is None:
        return "no pool-level capture: " + why
    cupy_dir = os.path.dirname(os.path.abspath(getattr(cupy, "__file__", "") or "")) + os.sep

    class GpucollectHook(base):
        """Hands the memory pool's blocks and frees to the injection library, with the
        allocating thread's Python stack (the hook runs in that thread)."""

        name = "gpucollect"

        def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
            frames = _python_frames(sys._getframe(1), cupy_dir) if handover.max_frames else []
            handover.alloc(device_id, mem_ptr, mem_size, 0, pmem_id, frames)

        def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
            handover.free(device_id, mem_ptr, 0, pmem_id)

    # CuPy's hooks are per thread (`with hook:` installs it for the current thread only).
    # This thread gets it now; every thread started later through threading gets it as its
    # first action: Thread.start is wrapped to give the instance a `run` that enters the hook
    # and then runs the thread's own `run` (an instance attribute, so subclasses that override
    # run are covered too). Public API only, and no cost per call or line, unlike a
    # threading.settrace/setprofile function. Threads that were already running, and threads
    # started with _thread.start_new_thread, are not covered.
    def install():
        hook = GpucollectHook()
        hook.__enter__()
        return hook

    install()
    original_start = threading.Thread.start

    def start(self, *args, **kwargs):
        run = self.run

        def run_with_hook():
            install()
            return run()

        self.run = run_with_hook
        return original_start(self, *args, **kwargs)

    threading.Thread.start = start
    return (
        "pool-level capture through a cupy.cuda.MemoryHook in this thread and every thread "
        "started after cupy's import"
    )
