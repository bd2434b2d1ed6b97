//! gpucollect-accuracy: the yardstick for gpucollect's findings.
//!
//! It owns a realistic corpus of GPU memory histories, each with labelled truth (healthy, or a
//! planted cause with its class, the user's line and exact bytes), and the scorer that runs
//! `analysis_core::analyze` on each and reports precision, recall, "first finding right" and
//! "healthy with no alarm". The generators model how real programs use memory (a PyTorch
//! caching allocator under a training loop, CUDA C++ programs, multi-process runs, other
//! processes on the device) from their own accounting; they never look at the detectors, and
//! nothing here is tuned to them. `baseline.json` records today's verdicts so CI fails on a
//! regression (`tests/corpus.rs`).
//!
//! It also exports the same runs for the peer comparison with stormlog ([`peer`]).

pub mod corpus;
pub mod corpus_cpp;
pub mod peer;
pub mod programs;
pub mod run;
pub mod scenario;
pub mod score;

pub use scenario::{Call, Cause, Class, DeviceSample, History, Scenario, Truth};
