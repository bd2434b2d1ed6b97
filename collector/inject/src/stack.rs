//! The stack of an allocation, as a callback captures it: the native walk ([`crate::unwind`]),
//! the modules it passes through made known to the collector ([`crate::modules`]), and in a
//! Python program the Python frames in place of the interpreter frames that ran them
//! ([`crate::python`]).

use crate::event::MAX_FRAMES;
use crate::state::{self, State};

/// Captures the caller's stack (up to the configured depth) into `out`; returns the number of
/// frames. Callback-safe: no allocation, no locks.
#[inline]
pub fn capture(st: &State, out: &mut [u64; MAX_FRAMES]) -> usize {
    let n = crate::unwind::capture(
        &mut out[..st.stack_depth],
        &st.skip_ranges(),
        st.unwind,
        state::stack_top(),
    );
    crate::modules::note_frames(st, &out[..n]);
    if n == 0 {
        return 0;
    }
    crate::python::add_frames(st, out, n)
}
