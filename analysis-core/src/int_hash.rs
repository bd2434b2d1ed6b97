//! Maps keyed by integers, hashed with one multiply per word.

use hashbrown::HashMap;

/// A hasher for integer keys (addresses, indexes, hashes of values): one multiply
/// per word, no 128-bit arithmetic (WebAssembly has none: the default hasher's folded multiply
/// becomes a library call there). Keys come from the input, but keys made to collide only slow
/// down their own conversion or parse; memory stays bounded.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IntHasher(u64);

impl IntHasher {
    #[inline(always)]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0xf135_7aea_2e62_a9c5);
    }
}

impl core::hash::Hasher for IntHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.add(u64::from(b));
        }
    }
    #[inline(always)]
    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }
    #[inline(always)]
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }
    #[inline(always)]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }
    #[inline(always)]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
    #[inline(always)]
    fn finish(&self) -> u64 {
        // The product's high bits depend on every bit of the key: bring them to the low bits
        // (the bucket) and to the top 7 (the tag).
        self.0.rotate_left(26)
    }
}

pub(crate) type IntMap<K, V> = HashMap<K, V, core::hash::BuildHasherDefault<IntHasher>>;
pub(crate) type IntSet<K> = hashbrown::HashSet<K, core::hash::BuildHasherDefault<IntHasher>>;
