//! The common case of the transform, straight from an oplog entry's bytes: a top-level insert,
//! update, replace or delete becomes its event's bytes, with the entry's values (the document,
//! `wall`, `ui`) copied as they are instead of being decoded into a document and encoded
//! again. The event is written in place into one buffer (`bson_writer`); the document key is
//! KeyString-encoded into the token from its bytes (decoded only where that encoder declines,
//! see `resume::keystring`); a `$v:2` diff is walked on its bytes, its updated values copied.
//! Buffers that outlive one event ([`Buffers`]) are reused by the next.
//!
//! Invariant: where [`Transformer::transform_encoded`] answers, its bytes equal
//! [`Transformer::transform`]'s event encoded, and its token is the same (tested against it
//! over the CRUD shapes and the stream options). Anything else (commands, noops, entries
//! unwound from transactions, view definitions, malformed entries) answers `None`, and goes
//! through [`Transformer::transform`].

use bson::raw::cstr;
use bson::spec::{BinarySubtype, ElementType};
use bson::{Bson, Document, RawBsonRef, RawDocument, RawDocumentBuf, Uuid};
use resume::ClusterTime;
use resume::token::{ResumeToken, ResumeTokenData};
use wire::{MongoError, Result};

use super::Transformer;
use crate::changestream::bson_writer::{self as w, begin, end};
use crate::changestream::diff_parser::{DiffBuffers, write_raw_update_description};

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
    document_key: Key<'a>,
    full_document: Option<&'a RawDocument>,
    update_description: Option<Description<'a>>,
}

/// An event's document key.
enum Key<'a> {
    /// As the entry holds it (`o2`, or a delete's `o`): copied into the event, and encoded
    /// into the token from its bytes.
    Raw(&'a RawDocument),
    /// `{_id: o._id}`, for an insert or replacement without `o2`.
    Built(Document),
}

enum Description<'a> {
    /// `rawUpdateDescription`: the entry's `o`.
    Raw(&'a RawDocument),
    /// `updateDescription`, written into [`Buffers::description`].
    Written,
}

/// What the encoded path reuses from one event to the next (their content means nothing
/// between events).
#[derive(Debug, Clone, Default)]
pub(super) struct Buffers {
    diff: DiffBuffers,
    /// The `updateDescription` of the current update.
    description: Vec<u8>,
}

impl Transformer {
    /// The event of a top-level CRUD entry, from its bytes; `None` when the entry is not one
    /// this path handles (see the module note).
    pub fn transform_encoded(&mut self, entry: &EntryFields<'_>) -> Result<Option<EncodedEvent>> {
        let (Some(o), Some(ts)) = (entry.o, entry.ts) else {
            return Ok(None);
        };
        if !matches!(entry.op, "i" | "u" | "d") || entry.txn_op_index || self.show_commit_metadata {
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
        let op = crud.operation_type;
        let data = match &crud.document_key {
            Key::Raw(key) => match self.crud_token_data_raw(ts, ui.and_then(uuid), op, key)? {
                Some(data) => data,
                // Bytes the raw encoder declines are decoded, as the general path does (which
                // also reports the malformed ones).
                None => {
                    let key = decode(key)?;
                    self.token_data(ts, ui.and_then(uuid), None, op, Some(&key), None)?
                }
            },
            Key::Built(key) => self.token_data(ts, ui.and_then(uuid), None, op, Some(key), None)?,
        };
        let token = data.encode();

        // The event, written in place in the transform's field order (see its module note),
        // into a buffer that holds it without growing in the common case: its parts, and
        // fewer than 256 bytes of names, lengths and scalars.
        let description = match crud.update_description {
            Some(Description::Written) => self.buffers.description.len(),
            _ => 0,
        };
        let size = token.raw_document_len()
            + o.as_bytes().len()
            + entry.o2.map_or(0, |k| k.as_bytes().len())
            + description
            + entry.ns.len()
            + 256;
        let mut out = Vec::with_capacity(size);
        let event = begin(&mut out);
        w::element_name(&mut out, ElementType::EmbeddedDocument, cstr!("_id"));
        token.write_raw_document(&mut out);
        w::string(&mut out, cstr!("operationType"), op);
        w::timestamp(&mut out, cstr!("clusterTime"), ts.timestamp());
        if self.show_expanded_events
            && let Some(ui) = ui
        {
            w::value(&mut out, cstr!("collectionUUID"), ui);
        }
        if let Some(wall) = entry.wall {
            w::value(&mut out, cstr!("wallTime"), wall);
        }
        if let Some(full) = crud.full_document {
            w::document(&mut out, cstr!("fullDocument"), full);
        }
        w::element_name(&mut out, ElementType::EmbeddedDocument, cstr!("ns"));
        let ns = begin(&mut out);
        w::string(&mut out, cstr!("db"), db);
        w::string(&mut out, cstr!("coll"), coll);
        end(&mut out, ns)?;
        match &crud.document_key {
            Key::Raw(key) => w::document(&mut out, cstr!("documentKey"), key),
            Key::Built(key) => w::document(&mut out, cstr!("documentKey"), &encode(key)?),
        }
        match crud.update_description {
            Some(Description::Raw(o)) => w::document(&mut out, cstr!("rawUpdateDescription"), o),
            Some(Description::Written) => {
                w::element_name(
                    &mut out,
                    ElementType::EmbeddedDocument,
                    cstr!("updateDescription"),
                );
                out.extend_from_slice(&self.buffers.description);
            }
            None => {}
        }
        if self.show_commit_timestamp
            && let Some(ct) = entry.commit_timestamp
        {
            w::value(&mut out, cstr!("commitTimestamp"), ct);
        }
        end(&mut out, event)?;
        Ok(Some(EncodedEvent {
            token,
            data,
            bytes: out,
        }))
    }

    /// The parts of a CRUD entry; `None` for a shape left to the general path (which also
    /// reports the malformed ones). An update's `updateDescription` is written into
    /// [`Buffers::description`].
    fn crud<'a>(
        &mut self,
        op: &str,
        o: &'a RawDocument,
        o2: Option<&'a RawDocument>,
    ) -> Result<Option<Crud<'a>>> {
        let crud = match op {
            "i" => Crud {
                operation_type: "insert",
                document_key: key_or_id(o2, o)?,
                full_document: Some(o),
                update_description: None,
            },
            "d" => Crud {
                operation_type: "delete",
                document_key: Key::Raw(o),
                full_document: None,
                update_description: None,
            },
            _ => match version_and_diff(o) {
                (Some(v), diff) if is_two(v) => {
                    let (Some(diff), Some(key)) = (diff, o2) else {
                        return Ok(None);
                    };
                    let description = if self.show_raw_update_description {
                        Description::Raw(o)
                    } else {
                        let Buffers {
                            diff: buffers,
                            description,
                        } = &mut self.buffers;
                        description.clear();
                        write_raw_update_description(
                            diff,
                            self.show_expanded_events,
                            buffers,
                            description,
                        )?;
                        Description::Written
                    };
                    Crud {
                        operation_type: "update",
                        document_key: Key::Raw(key),
                        full_document: None,
                        update_description: Some(description),
                    }
                }
                (None, _) if has(o, "_id") => Crud {
                    operation_type: "replace",
                    document_key: key_or_id(o2, o)?,
                    full_document: Some(o),
                    update_description: None,
                },
                _ => return Ok(None),
            },
        };
        Ok(Some(crud))
    }
}

/// An update's `o.$v`, and `o.diff` when `$v` is two, as `o.get("$v")` and
/// `o.get_document("diff")` read them (a lookup that fails reads as absent), in one scan.
fn version_and_diff(o: &RawDocument) -> (Option<RawBsonRef<'_>>, Option<&RawDocument>) {
    // `Some(found)` once the first field of that name was met: what its lookup gives.
    let (mut v, mut diff) = (None, None);
    for field in o.iter_elements() {
        // A lookup still looking fails here (and reads as absent).
        let Ok(field) = field else { break };
        match field.key().as_str() {
            "$v" if v.is_none() => v = Some(field.value().ok()),
            "diff" if diff.is_none() => {
                diff = Some(field.value().ok().and_then(|d| d.as_document()))
            }
            _ => {}
        }
        // Done once `$v` is known not to be two (`diff` is then not read), or both are found.
        if v.is_some_and(|v| !v.is_some_and(is_two)) || (v.is_some() && diff.is_some()) {
            break;
        }
    }
    (v.flatten(), diff.flatten())
}

fn has(d: &RawDocument, key: &str) -> bool {
    matches!(d.get(key), Ok(Some(_)))
}

/// `o2` when the entry has it, else `{_id: o._id}`.
fn key_or_id<'a>(o2: Option<&'a RawDocument>, o: &RawDocument) -> Result<Key<'a>> {
    if let Some(k) = o2 {
        return Ok(Key::Raw(k));
    }
    let mut k = Document::new();
    if let Ok(Some(id)) = o.get("_id") {
        let id = Bson::try_from(id).map_err(corrupt)?;
        k.insert("_id", id);
    }
    Ok(Key::Built(k))
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
    use crate::changestream::spec::{ChangeStreamSpec, StartPoint, StreamLevel};

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

    /// The general transform of `entry` and the encoded one of its bytes `raw`.
    fn both(
        spec: &ChangeStreamSpec,
        entry: &Document,
        raw: &RawDocumentBuf,
    ) -> (crate::changestream::ChangeEvent, EncodedEvent) {
        let expected = Transformer::new(spec)
            .transform(entry)
            .expect("transforms")
            .expect("an event");
        let got = Transformer::new(spec)
            .transform_encoded(&EntryFields::read(raw).expect("reads"))
            .expect("transforms")
            .expect("handled");
        (expected, got)
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
            // Document keys of many types, encoded into the token from their bytes.
            entry(
                "u",
                doc! {"$v": 2, "diff": {"u": {"a.b": 1}, "sarr": {"a": true, "l": 1, "s0": {"u": {"2": "x"}}}}},
                Some(
                    doc! {"sk": {"n": [1.5, "s", Bson::Null]}, "_id": bson::oid::ObjectId::from_bytes([1; 12])},
                ),
            ),
            entry(
                "d",
                doc! {"_id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![3; 16] }, "r": Bson::RegularExpression(bson::Regex { pattern: bson::raw::CString::try_from("a").expect("no NUL"), options: bson::raw::CString::try_from("im").expect("no NUL") })},
                None,
            ),
            entry(
                "i",
                doc! {"_id": {"x": -0.0, "y": i64::MAX}},
                Some(doc! {"_id": {"x": -0.0, "y": i64::MAX}}),
            ),
            entry("i", doc! {}, Some(doc! {})),
            {
                // No `ui`: a v1 token then has no identifier.
                let mut e = entry("d", doc! {"_id": "no ui"}, None);
                e.remove("ui");
                e
            },
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
                out.push(spec.clone());
                // A client token of v1 that the entries' events do not pass (they keep v1),
                // and one that they do (they go on with the default version).
                for secs in [20, 5] {
                    let mut resumed = spec.clone();
                    resumed.start = StartPoint::ResumeAfter(ResumeTokenData::high_water_mark(
                        ClusterTime::new(secs, 0),
                        resume::TokenVersion::V1,
                    ));
                    out.push(resumed);
                }
            }
        }
        out
    }

    #[test]
    fn crud_events_from_bytes_equal_the_general_transform() {
        for spec in specs() {
            for e in entries() {
                let raw = RawDocumentBuf::try_from(&e).expect("encodes");
                let (expected, got) = both(&spec, &e, &raw);
                assert_eq!(got.token, expected.token, "{e:?} {spec:?}");
                assert_eq!(got.token.type_bits(), expected.token.type_bits(), "{e:?}");
                assert_eq!(got.data, expected.data, "{e:?} {spec:?}");
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

    /// A document key the token's raw encoder declines (a field twice) is decoded, as the
    /// general path decodes the whole entry: the same token.
    #[test]
    fn a_declined_document_key_gives_the_decoded_token() {
        let spec = ChangeStreamSpec::new(StreamLevel::Collection, "db", Some("c"));
        let mut key = RawDocumentBuf::new();
        key.append(cstr!("_id"), 1);
        key.append(cstr!("_id"), 2);
        for (op, o) in [
            ("d", key.clone()),
            (
                "u",
                RawDocumentBuf::try_from(&doc! {"$v": 2, "diff": {"u": {"a": 1}}})
                    .expect("encodes"),
            ),
        ] {
            let mut raw = RawDocumentBuf::try_from(&entry(op, doc! {}, None)).expect("encodes");
            // Replace `o` (and give the update its `o2`): a document cannot hold `_id` twice.
            let fields: Vec<_> = raw
                .iter()
                .map(|f| f.expect("valid"))
                .filter(|(k, _)| k.as_str() != "o")
                .map(|(k, v)| (k.to_owned(), bson::RawBson::from(v)))
                .collect();
            raw = RawDocumentBuf::new();
            for (k, v) in &fields {
                raw.append(k, v.as_raw_bson_ref());
            }
            raw.append(cstr!("o"), &o);
            if op == "u" {
                raw.append(cstr!("o2"), &key);
            }
            let decoded = Document::try_from(raw.as_ref()).expect("decodes");
            let (expected, got) = both(&spec, &decoded, &raw);
            assert_eq!(got.token, expected.token, "{op}");
            assert_eq!(got.data, expected.data, "{op}");
        }
    }

    /// The one scan for `$v` and `diff` reads what the two lookups read, damaged bytes
    /// included (`diff` matters only when `$v` is two).
    #[test]
    fn version_and_diff_read_as_their_lookups() {
        let shapes = [
            doc! {"$v": 2, "diff": {"u": {"a": 1}}},
            doc! {"diff": {"u": {"a": "x"}}, "$v": 2_i64},
            doc! {"$v": 2.0, "x": "y", "diff": {}, "diff2": 1},
            doc! {"$v": 1, "$set": {"a": 1}},
            doc! {"$v": 2, "diff": 5},
            doc! {"$v": 2},
            doc! {"_id": 1, "a": "replacement"},
            doc! {},
        ];
        for shape in shapes {
            let bytes = RawDocumentBuf::try_from(&shape)
                .expect("encodes")
                .into_bytes();
            for at in 4..bytes.len() {
                for value in [
                    None,
                    Some(0x00),
                    Some(0x02),
                    Some(0x03),
                    Some(0x10),
                    Some(0xFF),
                ] {
                    let mut damaged = bytes.clone();
                    if let Some(value) = value {
                        damaged[at] = value;
                    }
                    let Ok(o) = RawDocument::from_bytes(&damaged) else {
                        continue;
                    };
                    let (v, diff) = version_and_diff(o);
                    let want_v = o.get("$v").ok().flatten();
                    assert_eq!(v, want_v, "{damaged:?}");
                    if want_v.is_some_and(is_two) {
                        assert_eq!(diff, o.get_document("diff").ok(), "{damaged:?}");
                    }
                }
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
