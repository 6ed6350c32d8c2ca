//! Building the change event and its resume token from one (pseudo-)oplog entry
//! (`$_internalChangeStreamTransform`, reference §2 and §5.1).
//!
//! Owns: the event types of §2.2 (including the view DDL events that database and cluster
//! streams build from `system.views` CRUD), the field layout of §2.1, the event identifier of the token,
//! and the classic-types filter.
//!
//! Invariants:
//! * field order: [`to` | `reshardingUUID`], [`txnNumber`, `lsid`], `_id`, `operationType`,
//!   `clusterTime`, `collectionUUID`, `wallTime`, `fullDocument`, `ns`, `documentKey`,
//!   `operationDescription`, `updateDescription` / `rawUpdateDescription`, `stateBeforeChange`,
//!   `nsType`;
//! * `collectionUUID`, `operationDescription`, `nsType` and `disambiguatedPaths` appear only with
//!   `showExpandedEvents`; `wallTime` always (when the entry has `wall`); `lsid`/`txnNumber` only
//!   on ops unwound from a transaction;
//! * the v2 token is `clusterTime, txnOpIndex, uuid (null when none), {operationType,
//!   documentKey}` for CRUD and `{operationType, operationDescription}` otherwise, where the
//!   operation description is computed whether or not it is shown (tokens must not depend on
//!   flags); the token version follows [`TokenVersionPolicy`];
//! * an entry that makes no event yields `Ok(None)`; a malformed update fails with 6741200.

use bson::{Bson, Document, RawDocument, Uuid, doc, spec::BinarySubtype};
use resume::ClusterTime;
use resume::token::{ResumeTokenData, TokenVersion};
use wire::{MongoError, Result};

mod encoded;

pub use encoded::{EncodedEvent, EntryFields};

use super::ChangeEvent;
use super::diff_parser::parse_diff;
use super::oplog_match::MARKERS;
use super::resumability::TokenVersionPolicy;
use super::spec::{ChangeStreamSpec, StreamLevel};

/// Event types that pass without `showExpandedEvents`.
pub const CLASSIC_TYPES: &[&str] = &[
    "insert",
    "update",
    "replace",
    "delete",
    "drop",
    "rename",
    "dropDatabase",
    "invalidate",
];

/// The classic-types filter: without `showExpandedEvents` only these reach the user.
pub fn is_classic_type(operation_type: &str) -> bool {
    CLASSIC_TYPES.contains(&operation_type)
}

/// An event's `commitMetadata`: who wrote the change and how, as the entry recorded it at
/// write time (its `commitMetadata`: `user`, `authenticatedDb`, `appName`, `comment`), when
/// (`wallTime`), and in which transaction (`txnMetadata`: `lsid`, `txnNumber`). Every field
/// is present, null when unknown, so a `$match` reads one shape.
fn commit_metadata(entry: &Document, in_transaction: bool) -> Document {
    let recorded = entry.get_document("commitMetadata").ok();
    let field = |f: &str| {
        recorded
            .and_then(|r| r.get(f))
            .cloned()
            .unwrap_or(Bson::Null)
    };
    let txn = match (in_transaction, entry.get("lsid"), entry.get("txnNumber")) {
        (true, Some(lsid), Some(n)) => {
            Bson::Document(doc! {"lsid": lsid.clone(), "txnNumber": n.clone()})
        }
        _ => Bson::Null,
    };
    doc! {
        "user": field("user"),
        "authenticatedDb": field("authenticatedDb"),
        "appName": field("appName"),
        "comment": field("comment"),
        "wallTime": entry.get("wall").cloned().unwrap_or(Bson::Null),
        "txnMetadata": txn,
    }
}

/// Builds events for one stream; holds the token-version state.
#[derive(Debug, Clone)]
pub struct Transformer {
    show_expanded_events: bool,
    show_raw_update_description: bool,
    show_commit_timestamp: bool,
    show_commit_metadata: bool,
    /// Database and cluster streams turn `system.views` CRUD into view DDL events.
    view_events: bool,
    versions: TokenVersionPolicy,
    /// Reused by the encoded path from one event to the next.
    buffers: encoded::Buffers,
}

/// What an entry says, before the document is laid out.
#[derive(Default)]
struct Parts {
    operation_type: &'static str,
    db: String,
    coll: Option<String>,
    to: Option<Document>,
    resharding_uuid: Option<Bson>,
    full_document: Option<Document>,
    document_key: Option<Document>,
    operation_description: Option<Document>,
    update_description: Option<(&'static str, Document)>,
    state_before_change: Option<Document>,
    ns_type: Option<&'static str>,
    /// A view DDL event (from `system.views` CRUD): no `collectionUUID` (the entry's `ui` is
    /// that of `system.views`).
    view_definition: bool,
}

impl Transformer {
    pub fn new(spec: &ChangeStreamSpec) -> Transformer {
        Transformer {
            show_expanded_events: spec.options.show_expanded_events,
            show_raw_update_description: spec.options.show_raw_update_description,
            show_commit_timestamp: spec.options.show_commit_timestamp,
            show_commit_metadata: spec.options.show_commit_metadata,
            view_events: spec.level != StreamLevel::Collection,
            versions: TokenVersionPolicy::new(&spec.start),
            buffers: encoded::Buffers::default(),
        }
    }

    /// The event for `entry` (a top-level entry or an unwound pseudo-entry), if it makes one.
    pub fn transform(&mut self, entry: &Document) -> Result<Option<ChangeEvent>> {
        let Some(p) = self.parts(entry)? else {
            return Ok(None);
        };
        let ts = match entry.get("ts") {
            Some(Bson::Timestamp(ts)) => ClusterTime::from(*ts),
            _ => return Err(MongoError::internal("oplog entry without a Timestamp 'ts'")),
        };
        let uuid = entry.get("ui").and_then(bson_uuid);
        let txn_op_index = match entry.get("txnOpIndex") {
            Some(Bson::Int64(i)) => Some(u32::try_from(*i).unwrap_or(u32::MAX)),
            Some(Bson::Int32(i)) => Some(u32::try_from(*i).unwrap_or(u32::MAX)),
            _ => None,
        };

        let crud = matches!(p.operation_type, "insert" | "update" | "replace" | "delete");
        let data = self.token_data(
            ts,
            uuid,
            txn_op_index,
            p.operation_type,
            p.document_key.as_ref(),
            p.operation_description.as_ref(),
        )?;
        let token = data.encode();

        let mut d = Document::new();
        if let Some(to) = p.to {
            d.insert("to", to);
        }
        if let Some(r) = p.resharding_uuid {
            d.insert("reshardingUUID", r);
        }
        if txn_op_index.is_some() {
            for f in ["txnNumber", "lsid"] {
                if let Some(v) = entry.get(f) {
                    d.insert(f, v.clone());
                }
            }
        }
        d.insert("_id", token.to_document());
        d.insert("operationType", p.operation_type);
        d.insert("clusterTime", Bson::Timestamp(ts.timestamp()));
        if self.show_expanded_events
            && !p.view_definition
            && let Some(ui) = entry.get("ui")
        {
            d.insert("collectionUUID", ui.clone());
        }
        if let Some(wall) = entry.get("wall") {
            d.insert("wallTime", wall.clone());
        }
        if let Some(full) = p.full_document {
            d.insert("fullDocument", full);
        }
        let mut ns = doc! {"db": p.db};
        if let Some(coll) = p.coll {
            ns.insert("coll", coll);
        }
        d.insert("ns", ns);
        if let Some(key) = p.document_key.filter(|_| crud) {
            d.insert("documentKey", key);
        }
        if self.show_expanded_events
            && let Some(desc) = p.operation_description
        {
            d.insert("operationDescription", desc);
        }
        if let Some((name, u)) = p.update_description {
            d.insert(name, u);
        }
        if let Some(s) = p.state_before_change {
            d.insert("stateBeforeChange", s);
        }
        if self.show_expanded_events
            && let Some(t) = p.ns_type
        {
            d.insert("nsType", t);
        }
        if self.show_commit_timestamp
            && let Some(ct) = entry.get("commitTimestamp")
        {
            d.insert("commitTimestamp", ct.clone());
        }
        if self.show_commit_metadata {
            d.insert(
                "commitMetadata",
                commit_metadata(entry, txn_op_index.is_some()),
            );
        }
        Ok(Some(ChangeEvent {
            token,
            data,
            doc: d,
        }))
    }

    /// The token of an event (see the module invariants on its identifier).
    fn token_data(
        &mut self,
        ts: ClusterTime,
        uuid: Option<Uuid>,
        txn_op_index: Option<u32>,
        operation_type: &str,
        document_key: Option<&Document>,
        operation_description: Option<&Document>,
    ) -> Result<ResumeTokenData> {
        let crud = matches!(operation_type, "insert" | "update" | "replace" | "delete");
        self.versions.make(|version| {
            let txn_op_index = txn_op_index.unwrap_or(0);
            if version == TokenVersion::V2 {
                // `{operationType, documentKey | operationDescription}`, built in place.
                let second = if crud {
                    document_key.map(|k| ("documentKey", k))
                } else {
                    operation_description.map(|d| ("operationDescription", d))
                };
                return ResumeTokenData::event_from_parts(
                    ts,
                    version,
                    txn_op_index,
                    uuid,
                    operation_type,
                    second,
                );
            }
            let identifier = if crud || is_classic_type(operation_type) {
                document_key.cloned().filter(|_| uuid.is_some())
            } else {
                Some(resume::token::event_identifier(
                    operation_type,
                    operation_description
                        .cloned()
                        .map(|d| ("operationDescription", d)),
                ))
                .filter(|_| uuid.is_some())
            };
            ResumeTokenData::event(ts, version, txn_op_index, uuid, identifier)
        })
    }

    /// [`Transformer::token_data`] of a CRUD event whose document key is BSON bytes, encoded
    /// without decoding them; `None` where they must be decoded first (see
    /// [`ResumeTokenData::event_from_raw_parts`]).
    fn crud_token_data_raw(
        &mut self,
        ts: ClusterTime,
        uuid: Option<Uuid>,
        operation_type: &str,
        document_key: &RawDocument,
    ) -> Result<Option<ResumeTokenData>> {
        self.versions.make_if(|version| {
            // As `token_data` for CRUD: `{operationType, documentKey}` from v2, before it the
            // bare key, and only with a uuid.
            let second = (version == TokenVersion::V2 || uuid.is_some())
                .then_some(("documentKey", document_key));
            ResumeTokenData::event_from_raw_parts(ts, version, 0, uuid, operation_type, second)
        })
    }

    fn parts(&self, entry: &Document) -> Result<Option<Parts>> {
        let op = entry.get_str("op").unwrap_or("");
        let ns = entry.get_str("ns").unwrap_or("");
        let o = entry.get_document("o").ok();
        let o2 = entry.get_document("o2").ok();
        let mut p = Parts::default();
        match op {
            "i" | "u" | "d" => {
                let Some((db, coll)) = ns.split_once('.') else {
                    return Ok(None);
                };
                let Some(o) = o else {
                    return Err(MongoError::internal("CRUD oplog entry without 'o'"));
                };
                if self.view_events && coll == "system.views" {
                    return view_definition(&mut p, op, o).map(|()| Some(p));
                }
                p.db = db.to_string();
                p.coll = Some(coll.to_string());
                match op {
                    "i" => {
                        p.operation_type = "insert";
                        p.document_key = Some(key_or_id(o2, o));
                        p.full_document = Some(o.clone());
                    }
                    "d" => {
                        p.operation_type = "delete";
                        p.document_key = Some(o.clone());
                    }
                    _ => self.update(&mut p, o, o2)?,
                }
            }
            "c" => {
                let Some(o) = o else { return Ok(None) };
                let Some(db) = ns.strip_suffix(".$cmd") else {
                    return Ok(None);
                };
                if !command(&mut p, db, o, o2) {
                    return Ok(None);
                }
            }
            "n" => {
                let Some(o2) = o2 else { return Ok(None) };
                let Some((marker, _)) = MARKERS.iter().find(|(m, _)| o2.contains_key(m)) else {
                    return Ok(None);
                };
                let Some((db, coll)) = ns.split_once('.') else {
                    return Ok(None);
                };
                p.operation_type = marker;
                p.db = db.to_string();
                p.coll = Some(coll.to_string());
                if matches!(*marker, "reshardBegin" | "reshardDoneCatchUp") {
                    p.resharding_uuid = o2.get("reshardingUUID").cloned();
                }
                p.operation_description = Some(without(o2, &[marker]));
            }
            _ => return Ok(None),
        }
        Ok(Some(p))
    }

    fn update(&self, p: &mut Parts, o: &Document, o2: Option<&Document>) -> Result<()> {
        match o.get("$v") {
            Some(v) if is_two(v) => {
                let Ok(diff) = o.get_document("diff") else {
                    return Err(bad_update("a $v:2 update without a 'diff' object"));
                };
                let Some(key) = o2 else {
                    return Err(bad_update("an update entry without 'o2'"));
                };
                p.operation_type = "update";
                p.document_key = Some(key.clone());
                p.update_description = Some(if self.show_raw_update_description {
                    ("rawUpdateDescription", o.clone())
                } else {
                    (
                        "updateDescription",
                        parse_diff(diff)?.into_document(self.show_expanded_events),
                    )
                });
            }
            Some(v) => {
                return Err(bad_update(&format!(
                    "unsupported update oplog version $v: {v}"
                )));
            }
            None if o.contains_key("_id") => {
                p.operation_type = "replace";
                p.document_key = Some(key_or_id(o2, o));
                p.full_document = Some(o.clone());
            }
            None => {
                return Err(bad_update(
                    "update entry is neither a $v:2 diff nor a replacement",
                ));
            }
        }
        Ok(())
    }
}

/// A view DDL event from CRUD on `<db>.system.views`, whose documents are
/// `{_id: "<db>.<view>", viewOn, pipeline}`: insert → `create`, replacement → `modify`,
/// delete → `drop`.
fn view_definition(p: &mut Parts, op: &str, o: &Document) -> Result<()> {
    let Some((db, view)) = o.get_str("_id").ok().and_then(|id| id.split_once('.')) else {
        return Err(MongoError::internal(
            "system.views entry without a namespace _id",
        ));
    };
    p.db = db.to_string();
    p.coll = Some(view.to_string());
    p.view_definition = true;
    match op {
        "i" => {
            p.operation_type = "create";
            p.ns_type = Some(
                if o.get_str("viewOn")
                    .is_ok_and(|v| v.starts_with("system.buckets."))
                {
                    "timeseries"
                } else {
                    "view"
                },
            );
            p.operation_description = Some(without(o, &["_id"]));
        }
        "u" => {
            if o.contains_key("$v") {
                return Err(MongoError::internal(
                    "a view definition update must be a replacement",
                ));
            }
            p.operation_type = "modify";
            p.operation_description = Some(without(o, &["_id"]));
        }
        _ => p.operation_type = "drop",
    }
    Ok(())
}

/// The DDL commands of §1.2; false when `o` is none of them.
fn command(p: &mut Parts, db: &str, o: &Document, o2: Option<&Document>) -> bool {
    p.db = db.to_string();
    if let Ok(coll) = o.get_str("drop") {
        p.operation_type = "drop";
        p.coll = Some(coll.to_string());
    } else if let Ok(from) = o.get_str("renameCollection") {
        let (Some((from_db, from_coll)), Some((to_db, to_coll))) = (
            from.split_once('.'),
            o.get_str("to").ok().and_then(|t| t.split_once('.')),
        ) else {
            return false;
        };
        p.operation_type = "rename";
        p.db = from_db.to_string();
        p.coll = Some(from_coll.to_string());
        let to = doc! {"db": to_db, "coll": to_coll};
        let mut desc = without(o, &["renameCollection", "stayTemp"]);
        desc.insert("to", to.clone());
        p.operation_description = Some(desc);
        p.to = Some(to);
    } else if o.contains_key("dropDatabase") {
        p.operation_type = "dropDatabase";
    } else if let Ok(coll) = o.get_str("create") {
        p.operation_type = "create";
        p.coll = Some(coll.to_string());
        p.ns_type = Some(if o.contains_key("viewOn") {
            "view"
        } else if o.contains_key("timeseries") {
            "timeseries"
        } else {
            "collection"
        });
        p.operation_description = Some(without(o, &["create"]));
    } else if let Ok(coll) = o.get_str("createIndexes") {
        p.operation_type = "createIndexes";
        p.coll = Some(coll.to_string());
        p.operation_description = Some(doc! {"indexes": [without(o, &["createIndexes"])]});
    } else if let Ok(coll) = o.get_str("commitIndexBuild") {
        p.operation_type = "createIndexes";
        p.coll = Some(coll.to_string());
        let indexes = o.get("indexes").cloned().unwrap_or(Bson::Array(Vec::new()));
        p.operation_description = Some(doc! {"indexes": indexes});
    } else if let Ok(coll) = o.get_str("dropIndexes") {
        p.operation_type = "dropIndexes";
        p.coll = Some(coll.to_string());
        let indexes: Vec<Bson> = o2.map(|s| Bson::Document(s.clone())).into_iter().collect();
        p.operation_description = Some(doc! {"indexes": indexes});
    } else if let Ok(coll) = o.get_str("collMod") {
        p.operation_type = "modify";
        p.coll = Some(coll.to_string());
        p.operation_description = Some(without(o, &["collMod"]));
        if let Some(o2) = o2 {
            let mut before = Document::new();
            if let Some(c) = o2.get("collectionOptions_old") {
                before.insert("collectionOptions", c.clone());
            }
            if let Some(i) = o2.get("indexOptions_old") {
                before.insert("indexOptions", i.clone());
            }
            if !before.is_empty() {
                p.state_before_change = Some(before);
            }
        }
    } else {
        return false;
    }
    true
}

fn key_or_id(o2: Option<&Document>, o: &Document) -> Document {
    match o2 {
        Some(k) => k.clone(),
        None => {
            let mut k = Document::new();
            if let Some(id) = o.get("_id") {
                k.insert("_id", id.clone());
            }
            k
        }
    }
}

fn without(d: &Document, drop: &[&str]) -> Document {
    d.iter()
        .filter(|(k, _)| !drop.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn is_two(v: &Bson) -> bool {
    match v {
        Bson::Int32(n) => *n == 2,
        Bson::Int64(n) => *n == 2,
        Bson::Double(n) => *n == 2.0,
        _ => false,
    }
}

fn bad_update(msg: &str) -> MongoError {
    MongoError::with_code(
        6741200,
        format!("Unexpected update oplog entry format: {msg}"),
    )
}

/// `ui` as a UUID (BinData subtype 4, 16 bytes).
pub(crate) fn bson_uuid(b: &Bson) -> Option<Uuid> {
    match b {
        Bson::Binary(bin) if bin.subtype == BinarySubtype::Uuid => {
            <[u8; 16]>::try_from(bin.bytes.as_slice())
                .ok()
                .map(Uuid::from_bytes)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
