//! `$sample: {size: n}`: a uniformly random subset of the input in random order.
//!
//! Invariants: the output holds `min(n, input length)` distinct input documents (each input
//! document at most once) in a uniformly random order; the randomness comes from the caller's
//! generator ([`sample_with`]) so tests can seed it. Parse errors are MongoDB's 28745–28749.

use bson::{Bson, Document};
use rand::Rng;
use rand::seq::SliceRandom;

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
    let amount = usize::try_from(size).unwrap_or(usize::MAX).min(docs.len());
    let picks = rand::seq::index::sample(rng, docs.len(), amount);
    let mut slots: Vec<Option<Document>> = docs.into_iter().map(Some).collect();
    let mut out: Vec<Document> = picks
        .into_iter()
        .filter_map(|i| slots.get_mut(i).and_then(Option::take))
        .collect();
    // Whatever order the index sampler yields, the output order is a uniform shuffle.
    out.shuffle(rng);
    out
}

/// [`sample_with`] the thread's generator.
pub fn sample(docs: Vec<Document>, size: u64) -> Vec<Document> {
    sample_with(docs, size, &mut rand::rng())
}
