//! A subscription's definition: what `createSubscription` asks for, checked and bounded, and
//! its stored form in `config.subscriptions`.
//!
//! Invariants: pure; every number is checked against its bound before it is used (a bad one is
//! a MongoDB error naming the field); the stream a definition denotes is one `watch()` could
//! open (the `$changeStream` options and stages are parsed as `aggregate` parses them), with
//! the start point apart: a subscription's start is its own field, never `resumeAfter` and
//! its kin inside `changeStream`.

use std::time::Duration;

use bson::{Bson, Document, Timestamp, doc};
use resume::token::ResumeToken;
use wire::{ErrorCode, MongoError, Result};

use pipeline::changestream::selectors::{Selectors, regroup_from};

use super::delivery::Limits;

/// The database the subscriptions' state lives in, and its collections.
pub const STATE_DB: &str = "config";
pub const DEFINITIONS: &str = "subscriptions";
pub const CONSUMERS: &str = "subscriptionConsumers";
pub const DEAD_LETTERS: &str = "subscriptionDeadLetters";
pub const SNAPSHOTS: &str = "subscriptionSnapshots";

/// Whether `db.coll` is one of the subscriptions' own collections (users may read them).
pub fn is_reserved(db: &str, coll: &str) -> bool {
    db == STATE_DB && [DEFINITIONS, CONSUMERS, DEAD_LETTERS, SNAPSHOTS].contains(&coll)
}

/// The longest subscription or consumer name.
pub const MAX_NAME_LEN: usize = 120;
pub const DEFAULT_ACK_TIMEOUT_SECS: i64 = 30;
pub const MAX_ACK_TIMEOUT_SECS: i64 = 24 * 3600;
pub const DEFAULT_MAX_DELIVERIES: i64 = 10;
pub const MAX_MAX_DELIVERIES: i64 = 1000;
pub const DEFAULT_MAX_IN_FLIGHT: i64 = 1000;
pub const MAX_MAX_IN_FLIGHT: i64 = 100_000;
pub const MAX_BACKOFF_STEPS: usize = 32;
pub const MAX_BACKOFF_MS: i64 = 24 * 3600 * 1000;
/// The longest a `readSubscription` waits (`waitMS`).
pub const MAX_WAIT_MS: i64 = 25_000;
pub const DEFAULT_READ_MAX: i64 = 100;
pub const MAX_READ_MAX: i64 = 10_000;
/// The most delivery ids one ack or nack names.
pub const MAX_IDS: usize = 10_000;

/// The `$changeStream` field that starts a stream after `token` (an event's, or a high-water
/// mark's: from its time): `startAfter` for an invalidate, the only way past one.
pub fn start_field(token: &ResumeToken) -> Result<(&'static str, Bson)> {
    let field = if token.decode()?.from_invalidate() {
        "startAfter"
    } else {
        "resumeAfter"
    };
    Ok((field, Bson::Document(token.to_document())))
}

/// The high-water-mark token of `ts`: a stream resumed after it starts at `ts`, as
/// `startAtOperationTime` does.
pub fn at_time(ts: Timestamp) -> ResumeToken {
    resume::token::ResumeTokenData::high_water_mark(ts.into(), Default::default()).encode()
}

/// A start point as a command gives it, before the cluster resolves `now` and `earliest`.
#[derive(Debug, Clone, PartialEq)]
pub enum StartAsked {
    Now,
    Earliest,
    Snapshot,
    At(Timestamp),
    After(ResumeToken),
}

impl StartAsked {
    pub fn parse(v: Option<&Bson>, field: &str) -> Result<StartAsked> {
        match v {
            None => Ok(StartAsked::Now),
            Some(Bson::String(s)) => match s.as_str() {
                "now" => Ok(StartAsked::Now),
                "earliest" => Ok(StartAsked::Earliest),
                "snapshot" => Ok(StartAsked::Snapshot),
                other => Err(MongoError::bad_value(format!(
                    "'{field}' must be \"now\", \"earliest\", \"snapshot\", a Timestamp or a \
                     resume token, not \"{other}\""
                ))),
            },
            Some(Bson::Timestamp(ts)) => Ok(StartAsked::At(*ts)),
            Some(Bson::Document(d)) => Ok(StartAsked::After(
                ResumeToken::from_document(d)
                    .map_err(|e| MongoError::bad_value(format!("'{field}': {e}")))?,
            )),
            Some(other) => Err(MongoError::type_mismatch(format!(
                "'{field}' must be a string, a Timestamp or a resume token, not {:?}",
                other.element_type()
            ))),
        }
    }
}

/// A subscription's definition.
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    /// The database it watches (`admin` for the whole cluster).
    pub db: String,
    pub name: String,
    /// The collection it watches; `None` for a database or the cluster.
    pub collection: Option<String>,
    /// The `$changeStream` options, start points excluded.
    pub change_stream: Document,
    /// The stages after `$changeStream`.
    pub pipeline: Vec<Bson>,
    /// Where consumers start: after this token (resolved when the subscription was created
    /// or last reset for all).
    pub start: ResumeToken,
    pub limits: Limits,
    pub max_lag_bytes: Option<i64>,
    pub max_lag_secs: Option<i64>,
    pub idle_timeout: Option<Duration>,
    pub paused: bool,
    /// With selectors, a trigger queue: only matching changes, one message per document per
    /// transaction.
    pub selectors: Option<Selectors>,
    /// The copy a `start: "snapshot"` took: consumers read it before the stream.
    pub snapshot: Option<Snapshot>,
    /// How many times every consumer was reset to `start`: a consumer that has applied fewer
    /// (served by another router, or by none) starts over at `start` when its owner learns of
    /// it (within a second) or when it is next loaded.
    pub resets: i64,
}

/// `<db>.<name>`: a subscription's id.
pub fn sub_id(db: &str, name: &str) -> String {
    format!("{db}.{name}")
}

impl Definition {
    pub fn id(&self) -> String {
        sub_id(&self.db, &self.name)
    }

    /// Parses `createSubscription`'s fields (all but the start, which the caller resolves).
    pub fn parse(db: &str, cmd: &Document, start: ResumeToken) -> Result<Definition> {
        let name = check_name(cmd.get("createSubscription"), "createSubscription")?;
        let collection = match cmd.get("collection") {
            None | Some(Bson::Null) => None,
            Some(Bson::String(c)) if !c.is_empty() && !c.contains('\0') => Some(c.clone()),
            Some(_) => {
                return Err(MongoError::new(
                    ErrorCode::INVALID_NAMESPACE,
                    "'collection' must be a non-empty collection name",
                ));
            }
        };
        let change_stream = match cmd.get("changeStream") {
            None | Some(Bson::Null) => Document::new(),
            Some(Bson::Document(d)) => d.clone(),
            Some(_) => {
                return Err(MongoError::type_mismatch(
                    "'changeStream' must be a document of $changeStream options",
                ));
            }
        };
        for field in ["resumeAfter", "startAfter", "startAtOperationTime"] {
            if change_stream.contains_key(field) {
                return Err(MongoError::bad_value(format!(
                    "a subscription's start is its 'start' field, not changeStream.{field}"
                )));
            }
        }
        let all = change_stream
            .get_bool("allChangesForCluster")
            .unwrap_or(false);
        if all && (db != "admin" || collection.is_some()) {
            return Err(MongoError::bad_value(
                "a subscription to the whole cluster (allChangesForCluster) is created on \
                 'admin' without a collection",
            ));
        }
        let pipeline = match cmd.get("pipeline") {
            None | Some(Bson::Null) => Vec::new(),
            Some(Bson::Array(a)) => a.clone(),
            Some(_) => {
                return Err(MongoError::type_mismatch(
                    "'pipeline' must be an array of stages",
                ));
            }
        };
        let selectors = match cmd.get("selectors") {
            None | Some(Bson::Null) => None,
            Some(v) => Some(Selectors::parse(v)?),
        };
        let splits = pipeline.iter().any(|stage| {
            matches!(stage, Bson::Document(d) if d.contains_key("$changeStreamSplitLargeEvent"))
        });
        if selectors.is_some() && splits {
            return Err(MongoError::bad_value(
                "'selectors' group whole events: a subscription with selectors does not take \
                 $changeStreamSplitLargeEvent",
            ));
        }
        let def = Definition {
            db: db.to_string(),
            name,
            collection,
            change_stream,
            pipeline,
            start,
            limits: parse_limits(cmd, None)?,
            max_lag_bytes: positive(cmd, "maxLagBytes", i64::MAX)?,
            max_lag_secs: positive(cmd, "maxLagSecs", i64::MAX / 1000)?,
            idle_timeout: positive(cmd, "consumerIdleTimeoutSecs", i64::MAX / 1000)?
                .map(|s| Duration::from_secs(s as u64)),
            paused: false,
            selectors,
            snapshot: None,
            resets: 0,
        };
        // The stream must be one `watch()` could open.
        pipeline::changestream::spec::parse_command(db, &def.aggregate_from(None)?, true)?;
        Ok(def)
    }

    /// The `aggregate` that opens this subscription's stream to meet what follows `start`
    /// (now without one): after it; just after the snapshot's time while `start` is in it;
    /// with selectors from the start of a message's cluster time, whose transaction is grouped
    /// anew.
    pub fn aggregate_from(&self, start: Option<&ResumeToken>) -> Result<Document> {
        let mut spec = self.change_stream.clone();
        let moved = match (start, self.snapshot) {
            // What is at or before a snapshot's time is the copy's.
            (Some(at), Some(snap)) if snap.covers(at) => Some(snap.follow()),
            (Some(at), _) if self.selectors.is_some() => {
                regroup_from(at).map(|ct| at_time(ct.into()))
            }
            _ => None,
        };
        if let Some(start) = moved.as_ref().or(start) {
            let (field, value) = start_field(start)?;
            spec.insert(field, value);
        }
        let mut stages = vec![Bson::Document(doc! {"$changeStream": spec})];
        stages.extend(self.pipeline.iter().cloned());
        let target = match &self.collection {
            Some(c) => Bson::String(c.clone()),
            None => Bson::Int32(1),
        };
        Ok(doc! {"aggregate": target, "pipeline": stages, "cursor": {"batchSize": 0}})
    }

    /// What names the stream this subscription reads: subscriptions with the same key read the
    /// same events (their starts apart), so a router shares one log among their consumers. A
    /// snapshot's copy is its subscription's own.
    pub fn stream_key(&self) -> Vec<u8> {
        let mut d = doc! {
            "db": &self.db,
            "collection": self.collection.clone().map_or(Bson::Null, Bson::String),
            "changeStream": self.change_stream.clone(),
            "pipeline": self.pipeline.clone(),
        };
        if let Some(s) = &self.selectors {
            d.insert("selectors", s.to_bson());
        }
        if self.snapshot.is_some() {
            d.insert("copy", self.id());
        }
        d.to_vec().unwrap_or_default()
    }

    pub fn to_document(&self) -> Document {
        let mut d = doc! {
            "_id": self.id(),
            "db": &self.db,
            "name": &self.name,
            "collection": self.collection.clone().map_or(Bson::Null, Bson::String),
            "changeStream": self.change_stream.clone(),
            "pipeline": self.pipeline.clone(),
            "start": self.start.to_document(),
            "paused": self.paused,
            "resets": self.resets,
        };
        limits_into(&self.limits, &mut d);
        if let Some(s) = &self.selectors {
            d.insert("selectors", s.to_bson());
        }
        if let Some(s) = self.snapshot {
            d.insert("snapshot", s.to_document());
        }
        for (field, v) in [
            ("maxLagBytes", self.max_lag_bytes),
            ("maxLagSecs", self.max_lag_secs),
            (
                "consumerIdleTimeoutSecs",
                self.idle_timeout.map(|d| d.as_secs() as i64),
            ),
        ] {
            if let Some(v) = v {
                d.insert(field, v);
            }
        }
        d
    }

    pub fn from_document(d: &Document) -> Result<Definition> {
        let get_i64 = |f: &str| match d.get(f) {
            Some(Bson::Int64(v)) => Some(*v),
            Some(Bson::Int32(v)) => Some(i64::from(*v)),
            _ => None,
        };
        Ok(Definition {
            db: d.get_str("db").map_err(|_| corrupt("db"))?.to_string(),
            name: d.get_str("name").map_err(|_| corrupt("name"))?.to_string(),
            collection: d.get_str("collection").ok().map(str::to_string),
            change_stream: d.get_document("changeStream").cloned().unwrap_or_default(),
            pipeline: d.get_array("pipeline").cloned().unwrap_or_default(),
            start: ResumeToken::from_document(
                d.get_document("start").map_err(|_| corrupt("start"))?,
            )?,
            limits: parse_limits(d, None)?,
            max_lag_bytes: get_i64("maxLagBytes"),
            max_lag_secs: get_i64("maxLagSecs"),
            idle_timeout: get_i64("consumerIdleTimeoutSecs").map(|s| Duration::from_secs(s as u64)),
            paused: d.get_bool("paused").unwrap_or(false),
            selectors: d.get("selectors").map(Selectors::parse).transpose()?,
            snapshot: d
                .get_document("snapshot")
                .ok()
                .and_then(Snapshot::from_document),
            resets: get_i64("resets").unwrap_or(0),
        })
    }
}

fn corrupt(field: &str) -> MongoError {
    MongoError::internal(format!("a stored subscription without a valid '{field}'"))
}

/// A subscription or consumer name: a non-empty string of at most [`MAX_NAME_LEN`] bytes
/// without NUL.
pub fn check_name(v: Option<&Bson>, field: &str) -> Result<String> {
    match v {
        Some(Bson::String(s)) if !s.is_empty() && s.len() <= MAX_NAME_LEN && !s.contains('\0') => {
            Ok(s.clone())
        }
        Some(Bson::String(_)) => Err(MongoError::new(
            ErrorCode::INVALID_NAMESPACE,
            format!("'{field}' must be a name of 1 to {MAX_NAME_LEN} bytes without NUL"),
        )),
        Some(_) => Err(MongoError::type_mismatch(format!(
            "'{field}' must be a string"
        ))),
        None => Err(MongoError::with_code(
            40414,
            format!("BSON field '{field}' is missing but a required field"),
        )),
    }
}

/// A whole number from 1 to `max` when present.
pub fn positive(cmd: &Document, field: &str, max: i64) -> Result<Option<i64>> {
    let v = match cmd.get(field) {
        None | Some(Bson::Null) => return Ok(None),
        Some(Bson::Int32(v)) => i64::from(*v),
        Some(Bson::Int64(v)) => *v,
        Some(Bson::Double(d)) if d.fract() == 0.0 && d.abs() < 9.0e15 => *d as i64,
        Some(_) => {
            return Err(MongoError::type_mismatch(format!(
                "'{field}' must be a whole number"
            )));
        }
    };
    if !(1..=max).contains(&v) {
        return Err(MongoError::bad_value(format!(
            "'{field}' must be from 1 to {max}, not {v}"
        )));
    }
    Ok(Some(v))
}

/// The delivery settings of `cmd`, each defaulting to `base`'s (or the default).
pub fn parse_limits(cmd: &Document, base: Option<&Limits>) -> Result<Limits> {
    let ack = positive(cmd, "ackTimeoutSecs", MAX_ACK_TIMEOUT_SECS)?;
    let max_deliveries = positive(cmd, "maxDeliveries", MAX_MAX_DELIVERIES)?;
    let in_flight = positive(cmd, "maxInFlight", MAX_MAX_IN_FLIGHT)?;
    let backoff = match cmd.get("retryBackoffMS") {
        None | Some(Bson::Null) => None,
        Some(Bson::Array(steps)) => {
            if steps.len() > MAX_BACKOFF_STEPS {
                return Err(MongoError::bad_value(format!(
                    "'retryBackoffMS' has at most {MAX_BACKOFF_STEPS} steps"
                )));
            }
            let mut out = Vec::with_capacity(steps.len());
            for step in steps {
                let ms = match step {
                    Bson::Int32(v) => i64::from(*v),
                    Bson::Int64(v) => *v,
                    Bson::Double(d) if d.fract() == 0.0 && d.abs() < 9.0e15 => *d as i64,
                    _ => {
                        return Err(MongoError::type_mismatch(
                            "'retryBackoffMS' must be an array of whole milliseconds",
                        ));
                    }
                };
                if !(0..=MAX_BACKOFF_MS).contains(&ms) {
                    return Err(MongoError::bad_value(format!(
                        "each 'retryBackoffMS' step must be from 0 to {MAX_BACKOFF_MS}"
                    )));
                }
                out.push(Duration::from_millis(ms as u64));
            }
            Some(out)
        }
        Some(_) => {
            return Err(MongoError::type_mismatch(
                "'retryBackoffMS' must be an array of whole milliseconds",
            ));
        }
    };
    Ok(Limits {
        ack_timeout: ack
            .map(|s| Duration::from_secs(s as u64))
            .unwrap_or_else(|| {
                base.map_or(Duration::from_secs(DEFAULT_ACK_TIMEOUT_SECS as u64), |b| {
                    b.ack_timeout
                })
            }),
        max_deliveries: max_deliveries
            .map(|v| v as u32)
            .unwrap_or_else(|| base.map_or(DEFAULT_MAX_DELIVERIES as u32, |b| b.max_deliveries)),
        backoff: backoff.unwrap_or_else(|| base.map(|b| b.backoff.clone()).unwrap_or_default()),
        max_in_flight: in_flight
            .map(|v| v as usize)
            .unwrap_or_else(|| base.map_or(DEFAULT_MAX_IN_FLIGHT as usize, |b| b.max_in_flight)),
    })
}

fn limits_into(limits: &Limits, d: &mut Document) {
    d.insert("ackTimeoutSecs", limits.ack_timeout.as_secs() as i64);
    d.insert("maxDeliveries", i64::from(limits.max_deliveries));
    d.insert(
        "retryBackoffMS",
        limits
            .backoff
            .iter()
            .map(|b| Bson::Int64(b.as_millis() as i64))
            .collect::<Vec<_>>(),
    );
    d.insert("maxInFlight", limits.max_in_flight as i64);
}

/// A subscription's snapshot: its time and how many documents it holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Snapshot {
    pub at: Timestamp,
    pub count: u32,
}

impl Snapshot {
    pub fn to_document(self) -> Document {
        doc! {"at": self.at, "count": i64::from(self.count)}
    }

    pub fn from_document(d: &Document) -> Option<Snapshot> {
        Some(Snapshot {
            at: d.get_timestamp("at").ok()?,
            count: u32::try_from(d.get_i64("count").ok()?).ok()?,
        })
    }

    /// Where a stream resumes to follow it: just after `T`.
    pub fn follow(self) -> ResumeToken {
        let next = match self.at.increment.checked_add(1) {
            Some(increment) => Timestamp {
                increment,
                ..self.at
            },
            None => Timestamp {
                time: self.at.time.saturating_add(1),
                increment: 0,
            },
        };
        at_time(next)
    }

    /// The place in the copy of the next message after `position`, while it is inside it.
    pub fn next(self, position: &ResumeToken) -> Option<u32> {
        let d = position.decode().ok()?;
        if d.cluster_time().timestamp() != self.at {
            return None;
        }
        let next = if d.is_high_water_mark() {
            0
        } else {
            d.txn_op_index() + 1
        };
        (next < self.count).then_some(next)
    }

    /// Whether a stream resuming at `position` must start just after `T` instead (what is at
    /// or before `T` is the copy's).
    pub fn covers(self, position: &ResumeToken) -> bool {
        position
            .decode()
            .is_ok_and(|d| d.cluster_time().timestamp() <= self.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> ResumeToken {
        at_time(Timestamp {
            time: 10,
            increment: 1,
        })
    }

    #[test]
    fn a_definition_round_trips_through_its_stored_form() {
        let cmd = doc! {
            "createSubscription": "audit",
            "collection": "orders",
            "pipeline": [{"$match": {"operationType": "insert"}}],
            "changeStream": {"fullDocument": "updateLookup"},
            "ackTimeoutSecs": 5,
            "maxDeliveries": 3,
            "retryBackoffMS": [100, 1000],
            "maxInFlight": 50,
            "maxLagSecs": 600,
            "consumerIdleTimeoutSecs": 3600,
        };
        let def = Definition::parse("shop", &cmd, at()).expect("parses");
        assert_eq!(def.limits.max_deliveries, 3);
        assert_eq!(def.limits.backoff.len(), 2);
        let back = Definition::from_document(&def.to_document()).expect("reads back");
        assert_eq!(back, def);
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let def = Definition::parse("db", &doc! {"createSubscription": "s"}, at()).unwrap();
        assert_eq!(def.limits.ack_timeout, Duration::from_secs(30));
        assert_eq!(def.limits.max_deliveries, 10);
        assert_eq!(def.limits.max_in_flight, 1000);
        assert!(def.limits.backoff.is_empty());
        assert_eq!(def.collection, None);
    }

    #[test]
    fn out_of_bounds_and_wrong_types_are_refused_with_mongodb_codes() {
        let cases = [
            (doc! {"createSubscription": ""}, 73),
            (doc! {"createSubscription": "x".repeat(121)}, 73),
            (doc! {"createSubscription": 5}, 14),
            (doc! {"createSubscription": "s", "ackTimeoutSecs": 0}, 2),
            (doc! {"createSubscription": "s", "maxDeliveries": 1001}, 2),
            (doc! {"createSubscription": "s", "maxInFlight": "x"}, 14),
            (doc! {"createSubscription": "s", "retryBackoffMS": [-1]}, 2),
            (
                doc! {"createSubscription": "s", "retryBackoffMS": vec![Bson::Int32(1); 33]},
                2,
            ),
            (
                doc! {"createSubscription": "s", "changeStream": {"resumeAfter": {}}},
                2,
            ),
            (
                doc! {"createSubscription": "s", "changeStream": {"allChangesForCluster": true}},
                2,
            ),
            (
                doc! {"createSubscription": "s", "pipeline": [{"$out": "x"}]},
                ErrorCode::ILLEGAL_OPERATION.code,
            ),
        ];
        for (cmd, code) in cases {
            let err = Definition::parse("db", &cmd, at()).expect_err("refused");
            assert_eq!(err.code, code, "{cmd}: {err}");
        }
    }

    #[test]
    fn the_start_opens_the_stream_with_the_field_watch_takes() {
        let def = Definition::parse(
            "db",
            &doc! {"createSubscription": "s", "collection": "c"},
            at(),
        )
        .unwrap();
        let agg = def.aggregate_from(Some(&def.start)).unwrap();
        let stage = agg.get_array("pipeline").unwrap()[0].as_document().unwrap();
        let spec = stage.get_document("$changeStream").unwrap();
        assert_eq!(
            spec.get_document("resumeAfter").ok(),
            Some(&def.start.to_document())
        );
        assert_eq!(agg.get_str("aggregate").unwrap(), "c");
    }
}
