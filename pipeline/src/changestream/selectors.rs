//! Selectors: which change events a subscription delivers, and how they group into messages
//! (a trigger queue: one message per document per transaction).
//!
//! A selector names a collection, operation types and changed fields; an event matches when
//! any selector matches it, and a selector when every field it gives does. Matched events of
//! one transaction are grouped by document: the message's `event` is the document's first
//! matching change, its `changes` every matching change of that document in the transaction.
//!
//! The [`Grouper`] takes events in token order and gives back complete groups in the order of
//! their first tokens. A transaction's events share one cluster time (a cross-shard commit's
//! too), so a group is complete once the stream has moved past that time: an event at a later
//! time, or a resume position past it ([`Grouper::release`]). An event outside any
//! transaction passes at once unless a transaction at its time is still open.
//!
//! Invariants: pure (no I/O, no clock); groups come out in first-token order, each event in
//! exactly one group; given the same events from the start of a cluster time the same groups
//! come out (so a reader that resumes at [`Grouper::holding`] rebuilds what it held, and one
//! that resumes at the start of a message's cluster time meets the same messages again); what
//! is held is one cluster time's events, and a group's changes are at most
//! [`MAX_GROUP_BYTES`] (past it the document's further changes start a new group).

use std::collections::HashMap;

use bson::{Bson, Document, RawBsonRef, RawDocument, doc};
use resume::time::ClusterTime;
use resume::token::ResumeToken;
use wire::{MongoError, Result};

use super::transform::is_classic_type;

/// The most selectors a subscription has.
pub const MAX_SELECTORS: usize = 100;
/// The most operation types or field paths one selector lists.
pub const MAX_SELECTOR_ITEMS: usize = 100;
/// The most bytes of changes one group holds.
pub const MAX_GROUP_BYTES: usize = 8 << 20;

/// The operation types a selector may name past the classic ones (expanded events).
const EXPANDED: &[&str] = &[
    "create",
    "createIndexes",
    "dropIndexes",
    "modify",
    "shardCollection",
    "refineCollectionShardKey",
    "reshardCollection",
];

/// One selector: every field it gives must match.
#[derive(Debug, Clone, PartialEq)]
pub struct Selector {
    pub collection: Option<String>,
    pub operations: Option<Vec<String>>,
    pub changed_fields: Option<Vec<String>>,
}

/// A subscription's selectors: an event is delivered when any matches.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Selectors(pub Vec<Selector>);

impl Selectors {
    /// Parses `selectors: [{collection?, operations?, changedFields?}]` (at least one).
    pub fn parse(v: &Bson) -> Result<Selectors> {
        let Bson::Array(items) = v else {
            return Err(MongoError::type_mismatch(
                "'selectors' must be an array of {collection, operations, changedFields}",
            ));
        };
        if items.is_empty() || items.len() > MAX_SELECTORS {
            return Err(MongoError::bad_value(format!(
                "'selectors' takes 1 to {MAX_SELECTORS} selectors"
            )));
        }
        items
            .iter()
            .map(Selector::parse)
            .collect::<Result<_>>()
            .map(Selectors)
    }

    pub fn to_bson(&self) -> Bson {
        Bson::Array(
            self.0
                .iter()
                .map(|s| Bson::Document(s.to_document()))
                .collect(),
        )
    }

    /// Whether `event` (a change event as `watch()` returns it) is delivered.
    pub fn matches(&self, event: &RawDocument) -> bool {
        self.0.iter().any(|s| s.matches(event))
    }
}

impl Selector {
    fn parse(v: &Bson) -> Result<Selector> {
        let Bson::Document(d) = v else {
            return Err(MongoError::type_mismatch(
                "each selector must be a document",
            ));
        };
        let mut s = Selector {
            collection: None,
            operations: None,
            changed_fields: None,
        };
        for (k, v) in d {
            match k.as_str() {
                "collection" => match v {
                    Bson::String(c) if !c.is_empty() && !c.contains('\0') => {
                        s.collection = Some(c.clone());
                    }
                    _ => {
                        return Err(MongoError::bad_value(
                            "'selectors.collection' must be a collection name",
                        ));
                    }
                },
                "operations" => {
                    let ops = strings(v, "selectors.operations")?;
                    if let Some(bad) = ops
                        .iter()
                        .find(|o| !is_classic_type(o) && !EXPANDED.contains(&o.as_str()))
                    {
                        return Err(MongoError::bad_value(format!(
                            "'selectors.operations': '{bad}' is not a change event's operationType"
                        )));
                    }
                    s.operations = Some(ops);
                }
                "changedFields" => {
                    let fields = strings(v, "selectors.changedFields")?;
                    if fields
                        .iter()
                        .any(|f| f.is_empty() || f.split('.').any(str::is_empty))
                    {
                        return Err(MongoError::bad_value(
                            "'selectors.changedFields' must be field paths",
                        ));
                    }
                    s.changed_fields = Some(fields);
                }
                other => {
                    return Err(MongoError::bad_value(format!(
                        "a selector has collection, operations and changedFields, not '{other}'"
                    )));
                }
            }
        }
        Ok(s)
    }

    fn to_document(&self) -> Document {
        let mut d = doc! {};
        if let Some(c) = &self.collection {
            d.insert("collection", c);
        }
        if let Some(o) = &self.operations {
            d.insert("operations", o.clone());
        }
        if let Some(f) = &self.changed_fields {
            d.insert("changedFields", f.clone());
        }
        d
    }

    fn matches(&self, event: &RawDocument) -> bool {
        let op = event.get_str("operationType").unwrap_or("");
        if let Some(c) = &self.collection {
            let coll = event
                .get_document("ns")
                .ok()
                .and_then(|ns| ns.get_str("coll").ok());
            if coll != Some(c.as_str()) {
                return false;
            }
        }
        if let Some(ops) = &self.operations
            && !ops.iter().any(|o| o == op)
        {
            return false;
        }
        match &self.changed_fields {
            None => true,
            Some(fields) => match op {
                // The whole document changes.
                "insert" | "replace" | "delete" => true,
                "update" => changed_paths(event).any(|p| fields.iter().any(|f| overlaps(f, p))),
                _ => false,
            },
        }
    }
}

/// An array of 1 to [`MAX_SELECTOR_ITEMS`] strings.
fn strings(v: &Bson, field: &str) -> Result<Vec<String>> {
    let Bson::Array(a) = v else {
        return Err(MongoError::type_mismatch(format!(
            "'{field}' must be an array of strings"
        )));
    };
    if a.is_empty() || a.len() > MAX_SELECTOR_ITEMS {
        return Err(MongoError::bad_value(format!(
            "'{field}' takes 1 to {MAX_SELECTOR_ITEMS} strings"
        )));
    }
    a.iter()
        .map(|v| match v {
            Bson::String(s) => Ok(s.clone()),
            _ => Err(MongoError::type_mismatch(format!(
                "'{field}' must be an array of strings"
            ))),
        })
        .collect()
}

/// The paths an update event changed: its updated, removed and truncated fields.
fn changed_paths(event: &RawDocument) -> impl Iterator<Item = &str> {
    let desc = event.get_document("updateDescription").ok();
    let updated = desc
        .and_then(|d| d.get_document("updatedFields").ok())
        .into_iter()
        .flat_map(|u| u.iter().filter_map(|e| e.ok().map(|(k, _)| k.as_str())));
    let names = |field: &'static str| {
        desc.and_then(move |d| d.get_array(field).ok())
            .into_iter()
            .flat_map(|a| a.into_iter().filter_map(|v| v.ok()))
    };
    let removed = names("removedFields").filter_map(|v| v.as_str());
    let truncated = names("truncatedArrays")
        .filter_map(|v| v.as_document().and_then(|d| d.get_str("field").ok()));
    updated.chain(removed).chain(truncated)
}

/// Whether changing `path` changes `field`: one is the other or lies below it.
fn overlaps(field: &str, path: &str) -> bool {
    let below = |long: &str, short: &str| {
        long.len() > short.len() && long.starts_with(short) && long.as_bytes()[short.len()] == b'.'
    };
    field == path || below(path, field) || below(field, path)
}

/// A complete group: one message.
#[derive(Debug, Clone, PartialEq)]
pub struct Group<E> {
    /// Its first change's token: the message's.
    pub token: ResumeToken,
    /// Every matching change of the document in the transaction, the first one first.
    pub changes: Vec<E>,
}

/// Groups matched events into messages; see the module's invariants.
#[derive(Debug)]
pub struct Grouper<E> {
    /// The cluster time of what is held.
    time: Option<ClusterTime>,
    held: Vec<(Group<E>, usize)>,
    /// Where each (transaction, document) group of `held` is, while it takes more.
    open: HashMap<Vec<u8>, usize>,
}

impl<E> Default for Grouper<E> {
    fn default() -> Self {
        Grouper {
            time: None,
            held: Vec::new(),
            open: HashMap::new(),
        }
    }
}

impl<E: AsRef<[u8]>> Grouper<E> {
    /// Takes the next matched event (token order): the groups it completes.
    pub fn push(&mut self, token: ResumeToken, event: E) -> Result<Vec<Group<E>>> {
        let time = token
            .decode()
            .map_err(|e| MongoError::internal(format!("an event's token: {e}")))?
            .cluster_time();
        let mut done = if self.time.is_some_and(|t| t < time) {
            self.flush()
        } else {
            Vec::new()
        };
        let doc = RawDocument::from_bytes(event.as_ref())
            .map_err(|e| MongoError::internal(format!("a change event: {e}")))?;
        let Some(key) = group_key(doc) else {
            // Outside a transaction: at once, unless a transaction at its time is held.
            let group = Group {
                token,
                changes: vec![event],
            };
            if self.time.is_some() {
                self.held.push((group, 0));
            } else {
                done.push(group);
            }
            return Ok(done);
        };
        self.time = Some(time);
        let len = event.as_ref().len();
        match self.open.get(&key).copied() {
            Some(i) if self.held[i].1 + len <= MAX_GROUP_BYTES => {
                self.held[i].0.changes.push(event);
                self.held[i].1 += len;
            }
            _ => {
                self.open.insert(key, self.held.len());
                self.held.push((
                    Group {
                        token,
                        changes: vec![event],
                    },
                    len,
                ));
            }
        }
        Ok(done)
    }

    /// The stream has read through `through`: what it completes.
    pub fn release(&mut self, through: &ResumeToken) -> Vec<Group<E>> {
        let past = through
            .decode()
            .is_ok_and(|t| self.time.is_some_and(|held| t.cluster_time() > held));
        if past { self.flush() } else { Vec::new() }
    }

    /// The stream ended (an invalidate): everything held is complete.
    pub fn finish(&mut self) -> Vec<Group<E>> {
        self.flush()
    }

    /// Where a reader must resume to rebuild what is held (the start of its cluster time);
    /// `None` when nothing is.
    pub fn holding(&self) -> Option<ClusterTime> {
        self.time
    }

    fn flush(&mut self) -> Vec<Group<E>> {
        self.time = None;
        self.open.clear();
        let mut groups: Vec<Group<E>> = self.held.drain(..).map(|(g, _)| g).collect();
        groups.sort_by(|a, b| a.token.cmp(&b.token));
        groups
    }
}

/// A transaction event's group: its transaction (`lsid`, `txnNumber`), namespace and
/// document; `None` outside a transaction.
fn group_key(event: &RawDocument) -> Option<Vec<u8>> {
    let txn = event.get("txnNumber").ok().flatten()?;
    let mut key = Vec::new();
    let mut part = |v: Option<RawBsonRef<'_>>| {
        let bytes: Vec<u8> = match v {
            Some(RawBsonRef::Document(d)) => d.as_bytes().to_vec(),
            Some(RawBsonRef::Int64(n)) => n.to_le_bytes().to_vec(),
            Some(RawBsonRef::Int32(n)) => i64::from(n).to_le_bytes().to_vec(),
            _ => Vec::new(),
        };
        key.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        key.extend_from_slice(&bytes);
    };
    part(event.get("lsid").ok().flatten());
    part(Some(txn));
    part(event.get("ns").ok().flatten());
    part(event.get("documentKey").ok().flatten());
    Some(key)
}

/// Where a selector subscription's stream resumes to meet again what follows `position`: the
/// start of its cluster time when it is a message's token (the message's transaction is
/// grouped anew, and what is at or before `position` is passed over by the reader).
pub fn regroup_from(position: &ResumeToken) -> Option<ClusterTime> {
    let data = position.decode().ok()?;
    (!data.is_high_water_mark() && !data.from_invalidate()).then(|| data.cluster_time())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use resume::token::ResumeTokenData;

    fn token(secs: u32, op: u32) -> ResumeToken {
        let ct = ClusterTime { secs, inc: 1 };
        let key = doc! {"_id": op as i32};
        ResumeTokenData::event_from_parts(
            ct,
            Default::default(),
            op,
            None,
            "insert",
            Some(("documentKey", &key)),
        )
        .map(|d| d.encode())
        .expect("a token")
    }

    fn event(txn: Option<i64>, doc_id: i32, op: &str, fields: &[&str]) -> Vec<u8> {
        let mut e = doc! {
            "operationType": op,
            "ns": {"db": "d", "coll": "c"},
            "documentKey": {"_id": doc_id},
        };
        if let Some(n) = txn {
            e.insert("lsid", doc! {"id": 1});
            e.insert("txnNumber", n);
        }
        if op == "update" {
            let updated: Document = fields
                .iter()
                .map(|f| (f.to_string(), Bson::Int32(1)))
                .collect();
            e.insert(
                "updateDescription",
                doc! {"updatedFields": updated, "removedFields": [], "truncatedArrays": []},
            );
        }
        let mut bytes = Vec::new();
        e.to_writer(&mut bytes).expect("bytes");
        bytes
    }

    #[test]
    fn selectors_match_collection_operation_and_changed_fields() {
        let s = Selectors::parse(&bson::bson!([
            {"collection": "c", "operations": ["update"], "changedFields": ["status"]},
            {"operations": ["delete"]},
        ]))
        .expect("valid");
        let m = |e: Vec<u8>| s.matches(RawDocument::from_bytes(&e).expect("doc"));
        assert!(m(event(None, 1, "update", &["status"])));
        assert!(
            m(event(None, 1, "update", &["status.code"])),
            "below the field"
        );
        assert!(!m(event(None, 1, "update", &["statusx", "other"])));
        assert!(!m(event(None, 1, "insert", &[])), "not an update");
        assert!(m(event(None, 1, "delete", &[])), "the second selector");
        let whole = Selectors::parse(&bson::bson!([{"changedFields": ["a.b"]}])).expect("valid");
        let e = event(None, 1, "update", &["a"]);
        assert!(
            whole.matches(RawDocument::from_bytes(&e).expect("doc")),
            "above the field"
        );
        assert!(
            whole.matches(RawDocument::from_bytes(&event(None, 1, "insert", &[])).expect("doc"))
        );
    }

    #[test]
    fn bad_selectors_are_refused() {
        for bad in [
            bson::bson!([]),
            bson::bson!("x"),
            bson::bson!([{"operations": ["upsert"]}]),
            bson::bson!([{"changedFields": ["a..b"]}]),
            bson::bson!([{"collection": ""}]),
            bson::bson!([{"other": 1}]),
            bson::bson!([{"operations": []}]),
        ] {
            assert!(Selectors::parse(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_transaction_becomes_one_message_per_document_once_the_stream_passes_its_time() {
        let mut g = Grouper::default();
        assert!(
            g.push(token(5, 0), event(Some(1), 1, "update", &["a"]))
                .unwrap()
                .is_empty()
        );
        assert!(
            g.push(token(5, 1), event(Some(1), 2, "update", &["a"]))
                .unwrap()
                .is_empty()
        );
        assert!(
            g.push(token(5, 2), event(Some(1), 1, "update", &["b"]))
                .unwrap()
                .is_empty()
        );
        assert_eq!(g.holding(), Some(ClusterTime { secs: 5, inc: 1 }));
        assert!(g.release(&token(5, 3)).is_empty(), "its time may hold more");
        let done = g.release(
            &ResumeTokenData::high_water_mark(ClusterTime { secs: 6, inc: 1 }, Default::default())
                .encode(),
        );
        assert_eq!(done.len(), 2);
        assert_eq!(
            (done[0].token.clone(), done[0].changes.len()),
            (token(5, 0), 2)
        );
        assert_eq!(
            (done[1].token.clone(), done[1].changes.len()),
            (token(5, 1), 1)
        );
        assert_eq!(g.holding(), None);
        let single = g.push(token(7, 0), event(None, 3, "insert", &[])).unwrap();
        assert_eq!(single.len(), 1, "outside a transaction: at once");
    }

    #[test]
    fn resuming_at_a_messages_time_meets_the_same_messages() {
        assert_eq!(
            regroup_from(&token(5, 1)),
            Some(ClusterTime { secs: 5, inc: 1 })
        );
        let hwm =
            ResumeTokenData::high_water_mark(ClusterTime { secs: 5, inc: 1 }, Default::default())
                .encode();
        assert_eq!(regroup_from(&hwm), None);
    }

    proptest! {
        /// Events of random transactions and single writes, in token order: every event is in
        /// exactly one group, groups come in first-token order, a group holds one
        /// transaction's changes of one document, and grouping again from any message's
        /// cluster time gives the same messages from there on.
        #[test]
        fn groups_partition_the_events_and_regroup_the_same(
            plan in proptest::collection::vec((0u32..4, proptest::option::of(0i64..3), 0i32..3), 1..60)
        ) {
            let mut secs = 10u32;
            let mut events = Vec::new();
            for (i, (step, txn, doc_id)) in plan.iter().enumerate() {
                secs += step.min(&1);
                events.push((token(secs, i as u32), event(*txn, *doc_id, "update", &["x"]), *txn, *doc_id));
            }
            let run = |from: usize| {
                let mut g = Grouper::default();
                let mut out = Vec::new();
                for (t, e, _, _) in &events[from..] {
                    out.extend(g.push(t.clone(), e.clone()).unwrap());
                }
                out.extend(g.release(&ResumeTokenData::high_water_mark(ClusterTime { secs: u32::MAX, inc: 1 }, Default::default()).encode()));
                out
            };
            let all = run(0);
            let n: usize = all.iter().map(|g| g.changes.len()).sum();
            prop_assert_eq!(n, events.len());
            prop_assert!(all.windows(2).all(|w| w[0].token < w[1].token));
            for g in &all {
                let first = events.iter().find(|e| e.0 == g.token).unwrap();
                let time = g.token.decode().unwrap().cluster_time();
                for c in &g.changes {
                    let e = events.iter().find(|e| &e.1 == c && e.0.decode().unwrap().cluster_time() == time).unwrap();
                    prop_assert_eq!((e.2, e.3), (first.2, first.3));
                }
                if first.2.is_none() {
                    prop_assert_eq!(g.changes.len(), 1);
                }
            }
            // A reader at message k resumes at the start of k's cluster time.
            for k in &all {
                let time = regroup_from(&k.token).unwrap();
                let from = events.iter().position(|e| e.0.decode().unwrap().cluster_time() >= time).unwrap();
                let again: Vec<_> = run(from).into_iter().filter(|g| g.token > k.token).collect();
                let expected: Vec<_> = all.iter().filter(|g| g.token > k.token).cloned().collect();
                prop_assert_eq!(again, expected);
            }
        }
    }
}
