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

/// Load bias and end of the highest segment (relative to the bias) of the ELF file at `path`
/// whose offset-0 mapping starts at `start`. `None` for non-ELF files.
pub fn load_bias(path: &str, start: u64) -> Option<(u64, u64)> {
    let mut head = vec![0u8; 64 * 1024];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
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
    for i in 0..phnum {
        let p = phoff + i * phentsize;
        if u32_at(p)? != 1 {
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
    Some((bias, end))
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
        let (bias, end) = load_bias(&exe, *start).expect("ELF");
        let here = own_executable_is_mapped_and_its_bias_is_consistent as *const () as u64;
        assert!(
            bias <= here && here < bias + end,
            "{bias:#x} {end:#x} {here:#x}"
        );
    }
}
