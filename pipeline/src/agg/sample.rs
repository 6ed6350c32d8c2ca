//! `$sample: {size: n}`: a uniformly random subset of the input in random order.
//!
//! Invariants: the output holds `min(n, input length)` distinct input documents (each input
//! document at most once, each equally likely) in a uniformly random order; the randomness
//! comes from the caller's generator ([`sample_with`]) so tests can seed it. Memory is the
//! sample's, not the input's ([`Reservoir`]). Parse errors are MongoDB's 28745–28749.

use bson::{Bson, Document};
use rand::Rng;
use rand::seq::SliceRandom;

use crate::changestream::split::document_size;
use crate::value;
use crate::{MongoError, Result};

/// Parses `$sample`'s argument into the requested size.
pub fn parse(arg: &Bson) -> Result<u64> {
    let Bson::Document(d) = arg else {
        return Err(MongoError::with_code(
            28745,
            "the $sample stage specification must be an object",
        ));
    };
    let mut size = None;
    for (k, v) in d {
        if k != "size" {
            return Err(MongoError::with_code(
                28748,
                format!("unrecognized option to $sample: {k}"),
            ));
        }
        if !value::is_number(v) {
            return Err(MongoError::with_code(
                28746,
                "size argument to $sample must be a number",
            ));
        }
        // MongoDB reads the size with `safeNumberLong`: NaN is 0, fractions truncate.
        let n = value::as_f64(v).filter(|n| !n.is_nan()).unwrap_or(0.0);
        if n < 0.0 {
            return Err(MongoError::with_code(
                28747,
                "size argument to $sample must not be negative",
            ));
        }
        size = Some(match v {
            Bson::Int32(i) => u64::try_from(*i).unwrap_or(0),
            Bson::Int64(i) => u64::try_from(*i).unwrap_or(0),
            _ if n >= u64::MAX as f64 => u64::MAX,
            _ => n as u64,
        });
    }
    size.ok_or_else(|| MongoError::with_code(28749, "$sample stage must specify a size"))
}

/// `min(size, docs.len())` documents chosen and ordered uniformly at random by `rng`.
pub fn sample_with(docs: Vec<Document>, size: u64, rng: &mut impl Rng) -> Vec<Document> {
    let mut reservoir = Reservoir::new(size);
    for d in docs {
        reservoir.offer(d, rng);
    }
    reservoir.finish(rng)
}

/// [`sample_with`] the thread's generator.
pub fn sample(docs: Vec<Document>, size: u64) -> Vec<Document> {
    sample_with(docs, size, &mut rand::rng())
}

/// A sample taken one document at a time (reservoir sampling): after `k` offers it holds
/// `min(size, k)` of them, each offered document equally likely to be among them, so a
/// `$sample` holds its size, not its input.
pub struct Reservoir {
    size: usize,
    kept: Vec<Document>,
    /// Documents offered so far.
    seen: u64,
    /// The size of what is kept.
    bytes: usize,
}

impl Reservoir {
    pub fn new(size: u64) -> Reservoir {
        Reservoir {
            size: usize::try_from(size).unwrap_or(usize::MAX),
            kept: Vec::new(),
            seen: 0,
            bytes: 0,
        }
    }

    /// Offers one document: kept while the sample is not full; after that it takes the place
    /// of a kept one with probability `size / seen`.
    pub fn offer(&mut self, d: Document, rng: &mut impl Rng) {
        self.seen += 1;
        if self.kept.len() < self.size {
            self.bytes += document_size(&d);
            self.kept.push(d);
            return;
        }
        let slot = usize::try_from(rng.random_range(0..self.seen)).unwrap_or(usize::MAX);
        if let Some(old) = self.kept.get_mut(slot) {
            self.bytes = self.bytes - document_size(old) + document_size(&d);
            *old = d;
        }
    }

    /// What the kept documents take.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The sample, in a uniformly random order.
    pub fn finish(mut self, rng: &mut impl Rng) -> Vec<Document> {
        self.kept.shuffle(rng);
        self.kept
    }
}
