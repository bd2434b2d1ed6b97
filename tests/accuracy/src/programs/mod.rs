//! The corpus generators. Each models how a kind of real program uses GPU memory, writes the
//! history from its own accounting, and knows its truth. None of them reads the detectors.

pub mod caching;
pub mod cuda;
pub mod torch;
pub mod writer;
