//! A [`Loader`] in two halves, for a front end that decodes on one thread and replays on
//! another: [`LoadDecoder`] turns pushed bytes into [`Decoded`] batches of records,
//! [`LoadReplay`] replays them into the model. This crate starts no threads; the halves are
//! `Send`, and what goes between them is the batch. Each record is decoded and replayed
//! exactly as [`Loader::push`] does it, so the model is the same; only a replay stopped by the
//! model's budget ([`DecodeError::TooDense`]) or by its caller may leave the decoder further on
//! than the fused loader would have been (the bytes counted are those replayed; warnings of the
//! records decoded past the stop are kept).

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::decode::{DecodeError, Decoder, Hot};
use crate::format::{Header, Record};
use crate::join::{Join, Sequential};
use crate::model::{LoadedTrace, Loader, TraceModel, finish_load, over_budget};
use crate::packed::Spill;

/// Records decoded from pushed bytes, in input order, with the header once it is known: what
/// [`LoadDecoder::push`] fills and [`LoadReplay::replay`] reads. Reused batch after batch
/// ([`Decoded::clear`]), it keeps its capacity.
#[derive(Debug, Default)]
pub struct Decoded {
    /// Set in the first batch after the header was decoded.
    header: Option<Header>,
    records: Vec<Item>,
}

#[derive(Debug)]
enum Item {
    /// An alloc, free or range record from the decoder's straight-line path, its offset and
    /// the offset just past it.
    Hot(Hot, u64, u64),
    /// Any other record (rare: definitions, samples, marks), boxed so that the common item
    /// stays small; taken when replayed.
    Other(Option<Box<Record>>, u64, u64),
}

impl Decoded {
    /// A batch with room for `records` records.
    pub fn with_capacity(records: usize) -> Self {
        Self {
            header: None,
            records: Vec::with_capacity(records),
        }
    }

    /// Records in the batch.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Neither a record nor the header: nothing for the replay.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.header.is_none()
    }

    /// Empties the batch, keeping its capacity.
    pub fn clear(&mut self) {
        self.header = None;
        self.records.clear();
    }
}

/// The decoding half of a split load.
#[derive(Debug, Default)]
pub struct LoadDecoder {
    decoder: Decoder,
    header_given: bool,
}

impl LoadDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Pushes bytes and appends every complete record to `out`, the header first once it is
    /// known. Returns the error that stopped decoding, if it stopped; the records before it
    /// are in `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Decoded) -> Result<(), DecodeError> {
        self.decoder.push(bytes);
        loop {
            if self.header_given {
                self.decoder.hot_records(
                    #[inline(always)]
                    |rec, offset, end| {
                        out.records.push(Item::Hot(rec, offset, end));
                        true
                    },
                );
            }
            let offset = self.decoder.bytes_consumed();
            let next = self.decoder.next_record();
            self.give_header(out);
            match next {
                Ok(Some(rec)) => {
                    let end = self.decoder.bytes_consumed();
                    out.records
                        .push(Item::Other(Some(Box::new(rec)), offset, end));
                }
                Ok(None) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    fn give_header(&mut self, out: &mut Decoded) {
        if !self.header_given
            && let Some(h) = self.decoder.header()
        {
            out.header = Some(h.clone());
            self.header_given = true;
        }
    }

    pub fn bytes_consumed(&self) -> u64 {
        self.decoder.bytes_consumed()
    }

    pub fn records_decoded(&self) -> u64 {
        self.decoder.records_decoded()
    }
}

/// The replaying half of a split load.
#[derive(Debug, Default)]
pub struct LoadReplay {
    model: Option<TraceModel>,
    /// Set when the model went over its budget: the error and the offset just past the record
    /// that took it over.
    stopped: Option<(DecodeError, u64)>,
    /// The offset just past the last record replayed.
    replayed_to: u64,
    spill: Option<Arc<dyn Spill>>,
}

impl LoadReplay {
    pub fn new() -> Self {
        Self::default()
    }

    /// A replay whose model sends its history's full chunks to `spill`
    /// ([`Loader::with_spill`]).
    pub fn with_spill(spill: Arc<dyn Spill>) -> Self {
        Self {
            spill: Some(spill),
            ..Self::default()
        }
    }

    /// Replays a batch and empties it (keeping its capacity). Returns
    /// [`DecodeError::TooDense`] once the model is over its budget; nothing more is replayed
    /// after that.
    pub fn replay(&mut self, batch: &mut Decoded) -> Result<(), DecodeError> {
        if let Some((e, _)) = &self.stopped {
            return Err(e.clone());
        }
        if self.model.is_none()
            && let Some(h) = batch.header.take()
        {
            self.model = Some(Loader::model_for(h, self.spill.as_ref()));
        }
        let Some(model) = self.model.as_mut() else {
            batch.clear();
            return Ok(());
        };
        // Read in place (an item is 96 bytes: moving each out of the vector costs a copy).
        let mut stop = None;
        for item in &mut batch.records {
            let end = match item {
                Item::Hot(rec, offset, end) => {
                    model.observe_hot(rec, *offset);
                    *end
                }
                Item::Other(rec, offset, end) => {
                    if let Some(rec) = rec.take() {
                        model.observe(*rec, *offset);
                    }
                    *end
                }
            };
            self.replayed_to = end;
            if let Some(e) = over_budget(model, end) {
                stop = Some(e);
                break;
            }
        }
        batch.records.clear();
        match stop {
            Some(e) => {
                self.stopped = Some((e.clone(), self.replayed_to));
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// The offset just past the last record replayed.
    pub fn bytes_replayed(&self) -> u64 {
        self.replayed_to
    }

    /// The model's heap so far, less what its spill holds ([`Loader::model_heap_bytes`]).
    pub fn model_heap_bytes(&self) -> u64 {
        self.model
            .as_ref()
            .map_or(0, TraceModel::resident_heap_estimate)
    }

    /// Records replayed so far.
    pub fn records_replayed(&self) -> u64 {
        self.model.as_ref().map_or(0, |m| m.records)
    }

    /// Ends the load, with the decoding half that fed it. Fails only when not even the header
    /// could be read. Where the replay stopped before the decoder (over its budget, or its
    /// caller stopped giving it batches), the bytes read are those replayed, and a decoding
    /// error past them is not reported.
    pub fn finish(self, decoder: LoadDecoder) -> Result<LoadedTrace, DecodeError> {
        self.finish_with(decoder, &Sequential)
    }

    /// [`Self::finish`], the model finished through `join` ([`TraceModel::finish_with`]).
    pub fn finish_with(
        self,
        decoder: LoadDecoder,
        join: &impl Join,
    ) -> Result<LoadedTrace, DecodeError> {
        let all_replayed = self.records_replayed() == decoder.records_decoded();
        let mut d = decoder.decoder;
        let warnings = d.finish()?;
        let (fatal, bytes) = match self.stopped {
            Some((e, at)) => (Some(e), at),
            None if all_replayed => (d.fatal().cloned(), d.bytes_consumed()),
            None => (None, self.replayed_to),
        };
        Ok(finish_load(self.model, &d, warnings, fatal, bytes, join))
    }
}
