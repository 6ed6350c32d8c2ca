//! `$bucketAuto`: documents sorted by `groupBy` and cut into at most `buckets` buckets of
//! about equal size, as MongoDB 7.0 does it.
//!
//! Invariants:
//! * Each bucket but the last takes `round(n / buckets)` documents (at least 1) and then every
//!   following document whose value equals the bucket's largest, so equal values never straddle
//!   two buckets; the last bucket takes everything left. There may be fewer buckets than asked.
//! * A bucket's `_id` is `{min, max}`: `min` is its smallest value and `max` the next bucket's
//!   `min` (the last bucket's own largest value), so bounds chain without gaps.
//! * Missing `groupBy` values count as null; values order by [`crate::value::compare`].
//! * `output` takes `$group`'s accumulators (default `{count: {$sum: 1}}`). `granularity`
//!   rounds bounds to a preferred-number series: `POWERSOF2`, `1-2-5`, `R5`, `R10`, `R20`,
//!   `E6`, `E12`, `E24` (values must then be non-negative numbers, 40265-40267): each bucket
//!   but the last also takes the values below its largest value rounded up, which becomes its
//!   `max` and the next bucket's `min`; the first `min` is rounded down and the last `max` up.
//!   Other MongoDB series (`R40 R80 E48 E96 E192`) are CommandNotSupported.
//! * Memory: over a stream ([`BucketAutoSink`]) the documents wait in a sorter (spilling under
//!   `allowDiskUse`) and each bucket holds only its accumulators, never its documents.

use std::sync::Arc;

use bson::{Bson, Document, doc};

use super::spill::{Compare, Purpose, Sorter};
use super::{AccKind, AccState, Group, accumulate, finish, parse_accumulators};
use crate::expr::{Env, Expr};
use crate::value::{self, compare, type_name};
use crate::{MongoError, Result};

/// A parsed `$bucketAuto` stage.
#[derive(Debug, Clone)]
pub struct BucketAuto {
    group: Group,
    buckets: usize,
    granularity: Option<Granularity>,
}

/// A preferred-number series for bucket bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Granularity {
    PowersOf2,
    /// The series' mantissas in `[1, 10)`, ascending.
    Series(&'static [f64]),
}

const ONE_TWO_FIVE: &[f64] = &[1.0, 2.0, 5.0];
const R5: &[f64] = &[1.0, 1.6, 2.5, 4.0, 6.3];
const R10: &[f64] = &[1.0, 1.25, 1.6, 2.0, 2.5, 3.15, 4.0, 5.0, 6.3, 8.0];
const R20: &[f64] = &[
    1.0, 1.12, 1.25, 1.4, 1.6, 1.8, 2.0, 2.24, 2.5, 2.8, 3.15, 3.55, 4.0, 4.5, 5.0, 5.6, 6.3, 7.1,
    8.0, 9.0,
];
const E6: &[f64] = &[1.0, 1.5, 2.2, 3.3, 4.7, 6.8];
const E12: &[f64] = &[1.0, 1.2, 1.5, 1.8, 2.2, 2.7, 3.3, 3.9, 4.7, 5.6, 6.8, 8.2];
const E24: &[f64] = &[
    1.0, 1.1, 1.2, 1.3, 1.5, 1.6, 1.8, 2.0, 2.2, 2.4, 2.7, 3.0, 3.3, 3.6, 3.9, 4.3, 4.7, 5.1, 5.6,
    6.2, 6.8, 7.5, 8.2, 9.1,
];

impl BucketAuto {
    /// Parses the stage's argument.
    pub fn parse(arg: &Bson, vars: &[String]) -> Result<BucketAuto> {
        let Bson::Document(d) = arg else {
            return Err(MongoError::with_code(
                40240,
                format!(
                    "The argument to $bucketAuto must be an object, but found type: {}",
                    type_name(arg)
                ),
            ));
        };
        let (mut group_by, mut buckets, mut output, mut granularity) = (None, None, None, None);
        for (k, v) in d {
            match k.as_str() {
                "groupBy" => {
                    let ok = matches!(v, Bson::String(s) if s.starts_with('$'))
                        || matches!(v, Bson::Document(d)
                            if d.keys().next().is_some_and(|k| k.starts_with('$')));
                    if !ok {
                        return Err(MongoError::with_code(
                            40239,
                            format!(
                                "The $bucketAuto 'groupBy' field must be defined as a $-prefixed path or an expression object, but found: {v}"
                            ),
                        ));
                    }
                    group_by = Some(Expr::parse_with_vars(v, vars)?);
                }
                "buckets" => {
                    if !value::is_number(v) {
                        return Err(MongoError::with_code(
                            40241,
                            format!(
                                "The $bucketAuto 'buckets' field must be a numeric value, but found type: {}",
                                type_name(v)
                            ),
                        ));
                    }
                    let n = value::as_i64_exact(v)
                        .and_then(|n| i32::try_from(n).ok())
                        .ok_or_else(|| {
                            MongoError::with_code(
                                40242,
                                format!(
                                    "The $bucketAuto 'buckets' field must be representable as a 32-bit integer, but found {}",
                                    value::as_f64(v).unwrap_or(f64::NAN)
                                ),
                            )
                        })?;
                    buckets = Some(n);
                }
                "output" => {
                    let Bson::Document(o) = v else {
                        return Err(MongoError::with_code(
                            40244,
                            format!(
                                "The $bucketAuto 'output' field must be an object, but found type: {}",
                                type_name(v)
                            ),
                        ));
                    };
                    output = Some(parse_accumulators(o, vars)?);
                }
                "granularity" => {
                    let Bson::String(g) = v else {
                        return Err(MongoError::with_code(
                            40261,
                            format!(
                                "The $bucketAuto 'granularity' field must be a string, but found type: {}",
                                type_name(v)
                            ),
                        ));
                    };
                    granularity = Some(match g.as_str() {
                        "POWERSOF2" => Granularity::PowersOf2,
                        "1-2-5" => Granularity::Series(ONE_TWO_FIVE),
                        "R5" => Granularity::Series(R5),
                        "R10" => Granularity::Series(R10),
                        "R20" => Granularity::Series(R20),
                        "E6" => Granularity::Series(E6),
                        "E12" => Granularity::Series(E12),
                        "E24" => Granularity::Series(E24),
                        "R40" | "R80" | "E48" | "E96" | "E192" => {
                            return Err(MongoError::new(
                                wire::ErrorCode::COMMAND_NOT_SUPPORTED,
                                format!(
                                    "$bucketAuto granularity '{g}' is not supported by this server"
                                ),
                            ));
                        }
                        other => {
                            return Err(MongoError::with_code(
                                40257,
                                format!("Unknown rounding granularity '{other}'"),
                            ));
                        }
                    });
                }
                other => {
                    return Err(MongoError::with_code(
                        40245,
                        format!("Unrecognized option to $bucketAuto: {other}"),
                    ));
                }
            }
        }
        let (Some(id), Some(buckets)) = (group_by, buckets) else {
            return Err(MongoError::with_code(
                40246,
                "$bucketAuto requires 'groupBy' and 'buckets' to be specified",
            ));
        };
        if buckets <= 0 {
            return Err(MongoError::with_code(
                40243,
                format!(
                    "The $bucketAuto 'buckets' field must be greater than 0, but found: {buckets}"
                ),
            ));
        }
        let buckets = usize::try_from(buckets).unwrap_or(1);
        let accumulators = output.unwrap_or_else(|| {
            vec![(
                "count".to_string(),
                AccKind::Sum,
                Expr::literal(Bson::Int32(1)),
            )]
        });
        Ok(BucketAuto {
            group: Group { id, accumulators },
            buckets,
            granularity,
        })
    }

    /// Runs the stage over a batch.
    pub fn run(&self, docs: Vec<Document>, env: &Env) -> Result<Vec<Document>> {
        let mut keyed = Vec::with_capacity(docs.len());
        for d in docs {
            keyed.push((self.value_of(&d, env)?, d));
        }
        keyed.sort_by(|a, b| compare(&a.0, &b.0));
        let n = keyed.len();
        self.cut(keyed.into_iter().map(Ok), n, env)
    }

    /// A document's `groupBy` value (missing is null), checked for a granularity.
    fn value_of(&self, d: &Document, env: &Env) -> Result<Bson> {
        let v = match self.group.id.evaluate_in(d, env)? {
            None | Some(Bson::Undefined) => Bson::Null,
            Some(v) => v,
        };
        if self.granularity.is_some() {
            check_rounding_input(&v)?;
        }
        Ok(v)
    }

    /// The buckets of `n` documents given in `groupBy` order (stably), each document folded
    /// into its bucket's accumulators as it comes.
    fn cut(
        &self,
        items: impl Iterator<Item = Result<(Bson, Document)>>,
        n: usize,
        env: &Env,
    ) -> Result<Vec<Document>> {
        let approx = ((n as f64 / self.buckets as f64).round() as usize).max(1);
        let round_up = |v: &Bson| match self.granularity {
            Some(g) => round(g, v, true),
            None => v.clone(),
        };
        let mut items = items.peekable();
        let mut buckets: Vec<Bucket> = Vec::new();
        for b in 0..self.buckets {
            let Some((first, doc)) = items.next().transpose()? else {
                break;
            };
            let mut bucket = Bucket {
                min: first.clone(),
                max: first,
                states: self.group.init(),
                count: 0,
            };
            bucket.add(&self.group, &doc, env)?;
            if b + 1 == self.buckets {
                for item in items.by_ref() {
                    let (v, d) = item?;
                    bucket.max = v;
                    bucket.add(&self.group, &d, env)?;
                }
            } else {
                for _ in 1..approx {
                    let Some((v, d)) = items.next().transpose()? else {
                        break;
                    };
                    bucket.max = v;
                    bucket.add(&self.group, &d, env)?;
                }
                // Absorb the values equal to the bucket's largest (with a granularity: below
                // its rounded-up boundary, which then becomes its max if more values follow).
                let boundary = round_up(&bucket.max);
                loop {
                    let absorb = match items.peek() {
                        None => false,
                        // Taken, to be returned.
                        Some(Err(_)) => true,
                        Some(Ok((v, _))) if self.granularity.is_some() => {
                            compare(v, &boundary).is_lt()
                        }
                        Some(Ok((v, _))) => compare(v, &bucket.max).is_eq(),
                    };
                    if !absorb {
                        break;
                    }
                    if let Some((v, d)) = items.next().transpose()? {
                        bucket.max = v;
                        bucket.add(&self.group, &d, env)?;
                    }
                }
                if self.granularity.is_some() && items.peek().is_some() {
                    bucket.max = boundary;
                }
            }
            match (buckets.last_mut(), self.granularity) {
                (Some(prev), Some(g)) => {
                    if value::as_f64(&prev.max) == Some(0.0) {
                        prev.max = round(g, &bucket.min, false);
                    }
                    bucket.min = prev.max.clone();
                }
                (Some(prev), None) => prev.max = bucket.min.clone(),
                (None, _) => {}
            }
            buckets.push(bucket);
        }
        if let Some(g) = self.granularity {
            if let Some(first) = buckets.first_mut() {
                first.min = round(g, &first.min, false);
            }
            if let Some(last) = buckets.last_mut() {
                last.max = round(g, &last.max, true);
            }
        }
        Ok(buckets
            .into_iter()
            .map(|b| {
                let mut o = doc! {"_id": {"min": b.min, "max": b.max}};
                for ((name, _, _), st) in self.group.accumulators.iter().zip(b.states) {
                    o.insert(name.clone(), finish(st));
                }
                o
            })
            .collect())
    }
}

/// One bucket being filled: its bounds so far and its accumulators.
struct Bucket {
    min: Bson,
    max: Bson,
    states: Vec<AccState>,
    count: usize,
}

impl Bucket {
    fn add(&mut self, group: &Group, d: &Document, env: &Env) -> Result<()> {
        for ((_, kind, e), st) in group.accumulators.iter().zip(self.states.iter_mut()) {
            accumulate(*kind, st, e.evaluate_in(d, env)?, self.count == 0, env)?;
        }
        self.count += 1;
        Ok(())
    }
}

/// A `$bucketAuto` fed one document at a time: each goes to a sorter by its `groupBy` value
/// (holding its limit in memory, spilling to disk under `allowDiskUse`, 292 past it without),
/// and the buckets are cut from the sorted stream at the end.
pub(super) struct BucketAutoSink {
    stage: BucketAuto,
    env: Env,
    sorter: Sorter,
    n: usize,
}

impl BucketAutoSink {
    pub(super) fn new(stage: &BucketAuto, env: &Env) -> BucketAutoSink {
        let by_value: Compare = Arc::new(|a: &Document, b: &Document| {
            compare(
                a.get("v").unwrap_or(&Bson::Null),
                b.get("v").unwrap_or(&Bson::Null),
            )
        });
        BucketAutoSink {
            stage: stage.clone(),
            env: env.clone(),
            sorter: Sorter::new(by_value, Purpose::Sort, env.allow_disk_use),
            n: 0,
        }
    }

    pub(super) fn push(&mut self, d: Document) -> Result<()> {
        let v = self.stage.value_of(&d, &self.env)?;
        self.n += 1;
        self.sorter.push(doc! {"v": v, "d": d})
    }

    pub(super) fn finish(self) -> Result<Vec<Document>> {
        let records = self.sorter.finish()?.map(|r| {
            let mut r = r?;
            let v = r.remove("v").unwrap_or(Bson::Null);
            match r.remove("d") {
                Some(Bson::Document(d)) => Ok((v, d)),
                _ => Err(MongoError::internal(
                    "a $bucketAuto record without its document",
                )),
            }
        });
        self.stage.cut(records, self.n, &self.env)
    }
}

fn check_rounding_input(v: &Bson) -> Result<()> {
    if !value::is_number(v) {
        return Err(MongoError::with_code(
            40265,
            format!(
                "A granularity rounder can only round numeric values, but found type: {}",
                type_name(v)
            ),
        ));
    }
    let f = value::as_f64(v).unwrap_or(f64::NAN);
    if f.is_nan() {
        return Err(MongoError::with_code(
            40266,
            "A granularity rounder cannot round NaN",
        ));
    }
    if f < 0.0 {
        return Err(MongoError::with_code(
            40267,
            "A granularity rounder can only round non-negative numbers",
        ));
    }
    Ok(())
}

/// The series value strictly above (`up`) or strictly below `v`; 0 stays 0. Powers of two are
/// `2^e` computed as MongoDB's `$pow` of two ints does (int, long, or double for `e < 0`);
/// other series are doubles.
fn round(g: Granularity, v: &Bson, up: bool) -> Bson {
    let x = value::as_f64(v).unwrap_or(0.0);
    if x <= 0.0 || !x.is_finite() {
        return v.clone();
    }
    match g {
        Granularity::PowersOf2 => {
            let l = x.log2();
            let e = if up { l.floor() + 1.0 } else { l.ceil() - 1.0 };
            if e < 0.0 {
                return Bson::Double(2f64.powf(e));
            }
            match 1i64.checked_shl(e as u32).filter(|_| e < 63.0) {
                Some(p) => match i32::try_from(p) {
                    Ok(i) => Bson::Int32(i),
                    Err(_) => Bson::Int64(p),
                },
                None => Bson::Double(2f64.powf(e)),
            }
        }
        Granularity::Series(s) => {
            let mut scale = 10f64.powf(x.log10().floor());
            let m = x / scale;
            let r = if up {
                match s.iter().find(|c| **c > m + 1e-12) {
                    Some(c) => c * scale,
                    None => s.first().copied().unwrap_or(1.0) * scale * 10.0,
                }
            } else {
                match s.iter().rev().find(|c| **c < m - 1e-12) {
                    Some(c) => c * scale,
                    None => {
                        scale /= 10.0;
                        s.last().copied().unwrap_or(1.0) * scale
                    }
                }
            };
            Bson::Double(r)
        }
    }
}
