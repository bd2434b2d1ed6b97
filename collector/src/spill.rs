//! The replay model's history on disk. A model keeps its allocation history and timelines in
//! chunks of packed bytes (`analysis_core::packed`); past a resident budget, each full chunk is
//! written to an unnamed temporary file and read back through a small cache, so the memory
//! `report`, `check`, `diff` and `view` take for a long trace (and the server, for a summary
//! too big for its budget in memory) stays near what is live rather than growing with the
//! history.
//!
//! The file is made with the first chunk past the budget, in [`spill_dir`], with no name: it is
//! gone when the model is dropped or the process ends, whatever way it ends. Where it cannot be
//! made or written (a full or read-only disk), chunks stay in memory, as they would without a
//! spill. Reads are of bytes this process wrote; one that fails ends the
//! process with a message, since the model cannot go on without its history.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, OnceLock};

use analysis_core::packed::{CHUNK_BYTES, Spill};

/// History kept in memory before chunks go to disk: a trace of a few million events never
/// touches the disk.
pub const RESIDENT_BYTES: u64 = 128 << 20;

/// Chunks handed to the writer thread at once (256 KiB): one wake-up of the writer per batch
/// rather than per chunk (at 300M events, waking it for each of 150,000 chunks took 3 % of the
/// replaying thread's time).
const BATCH_CHUNKS: usize = 8;

/// Batches queued for the writer thread before `put` waits for it.
const QUEUED_BATCHES: usize = 2;

/// The most the writer's queue holds: the batches queued, the one being written and the one
/// being filled (the server counts it for a summary).
#[cfg(feature = "serve")]
pub const QUEUE_BYTES: u64 = ((QUEUED_BATCHES + 2) * BATCH_CHUNKS * CHUNK_BYTES) as u64;

/// Chunks by the handle (offset) each will have in the file.
type Batch = Vec<(u64, Arc<[u8]>)>;

/// The writer's queue and the batch being filled for it.
#[derive(Debug)]
struct Queue {
    tx: SyncSender<Batch>,
    filling: Batch,
}

/// Full chunks of a model's packed history past `resident` bytes, in a temporary file.
///
/// A thread of its own writes them, so the replay goes on while the kernel copies a chunk into
/// the file (a third of `report`'s load time at 300M events, done on the same thread before).
/// A chunk is read from the queue until it is on disk.
#[derive(Debug)]
pub struct FileSpill {
    /// Tells this spill's chunks apart in the threads' caches.
    id: u64,
    resident: u64,
    offered: AtomicU64,
    dir: PathBuf,
    file: OnceLock<Arc<SpillFile>>,
    /// The file could not be made or written, or the spill is dropped: chunks stay in memory
    /// from then on, and the writer writes no more.
    failed: Arc<AtomicBool>,
    written: AtomicU64,
    /// The writer's queue, made with the file (puts come from the thread replaying the trace).
    queue: Mutex<Option<Queue>>,
}

/// The file and the chunks handed to its writer that are not in it yet.
#[derive(Debug)]
struct SpillFile {
    file: File,
    /// By handle: removed once written, so a reader that does not find a chunk here finds it
    /// in the file. One whose write failed stays here, in memory, for good.
    queued: Mutex<HashMap<u64, Arc<[u8]>>>,
    /// Every chunk below this offset is in the file: the writer writes them in the order they
    /// were queued, and a read below it takes no lock (the analysis' two threads reading
    /// chunks back had contended for `queued`'s, most of a report's futex calls).
    written: AtomicU64,
}

impl FileSpill {
    /// A spill that keeps the first `resident` bytes offered in memory and writes the rest to
    /// a file in `dir`.
    pub fn new(resident: u64, dir: PathBuf) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            resident,
            offered: AtomicU64::new(0),
            dir,
            file: OnceLock::new(),
            failed: Arc::new(AtomicBool::new(false)),
            written: AtomicU64::new(0),
            queue: Mutex::new(None),
        }
    }

    /// [`Self::new`] with [`RESIDENT_BYTES`], in [`spill_dir`].
    pub fn in_temp_dir() -> Arc<Self> {
        Arc::new(Self::new(RESIDENT_BYTES, spill_dir()))
    }

    /// Makes the file and starts its writer: the queue to it, or `None` where either fails.
    fn open(&self) -> Option<Queue> {
        let file = Arc::new(SpillFile {
            file: tempfile::tempfile_in(&self.dir).ok()?,
            queued: Mutex::new(HashMap::new()),
            written: AtomicU64::new(0),
        });
        let (tx, rx) = std::sync::mpsc::sync_channel::<Batch>(QUEUED_BATCHES);
        let (to, failed) = (Arc::clone(&file), Arc::clone(&self.failed));
        std::thread::Builder::new()
            .name("gpucollect-spill".into())
            .spawn(move || {
                for (at, chunk) in rx.into_iter().flatten() {
                    if failed.load(Ordering::Relaxed) {
                        continue;
                    }
                    match to.file.write_all_at(&chunk, at) {
                        Ok(()) => {
                            lock(&to.queued).remove(&at);
                            to.written.store(at + chunk.len() as u64, Ordering::Release);
                        }
                        Err(_) => failed.store(true, Ordering::Relaxed),
                    }
                }
            })
            .ok()?;
        let _ = self.file.set(file);
        Some(Queue {
            tx,
            filling: Vec::with_capacity(BATCH_CHUNKS),
        })
    }

    /// Reads the chunk at `handle` into `buf`; a failure ends the process (the module's
    /// comment says why).
    fn load(&self, handle: u64, buf: &mut [u8]) {
        let read = match self.file.get() {
            Some(f) if handle + buf.len() as u64 <= f.written.load(Ordering::Acquire) => {
                f.file.read_exact_at(buf, handle)
            }
            Some(f) => match lock(&f.queued).get(&handle) {
                Some(queued) => {
                    buf.copy_from_slice(queued);
                    Ok(())
                }
                None => f.file.read_exact_at(buf, handle),
            },
            None => Err(std::io::Error::other("no file was made")),
        };
        if let Err(e) = read {
            eprintln!(
                "gpucollect: reading back the trace's history from its temporary file in {} \
                 failed ({e}); check that disk, or set TMPDIR to another directory",
                self.dir.display()
            );
            std::process::exit(1);
        }
    }
}

impl Drop for FileSpill {
    /// The writer drops what is still queued rather than write it.
    fn drop(&mut self) {
        self.failed.store(true, Ordering::Relaxed);
    }
}

/// A lock whose holder cannot leave its data half-changed (each holds it for one map call).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where the history goes: `TMPDIR` when it is set; otherwise `/tmp`, unless `/tmp` is a RAM
/// disk (tmpfs, the default of several distributions), where the file would take memory after
/// all, and `/var/tmp` (meant for large temporary files) is not: then `/var/tmp`.
pub fn spill_dir() -> PathBuf {
    if std::env::var_os("TMPDIR").is_some_and(|d| !d.is_empty()) {
        return std::env::temp_dir();
    }
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let in_ram = |dir: &str| {
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| PathBuf::from(dir));
        matches!(fs_type(&mounts, &dir), Some("tmpfs" | "ramfs"))
    };
    let var_tmp = Path::new("/var/tmp");
    if in_ram("/tmp") && var_tmp.is_dir() && !in_ram("/var/tmp") {
        return var_tmp.to_path_buf();
    }
    std::env::temp_dir()
}

/// The type of the filesystem `path` (absolute, without symbolic links) lies on, from the
/// text of `/proc/self/mounts`: that of the longest mount point above it, the last mounted
/// where several share one.
fn fs_type<'a>(mounts: &'a str, path: &Path) -> Option<&'a str> {
    let mut best: Option<(usize, &str)> = None;
    for line in mounts.lines() {
        let mut f = line.split_whitespace();
        let (Some(_), Some(point), Some(kind)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        // Spaces and the like in mount points are written as octal escapes.
        let point = point.replace("\\040", " ");
        let len = Path::new(&point).components().count();
        if path.starts_with(&point) && best.is_none_or(|(l, _)| len >= l) {
            best = Some((len, kind));
        }
    }
    best.map(|(_, kind)| kind)
}

impl Spill for FileSpill {
    fn put(&self, chunk: &[u8]) -> Option<u64> {
        let before = self
            .offered
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        if before < self.resident || self.failed.load(Ordering::Relaxed) {
            return None;
        }
        let mut queue = lock(&self.queue);
        if queue.is_none() {
            *queue = self.open();
            if queue.is_none() {
                self.failed.store(true, Ordering::Relaxed);
                return None;
            }
        }
        let (Some(q), Some(file)) = (queue.as_mut(), self.file.get()) else {
            return None;
        };
        let (at, len) = (self.written.load(Ordering::Relaxed), chunk.len() as u64);
        let chunk: Arc<[u8]> = Arc::from(chunk);
        lock(&file.queued).insert(at, Arc::clone(&chunk));
        q.filling.push((at, chunk));
        // A batch still filling (the last of a history) is read from the queue's map, as is
        // one whose writer is gone.
        if q.filling.len() == BATCH_CHUNKS {
            let batch = std::mem::replace(&mut q.filling, Vec::with_capacity(BATCH_CHUNKS));
            if q.tx.send(batch).is_err() {
                self.failed.store(true, Ordering::Relaxed);
            }
        }
        self.written.store(at + len, Ordering::Relaxed);
        Some(at)
    }

    fn read(&self, handle: u64, at: usize, len: usize, f: &mut dyn FnMut(&[u8])) {
        let mut f = Some(f);
        // Without the cache (a read from inside another's callback, or from a thread whose
        // cache is gone at its exit), `f` is left for a read straight from the file.
        let _ = CACHE.try_with(|c| {
            if let Ok(mut c) = c.try_borrow_mut()
                && let Some(f) = f.take()
            {
                f(&c.chunk(self, handle)[at..at + len]);
            }
        });
        if let Some(f) = f {
            let mut buf = vec![0u8; CHUNK_BYTES];
            self.load(handle, &mut buf);
            f(&buf[at..at + len]);
        }
    }

    fn held_bytes(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }
}

/// Sets of the chunk cache, each of [`WAYS`] chunks.
const SETS: usize = 64;
const WAYS: usize = 4;

/// The most a thread's cache of chunks read back holds (the server counts it for a summary).
#[cfg(feature = "serve")]
pub const CACHE_BYTES_PER_THREAD: u64 = (SETS * WAYS * CHUNK_BYTES) as u64;

thread_local! {
    /// Chunks read back, per thread, so reads take no lock: a pass over the history reads each
    /// column's chunks in order, so a few per column in use are enough. At most
    /// `SETS * WAYS` chunks (8 MiB), allocated as they are first needed.
    static CACHE: RefCell<ChunkCache> = RefCell::new(ChunkCache::default());
}

#[derive(Default)]
struct ChunkCache {
    /// (spill id, handle, last use, bytes) per way; empty ways have no bytes.
    ways: Vec<(u64, u64, u64, Box<[u8]>)>,
    tick: u64,
    /// The way read last: a pass reads a chunk many times in a row.
    last: usize,
}

impl ChunkCache {
    /// The chunk `handle` of `spill`, read from its file unless cached.
    fn chunk(&mut self, spill: &FileSpill, handle: u64) -> &[u8] {
        if let Some(w) = self.ways.get(self.last)
            && w.0 == spill.id
            && w.1 == handle
            && !w.3.is_empty()
        {
            return &self.ways[self.last].3;
        }
        if self.ways.is_empty() {
            self.ways
                .resize_with(SETS * WAYS, || (0, 0, 0, Box::default()));
        }
        self.tick += 1;
        let index = (handle / CHUNK_BYTES as u64) ^ spill.id.wrapping_mul(0x9e37_79b9);
        let set = (index as usize % SETS) * WAYS;
        let ways = &mut self.ways[set..set + WAYS];
        let hit = ways
            .iter()
            .position(|w| w.0 == spill.id && w.1 == handle && !w.3.is_empty());
        let k = match hit {
            Some(k) => k,
            None => {
                let k = (0..WAYS).min_by_key(|&k| ways[k].2).unwrap_or(0);
                let w = &mut ways[k];
                if w.3.is_empty() {
                    w.3 = vec![0u8; CHUNK_BYTES].into_boxed_slice();
                }
                // Marked empty until it holds the chunk.
                w.1 = u64::MAX;
                spill.load(handle, &mut w.3);
                (w.0, w.1) = (spill.id, handle);
                k
            }
        };
        ways[k].2 = self.tick;
        self.last = set + k;
        &self.ways[set + k].3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(seed: u8) -> Vec<u8> {
        (0..CHUNK_BYTES)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn chunks_past_the_budget_go_to_the_file_and_read_back() {
        let s = FileSpill::new(2 * CHUNK_BYTES as u64, std::env::temp_dir());
        assert_eq!(s.put(&chunk(0)), None);
        assert_eq!(s.put(&chunk(1)), None);
        let handles: Vec<u64> = (2..=255u8)
            .map(|k| s.put(&chunk(k)).expect("past the budget, spilled"))
            .collect();
        assert_eq!(s.held_bytes(), (handles.len() * CHUNK_BYTES) as u64);
        // More chunks than the cache holds, read twice over in two orders.
        for round in 0..2 {
            for k in 0..handles.len() {
                let j = if round == 0 { k } else { handles.len() - 1 - k };
                let want = chunk(j as u8 + 2);
                let at = (j * 997) % (CHUNK_BYTES - 100);
                let mut got = Vec::new();
                s.read(handles[j], at, 100, &mut |b| got.extend_from_slice(b));
                assert_eq!(&got[..], &want[at..at + 100], "chunk {j}");
            }
        }
    }

    /// Read back at once, a chunk is still in the writer's queue (or being written): the read
    /// takes it from there, or from the file once it is written, never a half-written one.
    #[test]
    fn a_chunk_reads_back_before_and_after_its_write() {
        let s = FileSpill::new(0, std::env::temp_dir());
        let mut handles = Vec::new();
        for k in 0..=255u8 {
            let h = s.put(&chunk(k)).expect("spilled");
            handles.push(h);
            let mut got = Vec::new();
            s.read(h, 0, CHUNK_BYTES, &mut |b| got.extend_from_slice(b));
            assert!(got == chunk(k), "chunk {k} read at once");
        }
        // Cold (past the cache) and read straight from the file, nested in another read.
        for (k, &h) in handles.iter().enumerate() {
            let mut got = Vec::new();
            s.read(handles[0], 0, 1, &mut |_| {
                s.read(h, 7, 100, &mut |b| got.extend_from_slice(b));
            });
            assert_eq!(got[..], chunk(k as u8)[7..107], "chunk {k} read later");
        }
    }

    /// Chunks go to the writer a batch at a time: once written, only the batch still filling
    /// is held in memory.
    #[test]
    fn written_batches_leave_memory_and_only_the_filling_one_stays() {
        let s = FileSpill::new(0, std::env::temp_dir());
        let n = 5 * BATCH_CHUNKS + 3;
        let handles: Vec<u64> = (0..n)
            .map(|k| s.put(&chunk(k as u8)).expect("spilled"))
            .collect();
        let file = s.file.get().expect("a file");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while lock(&file.queued).len() > 3 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let mut left: Vec<u64> = lock(&file.queued).keys().copied().collect();
        left.sort_unstable();
        assert_eq!(left, handles[n - 3..], "the batch still filling");
        for (k, &h) in handles.iter().enumerate() {
            let mut buf = vec![0u8; CHUNK_BYTES];
            s.load(h, &mut buf);
            assert!(buf == chunk(k as u8), "chunk {k}");
        }
    }

    #[test]
    fn the_filesystem_of_a_path_is_that_of_its_deepest_mount() {
        let mounts = "/dev/vda / ext4 rw 0 0\n\
                      tmpfs /tmp tmpfs rw 0 0\n\
                      /dev/vdb /var ext4 rw 0 0\n\
                      tmpfs /var/tmp tmpfs rw 0 0\n\
                      /dev/vdc /var/tmp xfs rw 0 0\n\
                      /dev/vdd /mnt/my\\040disk xfs rw 0 0\n\
                      garbage\n";
        let of = |p: &str| fs_type(mounts, Path::new(p));
        assert_eq!(of("/tmp"), Some("tmpfs"));
        assert_eq!(of("/tmp/x/y"), Some("tmpfs"));
        assert_eq!(of("/tmpfoo"), Some("ext4"));
        assert_eq!(of("/var/log"), Some("ext4"));
        assert_eq!(
            of("/var/tmp/a"),
            Some("xfs"),
            "the last mounted over the same point"
        );
        assert_eq!(of("/mnt/my disk/t"), Some("xfs"));
        assert_eq!(of("/home"), Some("ext4"));
        assert_eq!(fs_type("", Path::new("/tmp")), None);
    }

    #[test]
    fn a_read_inside_another_reads_the_file() {
        let s = FileSpill::new(0, std::env::temp_dir());
        let (a, b) = (s.put(&chunk(1)).expect("a"), s.put(&chunk(2)).expect("b"));
        let mut got = Vec::new();
        s.read(a, 10, 4, &mut |outer| {
            s.read(b, 20, 4, &mut |inner| got.extend_from_slice(inner));
            got.extend_from_slice(outer);
        });
        let (x, y) = (chunk(1), chunk(2));
        assert_eq!(got, [&y[20..24], &x[10..14]].concat());
    }

    #[test]
    fn a_directory_that_cannot_hold_the_file_keeps_chunks_in_memory() {
        let s = FileSpill::new(0, PathBuf::from("/nonexistent/gpucollect-spill"));
        assert_eq!(s.put(&chunk(0)), None);
        assert_eq!(s.put(&chunk(1)), None);
        assert_eq!(s.held_bytes(), 0);
    }
}
