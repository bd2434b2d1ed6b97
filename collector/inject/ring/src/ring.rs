//! The shared-memory event ring: one memfd created by the collector, holding a header and
//! [`SLOTS`] per-process slots. Each slot is a bounded multi-producer, single-consumer queue of
//! fixed-size cells (a sequence-numbered ring: a producer claims a position with a CAS, writes its
//! cell, then publishes it by storing the cell's sequence number with release ordering).
//!
//! Per-process slots keep a `fork` harmless: the child inherits the mapping, forgets its parent's
//! slot (`pthread_atfork`) and claims its own on its first event. The memory starts zeroed, so
//! sequence numbers are stored relative to the cell index (`stored = seq - index`): no page is
//! touched until it is used.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::event::Event;

pub const MAGIC: u64 = 0x3176_6e69_7270_6367; // "gcprinv1"
/// Process slots per ring; a process beyond this count runs untraced (and is counted).
pub const SLOTS: usize = 64;
/// Cells per slot.
pub const CELLS: u64 = 65536;

const HEADER_BYTES: usize = 4096;
const SLOT_HEADER_BYTES: usize = 256;
const CELL_BYTES: usize = core::mem::size_of::<Cell>();
const SLOT_BYTES: usize = (SLOT_HEADER_BYTES + CELLS as usize * CELL_BYTES).next_multiple_of(4096);
/// Total size of the shared mapping (sparse: untouched pages cost nothing).
pub const RING_BYTES: usize = HEADER_BYTES + SLOTS * SLOT_BYTES;

#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("cannot create the shared-memory ring ({0}); is /dev/shm or memfd available?")]
    Create(std::io::Error),
    #[error("cannot map the shared-memory ring ({0})")]
    Map(std::io::Error),
    #[error("cannot open the shared-memory ring ({0}) at {1}")]
    Open(std::io::Error, String),
    #[error("{0} is not a gpucollect ring (bad magic or size)")]
    Invalid(String),
}

#[repr(C)]
struct RingHeader {
    magic: u64,
    slots: u32,
    collector_pid: u32,
    cells: u64,
    /// Events lost because no slot was free.
    unslotted_dropped: AtomicU64,
}

#[repr(C)]
struct SlotHeader {
    /// 0 free, 1 claimed.
    state: AtomicU32,
    pid: AtomicU32,
    ppid: AtomicU32,
    _pad0: u32,
    dropped: AtomicU64,
    /// Pushes that found the ring full and waited for the collector (the program was slowed).
    waited: AtomicU64,
    _pad1: [u64; 4],
    enqueue: AtomicU64,
    _pad2: [u64; 7],
    dequeue: AtomicU64,
    _pad3: [u64; 7],
}

#[repr(C)]
struct Cell {
    seq: AtomicU64,
    event: Event,
}

const _: () = assert!(core::mem::size_of::<SlotHeader>() <= SLOT_HEADER_BYTES);
const _: () = assert!(core::mem::size_of::<RingHeader>() <= HEADER_BYTES);

/// A mapping of the ring. Cheap to share between threads: all access goes through atomics and
/// the cell-ownership protocol.
#[derive(Debug)]
pub struct Ring {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is shared memory used only through atomics and the cell protocol; the
// pointer itself stays valid until Drop.
unsafe impl Send for Ring {}
// SAFETY: as above.
unsafe impl Sync for Ring {}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: base/len come from a successful mmap and nothing refers to it after drop.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

fn map_fd(fd: i32) -> Result<Ring, std::io::Error> {
    // SAFETY: mapping a file descriptor we own with valid arguments; the result is checked.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            RING_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Ring {
        base: p.cast(),
        len: RING_BYTES,
    })
}

impl Ring {
    fn header(&self) -> &RingHeader {
        // SAFETY: the mapping is at least HEADER_BYTES long and suitably aligned (page).
        unsafe { &*self.base.cast::<RingHeader>() }
    }

    fn slot(&self, slot: usize) -> &SlotHeader {
        debug_assert!(slot < SLOTS);
        // SAFETY: slot < SLOTS, so the slot header lies inside the mapping, page aligned.
        unsafe {
            &*self
                .base
                .add(HEADER_BYTES + slot * SLOT_BYTES)
                .cast::<SlotHeader>()
        }
    }

    fn cell(&self, slot: usize, index: u64) -> *mut Cell {
        // SAFETY: index < CELLS and slot < SLOTS keep the cell inside the mapping; cells are
        // 8-byte aligned (CELL_BYTES is a multiple of 8, slot bases are page aligned).
        unsafe {
            self.base
                .add(
                    HEADER_BYTES
                        + slot * SLOT_BYTES
                        + SLOT_HEADER_BYTES
                        + index as usize * CELL_BYTES,
                )
                .cast::<Cell>()
        }
    }

    /// Opens the ring the collector created, by path (producer side). Not for callbacks: it
    /// allocates for the path.
    pub fn open(path: &str) -> Result<Self, RingError> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| RingError::Open(e, path.into()))?;
        let len = f
            .metadata()
            .map_err(|e| RingError::Open(e, path.into()))?
            .len();
        if len != RING_BYTES as u64 {
            return Err(RingError::Invalid(path.into()));
        }
        let ring = map_fd(f.as_raw_fd()).map_err(RingError::Map)?;
        if ring.header().magic != MAGIC || ring.header().cells != CELLS {
            return Err(RingError::Invalid(path.into()));
        }
        Ok(ring)
    }

    /// Pid of the collector that owns the ring.
    pub fn collector_pid(&self) -> u32 {
        self.header().collector_pid
    }

    /// Claims a free slot for process `pid` (callback-safe: atomics only). `None` when all are
    /// taken.
    pub fn claim(&self, pid: u32, ppid: u32) -> Option<usize> {
        for i in 0..SLOTS {
            let s = self.slot(i);
            if s.state
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                s.ppid.store(ppid, Ordering::Relaxed);
                // The pid is stored last: the collector treats a slot as claimed once it is set.
                s.pid.store(pid, Ordering::Release);
                return Some(i);
            }
        }
        None
    }

    /// Counts an event lost because no slot could be claimed.
    pub fn count_unslotted(&self) {
        self.header()
            .unslotted_dropped
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Pushes one event into `slot` (callback-safe: no allocation, no locks). `fill` writes the
    /// event in place. When the ring is full it waits until `wait_ok()` says to stop, then drops
    /// the event and counts it. Returns whether the event was written.
    #[inline]
    pub fn push(
        &self,
        slot: usize,
        mut wait_ok: impl FnMut(u32) -> bool,
        fill: impl FnOnce(&mut Event),
    ) -> bool {
        let s = self.slot(slot);
        let mut spins: u32 = 0;
        let pos = loop {
            let pos = s.enqueue.load(Ordering::Relaxed);
            let index = pos % CELLS;
            let cell = self.cell(slot, index);
            // SAFETY: cell points into the mapping; seq is an atomic, valid for shared access.
            let stored = unsafe { (*cell).seq.load(Ordering::Acquire) };
            let diff = stored.wrapping_sub(pos - index) as i64;
            if diff == 0 {
                if s.enqueue
                    .compare_exchange_weak(pos, pos + 1, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                {
                    break pos;
                }
            } else if diff < 0 {
                // Full: the consumer has not released this cell yet.
                if spins == 0 {
                    s.waited.fetch_add(1, Ordering::Relaxed);
                }
                spins += 1;
                if !wait_ok(spins) {
                    s.dropped.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            }
            core::hint::spin_loop();
        };
        let index = pos % CELLS;
        let cell = self.cell(slot, index);
        // SAFETY: winning the CAS gives this thread exclusive ownership of the cell's event
        // until it publishes the sequence number below.
        unsafe {
            fill(&mut (*cell).event);
            (*cell).seq.store(pos + 1 - index, Ordering::Release);
        }
        true
    }
}

/// The collector's side: creates the ring and drains it.
#[derive(Debug)]
pub struct RingOwner {
    ring: Ring,
    fd: OwnedFd,
}

/// A claimed slot as the collector sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotInfo {
    pub slot: usize,
    pub pid: u32,
    pub ppid: u32,
}

impl RingOwner {
    /// Creates a zeroed ring in a memfd.
    pub fn create() -> Result<Self, RingError> {
        // SAFETY: the name is a valid NUL-terminated string; the result is checked.
        let fd = unsafe { libc::memfd_create(c"gpucollect-ring".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(RingError::Create(std::io::Error::last_os_error()));
        }
        // SAFETY: fd was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: fd is a valid memfd; the result is checked.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), RING_BYTES as libc::off_t) } != 0 {
            return Err(RingError::Create(std::io::Error::last_os_error()));
        }
        let ring = map_fd(fd.as_raw_fd()).map_err(RingError::Map)?;
        // SAFETY: the header lies at the start of the fresh mapping; nobody else has it yet.
        unsafe {
            let h = ring.base.cast::<RingHeader>();
            (*h).slots = SLOTS as u32;
            (*h).cells = CELLS;
            (*h).collector_pid = std::process::id();
            (*h).magic = MAGIC;
        }
        Ok(Self { ring, fd })
    }

    /// The path a traced process opens: `/proc/<pid>/fd/<fd>`, valid while the collector lives.
    pub fn path(&self) -> String {
        format!("/proc/{}/fd/{}", std::process::id(), self.fd.as_raw_fd())
    }

    /// The ring, for producing from this process (benchmarks and tests).
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Slot `slot` if a process has claimed it.
    pub fn slot_info(&self, slot: usize) -> Option<SlotInfo> {
        let s = self.ring.slot(slot);
        let pid = s.pid.load(Ordering::Acquire);
        (pid != 0).then(|| SlotInfo {
            slot,
            pid,
            ppid: s.ppid.load(Ordering::Relaxed),
        })
    }

    /// Events the producers of `slot` dropped so far.
    pub fn dropped(&self, slot: usize) -> u64 {
        self.ring.slot(slot).dropped.load(Ordering::Relaxed)
    }

    /// Pushes by the producers of `slot` that found the ring full and waited for room.
    pub fn waited(&self, slot: usize) -> u64 {
        self.ring.slot(slot).waited.load(Ordering::Relaxed)
    }

    /// Events lost because every slot was taken.
    pub fn unslotted_dropped(&self) -> u64 {
        self.ring.header().unslotted_dropped.load(Ordering::Relaxed)
    }

    /// Takes the next published event of `slot` into `out`. Returns false when none is ready.
    pub fn pop(&self, slot: usize, out: &mut Event) -> bool {
        let s = self.ring.slot(slot);
        let pos = s.dequeue.load(Ordering::Relaxed);
        let index = pos % CELLS;
        let cell = self.ring.cell(slot, index);
        // SAFETY: cell is inside the mapping; seq is atomic.
        let stored = unsafe { (*cell).seq.load(Ordering::Acquire) };
        if stored != pos + 1 - index {
            return false;
        }
        // SAFETY: the acquire load saw the producer's release: the event is complete and the
        // producer no longer touches it until we release the cell below. Only the used bytes
        // are copied; the rest of `out` keeps older contents that `used_bytes` excludes.
        unsafe {
            let src = &raw const (*cell).event;
            let used = (*src).used_bytes().min(core::mem::size_of::<Event>());
            core::ptr::copy_nonoverlapping(
                src.cast::<u8>(),
                (out as *mut Event).cast::<u8>(),
                used,
            );
            (*cell).seq.store(pos + CELLS - index, Ordering::Release);
        }
        s.dequeue.store(pos + 1, Ordering::Release);
        true
    }

    /// Makes the slot of a dead, fully drained process claimable again (long runs that start
    /// more than [`SLOTS`] traced processes). Only for a slot whose producer can no longer write.
    pub fn recycle(&self, slot: usize) {
        let s = self.ring.slot(slot);
        let end = s.enqueue.load(Ordering::Acquire).min(CELLS);
        for index in 0..end {
            // SAFETY: cell inside the mapping; its producer is gone and the consumer is us.
            unsafe {
                (*self.ring.cell(slot, index))
                    .seq
                    .store(0, Ordering::Relaxed)
            };
        }
        s.enqueue.store(0, Ordering::Relaxed);
        s.dequeue.store(0, Ordering::Relaxed);
        s.dropped.store(0, Ordering::Relaxed);
        s.waited.store(0, Ordering::Relaxed);
        s.ppid.store(0, Ordering::Relaxed);
        s.pid.store(0, Ordering::Relaxed);
        s.state.store(0, Ordering::Release);
    }

    /// For a slot whose process is dead: skips cells that were claimed but never published
    /// (the process died mid-write) so the published ones behind them can be read. Returns the
    /// number of cells skipped (lost events).
    pub fn skip_unpublished(&self, slot: usize) -> u64 {
        let s = self.ring.slot(slot);
        let end = s.enqueue.load(Ordering::Acquire);
        let pos = s.dequeue.load(Ordering::Relaxed);
        if pos >= end {
            return 0;
        }
        let index = pos % CELLS;
        let cell = self.ring.cell(slot, index);
        // SAFETY: cell is inside the mapping; seq is atomic.
        let stored = unsafe { (*cell).seq.load(Ordering::Acquire) };
        if stored == pos + 1 - index {
            return 0;
        }
        // SAFETY: as above; the producer is dead, so nobody else writes this cell.
        unsafe { (*cell).seq.store(pos + CELLS - index, Ordering::Release) };
        s.dequeue.store(pos + 1, Ordering::Release);
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::kind;

    #[test]
    fn push_pop_in_order_and_wraps() {
        let owner = RingOwner::create().expect("memfd");
        let ring = Ring::open(&owner.path()).expect("open by path");
        let slot = ring.claim(42, 1).expect("slot");
        assert_eq!(
            owner.slot_info(slot),
            Some(SlotInfo {
                slot,
                pid: 42,
                ppid: 1
            })
        );
        let mut out = Event::zeroed();
        for round in 0..3u64 {
            for i in 0..CELLS {
                assert!(ring.push(
                    slot,
                    |_| false,
                    |e| {
                        e.kind = kind::FREE;
                        e.addr = round * CELLS + i;
                    }
                ));
            }
            // Full: a push that may not wait is dropped and counted.
            assert!(!ring.push(slot, |_| false, |e| e.kind = kind::FREE));
            for i in 0..CELLS {
                assert!(owner.pop(slot, &mut out));
                assert_eq!(out.addr, round * CELLS + i);
            }
            assert!(!owner.pop(slot, &mut out));
        }
        assert_eq!(owner.dropped(slot), 3);
        // Each of those pushes found the ring full once; the others never waited.
        assert_eq!(owner.waited(slot), 3);
    }

    #[test]
    fn recycled_slot_is_claimed_again_and_starts_empty() {
        let owner = RingOwner::create().expect("memfd");
        let ring = owner.ring();
        let mut claimed = Vec::new();
        while let Some(s) = ring.claim(100, 1) {
            claimed.push(s);
        }
        assert_eq!(claimed.len(), SLOTS);
        let slot = claimed[3];
        for i in 0..CELLS + 10 {
            let pushed = ring.push(slot, |_| false, |e| e.addr = i);
            assert_eq!(pushed, i < CELLS);
        }
        let mut out = Event::zeroed();
        while owner.pop(slot, &mut out) {}
        owner.recycle(slot);
        assert_eq!(owner.slot_info(slot), None);
        assert_eq!(ring.claim(200, 1), Some(slot));
        assert_eq!(owner.dropped(slot), 0);
        assert_eq!(owner.waited(slot), 0);
        for i in 0..CELLS {
            assert!(ring.push(slot, |_| false, |e| e.addr = i));
        }
        for i in 0..CELLS {
            assert!(owner.pop(slot, &mut out));
            assert_eq!(out.addr, i);
        }
        assert!(!owner.pop(slot, &mut out));
    }

    #[test]
    fn frames_and_text_survive_the_copy() {
        let owner = RingOwner::create().expect("memfd");
        let slot = owner.ring().claim(7, 1).expect("slot");
        owner.ring().push(
            slot,
            |_| false,
            |e| {
                e.kind = kind::ALLOC;
                e.nframes = 3;
                e.data[..3].copy_from_slice(&[1, 2, 3]);
            },
        );
        owner.ring().push(
            slot,
            |_| false,
            |e| {
                e.kind = kind::THREAD;
                e.set_text(b"worker-1");
            },
        );
        let mut out = Event::zeroed();
        assert!(owner.pop(slot, &mut out));
        assert_eq!(out.frames(), &[1, 2, 3]);
        assert!(owner.pop(slot, &mut out));
        assert_eq!(out.text(), "worker-1");
    }

    #[test]
    fn many_threads_lose_nothing() {
        let owner = std::sync::Arc::new(RingOwner::create().expect("memfd"));
        let slot = owner.ring().claim(9, 1).expect("slot");
        let per_thread = 50_000u64;
        let producers: Vec<_> = (0..4u64)
            .map(|t| {
                let o = owner.clone();
                std::thread::spawn(move || {
                    for i in 0..per_thread {
                        o.ring().push(
                            slot,
                            |_| true,
                            |e| {
                                e.kind = kind::FREE;
                                e.tid = t;
                                e.addr = i;
                            },
                        );
                    }
                })
            })
            .collect();
        let mut next = [0u64; 4];
        let mut out = Event::zeroed();
        let mut got = 0;
        while got < 4 * per_thread {
            if owner.pop(slot, &mut out) {
                assert_eq!(out.addr, next[out.tid as usize], "per-thread order");
                next[out.tid as usize] += 1;
                got += 1;
            } else {
                std::thread::yield_now();
            }
        }
        for p in producers {
            p.join().expect("producer");
        }
        assert_eq!(owner.dropped(slot), 0);
    }
}
