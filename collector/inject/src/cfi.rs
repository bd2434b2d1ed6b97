//! x86-64 call-frame information (CFI, `.eh_frame`) reduced to the one rule a stack walk needs
//! per code address, and a lock-free cache of those rules.
//!
//! A [`Rule`] says where a frame's caller state is: CFA = rsp or rbp + offset, the return
//! address at CFA - 8, rbp saved at CFA + k or unchanged. It is found by
//! - `_dl_find_object` (glibc >= 2.35, lock-free) giving the object's `PT_GNU_EH_FRAME`
//!   segment (`.eh_frame_hdr`),
//! - a binary search of that header's sorted table for the FDE,
//! - gimli parsing the FDE and its CIE and running their CFA instructions up to the address,
//!   with its unwind state in fixed arrays ([`FixedStorage`]: remember/restore stack of
//!   [`STATE_STACK`] rows): no allocation, no lock.
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
    let Some(fde_len) = entry_len(fde_addr, &obj.map) else {
        return Rule::Unknown;
    };
    // SAFETY: an FDE's second word is its CIE pointer; `entry_len` checked that the FDE's
    // `fde_len` bytes lie in the object's mapping.
    let cie_ptr = unsafe { ((fde_addr + 4) as *const u32).read() } as usize;
    let cie_addr = (fde_addr + 4).wrapping_sub(cie_ptr);
    let fde_end = fde_addr + fde_len;
    if cie_ptr == 0 || cie_addr >= fde_addr || entry_len(cie_addr, &obj.map).is_none() {
        return Rule::Unknown;
    }
    // SAFETY: the CIE and the FDE are entries of the object's `.eh_frame` section, which is
    // contiguous and mapped whole (read-only, for as long as the object is loaded): every byte
    // from the CIE to the FDE's end is part of it, and lies in the object's mapping.
    let section = unsafe { core::slice::from_raw_parts(cie_addr as *const u8, fde_end - cie_addr) };
    rule_in_section(section, cie_addr, fde_addr - cie_addr, pc)
}

/// Bytes of the CIE or FDE at `addr` (its length field included), if it lies in `map`.
fn entry_len(addr: usize, map: &core::ops::Range<usize>) -> Option<usize> {
    if addr == 0 || !addr.is_multiple_of(4) || !map.contains(&addr) || map.end - addr < 8 {
        return None;
    }
    // SAFETY: addr is an FDE address from the object's .eh_frame_hdr table, or a CIE address
    // computed from such an FDE, inside the object's mapping; every entry starts with a 4-byte
    // length.
    let len = unsafe { (addr as *const u32).read() } as usize;
    if len == 0 || len == 0xffff_ffff || len > MAX_ENTRY_BYTES || map.end - addr < 4 + len {
        return None;
    }
    Some(4 + len)
}

const DW_EH_PE_OMIT: u8 = 0xff;
/// `DW_EH_PE_datarel | DW_EH_PE_sdata4`: the only table encoding searched.
const TABLE_ENC: u8 = 0x3b;

/// Bytes of a value in the pointer encoding `enc` (its format, the low 4 bits); `None` for
/// variable-length formats (LEB128).
fn encoded_size(enc: u8) -> Option<usize> {
    match enc & 0x0f {
        _ if enc == DW_EH_PE_OMIT => Some(0),
        0x02 | 0x0a => Some(2),
        0x03 | 0x0b => Some(4),
        0x00 | 0x04 | 0x0c => Some(8),
        _ => None,
    }
}

/// Length of the head of `.eh_frame_hdr` (header, eh_frame pointer, entry count), from its first
/// 4 bytes; `None` for encodings whose size is not fixed.
fn hdr_len(first: &[u8]) -> Option<usize> {
    Some(4 + encoded_size(*first.get(1)?)? + encoded_size(*first.get(2)?)?)
}

/// Parses the head of `.eh_frame_hdr` at `hdr_addr`: (address of the search table, entries).
fn hdr_table(head: &[u8], hdr_addr: usize) -> Option<(usize, usize)> {
    let &[version, ptr_enc, count_enc, table_enc] = head.first_chunk::<4>()?;
    // The count is a plain number: no pc-relative or other application, not indirect.
    if version != 1 || count_enc == DW_EH_PE_OMIT || count_enc & 0xf0 != 0 {
        return None;
    }
    if table_enc != TABLE_ENC {
        return None;
    }
    let at = 4 + encoded_size(ptr_enc)?;
    let field = head.get(at..at + encoded_size(count_enc)?)?;
    let count = match *field {
        [a, b] => u64::from(u16::from_le_bytes([a, b])),
        [a, b, c, d] => u64::from(u32::from_le_bytes([a, b, c, d])),
        _ => u64::from_le_bytes(field.try_into().ok()?),
    };
    // A sanity bound: 16 M functions in one object (also refuses negative signed counts).
    if count == 0 || count > 1 << 24 {
        return None;
    }
    Some((hdr_addr + head.len(), count as usize))
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

/// Register rules gimli keeps per row. x86-64 code saves at most rbx, rbp, r12–r15 and the
/// return address; CFI that names more registers is left to libgcc (`TooManyRegisterRules`).
const MAX_RULES: usize = 16;

/// gimli's unwind state in fixed arrays, so that running CFA instructions never allocates: rows
/// of [`MAX_RULES`] rules, and a row stack for the current row, [`STATE_STACK`] remembered ones
/// and, when the CIE sets more than one rule, its initial rules (then one remembered row less).
/// About 5 KiB of the callback's stack, only while a rule is looked up.
struct FixedStorage;

impl<T: gimli::ReaderOffset> gimli::UnwindContextStorage<T> for FixedStorage {
    type Rules = [(gimli::Register, gimli::RegisterRule<T>); MAX_RULES];
    type Stack = [gimli::UnwindTableRow<T, Self>; STATE_STACK + 1];
}

/// The rule for `pc` from the FDE at `fde_offset` of `section`, a piece of `.eh_frame` that
/// starts with the FDE's CIE and is mapped at `section_addr`. gimli parses the CIE and FDE and
/// runs their CFA instructions (with [`FixedStorage`]: no allocation, no lock). `Unknown` when
/// pc is outside the FDE or anything is not understood.
fn rule_in_section(section: &[u8], section_addr: usize, fde_offset: usize, pc: usize) -> Rule {
    use gimli::UnwindSection as _;
    let eh_frame = gimli::EhFrame::new(section, gimli::LittleEndian);
    let bases = gimli::BaseAddresses::default().set_eh_frame(section_addr as u64);
    let Ok(fde) = eh_frame.fde_from_offset(
        &bases,
        gimli::EhFrameOffset(fde_offset),
        gimli::EhFrame::cie_from_offset,
    ) else {
        return Rule::Unknown;
    };
    // A signal frame: the caller's pc is not a return address. Leave it to libgcc.
    if fde.cie().is_signal_trampoline() || !fde.contains(pc as u64) {
        return Rule::Unknown;
    }
    let mut ctx = gimli::UnwindContext::<usize, FixedStorage>::new_in();
    match fde.unwind_info_for_address(&eh_frame, &bases, &mut ctx, pc as u64) {
        Ok(row) => rule_of_row(row, fde.cie().return_address_register()),
        Err(_) => Rule::Unknown,
    }
}

/// A row of the CFI table as a [`Rule`]: only the CFA, rbp and the return address matter.
fn rule_of_row(row: &gimli::UnwindTableRow<usize, FixedStorage>, ra: gimli::Register) -> Rule {
    use gimli::{CfaRule, RegisterRule, X86_64};
    match row.register(ra) {
        // No rule at all, or DW_CFA_undefined: the outermost frame.
        RegisterRule::Undefined => return Rule::Outermost,
        RegisterRule::Offset(-8) => {}
        _ => return Rule::Unknown,
    }
    let CfaRule::RegisterAndOffset { register, offset } = *row.cfa() else {
        return Rule::Unknown;
    };
    if register != X86_64::RSP && register != X86_64::RBP {
        return Rule::Unknown;
    }
    let rbp_off = match row.register(X86_64::RBP) {
        RegisterRule::Undefined | RegisterRule::SameValue => None,
        RegisterRule::Offset(o) => Some(o),
        _ => return Rule::Unknown,
    };
    Rule::Frame {
        cfa_rbp: register == X86_64::RBP,
        cfa_off: offset,
        rbp_off,
    }
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
        rule_in_section(&frame, base, fde_addr - base, pc)
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
    fn looking_up_rules_in_loaded_objects_allocates_nothing() {
        crate::objects::resolve_find_object();
        if !crate::objects::can_find_objects() {
            eprintln!("skipped: this glibc has no _dl_find_object");
            return;
        }
        // Code addresses in this test binary (Rust code) and in libc (C code), one byte into
        // each function: after its first instruction, inside its FDE.
        let pcs = [
            looking_up_rules_in_loaded_objects_allocates_nothing as *const () as usize + 1,
            rule_in_section as *const () as usize + 1,
            libc::getpid as *const () as usize + 1,
        ];
        let before = crate::test_alloc::count();
        let rules = pcs.map(lookup);
        assert_eq!(crate::test_alloc::count(), before, "lookup allocated");
        assert!(
            rules.iter().all(|r| matches!(r, Rule::Frame { .. })),
            "{rules:?}"
        );
        // The counter sees allocations of this thread.
        let v = std::hint::black_box(vec![0u8; 16]);
        assert!(crate::test_alloc::count() > before, "{}", v.len());
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
