//! The reference model of a workload's change events, and the verifier that checks an observed
//! change stream against it.
//!
//! Pure: no I/O. The workload threads record one [`Expected`] per change event a write must (or,
//! with an unknown outcome, may) produce; the verifier matches observed events to them by
//! identity ([`Expected::ident`] / [`ident_of_event`]): CRUD events by namespace, operation,
//! document key and the write's unique tag (the `w` field every write sets), DDL events by
//! namespace, operation and their argument (index name, rename target).
//!
//! Invariants checked by [`verify`]:
//! * every acknowledged write in scope appears exactly once; an unknown-outcome write appears at
//!   most once; nothing appears that no write explains;
//! * resume tokens strictly increase and `clusterTime` never goes backwards (the stream is in
//!   cluster-time order overall, and so per namespace);
//! * each thread's acknowledged operations appear in the order the thread made them (a thread's
//!   writes are causally ordered through its client's cluster-time gossip);
//! * per document, the operations appear in the order they were made (each key has one writer);
//! * nothing of a namespace follows its `drop`/`rename`, nothing of a database follows its
//!   `dropDatabase`; a collection or database stream ends with one `invalidate` right after its
//!   terminating event.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use mongodb::bson::{Bson, Document};

/// A change event's `operationType`, for the events the workloads make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Insert,
    Update,
    Replace,
    Delete,
    Create,
    CreateIndexes,
    DropIndexes,
    ShardCollection,
    Rename,
    Drop,
    DropDatabase,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Insert => "insert",
            Op::Update => "update",
            Op::Replace => "replace",
            Op::Delete => "delete",
            Op::Create => "create",
            Op::CreateIndexes => "createIndexes",
            Op::DropIndexes => "dropIndexes",
            Op::ShardCollection => "shardCollection",
            Op::Rename => "rename",
            Op::Drop => "drop",
            Op::DropDatabase => "dropDatabase",
        }
    }

    pub fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "insert" => Op::Insert,
            "update" => Op::Update,
            "replace" => Op::Replace,
            "delete" => Op::Delete,
            "create" => Op::Create,
            "createIndexes" => Op::CreateIndexes,
            "dropIndexes" => Op::DropIndexes,
            "shardCollection" => Op::ShardCollection,
            "rename" => Op::Rename,
            "drop" => Op::Drop,
            "dropDatabase" => Op::DropDatabase,
            _ => return None,
        })
    }

    /// Shown only to streams opened with `showExpandedEvents: true`.
    pub fn expanded_only(self) -> bool {
        matches!(
            self,
            Op::Create | Op::CreateIndexes | Op::DropIndexes | Op::ShardCollection
        )
    }

    /// Ends a collection stream on its namespace (followed by `invalidate`).
    fn ends_collection(self) -> bool {
        matches!(self, Op::Drop | Op::Rename | Op::DropDatabase)
    }
}

/// Whether the write that should make an event was acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The server acknowledged it: its event must appear exactly once.
    Acked,
    /// It failed in a way that leaves the outcome unknown (a network error during a kill): its
    /// event may appear once or not at all, never twice.
    Unknown,
}

/// One change event the model expects (or allows).
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    /// The thread that made the write (the teardown counts as thread `thread_count`).
    pub tid: usize,
    /// The thread's operation number: events of one operation (a multi-document update, the
    /// drops of a `dropDatabase`) share it and may come in any order among themselves.
    pub step: u64,
    pub db: String,
    /// `None` for `dropDatabase`.
    pub coll: Option<String>,
    pub op: Op,
    /// `documentKey._id` of a CRUD event.
    pub key: Option<Bson>,
    /// What makes the event unique: the `w` value a CRUD write set, an index name, a rename's
    /// target namespace.
    pub tag: Option<Bson>,
    pub outcome: Outcome,
}

impl Expected {
    /// The identity an observed event must have to match this write.
    pub fn ident(&self) -> String {
        ident_string(
            self.op.name(),
            &self.db,
            self.coll.as_deref(),
            self.key.as_ref(),
            self.tag.as_ref(),
        )
    }

    pub fn ns(&self) -> String {
        match &self.coll {
            Some(c) => format!("{}.{c}", self.db),
            None => self.db.clone(),
        }
    }
}

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[thread {} op #{} {:?}] {}",
            self.tid,
            self.step,
            self.outcome,
            self.ident()
        )
    }
}

fn ident_string(
    op: &str,
    db: &str,
    coll: Option<&str>,
    key: Option<&Bson>,
    tag: Option<&Bson>,
) -> String {
    let mut s = format!("{op} {db}");
    if let Some(c) = coll {
        s.push('.');
        s.push_str(c);
    }
    if let Some(k) = key {
        s.push_str(&format!(" _id={}", canonical(k)));
    }
    if let Some(t) = tag {
        s.push_str(&format!(" tag={}", canonical(t)));
    }
    s
}

/// Numbers compare by value whatever their BSON width (the driver and the server may pick
/// different ones); everything else by its extended-JSON form.
fn canonical(b: &Bson) -> String {
    match b {
        Bson::Int32(i) => i.to_string(),
        Bson::Int64(i) => i.to_string(),
        Bson::Double(d) if d.fract() == 0.0 && d.abs() < 1e15 => format!("{}", *d as i64),
        other => other.to_string(),
    }
}

/// The identity of an observed change event (see [`Expected::ident`]), `"invalidate"` for an
/// invalidate, or an error naming what is malformed.
pub fn ident_of_event(ev: &Document) -> Result<String, String> {
    let op = ev
        .get_str("operationType")
        .map_err(|_| format!("event without operationType: {ev}"))?;
    if op == "invalidate" {
        return Ok("invalidate".into());
    }
    let ns = ev
        .get_document("ns")
        .map_err(|_| format!("event without ns: {ev}"))?;
    let db = ns.get_str("db").unwrap_or("");
    let coll = ns.get_str("coll").ok();
    let key = ev
        .get_document("documentKey")
        .ok()
        .and_then(|k| k.get("_id").cloned());
    let tag = match Op::parse(op) {
        Some(Op::Insert | Op::Replace) => ev
            .get_document("fullDocument")
            .ok()
            .and_then(|d| d.get("w").cloned()),
        Some(Op::Update) => ev
            .get_document("updateDescription")
            .and_then(|u| u.get_document("updatedFields"))
            .ok()
            .and_then(|d| d.get("w").cloned()),
        Some(Op::Rename) => ev.get_document("to").ok().map(|to| {
            Bson::String(format!(
                "{}.{}",
                to.get_str("db").unwrap_or(""),
                to.get_str("coll").unwrap_or("")
            ))
        }),
        Some(Op::CreateIndexes | Op::DropIndexes) => ev
            .get_document("operationDescription")
            .ok()
            .and_then(|d| d.get_array("indexes").ok())
            .and_then(|a| a.first())
            .and_then(|i| i.as_document())
            .and_then(|i| i.get("name").cloned()),
        _ => None,
    };
    let key = match Op::parse(op) {
        Some(Op::Insert | Op::Update | Op::Replace | Op::Delete) => key,
        _ => None,
    };
    Ok(ident_string(op, db, coll, key.as_ref(), tag.as_ref()))
}

/// What a watcher watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Collection { db: String, coll: String },
    Database(String),
    Cluster,
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Collection { db, coll } => write!(f, "collection {db}.{coll}"),
            Scope::Database(db) => write!(f, "database {db}"),
            Scope::Cluster => write!(f, "cluster"),
        }
    }
}

/// A watcher's scope and options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSpec {
    pub scope: Scope,
    pub expanded: bool,
    /// `fullDocumentBeforeChange` and `fullDocument` `required`: every update, replace and
    /// delete carries its images, checked by [`image_failures`].
    pub images: bool,
}

impl WatchSpec {
    /// Whether the stream sees `e` (ignoring where the stream ends).
    pub fn sees(&self, e: &Expected) -> bool {
        if e.op.expanded_only() && !self.expanded {
            return false;
        }
        match &self.scope {
            Scope::Cluster => true,
            Scope::Database(db) => &e.db == db,
            Scope::Collection { db, coll } => {
                &e.db == db && (e.coll.as_ref() == Some(coll) || e.op == Op::DropDatabase)
            }
        }
    }

    /// Whether `e` ends this stream (an `invalidate` follows it).
    fn ended_by(&self, e: &Expected) -> bool {
        match &self.scope {
            Scope::Cluster => false,
            Scope::Database(db) => e.op == Op::DropDatabase && &e.db == db,
            Scope::Collection { db, coll } => {
                &e.db == db && e.coll.as_ref() == Some(coll) && e.op.ends_collection()
            }
        }
    }
}

/// What a verified stream contained.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub observed: usize,
    pub acked_seen: usize,
    pub unknown_seen: usize,
    pub unknown_absent: usize,
}

fn token_data(ev: &Document) -> String {
    ev.get_document("_id")
        .and_then(|t| t.get_str("_data"))
        .unwrap_or("")
        .to_string()
}

fn cluster_time(ev: &Document) -> Option<(u32, u32)> {
    match ev.get("clusterTime") {
        Some(Bson::Timestamp(t)) => Some((t.time, t.increment)),
        _ => None,
    }
}

/// At most this many messages of one kind, so a broken run stays readable.
const MAX_PER_KIND: usize = 10;

struct Failures {
    msgs: Vec<String>,
    counts: HashMap<&'static str, usize>,
}

impl Failures {
    fn push(&mut self, kind: &'static str, msg: String) {
        let n = self.counts.entry(kind).or_default();
        *n += 1;
        if *n <= MAX_PER_KIND {
            self.msgs.push(msg);
        } else if *n == MAX_PER_KIND + 1 {
            self.msgs
                .push(format!("... more '{kind}' failures left out"));
        }
    }
}

/// Checks one observed stream against the model. `complete` says the watcher read to its end
/// (the terminating event); when false, only what was read is checked for duplicates and order,
/// and acknowledged writes after the last observed event are not reported missing.
pub fn verify(
    model: &[Expected],
    spec: &WatchSpec,
    observed: &[Document],
    complete: bool,
) -> Result<Summary, Vec<String>> {
    let mut f = Failures {
        msgs: Vec::new(),
        counts: HashMap::new(),
    };
    // The model as this stream sees it: a collection stream stops at its namespace's first
    // terminating event (by the thread order of the terminating thread; the teardown is last).
    let mut in_scope: Vec<&Expected> = model.iter().filter(|e| spec.sees(e)).collect();
    if let Some(end) = in_scope
        .iter()
        .filter(|e| e.outcome == Outcome::Acked && spec.ended_by(e))
        .map(|e| (e.tid, e.step))
        .min()
    {
        // Only collection/database streams end; everything of that namespace is either before
        // the end (same thread, earlier step) or made by threads that stopped before it.
        in_scope.retain(|e| !(e.tid == end.0 && e.step > end.1));
    }
    let mut by_ident: HashMap<String, usize> = HashMap::new();
    for (i, e) in in_scope.iter().enumerate() {
        by_ident.insert(e.ident(), i);
    }

    // Tokens strictly increase; clusterTime never goes backwards.
    for (i, w) in observed.windows(2).enumerate() {
        let (a, b) = (token_data(&w[0]), token_data(&w[1]));
        if a >= b {
            f.push(
                "token order",
                format!(
                    "resume tokens do not strictly increase at position {}: {a} then {b} ({} then {})",
                    i + 1,
                    ident_of_event(&w[0]).unwrap_or_default(),
                    ident_of_event(&w[1]).unwrap_or_default()
                ),
            );
        }
        if let (Some(x), Some(y)) = (cluster_time(&w[0]), cluster_time(&w[1]))
            && y < x
        {
            f.push(
                "time order",
                format!(
                    "clusterTime goes backwards at position {}: {x:?} then {y:?}",
                    i + 1
                ),
            );
        }
    }

    // Match observed events to the model.
    let mut seen_at: Vec<Option<usize>> = vec![None; in_scope.len()];
    let mut matched: Vec<Option<usize>> = vec![None; observed.len()];
    let mut invalidate_at: Option<usize> = None;
    for (pos, ev) in observed.iter().enumerate() {
        let ident = match ident_of_event(ev) {
            Ok(i) => i,
            Err(e) => {
                f.push("malformed", e);
                continue;
            }
        };
        if ident == "invalidate" {
            if let Some(first) = invalidate_at {
                f.push(
                    "invalidate",
                    format!("a second invalidate at position {pos} (the first at {first})"),
                );
            } else {
                invalidate_at = Some(pos);
            }
            continue;
        }
        if let Some(inv) = invalidate_at {
            f.push(
                "after invalidate",
                format!("event {ident} at position {pos} after the invalidate at {inv}"),
            );
        }
        match by_ident.get(&ident) {
            None => f.push(
                "unexpected",
                format!(
                    "unexpected event at position {pos}: {ident} matches no write of the model ({ev})"
                ),
            ),
            Some(&i) => {
                if let Some(first) = seen_at[i] {
                    f.push(
                        "duplicate",
                        format!(
                            "duplicate event: {} appears twice, at positions {first} and {pos}",
                            in_scope[i]
                        ),
                    );
                } else {
                    seen_at[i] = Some(pos);
                    matched[pos] = Some(i);
                }
            }
        }
    }

    // Every acknowledged write appears (up to where the watcher read).
    let last_pos = observed.len();
    let mut summary = Summary {
        observed: observed.len(),
        ..Summary::default()
    };
    for (i, e) in in_scope.iter().enumerate() {
        match (seen_at[i], e.outcome) {
            (Some(_), Outcome::Acked) => summary.acked_seen += 1,
            (Some(_), Outcome::Unknown) => summary.unknown_seen += 1,
            (None, Outcome::Unknown) => summary.unknown_absent += 1,
            (None, Outcome::Acked) => {
                if complete {
                    f.push(
                        "missing",
                        format!(
                            "acknowledged write missing from the stream: {e} (the stream had {last_pos} events)"
                        ),
                    );
                }
            }
        }
    }

    // Per thread: operations in the thread's order (acknowledged ones).
    let mut last_of_thread: BTreeMap<usize, (u64, usize)> = BTreeMap::new();
    for (pos, m) in matched.iter().enumerate() {
        let Some(i) = *m else { continue };
        let e = in_scope[i];
        if e.outcome != Outcome::Acked {
            continue;
        }
        if let Some(&(step, at)) = last_of_thread.get(&e.tid)
            && e.step < step
        {
            f.push(
                "thread order",
                format!(
                    "thread {}'s writes out of order: {e} at position {pos} comes after its op #{step} at position {at}",
                    e.tid
                ),
            );
            continue;
        }
        last_of_thread.insert(e.tid, (e.step, pos));
    }

    // Per document: operations in the order they were made (including unknown outcomes).
    let mut last_of_doc: HashMap<(String, String), (usize, u64, usize)> = HashMap::new();
    for (pos, m) in matched.iter().enumerate() {
        let Some(i) = *m else { continue };
        let e = in_scope[i];
        let Some(key) = &e.key else { continue };
        let k = (e.ns(), canonical(key));
        if let Some(&(tid, step, at)) = last_of_doc.get(&k)
            && tid == e.tid
            && e.step < step
        {
            f.push(
                "document order",
                format!(
                    "document {} _id={} out of order: {e} at position {pos} after op #{step} at position {at}",
                    k.0, k.1
                ),
            );
            continue;
        }
        last_of_doc.insert(k, (e.tid, e.step, pos));
    }

    // Nothing of a namespace after its drop/rename; nothing of a database after dropDatabase.
    let mut ended: HashMap<String, (usize, String)> = HashMap::new();
    for (pos, m) in matched.iter().enumerate() {
        let Some(i) = *m else { continue };
        let e = in_scope[i];
        let ns = e.ns();
        let db_end = ended.get(&e.db).cloned();
        let ns_end = ended.get(&ns).cloned();
        for (at, what) in db_end.into_iter().chain(ns_end) {
            if e.op != Op::Create {
                f.push(
                    "after end",
                    format!("{e} at position {pos} comes after {what} at position {at}"),
                );
            }
        }
        match e.op {
            Op::Drop | Op::Rename => {
                ended.insert(ns, (pos, e.ident()));
            }
            Op::DropDatabase => {
                ended.insert(e.db.clone(), (pos, e.ident()));
            }
            Op::Create => {
                ended.remove(&ns);
            }
            _ => {}
        }
    }

    // A collection or database stream ends with one invalidate right after its end.
    if !matches!(spec.scope, Scope::Cluster) && complete {
        let end_pos = matched
            .iter()
            .position(|m| m.is_some_and(|i| spec.ended_by(in_scope[i])));
        match (end_pos, invalidate_at) {
            (Some(e), Some(inv)) if inv != e + 1 => f.push(
                "invalidate",
                format!(
                    "the invalidate at position {inv} does not follow the terminating event at {e}"
                ),
            ),
            (Some(e), None) => f.push(
                "invalidate",
                format!("no invalidate after the terminating event at position {e}"),
            ),
            (None, Some(inv)) => f.push(
                "invalidate",
                format!("an invalidate at position {inv} without a terminating event"),
            ),
            _ => {}
        }
    }

    if f.msgs.is_empty() {
        Ok(summary)
    } else {
        Err(f.msgs)
    }
}

/// The token-order failures of a whole stream (resume tokens strictly increase).
/// The images of an image-watcher's stream, checked against the stream itself: per document
/// (by `documentKey`), a pre-image must equal the document as the earlier events of the stream
/// left it (once the stream has seen it whole: inserted, replaced or post-imaged), and an
/// update's post-image must hold its `updatedFields` and lack its `removedFields`.
pub fn image_failures(observed: &[Document]) -> Vec<String> {
    let mut current: HashMap<String, Document> = HashMap::new();
    let mut out = Vec::new();
    for (pos, ev) in observed.iter().enumerate() {
        let kind = ev.get_str("operationType").unwrap_or("");
        let Ok(key) = ev.get_document("documentKey") else {
            continue;
        };
        let key = canonical(&Bson::Document(key.clone()));
        let before = ev.get_document("fullDocumentBeforeChange").ok();
        let after = ev.get_document("fullDocument").ok();
        if matches!(kind, "update" | "replace" | "delete") {
            match (before, current.get(&key)) {
                (None, _) => out.push(format!("event {pos} ({kind} {key}) has no pre-image")),
                (Some(b), Some(c)) if !same_doc(b, c) => out.push(format!(
                    "event {pos} ({kind} {key}): pre-image {b} but the stream left {c}"
                )),
                _ => {}
            }
        }
        match kind {
            "insert" | "replace" | "update" => {
                let Some(a) = after else {
                    out.push(format!("event {pos} ({kind} {key}) has no post-image"));
                    continue;
                };
                if kind == "update"
                    && let Ok(desc) = ev.get_document("updateDescription")
                {
                    for (f, v) in desc.get_document("updatedFields").into_iter().flatten() {
                        if !f.contains('.') && a.get(f).map(canonical) != Some(canonical(v)) {
                            out.push(format!(
                                "event {pos} (update {key}): post-image lacks {f}: {v}"
                            ));
                        }
                    }
                    for f in desc.get_array("removedFields").into_iter().flatten() {
                        if let Some(f) = f.as_str()
                            && !f.contains('.')
                            && a.contains_key(f)
                        {
                            out.push(format!(
                                "event {pos} (update {key}): post-image still has {f}"
                            ));
                        }
                    }
                }
                current.insert(key, a.clone());
            }
            "delete" => {
                current.remove(&key);
            }
            _ => {}
        }
    }
    out
}

/// Documents equal field by field, whatever their numeric types.
fn same_doc(a: &Document, b: &Document) -> bool {
    canonical(&Bson::Document(a.clone())) == canonical(&Bson::Document(b.clone()))
}

pub fn token_order_failures(observed: &[Document]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, w) in observed.windows(2).enumerate() {
        let (a, b) = (token_data(&w[0]), token_data(&w[1]));
        if a >= b {
            out.push(format!(
                "resume tokens do not strictly increase at position {}: {a} then {b}",
                i + 1
            ));
            if out.len() >= MAX_PER_KIND {
                break;
            }
        }
    }
    out
}

/// The part of a recorded (verified) stream a new stream must replay when started at
/// `startAtOperationTime: t`: the events with `clusterTime >= t`.
pub fn suffix_from_time(recorded: &[Document], t: (u32, u32)) -> &[Document] {
    let start = recorded
        .iter()
        .position(|e| cluster_time(e).is_some_and(|c| c >= t))
        .unwrap_or(recorded.len());
    &recorded[start..]
}

/// Compares a prefix read with the suffix it must equal; `None` if equal.
pub fn compare_suffix(expected: &[Document], got: &[Document]) -> Option<String> {
    for (i, (e, g)) in expected.iter().zip(got).enumerate() {
        if e != g {
            return Some(format!(
                "event {i} of the suffix differs: expected {} got {}",
                ident_of_event(e).unwrap_or_default(),
                ident_of_event(g).unwrap_or_default()
            ));
        }
    }
    if expected.len() != got.len() {
        return Some(format!(
            "the suffix has {} events, the new stream gave {}",
            expected.len(),
            got.len()
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use mongodb::bson::{Timestamp, doc};

    fn w(tid: usize, step: u64, op: Op, key: i64, tag: i64) -> Expected {
        Expected {
            tid,
            step,
            db: "d".into(),
            coll: Some("c".into()),
            op,
            key: Some(Bson::Int64(key)),
            tag: if op == Op::Delete {
                None
            } else {
                Some(Bson::Int64(tag))
            },
            outcome: Outcome::Acked,
        }
    }

    /// The event a write makes, with a token and clusterTime at position `n`.
    fn event(e: &Expected, n: u32) -> Document {
        let mut ev = doc! {
            "_id": {"_data": format!("{n:08}")},
            "operationType": e.op.name(),
            "clusterTime": Timestamp { time: 100, increment: n },
            "ns": {"db": e.db.clone(), "coll": e.coll.clone().unwrap_or_default()},
        };
        if let Some(k) = &e.key {
            ev.insert("documentKey", doc! {"_id": k.clone()});
        }
        match e.op {
            Op::Insert | Op::Replace => {
                ev.insert(
                    "fullDocument",
                    doc! {"_id": e.key.clone().unwrap(), "w": e.tag.clone().unwrap()},
                );
            }
            Op::Update => {
                ev.insert(
                    "updateDescription",
                    doc! {"updatedFields": {"w": e.tag.clone().unwrap()}, "removedFields": []},
                );
            }
            _ => {}
        }
        ev
    }

    fn model() -> Vec<Expected> {
        vec![
            w(0, 0, Op::Insert, 1, 10),
            w(1, 0, Op::Insert, 2, 20),
            w(0, 1, Op::Update, 1, 11),
            w(1, 1, Op::Replace, 2, 21),
            w(0, 2, Op::Delete, 1, 0),
        ]
    }

    fn cluster() -> WatchSpec {
        WatchSpec {
            scope: Scope::Cluster,
            expanded: false,
            images: false,
        }
    }

    fn stream(order: &[usize]) -> Vec<Document> {
        let m = model();
        order
            .iter()
            .enumerate()
            .map(|(n, &i)| event(&m[i], n as u32 + 1))
            .collect()
    }

    fn failures(observed: &[Document]) -> String {
        verify(&model(), &cluster(), observed, true)
            .unwrap_err()
            .join("\n")
    }

    #[test]
    fn a_faithful_interleaving_passes() {
        let s = verify(&model(), &cluster(), &stream(&[0, 1, 2, 3, 4]), true).unwrap();
        assert_eq!(s.acked_seen, 5);
        // Another interleaving of the two threads is just as good.
        verify(&model(), &cluster(), &stream(&[1, 0, 3, 2, 4]), true).unwrap();
    }

    #[test]
    fn a_dropped_event_is_reported_missing() {
        let msg = failures(&stream(&[0, 1, 3, 4]));
        assert!(
            msg.contains("acknowledged write missing from the stream")
                && msg.contains("update d.c _id=1 tag=11"),
            "{msg}"
        );
    }

    #[test]
    fn a_duplicated_event_is_reported_twice() {
        let mut s = stream(&[0, 1, 2, 3, 4]);
        // The merger emitting one event twice: same event, a later token.
        let mut again = s[2].clone();
        again.insert("_id", doc! {"_data": "00000099"});
        s.push(again);
        let msg = failures(&s);
        assert!(
            msg.contains("duplicate event") && msg.contains("appears twice, at positions 2 and 5"),
            "{msg}"
        );
    }

    #[test]
    fn reordered_events_of_one_thread_are_reported() {
        // Thread 0's update before its insert (tokens still increase: the merge is wrong).
        let msg = failures(&stream(&[2, 1, 0, 3, 4]));
        assert!(msg.contains("thread 0's writes out of order"), "{msg}");
        assert!(msg.contains("out of order"), "{msg}");
    }

    #[test]
    fn tokens_that_do_not_increase_are_reported() {
        let mut s = stream(&[0, 1, 2, 3, 4]);
        s.swap(1, 2);
        let msg = failures(&s);
        assert!(
            msg.contains("resume tokens do not strictly increase"),
            "{msg}"
        );
    }

    #[test]
    fn an_unknown_outcome_may_be_absent_or_once_but_never_twice() {
        let mut m = model();
        m[2].outcome = Outcome::Unknown;
        let absent = stream(&[0, 1, 3, 4]);
        let s = verify(&m, &cluster(), &absent, true).unwrap();
        assert_eq!(s.unknown_absent, 1);
        let once = stream(&[0, 1, 2, 3, 4]);
        assert_eq!(verify(&m, &cluster(), &once, true).unwrap().unknown_seen, 1);
        let mut twice = once.clone();
        let mut again = twice[2].clone();
        again.insert("_id", doc! {"_data": "00000099"});
        twice.push(again);
        let msg = verify(&m, &cluster(), &twice, true).unwrap_err().join("\n");
        assert!(msg.contains("duplicate event"), "{msg}");
    }

    #[test]
    fn an_event_no_write_explains_is_unexpected() {
        let mut s = stream(&[0, 1, 2, 3, 4]);
        let stray = event(&w(5, 0, Op::Insert, 99, 999), 50);
        s.push(stray);
        let msg = failures(&s);
        assert!(msg.contains("unexpected event at position 5"), "{msg}");
    }

    #[test]
    fn a_collection_stream_ends_with_one_invalidate_after_its_drop() {
        let mut m = model();
        m.push(Expected {
            tid: 2,
            step: 0,
            db: "d".into(),
            coll: Some("c".into()),
            op: Op::Drop,
            key: None,
            tag: None,
            outcome: Outcome::Acked,
        });
        let spec = WatchSpec {
            scope: Scope::Collection {
                db: "d".into(),
                coll: "c".into(),
            },
            expanded: false,
            images: false,
        };
        let mut s: Vec<Document> = [0, 1, 2, 3, 4, 5]
            .iter()
            .enumerate()
            .map(|(n, &i)| event(&m[i], n as u32 + 1))
            .collect();
        let no_invalidate = verify(&m, &spec, &s, true).unwrap_err().join("\n");
        assert!(no_invalidate.contains("no invalidate"), "{no_invalidate}");
        s.push(
            doc! {"_id": {"_data": "00000007"}, "operationType": "invalidate",
            "clusterTime": Timestamp { time: 100, increment: 6 }},
        );
        verify(&m, &spec, &s, true).unwrap();
        // A write after the drop is reported.
        let late = event(&w(0, 3, Op::Insert, 7, 70), 8);
        s.insert(6, late);
        let msg = verify(&m, &spec, &s, true).unwrap_err().join("\n");
        assert!(msg.contains("unexpected event"), "{msg}");
    }

    #[test]
    fn suffix_from_time_is_inclusive() {
        let s = stream(&[0, 1, 2, 3, 4]);
        assert_eq!(suffix_from_time(&s, (100, 3)).len(), 3);
        assert_eq!(suffix_from_time(&s, (101, 0)).len(), 0);
        assert!(compare_suffix(&s[2..], &s[2..]).is_none());
        let msg = compare_suffix(&s[2..], &s[3..]).unwrap();
        assert!(msg.contains("event 0 of the suffix differs"), "{msg}");
    }

    #[test]
    fn images_must_follow_the_stream() {
        use mongodb::bson::doc;
        let ev = |kind: &str,
                  before: Option<Document>,
                  after: Option<Document>,
                  desc: Option<Document>| {
            let mut e = doc! {"operationType": kind, "documentKey": {"_id": 1}};
            if let Some(b) = before {
                e.insert("fullDocumentBeforeChange", b);
            }
            if let Some(a) = after {
                e.insert("fullDocument", a);
            }
            if let Some(d) = desc {
                e.insert("updateDescription", d);
            }
            e
        };
        let v1 = doc! {"_id": 1, "n": 1};
        let v2 = doc! {"_id": 1, "n": 2};
        let good = vec![
            ev("insert", None, Some(v1.clone()), None),
            ev(
                "update",
                Some(v1.clone()),
                Some(v2.clone()),
                Some(doc! {"updatedFields": {"n": 2}, "removedFields": []}),
            ),
            ev("delete", Some(v2.clone()), None, None),
        ];
        assert!(
            image_failures(&good).is_empty(),
            "{:?}",
            image_failures(&good)
        );
        let mut stale = good.clone();
        stale[2] = ev("delete", Some(v1.clone()), None, None);
        assert_eq!(image_failures(&stale).len(), 1, "a stale pre-image");
        let mut missing = good.clone();
        missing[1].remove("fullDocumentBeforeChange");
        assert_eq!(image_failures(&missing).len(), 1, "no pre-image");
        let mut wrong_after = good.clone();
        wrong_after[1].insert("fullDocument", v1.clone());
        assert!(
            !image_failures(&wrong_after).is_empty(),
            "a post-image without the update"
        );
    }
}
