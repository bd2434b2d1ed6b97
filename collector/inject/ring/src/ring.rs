//! The shared-memory event ring: one memfd created by the collector, holding a header and
//! [`SLOTS`] per-process slots. Each slot is a bounded multi-producer, single-consumer queue of
//! 64-byte cells, each with a sequence number. An event takes as many consecutive cells as its
//! used bytes need ([`Event::used_bytes`]: 2 for an allocation with 8 frames, 9 at most), so a
//! slot holds more events the shorter they are. A producer builds the event on its own stack,
//! claims its cells with a CAS on the slot's enqueue position, copies the event in, then
//! publishes it by storing the first cell's sequence number with release ordering. The consumer
//! reads the first cell's header to learn how many cells follow, copies them out and releases
//! every cell in order, so a producer needs to check only the last cell of its claim to know the
//! consumer is done with all of them.
//!
//! Per-process slots keep a `fork` harmless: the child inherits the mapping, forgets its parent's
//! slot (`pthread_atfork`) and claims its own on its first event. The memory starts zeroed, so
//! sequence numbers are stored relative to the cell index (`stored = seq - index`): no page is
//! touched until it is used.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::event::Event;

pub const MAGIC: u64 = 0x3276_6e69_7270_6367; // "gcprinv2"
/// Process slots per ring; a process beyond this count runs untraced (and is counted).
pub const SLOTS: usize = 64;
/// Cells per slot: 524,288 events without frames, 262,144 allocations with up to 8 frames,
/// 58,254 of the largest events.
pub const CELLS: u64 = 1 << 19;
/// Bytes of event per cell.
pub const CELL_BYTES: usize = 64;
/// The most cells one event takes.
pub const MAX_EVENT_CELLS: u64 = core::mem::size_of::<Event>().div_ceil(CELL_BYTES) as u64;

const HEADER_BYTES: usize = 4096;
const SLOT_HEADER_BYTES: usize = 256;
/// A slot: its header, then the cells' sequence numbers, then the cells' bytes.
const SEQS_OFFSET: usize = SLOT_HEADER_BYTES;
const DATA_OFFSET: usize = SEQS_OFFSET + CELLS as usize * 8;
const SLOT_BYTES: usize = (DATA_OFFSET + CELLS as usize * CELL_BYTES).next_multiple_of(4096);
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

const _: () = assert!(core::mem::size_of::<SlotHeader>() <= SLOT_HEADER_BYTES);
// The cells' bytes start 64-byte aligned; the largest event takes 9 cells.
const _: () = assert!(DATA_OFFSET.is_multiple_of(64) && MAX_EVENT_CELLS == 9);
const _: () = assert!(core::mem::size_of::<Event>() <= MAX_EVENT_CELLS as usize * CELL_BYTES);
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

    /// The sequence number of cell `index` of `slot`.
    fn seq(&self, slot: usize, index: u64) -> &AtomicU64 {
        debug_assert!(slot < SLOTS && index < CELLS);
        // SAFETY: index < CELLS and slot < SLOTS keep the word inside the slot's sequence
        // numbers, 8-byte aligned (slot bases are page aligned, SEQS_OFFSET is a multiple of 8).
        unsafe {
            &*self
                .base
                .add(HEADER_BYTES + slot * SLOT_BYTES + SEQS_OFFSET + index as usize * 8)
                .cast::<AtomicU64>()
        }
    }

    /// The bytes of cell `index` of `slot` and of the cells after it, up to the slot's end.
    fn cell_bytes(&self, slot: usize, index: u64) -> *mut u8 {
        debug_assert!(slot < SLOTS && index < CELLS);
        // SAFETY: index < CELLS and slot < SLOTS keep the cell inside the mapping.
        unsafe {
            self.base
                .add(HEADER_BYTES + slot * SLOT_BYTES + DATA_OFFSET + index as usize * CELL_BYTES)
        }
    }

    /// Copies `len` bytes from `src` into the cells of `slot` from position `pos` on (wrapping
    /// at the slot's end).
    ///
    /// SAFETY: the caller owns those cells (it claimed them and has not published them) and
    /// `src` is valid for `len` bytes.
    unsafe fn write_cells(&self, slot: usize, pos: u64, src: *const u8, len: usize) {
        let index = pos % CELLS;
        let room = (CELLS - index) as usize * CELL_BYTES;
        let first = len.min(room);
        // SAFETY: per the contract; `first` bytes fit before the slot's end, the rest from
        // its first cell.
        unsafe {
            core::ptr::copy_nonoverlapping(src, self.cell_bytes(slot, index), first);
            if len > first {
                core::ptr::copy_nonoverlapping(
                    src.add(first),
                    self.cell_bytes(slot, 0),
                    len - first,
                );
            }
        }
    }

    /// Copies `len` bytes out of the cells of `slot` from position `pos` on into `dst`.
    ///
    /// SAFETY: the caller owns those cells (published to it, not yet released) and `dst` is
    /// valid for `len` bytes.
    unsafe fn read_cells(&self, slot: usize, pos: u64, dst: *mut u8, len: usize) {
        let index = pos % CELLS;
        let room = (CELLS - index) as usize * CELL_BYTES;
        let first = len.min(room);
        // SAFETY: per the contract, as in `write_cells`.
        unsafe {
            core::ptr::copy_nonoverlapping(self.cell_bytes(slot, index), dst, first);
            if len > first {
                core::ptr::copy_nonoverlapping(
                    self.cell_bytes(slot, 0),
                    dst.add(first),
                    len - first,
                );
            }
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
    /// event, on this thread's stack; once its cells are claimed, its time is set from `clock`
    /// (so the ring's order follows the times as closely as the claims do). When the ring is
    /// full it waits until `wait_ok()` says to stop, then drops the event and counts it.
    /// Returns whether the event was written.
    #[inline]
    pub fn push(
        &self,
        slot: usize,
        mut wait_ok: impl FnMut(u32) -> bool,
        clock: impl FnOnce() -> u64,
        fill: impl FnOnce(&mut Event),
    ) -> bool {
        let mut event = Event::zeroed();
        fill(&mut event);
        let used = event.used_bytes().min(core::mem::size_of::<Event>());
        let cells = used.div_ceil(CELL_BYTES).max(1) as u64;
        let s = self.slot(slot);
        let mut spins: u32 = 0;
        let pos = loop {
            let pos = s.enqueue.load(Ordering::Relaxed);
            // The consumer releases cells in order: once the last of the claim is released
            // for this round, all of them are.
            let last = pos + cells - 1;
            let index = last % CELLS;
            let stored = self.seq(slot, index).load(Ordering::Acquire);
            let diff = stored.wrapping_sub(last - index) as i64;
            if diff == 0 {
                if s.enqueue
                    .compare_exchange_weak(pos, pos + cells, Ordering::Relaxed, Ordering::Relaxed)
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
        event.ts_nanos = clock();
        let index = pos % CELLS;
        // SAFETY: winning the CAS gives this thread exclusive ownership of cells
        // `pos..pos + cells` until it publishes the first one below; `event` is `used` bytes
        // or more.
        unsafe {
            self.write_cells(slot, pos, (&raw const event).cast::<u8>(), used);
        }
        self.seq(slot, index)
            .store(pos + 1 - index, Ordering::Release);
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
        let r = &self.ring;
        let s = r.slot(slot);
        let pos = s.dequeue.load(Ordering::Relaxed);
        let index = pos % CELLS;
        if r.seq(slot, index).load(Ordering::Acquire) != pos + 1 - index {
            return false;
        }
        let header = core::mem::size_of::<Event>() - crate::event::MAX_FRAMES * 8;
        let dst = (out as *mut Event).cast::<u8>();
        // SAFETY: the acquire load saw the producer's release: the event's cells are complete
        // and no producer touches them until they are released below. The header comes first,
        // and says how many bytes follow (`used_bytes`, as the producer computed it); the rest
        // of `out` keeps older contents that `used_bytes` excludes.
        let used = unsafe {
            r.read_cells(slot, pos, dst, header);
            let used = out.used_bytes().min(core::mem::size_of::<Event>());
            r.read_cells(
                slot,
                pos + (header / CELL_BYTES) as u64,
                dst.add(header),
                used - header,
            );
            used
        };
        let cells = used.div_ceil(CELL_BYTES).max(1) as u64;
        self.release(slot, pos, cells);
        true
    }

    /// Releases cells `pos..pos + n` of `slot` to the producers, in order, and moves the
    /// dequeue position past them.
    fn release(&self, slot: usize, pos: u64, n: u64) {
        for p in pos..pos + n {
            let index = p % CELLS;
            self.ring
                .seq(slot, index)
                .store(p + CELLS - index, Ordering::Release);
        }
        self.ring
            .slot(slot)
            .dequeue
            .store(pos + n, Ordering::Release);
    }

    /// Makes the slot of a dead, fully drained process claimable again (long runs that start
    /// more than [`SLOTS`] traced processes). Only for a slot whose producer can no longer write.
    pub fn recycle(&self, slot: usize) {
        let s = self.ring.slot(slot);
        let end = s.enqueue.load(Ordering::Acquire).min(CELLS);
        for index in 0..end {
            // Its producer is gone and the consumer is us.
            self.ring.seq(slot, index).store(0, Ordering::Relaxed);
        }
        s.enqueue.store(0, Ordering::Relaxed);
        s.dequeue.store(0, Ordering::Relaxed);
        s.dropped.store(0, Ordering::Relaxed);
        s.waited.store(0, Ordering::Relaxed);
        s.ppid.store(0, Ordering::Relaxed);
        s.pid.store(0, Ordering::Relaxed);
        s.state.store(0, Ordering::Release);
    }

    /// For a slot whose process is dead: skips the cells that were claimed but never published
    /// (the process died while writing) up to the next published event, so the ones behind
    /// them can be read. Returns the events lost: 1 for such a run of cells (a thread has one
    /// claim at a time, and a process seldom dies in several threads' writes at once), 0 when
    /// the next event is published or none is claimed.
    pub fn skip_unpublished(&self, slot: usize) -> u64 {
        let r = &self.ring;
        let s = r.slot(slot);
        let end = s.enqueue.load(Ordering::Acquire);
        let pos = s.dequeue.load(Ordering::Relaxed);
        let mut p = pos;
        // A cell that no published event starts at reads as free for its position (the
        // producer writes only the first cell's sequence number).
        while p < end && r.seq(slot, p % CELLS).load(Ordering::Acquire) != p + 1 - p % CELLS {
            p += 1;
        }
        if p == pos {
            return 0;
        }
        // The producer is dead, so nobody else writes these cells.
        self.release(slot, pos, p - pos);
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
                    || 0,
                    |e| {
                        e.kind = kind::FREE;
                        e.addr = round * CELLS + i;
                    }
                ));
            }
            // Full: a push that may not wait is dropped and counted.
            assert!(!ring.push(slot, |_| false, || 0, |e| e.kind = kind::FREE));
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
            let pushed = ring.push(slot, |_| false, || 0, |e| e.addr = i);
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
            assert!(ring.push(slot, |_| false, || 0, |e| e.addr = i));
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
            || 0,
            |e| {
                e.kind = kind::ALLOC;
                e.nframes = 3;
                e.data[..3].copy_from_slice(&[1, 2, 3]);
            },
        );
        owner.ring().push(
            slot,
            |_| false,
            || 0,
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

    /// An allocation event with `n` frames, each frame derived from `seed`.
    fn alloc_with_frames(e: &mut Event, seed: u64, n: usize) {
        e.kind = kind::ALLOC;
        e.addr = seed;
        e.nframes = n as u32;
        for (k, f) in e.data[..n].iter_mut().enumerate() {
            *f = seed.wrapping_mul(31).wrapping_add(k as u64);
        }
    }

    #[test]
    fn events_of_every_size_wrap_around_the_slot_and_come_back_whole() {
        let owner = RingOwner::create().expect("memfd");
        let slot = owner.ring().claim(11, 1).expect("slot");
        let mut out = Event::zeroed();
        let (mut pushed, mut popped, mut cells) = (0u64, 0u64, 0u64);
        // Three times round the slot, the ring kept between empty and about half full so the
        // events straddle its end at every offset.
        while cells < 3 * CELLS {
            for _ in 0..(pushed % 7_919) + 1 {
                let n = (pushed % 65) as usize;
                let text = pushed % 97 == 0;
                assert!(owner.ring().push(
                    slot,
                    |_| false,
                    || pushed,
                    |e| {
                        if text {
                            e.kind = kind::MARK;
                            e.addr = pushed;
                            e.set_text(b"a mark");
                        } else {
                            alloc_with_frames(e, pushed, n);
                        }
                    },
                ));
                cells += if text {
                    MAX_EVENT_CELLS
                } else {
                    (64 + 8 * n as u64).div_ceil(CELL_BYTES as u64)
                };
                pushed += 1;
            }
            while popped < pushed && (popped % 3 != 0 || pushed - popped > 3_000) {
                assert!(owner.pop(slot, &mut out), "event {popped} is there");
                assert_eq!(out.addr, popped);
                assert_eq!(out.ts_nanos, popped, "stamped once claimed");
                if popped % 97 == 0 {
                    assert_eq!(out.text(), "a mark");
                } else {
                    let mut want = Event::zeroed();
                    alloc_with_frames(&mut want, popped, (popped % 65) as usize);
                    assert_eq!(out.frames(), want.frames(), "event {popped}");
                }
                popped += 1;
            }
        }
        while owner.pop(slot, &mut out) {
            assert_eq!(out.addr, popped);
            popped += 1;
        }
        assert_eq!(popped, pushed);
        assert_eq!((owner.dropped(slot), owner.waited(slot)), (0, 0));
    }

    #[test]
    fn an_event_that_does_not_fit_waits_while_a_smaller_one_fits() {
        let owner = RingOwner::create().expect("memfd");
        let ring = owner.ring();
        let slot = ring.claim(12, 1).expect("slot");
        // All cells but two hold one-cell events.
        for i in 0..CELLS - 2 {
            assert!(ring.push(slot, |_| false, || 0, |e| e.addr = i));
        }
        // 3 cells (16 frames) do not fit: the push waits, then drops.
        assert!(!ring.push(slot, |_| false, || 0, |e| alloc_with_frames(e, 1, 16)));
        assert_eq!((owner.dropped(slot), owner.waited(slot)), (1, 1));
        // 2 cells (8 frames) do.
        assert!(ring.push(slot, |_| false, || 0, |e| alloc_with_frames(e, 2, 8)));
        assert!(!ring.push(slot, |_| false, || 0, |e| e.addr = 3));
        // Once the consumer frees the first three cells, the 3-cell event fits, across the
        // slot's end.
        let mut out = Event::zeroed();
        for i in 0..3 {
            assert!(owner.pop(slot, &mut out));
            assert_eq!(out.addr, i);
        }
        assert!(ring.push(slot, |_| false, || 0, |e| alloc_with_frames(e, 4, 16)));
        for _ in 3..CELLS - 2 {
            assert!(owner.pop(slot, &mut out));
        }
        assert!(owner.pop(slot, &mut out));
        assert_eq!((out.addr, out.frames().len()), (2, 8));
        assert!(owner.pop(slot, &mut out));
        assert_eq!((out.addr, out.frames().len()), (4, 16));
        assert_eq!(out.frames()[15], 4 * 31 + 15);
        assert!(!owner.pop(slot, &mut out));
    }

    #[test]
    fn cells_a_dead_producer_claimed_are_skipped_as_one_lost_event() {
        let owner = RingOwner::create().expect("memfd");
        let ring = owner.ring();
        let slot = ring.claim(13, 1).expect("slot");
        assert!(ring.push(slot, |_| false, || 0, |e| alloc_with_frames(e, 1, 20)));
        // A thread claimed three cells and died before publishing them.
        ring.slot(slot).enqueue.fetch_add(3, Ordering::Relaxed);
        assert!(ring.push(slot, |_| false, || 0, |e| alloc_with_frames(e, 2, 20)));
        let mut out = Event::zeroed();
        assert_eq!(
            owner.skip_unpublished(slot),
            0,
            "the next event is published"
        );
        assert!(owner.pop(slot, &mut out));
        assert_eq!(out.addr, 1);
        assert!(
            !owner.pop(slot, &mut out),
            "stuck behind the unpublished cells"
        );
        assert_eq!(owner.skip_unpublished(slot), 1);
        assert!(owner.pop(slot, &mut out));
        assert_eq!((out.addr, out.frames().len()), (2, 20));
        assert_eq!(owner.skip_unpublished(slot), 0, "nothing claimed");
        assert!(!owner.pop(slot, &mut out));
    }

    #[test]
    fn many_threads_lose_nothing_with_events_of_every_size() {
        let owner = std::sync::Arc::new(RingOwner::create().expect("memfd"));
        let slot = owner.ring().claim(14, 1).expect("slot");
        let per_thread = 100_000u64;
        let producers: Vec<_> = (0..4u64)
            .map(|t| {
                let o = owner.clone();
                std::thread::spawn(move || {
                    for i in 0..per_thread {
                        o.ring().push(
                            slot,
                            |_| true,
                            || 0,
                            |e| {
                                alloc_with_frames(e, i, ((i + t) % 65) as usize);
                                e.tid = t;
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
                let t = out.tid as usize;
                assert_eq!(out.addr, next[t], "per-thread order");
                let mut want = Event::zeroed();
                alloc_with_frames(&mut want, out.addr, ((out.addr + out.tid) % 65) as usize);
                assert_eq!(out.frames(), want.frames());
                next[t] += 1;
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
