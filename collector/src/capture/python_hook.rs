//! Framework capture in an unmodified Python program: gpucollect writes its own
//! `sitecustomize.py` (and the capture module it loads) into a private directory made for this
//! run and puts that directory first on the program's `PYTHONPATH`. Children inherit the
//! environment, so Python processes the program starts (multiprocessing spawn and forkserver,
//! subprocess, launcher workers) load it too. The directory is removed when the run ends.
//!
//! The files are part of the binary (`include_str!`), so gpucollect stays a single file and the
//! code the program runs is the code this gpucollect was built with.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The files written into the directory: (name, contents). The C++ source is the PyTorch trace
/// tracker shim, which `gpucollect_frameworks.py` compiles in the traced program when it can.
const FILES: [(&str, &str); 3] = [
    ("sitecustomize.py", include_str!("python/sitecustomize.py")),
    (
        "gpucollect_frameworks.py",
        include_str!("python/gpucollect_frameworks.py"),
    ),
    (
        "gpucollect_torch_tracker.cpp",
        include_str!("python/gpucollect_torch_tracker.cpp"),
    ),
];

/// The private directory holding gpucollect's Python files for one run; removed on drop.
#[derive(Debug)]
pub struct PythonHookDir {
    path: PathBuf,
}

impl PythonHookDir {
    /// Creates a new directory (mode 0700, a name no other process holds) under `parent` and
    /// writes the files into it.
    pub fn create(parent: &Path) -> Result<Self> {
        let pid = std::process::id();
        let mut attempt = 0u32;
        let path = loop {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let candidate = parent.join(format!("gpucollect-py-{pid}-{nanos:08x}{attempt}"));
            match std::fs::DirBuilder::new().mode(0o700).create(&candidate) {
                Ok(()) => break candidate,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                    attempt += 1;
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!(
                            "cannot create a private directory for gpucollect's Python hook in \
                             {} (set TMPDIR to a writable directory, or pass --no-framework)",
                            parent.display()
                        )
                    });
                }
            }
        };
        let dir = Self { path };
        for (name, text) in FILES {
            let file = dir.path.join(name);
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&file)
                .and_then(|mut f| f.write_all(text.as_bytes()))
                .with_context(|| format!("cannot write {}", file.display()))?;
        }
        Ok(dir)
    }

    /// `PYTHONPATH` for the program: this directory first, then the one it would have had
    /// (an empty or unset one adds nothing: an empty entry would put the working directory on
    /// the path).
    pub fn pythonpath(&self, existing: Option<OsString>) -> OsString {
        let mut v = self.path.as_os_str().to_os_string();
        if let Some(old) = existing.filter(|o| !o.is_empty()) {
            v.push(":");
            v.push(old);
        }
        v
    }
}

impl Drop for PythonHookDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!(
                "gpucollect: cannot remove {} ({e}); delete it by hand",
                self.path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_is_private_holds_the_files_and_goes_away() {
        let parent = std::env::temp_dir();
        let dir = PythonHookDir::create(&parent).expect("create");
        let path = dir.path.clone();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        for (name, text) in FILES {
            assert_eq!(
                std::fs::read_to_string(path.join(name)).expect("read"),
                text
            );
        }
        let other = PythonHookDir::create(&parent).expect("a second run");
        assert_ne!(other.path, path);
        drop(dir);
        assert!(!path.exists());
    }

    #[test]
    fn pythonpath_puts_the_directory_first_and_adds_no_empty_entry() {
        let dir = PythonHookDir::create(&std::env::temp_dir()).expect("create");
        let p = dir.path.display().to_string();
        assert_eq!(dir.pythonpath(None), OsString::from(&p));
        assert_eq!(dir.pythonpath(Some("".into())), OsString::from(&p));
        assert_eq!(
            dir.pythonpath(Some("/a:/b".into())),
            OsString::from(format!("{p}:/a:/b"))
        );
    }
}
