//! The common case of the transform, straight from an oplog entry's bytes: a top-level insert,
//! update, replace or delete becomes its event's bytes, with the entry's values (the document,
//! `wall`, `ui`) copied as they are instead of being decoded into a document and encoded
//! again. Only the document key (for the token) is decoded; a `$v:2` diff is walked on its
//! bytes, its updated values copied.
//!
//! Invariant: where [`Transformer::transform_encoded`] answers, its bytes equal
//! [`Transformer::transform`]'s event encoded, and its token is the same (tested against it
//! over the CRUD shapes and the stream options). Anything else (commands, noops, entries
//! unwound from transactions, view definitions, malformed entries) answers `None`, and goes
//! through [`Transformer::transform`].

use bson::raw::cstr;
use bson::spec::BinarySubtype;
use bson::{Bson, Document, RawBsonRef, RawDocument, RawDocumentBuf, Uuid};
use resume::ClusterTime;
use resume::token::{ResumeToken, ResumeTokenData};
use wire::{MongoError, Result};

use super::Transformer;
use crate::changestream::diff_parser::parse_raw_diff;

/// An event made from an entry's bytes.
#[derive(Debug, Clone)]
pub struct EncodedEvent {
    pub token: ResumeToken,
    pub data: ResumeTokenData,
    pub bytes: Vec<u8>,
}

/// The top-level fields of an oplog entry that this path reads, found in one pass over its
/// bytes (a field looked up by name is a scan of the document).
#[derive(Debug, Default)]
pub struct EntryFields<'a> {
    pub op: &'a str,
    pub ns: &'a str,
    o: Option<&'a RawDocument>,
    o2: Option<&'a RawDocument>,
    ts: Option<bson::Timestamp>,
    ui: Option<RawBsonRef<'a>>,
    wall: Option<RawBsonRef<'a>>,
    commit_timestamp: Option<RawBsonRef<'a>>,
    /// `fromMigrate` is present (whatever its value).
    pub from_migrate: bool,
    txn_op_index: bool,
}

impl<'a> EntryFields<'a> {
    /// Reads the top level of an entry with a scan that skips the values it does not need
    /// (the general raw iterator checks every value of every field). `None` when a field it
    /// reads has an unexpected type or the entry is malformed: the general path reports it.
    pub fn read(entry: &'a RawDocument) -> Option<EntryFields<'a>> {
        let mut f = EntryFields::default();
        let bytes = entry.as_bytes();
        // The length prefix, then elements up to the terminating NUL.
        let mut at = 4;
        let end = bytes.len().checked_sub(1)?;
        while at < end {
            let kind = bytes[at];
            let key_start = at + 1;
            let key_len = bytes.get(key_start..)?.iter().position(|&b| b == 0)?;
            let key = &bytes[key_start..key_start + key_len];
            let value_start = key_start + key_len + 1;
            let value_len = value_len(kind, bytes.get(value_start..end)?)?;
            let value = bytes.get(value_start..value_start + value_len)?;
            at = value_start + value_len;
            match key {
                b"op" => f.op = string(kind, value)?,
                b"ns" => f.ns = string(kind, value)?,
                b"o" => f.o = Some(document(kind, value)?),
                b"o2" => f.o2 = Some(document(kind, value)?),
                b"ts" if kind == 0x11 => {
                    let increment = u32::from_le_bytes(value.get(0..4)?.try_into().ok()?);
                    let time = u32::from_le_bytes(value.get(4..8)?.try_into().ok()?);
                    f.ts = Some(bson::Timestamp { time, increment });
                }
                b"ui" => f.ui = Some(scalar(kind, value)?),
                b"wall" => f.wall = Some(scalar(kind, value)?),
                b"commitTimestamp" => f.commit_timestamp = Some(scalar(kind, value)?),
                b"fromMigrate" => f.from_migrate = true,
                b"txnOpIndex" => f.txn_op_index = true,
                _ => {}
            }
        }
        (at == end).then_some(f)
    }
}

/// The length of a value of BSON type `kind` at the start of `rest`.
fn value_len(kind: u8, rest: &[u8]) -> Option<usize> {
    let prefix = || -> Option<usize> {
        usize::try_from(i32::from_le_bytes(rest.get(0..4)?.try_into().ok()?)).ok()
    };
    let cstring = |from: usize| -> Option<usize> {
        Some(rest.get(from..)?.iter().position(|&b| b == 0)? + 1)
    };
    match kind {
        0x06 | 0x0A | 0x7F | 0xFF => Some(0),
        0x08 => Some(1),
        0x10 => Some(4),
        0x01 | 0x09 | 0x11 | 0x12 => Some(8),
        0x07 => Some(12),
        0x13 => Some(16),
        0x02 | 0x0D | 0x0E => Some(4 + prefix()?),
        0x03 | 0x04 | 0x0F => prefix(),
        0x05 => Some(5 + prefix()?),
        0x0C => Some(4 + prefix()? + 12),
        0x0B => {
            let pattern = cstring(0)?;
            Some(pattern + cstring(pattern)?)
        }
        _ => None,
    }
}

fn string(kind: u8, value: &[u8]) -> Option<&str> {
    if kind != 0x02 {
        return None;
    }
    std::str::from_utf8(value.get(4..value.len().checked_sub(1)?)?).ok()
}

fn document(kind: u8, value: &[u8]) -> Option<&RawDocument> {
    if kind != 0x03 {
        return None;
    }
    RawDocument::from_bytes(value).ok()
}

/// `ui`, `wall` and `commitTimestamp` as values to copy: BinData, a date or a timestamp.
fn scalar(kind: u8, value: &[u8]) -> Option<RawBsonRef<'_>> {
    let eight = || -> Option<[u8; 8]> { value.get(0..8)?.try_into().ok() };
    match kind {
        0x05 => Some(RawBsonRef::Binary(bson::RawBinaryRef {
            subtype: BinarySubtype::from(*value.get(4)?),
            bytes: value.get(5..)?,
        })),
        0x09 => Some(RawBsonRef::DateTime(bson::DateTime::from_millis(
            i64::from_le_bytes(eight()?),
        ))),
        0x11 => {
            let v = eight()?;
            Some(RawBsonRef::Timestamp(bson::Timestamp {
                increment: u32::from_le_bytes(v[0..4].try_into().ok()?),
                time: u32::from_le_bytes(v[4..8].try_into().ok()?),
            }))
        }
        _ => None,
    }
}

/// What a CRUD entry says, borrowed from its bytes.
struct Crud<'a> {
    operation_type: &'static str,
    document_key: Document,
    /// The document key as the entry holds it, when it holds it whole (`o2`, or a delete's
    /// `o`): copied into the event instead of encoded again.
    document_key_bytes: Option<&'a RawDocument>,
    full_document: Option<&'a RawDocument>,
    update_description: Option<(&'static str, Description<'a>)>,
}

enum Description<'a> {
    Parsed(RawDocumentBuf),
    Raw(&'a RawDocument),
}

impl Transformer {
    /// The event of a top-level CRUD entry, from its bytes; `None` when the entry is not one
    /// this path handles (see the module note).
    pub fn transform_encoded(&mut self, entry: &EntryFields<'_>) -> Result<Option<EncodedEvent>> {
        let (Some(o), Some(ts)) = (entry.o, entry.ts) else {
            return Ok(None);
        };
        if !matches!(entry.op, "i" | "u" | "d") || entry.txn_op_index {
            return Ok(None);
        }
        let Some((db, coll)) = entry.ns.split_once('.') else {
            return Ok(None);
        };
        if self.view_events && coll == "system.views" {
            return Ok(None);
        }
        let Some(crud) = self.crud(entry.op, o, entry.o2)? else {
            return Ok(None);
        };
        let ts = ClusterTime::from(ts);
        let ui = entry.ui;
        let data = self.token_data(
            ts,
            ui.and_then(uuid),
            None,
            crud.operation_type,
            Some(&crud.document_key),
            None,
        )?;
        let token = data.encode();

        let mut d = RawDocumentBuf::new();
        d.append(cstr!("_id"), token.to_raw_document());
        d.append(cstr!("operationType"), crud.operation_type);
        d.append(cstr!("clusterTime"), ts.timestamp());
        if self.show_expanded_events
            && let Some(ui) = ui
        {
            d.append(cstr!("collectionUUID"), ui);
        }
        if let Some(wall) = entry.wall {
            d.append(cstr!("wallTime"), wall);
        }
        if let Some(full) = crud.full_document {
            d.append(cstr!("fullDocument"), full);
        }
        let mut namespace = RawDocumentBuf::new();
        namespace.append(cstr!("db"), db);
        namespace.append(cstr!("coll"), coll);
        d.append(cstr!("ns"), namespace);
        match crud.document_key_bytes {
            Some(key) => d.append(cstr!("documentKey"), key),
            None => d.append(cstr!("documentKey"), encode(&crud.document_key)?),
        }
        match crud.update_description {
            Some(("rawUpdateDescription", Description::Raw(o))) => {
                d.append(cstr!("rawUpdateDescription"), o)
            }
            Some((_, Description::Parsed(u))) => d.append(cstr!("updateDescription"), u),
            _ => {}
        }
        if self.show_commit_timestamp
            && let Some(ct) = entry.commit_timestamp
        {
            d.append(cstr!("commitTimestamp"), ct);
        }
        Ok(Some(EncodedEvent {
            token,
            data,
            bytes: d.into_bytes(),
        }))
    }

    /// The parts of a CRUD entry; `None` for a shape left to the general path (which also
    /// reports the malformed ones).
    fn crud<'a>(
        &self,
        op: &str,
        o: &'a RawDocument,
        o2: Option<&'a RawDocument>,
    ) -> Result<Option<Crud<'a>>> {
        let crud = match op {
            "i" => Crud {
                operation_type: "insert",
                document_key: key_or_id(o2, o)?,
                document_key_bytes: o2,
                full_document: Some(o),
                update_description: None,
            },
            "d" => Crud {
                operation_type: "delete",
                document_key: decode(o)?,
                document_key_bytes: Some(o),
                full_document: None,
                update_description: None,
            },
            _ => match o.get("$v").ok().flatten() {
                Some(v) if is_two(v) => {
                    let (Ok(diff), Some(key)) = (o.get_document("diff"), o2) else {
                        return Ok(None);
                    };
                    let description = if self.show_raw_update_description {
                        ("rawUpdateDescription", Description::Raw(o))
                    } else {
                        let parsed = parse_raw_diff(diff)?;
                        (
                            "updateDescription",
                            Description::Parsed(parsed.into_raw(self.show_expanded_events)?),
                        )
                    };
                    Crud {
                        operation_type: "update",
                        document_key: decode(key)?,
                        document_key_bytes: Some(key),
                        full_document: None,
                        update_description: Some(description),
                    }
                }
                None if has(o, "_id") => Crud {
                    operation_type: "replace",
                    document_key: key_or_id(o2, o)?,
                    document_key_bytes: o2,
                    full_document: Some(o),
                    update_description: None,
                },
                _ => return Ok(None),
            },
        };
        Ok(Some(crud))
    }
}

fn has(d: &RawDocument, key: &str) -> bool {
    matches!(d.get(key), Ok(Some(_)))
}

/// `o2` when the entry has it, else `{_id: o._id}`.
fn key_or_id(o2: Option<&RawDocument>, o: &RawDocument) -> Result<Document> {
    if let Some(k) = o2 {
        return decode(k);
    }
    let mut k = Document::new();
    if let Ok(Some(id)) = o.get("_id") {
        let id = Bson::try_from(id).map_err(corrupt)?;
        k.insert("_id", id);
    }
    Ok(k)
}

fn is_two(v: RawBsonRef<'_>) -> bool {
    match v {
        RawBsonRef::Int32(n) => n == 2,
        RawBsonRef::Int64(n) => n == 2,
        RawBsonRef::Double(n) => n == 2.0,
        _ => false,
    }
}

fn uuid(ui: RawBsonRef<'_>) -> Option<Uuid> {
    match ui {
        RawBsonRef::Binary(b) if b.subtype == BinarySubtype::Uuid => {
            <[u8; 16]>::try_from(b.bytes).ok().map(Uuid::from_bytes)
        }
        _ => None,
    }
}

fn decode(d: &RawDocument) -> Result<Document> {
    Document::try_from(d).map_err(corrupt)
}

fn encode(d: &Document) -> Result<RawDocumentBuf> {
    RawDocumentBuf::try_from(d).map_err(corrupt)
}

fn corrupt(e: impl std::fmt::Display) -> MongoError {
    MongoError::internal(format!("an oplog entry that does not decode: {e}"))
}

#[cfg(test)]
mod tests {
    use bson::{Binary, DateTime, Timestamp, doc};

    use super::*;
    use crate::changestream::spec::{ChangeStreamSpec, StreamLevel};

    fn ui() -> Bson {
        Bson::Binary(Binary {
            subtype: BinarySubtype::Uuid,
            bytes: vec![7; 16],
        })
    }

    fn entry(op: &str, o: Document, o2: Option<Document>) -> Document {
        let mut e = doc! {
            "lsid": {"id": ui()}, "txnNumber": 3_i64, "stmtId": 0,
            "op": op, "ns": "db.c", "ui": ui(), "o": o,
            "ts": Timestamp { time: 10, increment: 2 }, "t": 1_i64, "v": 2,
            "wall": DateTime::from_millis(5),
        };
        if let Some(o2) = o2 {
            e.insert("o2", o2);
        }
        e
    }

    fn entries() -> Vec<Document> {
        vec![
            entry(
                "i",
                doc! {"_id": 1, "a": {"b": [1, 2.5, "x"]}, "n": Bson::Null},
                Some(doc! {"_id": 1}),
            ),
            entry("i", doc! {"_id": "no o2", "a": 1}, None),
            entry(
                "i",
                doc! {"_id": 2, "sk": 9},
                Some(doc! {"sk": 9, "_id": 2}),
            ),
            entry("d", doc! {"_id": 3}, None),
            entry(
                "u",
                doc! {"_id": 4, "replaced": true},
                Some(doc! {"_id": 4}),
            ),
            entry(
                "u",
                doc! {"$v": 2, "diff": {"u": {"a": 1}, "d": {"b": false}, "sc": {"u": {"x": 1}}}},
                Some(doc! {"_id": 5}),
            ),
            entry(
                "u",
                doc! {"$v": 2, "diff": {"i": {"new": [1]}}},
                Some(doc! {"_id": 6}),
            ),
        ]
    }

    fn specs() -> Vec<ChangeStreamSpec> {
        let mut out = Vec::new();
        for level in [
            StreamLevel::Collection,
            StreamLevel::Database,
            StreamLevel::Cluster,
        ] {
            for flags in 0..8 {
                let coll = (level == StreamLevel::Collection).then_some("c");
                let mut spec = ChangeStreamSpec::new(level, "db", coll);
                spec.options.show_expanded_events = flags & 1 != 0;
                spec.options.show_raw_update_description = flags & 2 != 0;
                spec.options.show_commit_timestamp = flags & 4 != 0;
                out.push(spec);
            }
        }
        out
    }

    #[test]
    fn crud_events_from_bytes_equal_the_general_transform() {
        for spec in specs() {
            for e in entries() {
                let raw = RawDocumentBuf::try_from(&e).expect("encodes");
                let expected = Transformer::new(&spec)
                    .transform(&e)
                    .expect("transforms")
                    .expect("an event");
                let got = Transformer::new(&spec)
                    .transform_encoded(&EntryFields::read(&raw).expect("reads"))
                    .expect("transforms")
                    .expect("handled");
                assert_eq!(got.token, expected.token, "{e:?} {spec:?}");
                assert_eq!(
                    Document::try_from(RawDocument::from_bytes(&got.bytes).expect("bytes"))
                        .expect("decodes"),
                    expected.doc,
                    "{e:?} {spec:?}"
                );
                assert_eq!(
                    got.bytes,
                    expected.doc.to_vec().expect("encodes"),
                    "byte for byte: {e:?}"
                );
            }
        }
    }

    #[test]
    fn the_top_level_scan_skips_every_bson_type() {
        let filler = doc! {
            "d": 1.5, "s": "str", "doc": {"a": 1}, "arr": [1, "x"],
            "bin": Binary { subtype: BinarySubtype::Generic, bytes: vec![1, 2, 3] },
            "undef": Bson::Undefined, "oid": bson::oid::ObjectId::new(), "b": true,
            "dt": DateTime::from_millis(9), "null": Bson::Null,
            "re": Bson::RegularExpression(bson::Regex { pattern: bson::raw::CString::try_from("a.c").expect("no NUL"), options: bson::raw::CString::try_from("i").expect("no NUL") }),
            "code": Bson::JavaScriptCode("f()".into()),
            "sym": Bson::Symbol("sym".into()),
            "cws": Bson::JavaScriptCodeWithScope(bson::JavaScriptCodeWithScope { code: "g()".into(), scope: doc! {"x": 1} }),
            "i": 7, "ts0": Timestamp { time: 1, increment: 2 }, "l": 8_i64,
            "dec": Bson::Decimal128(bson::Decimal128::from_bytes([3; 16])),
            "min": Bson::MinKey, "max": Bson::MaxKey,
        };
        let mut e = filler.clone();
        e.extend(entry("i", doc! {"_id": 1}, Some(doc! {"_id": 1})));
        e.insert(
            "commitTimestamp",
            Timestamp {
                time: 4,
                increment: 5,
            },
        );
        let raw = RawDocumentBuf::try_from(&e).expect("encodes");
        let f = EntryFields::read(&raw).expect("reads");
        assert_eq!((f.op, f.ns), ("i", "db.c"));
        assert_eq!(
            f.ts,
            Some(Timestamp {
                time: 10,
                increment: 2
            })
        );
        assert_eq!(
            f.o.map(|o| o.as_bytes().to_vec()),
            Some(doc! {"_id": 1}.to_vec().expect("encodes"))
        );
        assert!(matches!(f.ui, Some(RawBsonRef::Binary(b)) if b.bytes == [7; 16]));
        assert!(matches!(f.wall, Some(RawBsonRef::DateTime(d)) if d.timestamp_millis() == 5));
        assert!(matches!(f.commit_timestamp, Some(RawBsonRef::Timestamp(t)) if t.time == 4));
        assert!(!f.from_migrate && !f.txn_op_index);
    }

    #[test]
    fn a_damaged_entry_never_panics_the_scan() {
        let raw = RawDocumentBuf::try_from(&entry("i", doc! {"_id": 1, "a": "b"}, None))
            .expect("encodes");
        let bytes = raw.as_bytes().to_vec();
        for at in 4..bytes.len() - 1 {
            for value in [0x00, 0x02, 0x03, 0x7F, 0xFF] {
                let mut damaged = bytes.clone();
                damaged[at] = value;
                if let Ok(doc) = RawDocument::from_bytes(&damaged) {
                    let _ = EntryFields::read(doc);
                }
            }
        }
    }

    #[test]
    fn other_entries_are_left_to_the_general_path() {
        let spec = ChangeStreamSpec::new(StreamLevel::Database, "db", None);
        let others = [
            doc! {"op": "c", "ns": "db.$cmd", "o": {"drop": "c"}, "ts": Timestamp { time: 1, increment: 1 }},
            doc! {"op": "n", "ns": "", "o": {"msg": "x"}, "ts": Timestamp { time: 1, increment: 1 }},
            doc! {"op": "i", "ns": "db.system.views", "o": {"_id": "db.v", "viewOn": "c", "pipeline": []}, "ts": Timestamp { time: 1, increment: 1 }},
            doc! {"op": "i", "ns": "db.c", "o": {"_id": 1}, "txnOpIndex": 1_i64, "ts": Timestamp { time: 1, increment: 1 }},
            doc! {"op": "u", "ns": "db.c", "o": {"$v": 1, "$set": {"a": 1}}, "o2": {"_id": 1}, "ts": Timestamp { time: 1, increment: 1 }},
            doc! {"op": "u", "ns": "db.c", "o": {"$v": 2, "diff": {}}, "ts": Timestamp { time: 1, increment: 1 }},
        ];
        for e in others {
            let raw = RawDocumentBuf::try_from(&e).expect("encodes");
            assert!(
                Transformer::new(&spec)
                    .transform_encoded(&EntryFields::read(&raw).expect("reads"))
                    .expect("no error")
                    .is_none(),
                "{e:?}"
            );
        }
    }
}
