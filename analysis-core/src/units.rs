//! Human units: bytes (KiB/MiB/GiB) and durations (ns/µs/ms/s), for the CLI and the viewer,
//! and parsing of byte sizes given by people (`512MiB`, `2GB`, `1.5 GiB`).

use alloc::format;
use alloc::string::String;

/// Formats bytes with binary units, three significant digits: `1.50 GiB`, `512 B`.
pub fn fmt_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut u = 0;
    // A value that would round to 1024 reads as 1.00 of the next unit.
    while v >= 1023.5 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    // Decimals by the rounded value: 99.96 reads "100", not "100.0".
    if v >= 99.95 {
        format!("{v:.0} {}", UNITS[u])
    } else if v >= 9.995 {
        format!("{v:.1} {}", UNITS[u])
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Formats a signed byte delta: `+4.00 MiB`, `-512 B`.
pub fn fmt_bytes_signed(bytes: i64) -> String {
    let sign = if bytes < 0 { "-" } else { "+" };
    format!("{sign}{}", fmt_bytes(bytes.unsigned_abs()))
}

/// Formats nanoseconds: `850 ns`, `12.500 µs` (`12 µs` when whole), `3.20 ms`, `1.50 s`,
/// `2 min 5 s`, `2 h 5 min`.
pub fn fmt_duration(nanos: u64) -> String {
    let n = nanos as f64;
    if nanos < 1_000 {
        format!("{nanos} ns")
    } else if nanos < 1_000_000 {
        format!("{:.3} µs", n / 1e3).replace(".000", "")
    } else if nanos < 1_000_000_000 {
        format!("{:.2} ms", n / 1e6)
    } else if nanos < 120_000_000_000 {
        format!("{:.2} s", n / 1e9)
    } else {
        let s = nanos / 1_000_000_000;
        if s < 7200 {
            format!("{} min {} s", s / 60, s % 60)
        } else {
            format!("{} h {} min", s / 3600, (s % 3600) / 60)
        }
    }
}

/// Why a byte size did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseBytesError {
    #[error("empty size: give a number with an optional unit, e.g. 512MiB or 2GB")]
    Empty,
    #[error(
        "`{0}` is not a size: give a number with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 512MiB"
    )]
    Invalid(String),
    #[error("`{0}` is too large")]
    Overflow(String),
}

/// Parses `123`, `512MiB`, `2GB`, `1.5 GiB`, `64k` (k/m/g/t alone mean binary units).
pub fn parse_bytes(input: &str) -> Result<u64, ParseBytesError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(ParseBytesError::Empty);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let unit = unit.trim();
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        _ => return Err(ParseBytesError::Invalid(input.into())),
    };
    if num.is_empty() || num.matches('.').count() > 1 {
        return Err(ParseBytesError::Invalid(input.into()));
    }
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    let int: u64 = if int_part.is_empty() {
        0
    } else {
        int_part
            .parse()
            .map_err(|_| ParseBytesError::Overflow(input.into()))?
    };
    let mut total = int
        .checked_mul(mult)
        .ok_or_else(|| ParseBytesError::Overflow(input.into()))?;
    if !frac_part.is_empty() {
        let digits = frac_part.len().min(18) as u32;
        let frac: u64 = frac_part[..digits as usize]
            .parse()
            .map_err(|_| ParseBytesError::Invalid(input.into()))?;
        let scale = 10u128.pow(digits);
        total = total
            .checked_add((u128::from(frac) * u128::from(mult) / scale) as u64)
            .ok_or_else(|| ParseBytesError::Overflow(input.into()))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(1536), "1.50 KiB");
        assert_eq!(fmt_bytes(100 << 20), "100 MiB");
        assert_eq!(fmt_bytes(3 << 30), "3.00 GiB");
        assert_eq!(fmt_bytes(1_048_065), "1.00 MiB");
        assert_eq!(fmt_bytes((1 << 20) - 1), "1.00 MiB");
        assert_eq!(fmt_bytes(102_360), "100 KiB");
        assert_eq!(fmt_bytes(10_234), "9.99 KiB");
        assert_eq!(fmt_duration(850), "850 ns");
        assert_eq!(fmt_duration(12_500), "12.500 µs");
        assert_eq!(fmt_duration(3_200_000), "3.20 ms");
        assert_eq!(fmt_duration(1_500_000_000), "1.50 s");
        assert_eq!(fmt_bytes_signed(-2048), "-2.00 KiB");
    }

    #[test]
    fn parses() {
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("64k"), Ok(65536));
        assert_eq!(parse_bytes("17"), Ok(17));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("99999999999999TiB").is_err());
        assert!(parse_bytes("1.2.3MB").is_err());
    }
}
