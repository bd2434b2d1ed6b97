//! x86-64 call-frame information (CFI, `.eh_frame`) reduced to the one rule a stack walk needs
//! per code address, and a lock-free cache of those rules.
//!
//! A [`Rule`] says where a frame's caller state is: CFA = rsp or rbp + offset, the return
//! address at CFA - 8, rbp saved at CFA + k or unchanged. It is found by
//! - `_dl_find_object` (glibc >= 2.35, lock-free) giving the object's `PT_GNU_EH_FRAME`
//!   segment (`.eh_frame_hdr`),
//! - a binary search of that header's sorted table for the FDE,
//! - running the CIE's and FDE's CFA instructions up to the address, with a fixed-size state
//!   (remember/restore stack of [`STATE_STACK`] rows): no allocation, no lock.
//!
//! What the rule cannot express (a CFA expression, rbp or the return address kept in another
//! register or by an expression, signal frames, unusual encodings, code outside any object)
//! becomes [`Rule::Unknown`], and the caller hands the rest of the walk to libgcc.
//!
//! Rules are cached in [`RULES`], a fixed 2-way set-associative table of `AtomicU64` words that
//! each hold the address tag and the packed rule together, so a reader never sees a torn entry.
//! Entries are never invalidated: a library unloaded and another loaded at the same addresses
//! can give wrong rules for those addresses (a wrong stack, never a wild read: the walk bounds
//! every read to the thread's stack).

use core::sync::atomic::{AtomicU64, Ordering};

/// How to find the caller's frame from a frame at a given code address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// CFA = (rbp if `cfa_rbp`, else rsp) + `cfa_off`; return address at CFA - 8; the caller's
    /// rsp is the CFA; its rbp is at CFA + `rbp_off` if set, otherwise rbp is unchanged.
    Frame {
        cfa_rbp: bool,
        cfa_off: i64,
        rbp_off: Option<i64>,
    },
    /// The outermost frame (return address undefined, e.g. `_start`, a thread's start routine).
    Outermost,
    /// Not expressible as a [`Rule::Frame`] or no FDE found: let libgcc unwind from here.
    Unknown,
}

/// DWARF register numbers on x86-64.
const REG_RBP: u64 = 6;
const REG_RSP: u64 = 7;

/// Depth of `DW_CFA_remember_state`.
const STATE_STACK: usize = 8;

/// The longest CIE or FDE accepted (a sanity bound on lengths read from memory).
const MAX_ENTRY_BYTES: usize = 1 << 20;

/// The rule for code address `pc` (a return address minus one), from the cache or the
/// object's CFI. Callback-safe.
#[inline]
pub fn rule_for(pc: usize) -> Rule {
    if let Some(r) = cache_get(pc) {
        return r;
    }
    let r = lookup(pc);
    cache_put(pc, r);
    r
}

/// The rule for `pc` from the loaded object's `.eh_frame_hdr` (no cache).
pub fn lookup(pc: usize) -> Rule {
    let Some(obj) = crate::objects::find_object(pc) else {
        return Rule::Unknown;
    };
    if obj.eh_frame_hdr == 0 {
        return Rule::Unknown;
    }
    // SAFETY: `_dl_find_object` returned the PT_GNU_EH_FRAME segment of a loaded object, which
    // starts with a 4-byte header.
    let version_and_encodings =
        unsafe { core::slice::from_raw_parts(obj.eh_frame_hdr as *const u8, 4) };
    let Some(head_len) = hdr_len(version_and_encodings) else {
        return Rule::Unknown;
    };
    // SAFETY: the header's encodings say the two fields after it take `head_len - 4` bytes.
    let head = unsafe { core::slice::from_raw_parts(obj.eh_frame_hdr as *const u8, head_len) };
    let Some((table_addr, count)) = hdr_table(head, obj.eh_frame_hdr) else {
        return Rule::Unknown;
    };
    // SAFETY: the header says `count` 8-byte entries follow at `table_addr`, inside the same
    // mapped segment (the loader mapped it whole; `hdr_table` bounds `count`).
    let table = unsafe { core::slice::from_raw_parts(table_addr as *const u8, count * 8) };
    let Some(fde_addr) = search_table(table, obj.eh_frame_hdr, pc) else {
        return Rule::Unknown;
    };
    let Some(fde) = loaded_entry(fde_addr) else {
        return Rule::Unknown;
    };
    rule_from_fde(fde, fde_addr, pc, loaded_entry)
}

/// The CIE or FDE at `addr` in a loaded object's `.eh_frame`, with its length field.
fn loaded_entry(addr: usize) -> Option<&'static [u8]> {
    if addr == 0 || !addr.is_multiple_of(4) {
        return None;
    }
    // SAFETY: addr is an FDE address from the object's .eh_frame_hdr table, or a CIE address
    // computed from such an FDE; every entry starts with a 4-byte length, in mapped memory.
    let len = unsafe { (addr as *const u32).read() } as usize;
    if len == 0 || len == 0xffff_ffff || len > MAX_ENTRY_BYTES {
        return None;
    }
    // SAFETY: the entry's length field says `len` bytes follow it, all in the mapped .eh_frame.
    Some(unsafe { core::slice::from_raw_parts(addr as *const u8, 4 + len) })
}

/// Bounds-checked reading of DWARF data; `base` is the address of `data[0]` (for pc-relative
/// pointers). Every method returns `None` past the end instead of panicking.
struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    base: usize,
}

impl<'a> Reader<'a> {
    fn new(data: &'a [u8], base: usize) -> Self {
        Reader { data, pos: 0, base }
    }
    fn addr(&self) -> usize {
        self.base.wrapping_add(self.pos)
    }
    fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let b = self.data.get(self.pos..self.pos.checked_add(N)?)?;
        self.pos += N;
        b.try_into().ok()
    }
    fn u8(&mut self) -> Option<u8> {
        let b = *self.data.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }
    fn u16(&mut self) -> Option<u16> {
        self.bytes().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.bytes().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.bytes().map(u64::from_le_bytes)
    }
    fn uleb(&mut self) -> Option<u64> {
        let mut v = 0u64;
        let mut shift = 0u32;
        loop {
            let b = self.u8()?;
            if shift < 64 {
                v |= u64::from(b & 0x7f) << shift;
            }
            shift = shift.saturating_add(7);
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
    }
    fn sleb(&mut self) -> Option<i64> {
        let mut v = 0i64;
        let mut shift = 0u32;
        loop {
            let b = self.u8()?;
            if shift < 64 {
                v |= i64::from(b & 0x7f) << shift;
            }
            shift = shift.saturating_add(7);
            if b & 0x80 == 0 {
                if shift < 64 && b & 0x40 != 0 {
                    v |= -1i64 << shift;
                }
                return Some(v);
            }
        }
    }
    fn skip(&mut self, n: u64) -> Option<()> {
        let end = self.pos.checked_add(usize::try_from(n).ok()?)?;
        if end > self.data.len() {
            return None;
        }
        self.pos = end;
        Some(())
    }
    /// A `DW_EH_PE_*` encoded pointer: absolute, pc-relative or relative to `data_base`. The
    /// indirect bit is not followed (callers that need the value refuse it).
    fn encoded(&mut self, enc: u8, data_base: usize) -> Option<usize> {
        let field = self.addr();
        let v = match enc & 0x0f {
            0x00 | 0x04 | 0x0c => self.u64()?,
            0x01 => self.uleb()?,
            0x02 => u64::from(self.u16()?),
            0x03 => u64::from(self.u32()?),
            0x09 => self.sleb()? as u64,
            0x0a => i64::from(self.u16()? as i16) as u64,
            0x0b => i64::from(self.u32()? as i32) as u64,
            _ => return None,
        };
        let base = match enc & 0x70 {
            0x00 => 0,
            0x10 => field,
            0x30 => data_base,
            _ => return None,
        };
        Some(base.wrapping_add(v as usize))
    }
}

const DW_EH_PE_OMIT: u8 = 0xff;
const DW_EH_PE_INDIRECT: u8 = 0x80;
/// `DW_EH_PE_datarel | DW_EH_PE_sdata4`: the only table encoding searched.
const TABLE_ENC: u8 = 0x3b;

/// Length of the head of `.eh_frame_hdr` (header, eh_frame pointer, entry count), from its first
/// 4 bytes; `None` for encodings whose size is not fixed.
fn hdr_len(first: &[u8]) -> Option<usize> {
    let size = |enc: u8| match enc & 0x0f {
        _ if enc == DW_EH_PE_OMIT => Some(0),
        0x02 | 0x0a => Some(2),
        0x03 | 0x0b => Some(4),
        0x00 | 0x04 | 0x0c => Some(8),
        _ => None,
    };
    Some(4 + size(*first.get(1)?)? + size(*first.get(2)?)?)
}

/// Parses the head of `.eh_frame_hdr` at `hdr_addr`: (address of the search table, entries).
fn hdr_table(head: &[u8], hdr_addr: usize) -> Option<(usize, usize)> {
    let mut r = Reader::new(head, hdr_addr);
    let (version, ptr_enc, count_enc, table_enc) = (r.u8()?, r.u8()?, r.u8()?, r.u8()?);
    if version != 1 || count_enc == DW_EH_PE_OMIT || table_enc != TABLE_ENC {
        return None;
    }
    if ptr_enc != DW_EH_PE_OMIT {
        r.encoded(ptr_enc & !DW_EH_PE_INDIRECT, hdr_addr)?;
    }
    let count = r.encoded(count_enc & !DW_EH_PE_INDIRECT, hdr_addr)?;
    // A sanity bound: 16 M functions in one object.
    if count == 0 || count > 1 << 24 {
        return None;
    }
    Some((r.addr(), count))
}

/// The FDE address for `pc` in a sorted `(initial location, FDE)` table of 4-byte offsets from
/// `hdr_addr`: the last entry whose location is <= pc.
fn search_table(table: &[u8], hdr_addr: usize, pc: usize) -> Option<usize> {
    let entry = |i: usize| -> Option<(usize, usize)> {
        let b = table.get(i * 8..i * 8 + 8)?;
        let loc = i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as isize;
        let fde = i32::from_le_bytes([b[4], b[5], b[6], b[7]]) as isize;
        Some((
            hdr_addr.wrapping_add_signed(loc),
            hdr_addr.wrapping_add_signed(fde),
        ))
    };
    let n = table.len() / 8;
    let (mut lo, mut hi) = (0usize, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if entry(mid)?.0 <= pc {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if lo == 0 {
        return None;
    }
    entry(lo - 1).map(|e| e.1)
}

/// What the CIE says that an FDE's instructions need.
struct Cie<'a> {
    code_align: u64,
    data_align: i64,
    ra_reg: u64,
    fde_enc: u8,
    has_aug_data: bool,
    instructions: &'a [u8],
    instructions_addr: usize,
}

fn parse_cie(entry: &[u8], addr: usize) -> Option<Cie<'_>> {
    let mut r = Reader::new(entry, addr);
    let len = r.u32()?;
    if len == 0xffff_ffff || r.u32()? != 0 {
        return None;
    }
    let version = r.u8()?;
    if version != 1 && version != 3 {
        return None;
    }
    let aug_start = r.pos;
    while r.u8()? != 0 {}
    let aug = entry.get(aug_start..r.pos - 1)?;
    let code_align = r.uleb()?;
    let data_align = r.sleb()?;
    let ra_reg = if version == 1 {
        u64::from(r.u8()?)
    } else {
        r.uleb()?
    };
    let mut fde_enc = 0u8;
    let has_aug_data = aug.first() == Some(&b'z');
    if has_aug_data {
        let aug_len = r.uleb()?;
        let data_end = r.pos.checked_add(usize::try_from(aug_len).ok()?)?;
        for &c in &aug[1..] {
            match c {
                b'L' => {
                    r.u8()?;
                }
                b'P' => {
                    let enc = r.u8()?;
                    r.encoded(enc & !DW_EH_PE_INDIRECT, 0)?;
                }
                b'R' => fde_enc = r.u8()?,
                // A signal frame: the caller's pc is not a return address. Leave it to libgcc.
                b'S' => return None,
                b'B' | b'G' => {}
                _ => break,
            }
        }
        if data_end > entry.len() {
            return None;
        }
        r.pos = data_end;
    } else if !aug.is_empty() {
        return None;
    }
    if fde_enc & DW_EH_PE_INDIRECT != 0 {
        return None;
    }
    let body = entry.get(r.pos..)?;
    Some(Cie {
        code_align,
        data_align,
        ra_reg,
        fde_enc,
        has_aug_data,
        instructions: body,
        instructions_addr: r.addr(),
    })
}

/// The rule for `pc` from the FDE `entry` at `addr`; `entry_at` gives the entry (CIE) at an
/// address. `Unknown` when pc is outside the FDE or anything is not understood.
fn rule_from_fde<'a>(
    entry: &'a [u8],
    addr: usize,
    pc: usize,
    entry_at: impl Fn(usize) -> Option<&'a [u8]>,
) -> Rule {
    fde_rule(entry, addr, pc, entry_at).unwrap_or(Rule::Unknown)
}

fn fde_rule<'a>(
    entry: &'a [u8],
    addr: usize,
    pc: usize,
    entry_at: impl Fn(usize) -> Option<&'a [u8]>,
) -> Option<Rule> {
    let mut r = Reader::new(entry, addr);
    let len = r.u32()?;
    if len == 0xffff_ffff {
        return None;
    }
    let cie_ptr_field = r.addr();
    let cie_ptr = r.u32()? as usize;
    if cie_ptr == 0 {
        return None; // a CIE, not an FDE
    }
    let cie_addr = cie_ptr_field.wrapping_sub(cie_ptr);
    let cie_entry = entry_at(cie_addr)?;
    let cie = parse_cie(cie_entry, cie_addr)?;
    let pc_begin = r.encoded(cie.fde_enc, 0)?;
    let pc_range = r.encoded(cie.fde_enc & 0x0f, 0)?;
    if pc < pc_begin || pc - pc_begin >= pc_range {
        return None;
    }
    if cie.has_aug_data {
        let n = r.uleb()?;
        r.skip(n)?;
    }
    let mut row = Row::initial();
    let mut stack = Stack::default();
    execute(
        &mut Reader::new(cie.instructions, cie.instructions_addr),
        &cie,
        &mut row,
        None,
        &mut stack,
        pc_begin,
        usize::MAX,
    )?;
    let initial = row;
    execute(
        &mut r,
        &cie,
        &mut row,
        Some(&initial),
        &mut stack,
        pc_begin,
        pc,
    )?;
    row.rule()
}

/// How one register of the caller is recovered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reg {
    /// Not saved (unchanged), or `DW_CFA_undefined` for a register other than the return
    /// address (libgcc leaves those unchanged too).
    Same,
    /// Saved at CFA + offset.
    At(i64),
    /// `DW_CFA_undefined`: for the return address, the outermost frame.
    Undefined,
    /// In another register or computed by an expression.
    Other,
}

/// One row of the CFI table, reduced to what a [`Rule`] needs.
#[derive(Clone, Copy, Debug)]
struct Row {
    cfa_reg: u64,
    cfa_off: i64,
    cfa_expr: bool,
    rbp: Reg,
    ra: Reg,
}

impl Row {
    fn initial() -> Row {
        Row {
            cfa_reg: REG_RSP,
            cfa_off: 8,
            cfa_expr: false,
            rbp: Reg::Same,
            ra: Reg::Same,
        }
    }

    fn rule(&self) -> Option<Rule> {
        match self.ra {
            Reg::Undefined => return Some(Rule::Outermost),
            Reg::At(-8) => {}
            _ => return None,
        }
        if self.cfa_expr || (self.cfa_reg != REG_RSP && self.cfa_reg != REG_RBP) {
            return None;
        }
        let rbp_off = match self.rbp {
            Reg::Same | Reg::Undefined => None,
            Reg::At(o) => Some(o),
            Reg::Other => return None,
        };
        Some(Rule::Frame {
            cfa_rbp: self.cfa_reg == REG_RBP,
            cfa_off: self.cfa_off,
            rbp_off,
        })
    }
}

#[derive(Default)]
struct Stack {
    rows: [Option<Row>; STATE_STACK],
    len: usize,
}

/// Which of the tracked registers `reg` is.
fn slot(row: &mut Row, reg: u64, ra_reg: u64) -> Option<&mut Reg> {
    if reg == ra_reg {
        Some(&mut row.ra)
    } else if reg == REG_RBP {
        Some(&mut row.rbp)
    } else {
        None
    }
}

/// Runs CFA instructions from `r`, starting at code address `loc`, until the row for `pc` is
/// complete. `initial` is the CIE's row (for `DW_CFA_restore`); `None` while running the CIE.
/// `None` on an instruction not understood or malformed data.
fn execute(
    r: &mut Reader<'_>,
    cie: &Cie<'_>,
    row: &mut Row,
    initial: Option<&Row>,
    stack: &mut Stack,
    mut loc: usize,
    pc: usize,
) -> Option<()> {
    let ra = cie.ra_reg;
    let factored = |n: u64| (n as i64).wrapping_mul(cie.data_align);
    let restored = |reg: u64| -> Reg {
        let Some(init) = initial else {
            return Reg::Same;
        };
        if reg == ra { init.ra } else { init.rbp }
    };
    let advance = |loc: &mut usize, delta: u64| -> bool {
        let next = loc.wrapping_add((delta.wrapping_mul(cie.code_align)) as usize);
        if next > pc {
            return false;
        }
        *loc = next;
        true
    };
    while !r.is_empty() {
        let op = r.u8()?;
        let (high, low) = (op >> 6, u64::from(op & 0x3f));
        match high {
            1 => {
                if !advance(&mut loc, low) {
                    return Some(());
                }
                continue;
            }
            2 => {
                let off = factored(r.uleb()?);
                if let Some(s) = slot(row, low, ra) {
                    *s = Reg::At(off);
                }
                continue;
            }
            3 => {
                let v = restored(low);
                if let Some(s) = slot(row, low, ra) {
                    *s = v;
                }
                continue;
            }
            _ => {}
        }
        match op {
            0x00 => {}
            0x01 => {
                let next = r.encoded(cie.fde_enc, 0)?;
                if next > pc {
                    return Some(());
                }
                loc = next;
            }
            0x02..=0x04 => {
                let delta = match op {
                    0x02 => u64::from(r.u8()?),
                    0x03 => u64::from(r.u16()?),
                    _ => u64::from(r.u32()?),
                };
                if !advance(&mut loc, delta) {
                    return Some(());
                }
            }
            // DW_CFA_offset_extended, DW_CFA_GNU_negative_offset_extended
            0x05 | 0x2f => {
                let reg = r.uleb()?;
                let off = factored(r.uleb()?);
                let off = if op == 0x2f { off.wrapping_neg() } else { off };
                if let Some(s) = slot(row, reg, ra) {
                    *s = Reg::At(off);
                }
            }
            // DW_CFA_restore_extended
            0x06 => {
                let reg = r.uleb()?;
                let v = restored(reg);
                if let Some(s) = slot(row, reg, ra) {
                    *s = v;
                }
            }
            // DW_CFA_undefined, DW_CFA_same_value
            0x07 | 0x08 => {
                let reg = r.uleb()?;
                let v = if op == 0x07 && reg == ra {
                    Reg::Undefined
                } else {
                    Reg::Same
                };
                if let Some(s) = slot(row, reg, ra) {
                    *s = v;
                }
            }
            // DW_CFA_register
            0x09 => {
                let reg = r.uleb()?;
                r.uleb()?;
                if let Some(s) = slot(row, reg, ra) {
                    *s = Reg::Other;
                }
            }
            // DW_CFA_remember_state
            0x0a => {
                let i = stack.len;
                *stack.rows.get_mut(i)? = Some(*row);
                stack.len += 1;
            }
            // DW_CFA_restore_state
            0x0b => {
                stack.len = stack.len.checked_sub(1)?;
                *row = stack.rows.get(stack.len).copied().flatten()?;
            }
            // DW_CFA_def_cfa, DW_CFA_def_cfa_sf
            0x0c | 0x12 => {
                row.cfa_reg = r.uleb()?;
                row.cfa_off = if op == 0x0c {
                    r.uleb()? as i64
                } else {
                    r.sleb()?.wrapping_mul(cie.data_align)
                };
                row.cfa_expr = false;
            }
            // DW_CFA_def_cfa_register
            0x0d => {
                row.cfa_reg = r.uleb()?;
                row.cfa_expr = false;
            }
            // DW_CFA_def_cfa_offset, DW_CFA_def_cfa_offset_sf
            0x0e | 0x13 => {
                row.cfa_off = if op == 0x0e {
                    r.uleb()? as i64
                } else {
                    r.sleb()?.wrapping_mul(cie.data_align)
                };
            }
            // DW_CFA_def_cfa_expression
            0x0f => {
                let n = r.uleb()?;
                r.skip(n)?;
                row.cfa_expr = true;
            }
            // DW_CFA_expression, DW_CFA_val_expression
            0x10 | 0x16 => {
                let reg = r.uleb()?;
                let n = r.uleb()?;
                r.skip(n)?;
                if let Some(s) = slot(row, reg, ra) {
                    *s = Reg::Other;
                }
            }
            // DW_CFA_offset_extended_sf
            0x11 => {
                let reg = r.uleb()?;
                let off = r.sleb()?.wrapping_mul(cie.data_align);
                if let Some(s) = slot(row, reg, ra) {
                    *s = Reg::At(off);
                }
            }
            // DW_CFA_val_offset, DW_CFA_val_offset_sf
            0x14 | 0x15 => {
                let reg = r.uleb()?;
                if op == 0x14 {
                    r.uleb()?;
                } else {
                    r.sleb()?;
                }
                if let Some(s) = slot(row, reg, ra) {
                    *s = Reg::Other;
                }
            }
            // DW_CFA_GNU_args_size
            0x2e => {
                r.uleb()?;
            }
            _ => return None,
        }
    }
    Some(())
}

// ---- The rule cache ----

/// Sets of the cache (2 ways each): 2 × 8192 words, 128 KiB of zeroed static memory.
const SETS: usize = 1 << 13;
const SET_BITS: u32 = SETS.trailing_zeros();
/// Bits of the word holding `pc >> SET_BITS` (pc < 2^47: user-space addresses).
const TAG_BITS: u32 = 47 - SET_BITS;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;

static RULES: [AtomicU64; 2 * SETS] = [const { AtomicU64::new(0) }; 2 * SETS];

/// Packs a rule into the bits above the tag (64 - 34 = 30 bits): kind (2), CFA from rbp (1),
/// CFA offset / 8 (14), rbp slot k with rbp at CFA - 8k, 0 = unchanged (13). `None` when the
/// rule does not fit; such rules are recomputed each time.
fn pack(rule: Rule) -> Option<u64> {
    let bits = match rule {
        Rule::Outermost => 2,
        Rule::Unknown => 3,
        Rule::Frame {
            cfa_rbp,
            cfa_off,
            rbp_off,
        } => {
            if cfa_off < 0 || cfa_off % 8 != 0 || cfa_off / 8 >= 1 << 14 {
                return None;
            }
            let k = match rbp_off {
                None => 0,
                Some(o) if o < 0 && o % 8 == 0 && o > -8 * (1 << 13) => (o / -8) as u64,
                Some(_) => return None,
            };
            1 | (u64::from(cfa_rbp) << 2) | ((cfa_off as u64 / 8) << 3) | (k << 17)
        }
    };
    Some(bits)
}

fn unpack(bits: u64) -> Rule {
    match bits & 3 {
        1 => {
            let k = ((bits >> 17) & 0x1fff) as i64;
            Rule::Frame {
                cfa_rbp: bits & 4 != 0,
                cfa_off: ((bits >> 3) & 0x3fff) as i64 * 8,
                rbp_off: (k != 0).then_some(-8 * k),
            }
        }
        2 => Rule::Outermost,
        _ => Rule::Unknown,
    }
}

#[inline]
fn cache_get(pc: usize) -> Option<Rule> {
    let pc = pc as u64;
    if pc >> 47 != 0 {
        return None;
    }
    let set = (pc as usize) & (SETS - 1);
    let tag = pc >> SET_BITS;
    for way in 0..2 {
        let w = RULES[2 * set + way].load(Ordering::Relaxed);
        if w != 0 && w & TAG_MASK == tag {
            return Some(unpack(w >> TAG_BITS));
        }
    }
    None
}

fn cache_put(pc: usize, rule: Rule) {
    let pc = pc as u64;
    let Some(bits) = pack(rule) else {
        return;
    };
    if pc >> 47 != 0 {
        return;
    }
    let set = (pc as usize) & (SETS - 1);
    let word = (pc >> SET_BITS) | (bits << TAG_BITS);
    // The newest entry goes to way 0, the previous one moves to way 1.
    let old = RULES[2 * set].swap(word, Ordering::Relaxed);
    if old != 0 {
        RULES[2 * set + 1].store(old, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gcc's usual CIE: "zR", code align 1, data align -8, return address column 16, pc-relative
    /// sdata4 pointers; CFA = rsp + 8, return address at CFA - 8.
    fn cie() -> Vec<u8> {
        let mut body = vec![0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x1b];
        body.extend([0x0c, 7, 8, 0x90, 1]);
        while (body.len() + 4) % 4 != 0 {
            body.push(0);
        }
        let mut e = (body.len() as u32).to_le_bytes().to_vec();
        e.extend(body);
        e
    }

    /// An FDE right after the CIE in `frame` covering [begin, begin + len) with `instrs`.
    fn with_fde(begin: usize, len: u32, instrs: &[u8], base: usize) -> (Vec<u8>, usize) {
        let mut frame = cie();
        let fde_addr = base + frame.len();
        let mut body = Vec::new();
        body.extend(((fde_addr + 4 - base) as u32).to_le_bytes());
        let field = fde_addr + 8;
        body.extend(((begin as i64 - field as i64) as i32).to_le_bytes());
        body.extend(len.to_le_bytes());
        body.push(0);
        body.extend(instrs);
        frame.extend((body.len() as u32).to_le_bytes());
        frame.extend(body);
        (frame, fde_addr)
    }

    fn rule_at(instrs: &[u8], pc: usize) -> Rule {
        let base = 0x10_0000;
        let (frame, fde_addr) = with_fde(0x40_0000, 0x100, instrs, base);
        let at = |a: usize| frame.get(a - base..);
        let fde = &frame[fde_addr - base..];
        rule_from_fde(fde, fde_addr, pc, |a| {
            let e = at(a)?;
            let len = u32::from_le_bytes(e.get(..4)?.try_into().ok()?) as usize;
            e.get(..4 + len)
        })
    }

    /// push rbp; mov rbp, rsp; ...; leave; ret, with gcc's CFI.
    const RBP_FRAME: &[u8] = &[
        0x41, // advance 1 (after push rbp)
        0x0e, 16, // def_cfa_offset 16
        0x86, 2,    // rbp at CFA - 16
        0x43, // advance 3 (after mov rbp, rsp)
        0x0d, 6,    // def_cfa_register rbp
        0x4a, // advance 10
        0x0a, // remember_state
        0x0c, 7, 8,    // def_cfa rsp, 8 (after leave)
        0x41, // advance 1
        0x0b, // restore_state
    ];

    #[test]
    fn rows_follow_the_instructions() {
        let base = 0x40_0000;
        assert_eq!(
            rule_at(RBP_FRAME, base),
            Rule::Frame {
                cfa_rbp: false,
                cfa_off: 8,
                rbp_off: None
            }
        );
        assert_eq!(
            rule_at(RBP_FRAME, base + 1),
            Rule::Frame {
                cfa_rbp: false,
                cfa_off: 16,
                rbp_off: Some(-16)
            }
        );
        let framed = Rule::Frame {
            cfa_rbp: true,
            cfa_off: 16,
            rbp_off: Some(-16),
        };
        assert_eq!(rule_at(RBP_FRAME, base + 4), framed);
        assert_eq!(rule_at(RBP_FRAME, base + 13), framed);
        assert_eq!(
            rule_at(RBP_FRAME, base + 14),
            Rule::Frame {
                cfa_rbp: false,
                cfa_off: 8,
                rbp_off: Some(-16)
            }
        );
        assert_eq!(rule_at(RBP_FRAME, base + 15), framed, "restore_state");
        assert_eq!(
            rule_at(RBP_FRAME, base + 0x100),
            Rule::Unknown,
            "past the FDE"
        );
        assert_eq!(
            rule_at(RBP_FRAME, base - 1),
            Rule::Unknown,
            "before the FDE"
        );
    }

    #[test]
    fn what_a_rule_cannot_express_is_unknown_and_undefined_ra_is_outermost() {
        let pc = 0x40_0010;
        // DW_CFA_def_cfa_expression (PLT entries).
        assert_eq!(rule_at(&[0x0f, 1, 0x77], pc), Rule::Unknown);
        // rbp kept in another register.
        assert_eq!(rule_at(&[0x09, 6, 3], pc), Rule::Unknown);
        // CFA from r10 (stack realignment with a DRAP register).
        assert_eq!(rule_at(&[0x0c, 10, 0], pc), Rule::Unknown);
        // An opcode that does not exist.
        assert_eq!(rule_at(&[0x3f], pc), Rule::Unknown);
        // restore_state without remember_state; too many remember_states.
        assert_eq!(rule_at(&[0x0b], pc), Rule::Unknown);
        assert_eq!(rule_at(&[0x0a; 9], pc), Rule::Unknown);
        // Truncated operands.
        assert_eq!(rule_at(&[0x0c, 7], pc), Rule::Unknown);
        assert_eq!(rule_at(&[0x07, 16], pc), Rule::Outermost);
        // Other registers' rules are skipped.
        assert_eq!(
            rule_at(&[0x83, 3, 0x10, 12, 2, 0x70, 0, 0x0e, 24], pc),
            Rule::Frame {
                cfa_rbp: false,
                cfa_off: 24,
                rbp_off: None
            }
        );
    }

    #[test]
    fn the_header_table_is_searched_for_the_last_start_at_or_below_pc() {
        let hdr = 0x1000usize;
        let mut table = Vec::new();
        for (loc, fde) in [(0x100i32, 0x10i32), (0x200, 0x20), (0x300, 0x30)] {
            table.extend(loc.to_le_bytes());
            table.extend(fde.to_le_bytes());
        }
        assert_eq!(search_table(&table, hdr, hdr + 0xff), None);
        assert_eq!(search_table(&table, hdr, hdr + 0x100), Some(hdr + 0x10));
        assert_eq!(search_table(&table, hdr, hdr + 0x2ff), Some(hdr + 0x20));
        assert_eq!(search_table(&table, hdr, hdr + 0x9999), Some(hdr + 0x30));
        let head = [1, 0x1b, 0x03, 0x3b, 0, 0, 0, 0, 3, 0, 0, 0];
        assert_eq!(hdr_len(&head), Some(12));
        assert_eq!(hdr_len(&[1, 0x1b, 0x01, 0x3b]), None, "uleb128 count");
        assert_eq!(hdr_table(&head, hdr), Some((hdr + 12, 3)));
        assert_eq!(
            hdr_table(&[1, 0x1b, 0x03, 0x03, 0, 0, 0, 0, 3, 0, 0, 0], hdr),
            None
        );
    }

    #[test]
    fn rules_survive_the_cache() {
        for rule in [
            Rule::Outermost,
            Rule::Unknown,
            Rule::Frame {
                cfa_rbp: true,
                cfa_off: 16,
                rbp_off: Some(-16),
            },
            Rule::Frame {
                cfa_rbp: false,
                cfa_off: 8 * 16383,
                rbp_off: Some(-8 * 8191),
            },
        ] {
            assert_eq!(pack(rule).map(unpack), Some(rule));
        }
        let odd = Rule::Frame {
            cfa_rbp: false,
            cfa_off: 12,
            rbp_off: None,
        };
        assert_eq!(pack(odd), None);
        // Two addresses in the same set both stay; a third evicts the oldest.
        let (a, b, c) = (
            0x7f00_0000_0123,
            0x7f00_0000_0123 + SETS,
            0x7f00_0000_0123 + 2 * SETS,
        );
        cache_put(a, Rule::Outermost);
        cache_put(b, Rule::Unknown);
        assert_eq!(cache_get(a), Some(Rule::Outermost));
        assert_eq!(cache_get(b), Some(Rule::Unknown));
        cache_put(c, Rule::Outermost);
        assert_eq!(cache_get(a), None);
        assert_eq!(cache_get(c), Some(Rule::Outermost));
        assert_eq!(cache_get(1 << 50), None);
    }
}
