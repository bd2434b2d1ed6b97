//! Maps keyed by integers, hashed with rustc-hash's `FxHasher`: one add and one multiply per
//! machine word, no 128-bit arithmetic for integer keys (WebAssembly has none: the default
//! hasher's folded multiply becomes a library call there). Keys come from the input, but keys
//! made to collide only slow down their own conversion or parse; memory stays bounded.

use hashbrown::HashMap;

/// The hasher of [`IntMap`] and [`IntSet`], also used on its own for content hashes.
pub(crate) type IntHasher = rustc_hash::FxHasher;

pub(crate) type IntMap<K, V> = HashMap<K, V, rustc_hash::FxBuildHasher>;
pub(crate) type IntSet<K> = hashbrown::HashSet<K, rustc_hash::FxBuildHasher>;
