//! Which frame of a stack is the user's own code. A finding names the first frame (innermost
//! first) that is not in a library: not the Python standard library, not an installed package
//! (`site-packages`, `dist-packages`), not a framework (torch, JAX, CuPy, Triton, NumPy, also
//! where a snapshot gives their paths relative to the package root), and not the CUDA, C++ or
//! Python runtimes (libcuda, libcudart, cuBLAS, cuDNN, NCCL, libc10, libtorch, libpython,
//! libstdc++, libc). The full stack stays in the report; only the label moves. Extra patterns
//! (`Config::hide_frames`, `gpucollect report --hide-frame`) skip more frames: a substring of the
//! function, file or module.

use alloc::string::String;
use serde::Serialize;

/// A symbolized frame, for display.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FrameView {
    pub function: String,
    pub file: String,
    pub line: u32,
    pub module: String,
    pub offset: u64,
    pub python: bool,
}

impl core::fmt::Display for FrameView {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let func = if self.function.is_empty() {
            "??"
        } else {
            &self.function
        };
        if !self.file.is_empty() {
            write!(f, "{func} ({}:{})", self.file, self.line)
        } else if !self.module.is_empty() {
            let m = self.module.rsplit('/').next().unwrap_or(&self.module);
            write!(f, "{func} ({m}+{:#x})", self.offset)
        } else {
            write!(f, "{func}")
        }
    }
}

/// Python packages whose frames are library code even when a path is relative to the package
/// root (`torch/optim/adam.py`).
const PY_PACKAGES: &[&str] = &[
    "torch",
    "torchvision",
    "torchaudio",
    "triton",
    "cupy",
    "cupyx",
    "cupy_backends",
    "jax",
    "jaxlib",
    "flax",
    "numpy",
    "pycuda",
];

/// Shared objects of the CUDA, framework and language runtimes, by the start of the file name.
const NATIVE_MODULES: &[&str] = &[
    "libcuda.",
    "libcudart",
    "libcublas",
    "libcudnn",
    "libnccl",
    "libcufft",
    "libcurand",
    "libcusparse",
    "libcusolver",
    "libnvrtc",
    "libnvJitLink",
    "libnvToolsExt",
    "libcupti",
    "libc10",
    "libtorch",
    "libcaffe2",
    "libpython",
    "python3",
    "libffi",
    "_ctypes",
    "libstdc++",
    "libc.so",
    "libc-",
    "ld-linux",
    "libgcc_s",
    "libpthread",
    "libgpucollect",
    "libxla",
    "libjax",
];

/// C++ namespaces of runtimes and header-only libraries whose frames are compiled into the
/// user's binary: the user's call of them is the line to show.
const NATIVE_NAMESPACES: &[&str] = &[
    "c10::",
    "at::",
    "torch::",
    "caffe2::",
    "std::",
    "__gnu_cxx::",
    "thrust::",
    "cub::",
    "cudart::",
];

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn python_library(file: &str) -> bool {
    if file.starts_with('<') {
        // <frozen importlib._bootstrap>, <string>
        return true;
    }
    if file.contains("/site-packages/")
        || file.contains("/dist-packages/")
        || file.contains("/lib/python3")
        || file.contains("/lib64/python3")
    {
        return true;
    }
    PY_PACKAGES.iter().any(|p| {
        file.strip_prefix(p).is_some_and(|r| r.starts_with('/'))
            || file.contains(alloc::format!("/{p}/").as_str())
    })
}

/// Whether `f` is library code, not the user's.
pub fn is_library_frame(f: &FrameView, extra: &[String]) -> bool {
    let matches = |p: &String| {
        !p.is_empty()
            && (f.function.contains(p.as_str())
                || f.file.contains(p.as_str())
                || f.module.contains(p.as_str()))
    };
    if extra.iter().any(matches) {
        return true;
    }
    if is_python_source(f) {
        return python_library(&f.file);
    }
    if !f.module.is_empty() {
        let name = file_name(&f.module);
        if NATIVE_MODULES.iter().any(|m| name.starts_with(m))
            || f.module.contains("/site-packages/")
            || f.module.contains("/dist-packages/")
        {
            return true;
        }
    }
    if NATIVE_NAMESPACES
        .iter()
        .any(|ns| f.function.starts_with(ns))
    {
        return true;
    }
    // Headers of the C++ runtime and the CUDA toolkit, where line tables point into them.
    f.file.starts_with("/usr/include/")
        || f.file.contains("/include/c++/")
        || f.file.contains("/cuda/include/")
        || f.file.contains("/targets/x86_64-linux/include/")
}

/// Indexes of every user frame of a stack, innermost first (the rules of [`user_frame_index`]).
pub fn user_frame_indexes(frames: &[FrameView], extra: &[String]) -> alloc::vec::Vec<usize> {
    let python = frames.iter().any(is_python_source);
    (0..frames.len())
        .filter(|&i| {
            (!python || is_python_source(&frames[i])) && !is_library_frame(&frames[i], extra)
        })
        .collect()
}

fn is_python_source(f: &FrameView) -> bool {
    f.file.ends_with(".py") || (f.python && f.file.starts_with('<'))
}

/// Index of the frame that names the call site: the first user frame (innermost first). In a
/// stack with Python source frames only those can be the user's (native frames between them
/// are the interpreter, the framework and its extensions, whatever their names; snapshots give
/// C++ frames as `??` files). Where every frame is library code, the innermost frame with a
/// file, else the innermost.
pub fn user_frame_index(frames: &[FrameView], extra: &[String]) -> Option<usize> {
    if frames.is_empty() {
        return None;
    }
    // A marker a reader put first (`<allocated before the snapshot's history began>`) names
    // the site: it says what the stack cannot.
    if frames[0].file.is_empty() && frames[0].function.starts_with('<') {
        return Some(0);
    }
    let python = frames.iter().any(is_python_source);
    frames
        .iter()
        .position(|f| (!python || is_python_source(f)) && !is_library_frame(f, extra))
        .or_else(|| {
            frames
                .iter()
                .position(|f| !f.file.is_empty() && f.file != "??")
        })
        .or(Some(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn py(function: &str, file: &str, line: u32) -> FrameView {
        FrameView {
            function: function.into(),
            file: file.into(),
            line,
            python: true,
            ..FrameView::default()
        }
    }

    fn native(function: &str, module: &str) -> FrameView {
        FrameView {
            function: function.into(),
            module: module.into(),
            ..FrameView::default()
        }
    }

    #[test]
    fn the_users_python_line_is_found_under_torch_and_the_standard_library() {
        let frames = vec![
            py("_init_group", "torch/optim/adam.py", 166),
            py(
                "step",
                "/venv/lib/python3.12/site-packages/torch/optim/adam.py",
                213,
            ),
            py("_call_impl", "/usr/lib/python3.12/threading.py", 10),
            py("train", "/home/me/proj/train.py", 57),
            py("<module>", "/home/me/proj/train.py", 80),
        ];
        assert_eq!(user_frame_index(&frames, &[]), Some(3));
        // A project folder that merely contains "torch" in a longer name is the user's.
        let mine = vec![py("f", "/home/me/torchy/run.py", 3)];
        assert_eq!(user_frame_index(&mine, &[]), Some(0));
        // Extra patterns skip more.
        assert_eq!(
            user_frame_index(&frames, &[String::from("train.py")]),
            Some(0),
            "all library: the innermost frame with a file"
        );
    }

    #[test]
    fn in_a_python_stack_native_frames_are_never_the_users() {
        // As a snapshot gives them: every frame a (function, file, line), C++ ones with `??`.
        let frames = vec![
            py("torch::unwind::unwind()", "??", 0),
            py("my_extension_kernel", "??", 0),
            py("cfunction_call", "??", 0),
            py(
                "forward",
                "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py",
                125,
            ),
            py("forward", "/home/me/model.py", 33),
        ];
        assert_eq!(user_frame_index(&frames, &[]), Some(4));
    }

    #[test]
    fn native_runtimes_and_cxx_namespaces_are_skipped() {
        let frames = vec![
            native("cudaMalloc", "/usr/local/cuda/lib64/libcudart.so.12"),
            native(
                "c10::cuda::CUDACachingAllocator::malloc",
                "/x/libc10_cuda.so",
            ),
            native("std::vector<float>::reserve", "/home/me/app"),
            native("Solver::run", "/home/me/app"),
        ];
        assert_eq!(user_frame_index(&frames, &[]), Some(3));
        assert_eq!(user_frame_index(&[], &[]), None);
    }
}
