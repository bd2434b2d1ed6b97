//! analysis-core: the gpucollect trace format, push decoder, replay model and detectors.
#![no_std]
extern crate alloc;
