//! Builders shared by the change-stream tests: oplog entries in MongoDB's format, specs, tokens.

use bson::{Binary, Bson, DateTime, Document, Timestamp, doc, spec::BinarySubtype};
use resume::ClusterTime;
use resume::token::{ResumeTokenData, TokenVersion, event_identifier};

use super::ChangeEvent;
use super::spec::{ChangeStreamSpec, StreamLevel};

pub fn ts(secs: u32, inc: u32) -> Bson {
    Bson::Timestamp(Timestamp {
        time: secs,
        increment: inc,
    })
}

pub fn ct(secs: u32, inc: u32) -> ClusterTime {
    ClusterTime::new(secs, inc)
}

pub fn uuid(n: u8) -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::Uuid,
        bytes: vec![n; 16],
    })
}

pub fn buuid(n: u8) -> bson::Uuid {
    bson::Uuid::from_bytes([n; 16])
}

pub fn wall(ms: i64) -> Bson {
    Bson::DateTime(DateTime::from_millis(ms))
}

pub fn coll_spec(db: &str, coll: &str) -> ChangeStreamSpec {
    ChangeStreamSpec::new(StreamLevel::Collection, db, Some(coll))
}

pub fn db_spec(db: &str) -> ChangeStreamSpec {
    ChangeStreamSpec::new(StreamLevel::Database, db, None)
}

pub fn cluster_spec() -> ChangeStreamSpec {
    let mut s = ChangeStreamSpec::new(StreamLevel::Cluster, "admin", None);
    s.options.all_changes_for_cluster = true;
    s
}

pub fn expanded(mut s: ChangeStreamSpec) -> ChangeStreamSpec {
    s.options.show_expanded_events = true;
    s
}

pub fn insert(ns: &str, secs: u32, d: Document) -> Document {
    let id = d.get("_id").cloned().unwrap_or(Bson::Null);
    doc! {"ts": ts(secs, 1), "t": 1_i64, "v": 2, "op": "i", "ns": ns, "ui": uuid(1),
    "o": d, "o2": {"_id": id}, "wall": wall(i64::from(secs) * 1000)}
}

pub fn update(ns: &str, secs: u32, id: i32, diff: Document) -> Document {
    doc! {"ts": ts(secs, 1), "t": 1_i64, "v": 2, "op": "u", "ns": ns, "ui": uuid(1),
    "o": {"$v": 2, "diff": diff}, "o2": {"_id": id}, "wall": wall(i64::from(secs) * 1000)}
}

pub fn delete(ns: &str, secs: u32, id: i32) -> Document {
    doc! {"ts": ts(secs, 1), "t": 1_i64, "v": 2, "op": "d", "ns": ns, "ui": uuid(1),
    "o": {"_id": id}, "wall": wall(i64::from(secs) * 1000)}
}

pub fn cmd(db: &str, secs: u32, o: Document) -> Document {
    doc! {"ts": ts(secs, 1), "t": 1_i64, "v": 2, "op": "c", "ns": format!("{db}.$cmd"),
    "ui": uuid(1), "o": o, "wall": wall(i64::from(secs) * 1000)}
}

/// A v2 insert token for `{_id: id}`.
pub fn insert_token(secs: u32, txn: u32, id: i32) -> ResumeTokenData {
    ResumeTokenData::event(
        ct(secs, 1),
        TokenVersion::V2,
        txn,
        Some(buuid(1)),
        Some(event_identifier(
            "insert",
            Some(("documentKey", doc! {"_id": id})),
        )),
    )
    .unwrap()
}

pub fn event(data: ResumeTokenData, doc: Document) -> ChangeEvent {
    let token = data.encode();
    let mut d = doc! {"_id": token.to_document()};
    d.extend(doc);
    ChangeEvent {
        token,
        data,
        doc: d,
    }
}
