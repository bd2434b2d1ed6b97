//! Trace ids: 128 random bits as 32 lowercase hex digits. Unguessable, and validated before any
//! use so that no request can name a path outside the store.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceId(String);

#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a trace id: ids are 32 lowercase hexadecimal digits")]
pub struct BadId(pub String);

impl TraceId {
    /// A fresh id from the operating system's random source.
    pub fn random() -> anyhow::Result<Self> {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b)
            .map_err(|e| anyhow::anyhow!("cannot read the system's random source: {e}"))?;
        Ok(Self(b.iter().map(|x| format!("{x:02x}")).collect()))
    }

    pub fn parse(s: &str) -> Result<Self, BadId> {
        if s.len() == 32 && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
            Ok(Self(s.to_owned()))
        } else {
            // Keep hostile input out of messages and logs beyond a short, printable prefix.
            let shown: String = s
                .chars()
                .take(40)
                .map(|c| if c.is_ascii_graphic() { c } else { '?' })
                .collect();
            Err(BadId(shown))
        }
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_random_hex_and_validated() {
        let a = TraceId::random().expect("random");
        let b = TraceId::random().expect("random");
        assert_ne!(a, b);
        assert_eq!(TraceId::parse(&a.to_string()).expect("valid"), a);
        for bad in [
            "",
            "../../etc/passwd",
            "0123456789abcdef0123456789abcdeF",
            "0123456789abcdef0123456789abcde",
            "0123456789abcdef0123456789abcdef0",
            "0123456789abcdef/123456789abcdef",
            "%2e%2e%2f",
        ] {
            assert!(TraceId::parse(bad).is_err(), "{bad}");
        }
    }
}
