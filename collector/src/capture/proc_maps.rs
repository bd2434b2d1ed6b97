//! Reading a live process's file mappings (`/proc/<pid>/maps`) and an ELF file's load layout,
//! to place modules the process loaded after the injection library sent its module table.

use std::io::Read;

/// (path, lowest start address) of every file-backed mapping with file offset 0.
pub fn file_mappings(pid: u32) -> Vec<(String, u64)> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    let mut out: Vec<(String, u64)> = Vec::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(_perms), Some(offset), Some(_dev), Some(_inode)) =
            (it.next(), it.next(), it.next(), it.next(), it.next())
        else {
            continue;
        };
        let path = it.collect::<Vec<_>>().join(" ");
        if !path.starts_with('/') || u64::from_str_radix(offset, 16) != Ok(0) {
            continue;
        }
        let Some(start) = range
            .split('-')
            .next()
            .and_then(|s| u64::from_str_radix(s, 16).ok())
        else {
            continue;
        };
        match out.iter_mut().find(|(p, _)| *p == path) {
            Some((_, s)) => *s = (*s).min(start),
            None => out.push((path, start)),
        }
    }
    out
}

/// Where an ELF file is loaded, and its build id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfLayout {
    pub bias: u64,
    /// End of the highest segment, relative to the bias.
    pub end: u64,
    /// The GNU build id (empty when the file has none).
    pub build_id: Vec<u8>,
}

/// The layout of the ELF file at `path` whose offset-0 mapping starts at `start`. `None` for
/// non-ELF files.
pub fn load_layout(path: &str, start: u64) -> Option<ElfLayout> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut head = vec![0u8; 64 * 1024];
    let n = file.read(&mut head).ok()?;
    let h = &head[..n];
    if h.len() < 64 || &h[..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return None; // 64-bit little-endian ELF only
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(h.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(h.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(h.get(o..o + 8)?.try_into().ok()?));
    let e_type = u16_at(16)?;
    let phoff = u64_at(0x20)? as usize;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    let mut first_vaddr = None;
    let mut end = 0u64;
    let mut build_id = Vec::new();
    for i in 0..phnum {
        let p = phoff + i * phentsize;
        let p_type = u32_at(p)?;
        if p_type == 4 && build_id.is_empty() {
            // PT_NOTE: p_offset at +8, p_filesz at +32.
            let (off, size) = (u64_at(p + 8)?, u64_at(p + 32)?.min(64 * 1024));
            let notes = match h.get(off as usize..(off + size) as usize) {
                Some(n) => n.to_vec(),
                None => read_at(&mut file, off, size as usize).unwrap_or_default(),
            };
            build_id = gnu_build_id(&notes);
        }
        if p_type != 1 {
            continue; // PT_LOAD only
        }
        let vaddr = u64_at(p + 16)?;
        let memsz = u64_at(p + 40)?;
        first_vaddr.get_or_insert(vaddr);
        end = end.max(vaddr + memsz);
    }
    let first = first_vaddr? & !0xfff;
    let bias = if e_type == 2 {
        0
    } else {
        start.wrapping_sub(first)
    };
    Some(ElfLayout {
        bias,
        end,
        build_id,
    })
}

fn read_at(file: &mut std::fs::File, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    use std::io::{Seek, SeekFrom};
    file.seek(SeekFrom::Start(offset))?;
    let mut buf = vec![0u8; len];
    file.read_exact(&mut buf)?;
    Ok(buf)
}

/// The descriptor of the `NT_GNU_BUILD_ID` note in a PT_NOTE segment (empty if none).
fn gnu_build_id(mut notes: &[u8]) -> Vec<u8> {
    let word = |b: &[u8], o: usize| -> Option<usize> {
        Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?) as usize)
    };
    while let (Some(namesz), Some(descsz), Some(ty)) =
        (word(notes, 0), word(notes, 4), word(notes, 8))
    {
        let name_end = 12 + namesz.div_ceil(4) * 4;
        let desc_end = name_end + descsz.div_ceil(4) * 4;
        if ty == 3 && notes.get(12..12 + namesz) == Some(b"GNU\0".as_slice()) {
            return notes
                .get(name_end..name_end + descsz)
                .map(<[u8]>::to_vec)
                .unwrap_or_default();
        }
        match notes.get(desc_end..) {
            Some(rest) if desc_end > 0 => notes = rest,
            _ => break,
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_executable_is_mapped_and_its_bias_is_consistent() {
        let exe = std::fs::read_link("/proc/self/exe").expect("exe");
        let exe = exe.display().to_string();
        let maps = file_mappings(std::process::id());
        let (_, start) = maps.iter().find(|(p, _)| *p == exe).expect("exe mapped");
        let l = load_layout(&exe, *start).expect("ELF");
        let here = own_executable_is_mapped_and_its_bias_is_consistent as *const () as u64;
        assert!(
            l.bias <= here && here < l.bias + l.end,
            "{:#x} {:#x} {here:#x}",
            l.bias,
            l.end
        );
    }

    #[test]
    fn build_id_matches_the_one_the_toolchain_wrote() {
        // libc is built with a build id; `file`-style check against its .note.gnu.build-id.
        let maps = file_mappings(std::process::id());
        let (path, start) = maps
            .iter()
            .find(|(p, _)| p.contains("libc.so"))
            .expect("libc mapped");
        let l = load_layout(path, *start).expect("ELF");
        assert_eq!(l.build_id.len(), 20, "{path}: {:02x?}", l.build_id);
        // The same bytes, read independently through the section header table by readelf.
        let out = std::process::Command::new("readelf")
            .args(["-n", path])
            .output()
            .expect("readelf (binutils) is installed");
        let text = String::from_utf8_lossy(&out.stdout);
        let hex: String = l.build_id.iter().map(|b| format!("{b:02x}")).collect();
        assert!(text.contains(&format!("Build ID: {hex}")), "{text}");
    }

    #[test]
    fn notes_without_a_build_id_give_none() {
        let mut n = Vec::new();
        n.extend_from_slice(&4u32.to_le_bytes());
        n.extend_from_slice(&4u32.to_le_bytes());
        n.extend_from_slice(&1u32.to_le_bytes()); // NT_GNU_ABI_TAG
        n.extend_from_slice(b"GNU\0");
        n.extend_from_slice(&[0, 0, 0, 0]);
        assert!(gnu_build_id(&n).is_empty());
        assert!(gnu_build_id(&[1, 2, 3]).is_empty());
    }
}
