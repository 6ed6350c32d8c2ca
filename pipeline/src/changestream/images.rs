//! The image stages (reference §7): AddPreImage (`fullDocumentBeforeChange`) and AddPostImage
//! with `fullDocument: whenAvailable | required | updateLookup`. They run on the shard after the
//! resume check and before the user's stages and the 16 MiB check (or the split), as in
//! MongoDB 7.0: an event that the lookup takes past 16 MiB is split or refused on the shard,
//! like any other.
//!
//! Owns: which events get which image, where a pre-image is found, the post-image as the
//! pre-image with the entry's `$v: 2` diff applied, and the `required` failures. Reading stored
//! pre-images and current documents is the caller's ([`ImageSource`]), so nothing here does I/O.
//!
//! Invariants:
//! * a pre-image is the one stored with the write, keyed by the collection UUID, the `ts` of
//!   the oplog entry that holds the operation (the `applyOps` entry inside a transaction) and
//!   its index there (0 outside a transaction), so it is exactly the document before *this*
//!   event, never a later or earlier version;
//! * the post-image of an update is that pre-image with the event's own diff applied, so it is
//!   exactly the document after the event; without a pre-image it is `null`;
//! * `updateLookup` gives an update the collection's current version of the document (by the
//!   collection's UUID and the event's `_id`), `null` when it is gone;
//! * `required` with no image fails the stream with `NoMatchingDocument` (47); `whenAvailable`
//!   answers `null`; `off` / `default` add nothing.

use bson::{Bson, Document};
use resume::ClusterTime;
use wire::{ErrorCode, MongoError, Result};

use super::ChangeEvent;
use super::diff_apply::apply_diff;
use super::spec::{ChangeStreamSpec, FullDocument, FullDocumentBeforeChange};

/// Where the pre-image of one operation is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreImageId {
    pub uuid: bson::Uuid,
    pub ts: ClusterTime,
    pub apply_ops_index: u64,
}

/// The collection UUID (`ui`) of an oplog entry or unwound operation.
fn uuid_of(op: &Document) -> Option<bson::Uuid> {
    match op.get("ui")? {
        Bson::Binary(b) => b.to_uuid().ok(),
        _ => None,
    }
}

impl PreImageId {
    /// The id of the operation `op` (an oplog entry, or a transaction's unwound operation,
    /// which carries `applyOpsTs` and `applyOpsIndex`); `None` without a collection UUID.
    pub fn of(op: &Document) -> Option<PreImageId> {
        let uuid = uuid_of(op)?;
        let ts = match op.get("applyOpsTs").or_else(|| op.get("ts"))? {
            Bson::Timestamp(t) => ClusterTime::from(*t),
            _ => return None,
        };
        let apply_ops_index = match op.get("applyOpsIndex") {
            Some(Bson::Int64(i)) => u64::try_from(*i).ok()?,
            Some(Bson::Int32(i)) => u64::try_from(*i).ok()?,
            _ => 0,
        };
        Some(PreImageId {
            uuid,
            ts,
            apply_ops_index,
        })
    }
}

/// What the image stages read. A failure to read is an error that fails the stream, never a
/// missing image.
pub trait ImageSource {
    /// The pre-image stored with the write `id` names, if it is still there.
    fn pre_image(&mut self, id: &PreImageId) -> Result<Option<Document>>;
    /// The current version of the document with this `_id` in the collection `uuid`
    /// (`updateLookup`), if there is one.
    fn current(&mut self, uuid: &bson::Uuid, id: &Bson) -> Result<Option<Document>>;
}

/// No images at all: every image asked for is `null` (or fails the stream when `required`).
pub struct NoImages;

impl ImageSource for NoImages {
    fn pre_image(&mut self, _id: &PreImageId) -> Result<Option<Document>> {
        Ok(None)
    }

    fn current(&mut self, _uuid: &bson::Uuid, _id: &Bson) -> Result<Option<Document>> {
        Ok(None)
    }
}

/// A closure that finds pre-images is a source without current documents (tests, and streams
/// that read no images).
impl<F: FnMut(&PreImageId) -> Result<Option<Document>>> ImageSource for F {
    fn pre_image(&mut self, id: &PreImageId) -> Result<Option<Document>> {
        self(id)
    }

    fn current(&mut self, _uuid: &bson::Uuid, _id: &Bson) -> Result<Option<Document>> {
        Ok(None)
    }
}

/// Whether a stream with `spec` asks for images the shard adds.
pub fn wanted(spec: &ChangeStreamSpec) -> bool {
    spec.options.full_document_before_change != FullDocumentBeforeChange::Off
        || matches!(
            spec.options.full_document,
            FullDocument::WhenAvailable | FullDocument::Required | FullDocument::UpdateLookup
        )
}

/// Adds the images `spec` asks for to `event`, made from the operation `op` and what `source`
/// reads.
pub fn add_images(
    spec: &ChangeStreamSpec,
    op: &Document,
    event: &mut ChangeEvent,
    source: &mut dyn ImageSource,
) -> Result<()> {
    let kind = event.operation_type().to_owned();
    let kind = kind.as_str();
    if kind == "update" && spec.options.full_document == FullDocument::UpdateLookup {
        let current = match (uuid_of(op), event.doc.get_document("documentKey")) {
            (Some(uuid), Ok(key)) => match key.get("_id") {
                Some(id) => source.current(&uuid, id)?,
                None => None,
            },
            _ => None,
        };
        event
            .doc
            .insert("fullDocument", current.map_or(Bson::Null, Bson::Document));
    }
    let before_mode = spec.options.full_document_before_change;
    let wants_before = before_mode != FullDocumentBeforeChange::Off
        && matches!(kind, "update" | "replace" | "delete");
    let wants_after = kind == "update"
        && matches!(
            spec.options.full_document,
            FullDocument::WhenAvailable | FullDocument::Required
        );
    if !wants_before && !wants_after {
        return Ok(());
    }
    let before = match PreImageId::of(op) {
        Some(id) => source.pre_image(&id)?,
        None => None,
    };
    if wants_before && before.is_none() && before_mode == FullDocumentBeforeChange::Required {
        return Err(missing("pre-image", event));
    }
    if wants_after {
        let diff = op
            .get_document("o")
            .ok()
            .and_then(|o| o.get_document("diff").ok());
        let after = match (&before, diff) {
            (Some(pre), Some(diff)) => Some(apply_diff(pre, diff)?),
            _ => None,
        };
        if after.is_none() && spec.options.full_document == FullDocument::Required {
            return Err(missing("post-image", event));
        }
        event
            .doc
            .insert("fullDocument", after.map_or(Bson::Null, Bson::Document));
    }
    if wants_before {
        event.doc.insert(
            "fullDocumentBeforeChange",
            before.map_or(Bson::Null, Bson::Document),
        );
    }
    Ok(())
}

fn missing(what: &str, event: &ChangeEvent) -> MongoError {
    let id = event
        .doc
        .get("_id")
        .map(ToString::to_string)
        .unwrap_or_default();
    MongoError::new(
        ErrorCode::NO_MATCHING_DOCUMENT,
        format!(
            "Change stream was configured to require a {what} for all update, delete and \
             replace events, but the {what} was not found for event: {id}"
        ),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use bson::{Timestamp, doc};

    use super::*;
    use crate::changestream::test_util::coll_spec;

    const UUID: [u8; 16] = [3; 16];

    fn spec(full: FullDocument, before: FullDocumentBeforeChange) -> ChangeStreamSpec {
        let mut s = coll_spec("db", "c");
        s.options.full_document = full;
        s.options.full_document_before_change = before;
        s
    }

    fn op(kind: &str, o: Document, extra: Document) -> Document {
        let mut d = doc! {
            "op": kind, "ns": "db.c",
            "ui": Bson::Binary(bson::Binary {
                subtype: bson::spec::BinarySubtype::Uuid, bytes: UUID.to_vec() }),
            "o": o, "o2": {"_id": 1},
            "ts": Timestamp { time: 100, increment: 7 },
        };
        d.extend(extra);
        d
    }

    fn event(kind: &str) -> ChangeEvent {
        let token = resume::token::ResumeTokenData::high_water_mark(
            ClusterTime::new(100, 7),
            resume::token::TokenVersion::default(),
        )
        .encode();
        let doc = doc! {"_id": token.to_document(), "operationType": kind};
        ChangeEvent::from_document(doc).unwrap()
    }

    fn stored(id: &PreImageId) -> Result<Option<Document>> {
        Ok(
            (id.ts == ClusterTime::new(100, 7) && id.apply_ops_index == 0)
                .then(|| doc! {"_id": 1, "a": 1, "b": 2}),
        )
    }

    #[test]
    fn the_pre_image_is_keyed_by_the_entry_or_its_apply_ops_entry() {
        let plain = PreImageId::of(&op("d", doc! {"_id": 1}, doc! {})).unwrap();
        assert_eq!(plain.ts, ClusterTime::new(100, 7));
        assert_eq!(plain.apply_ops_index, 0);
        let in_txn = PreImageId::of(&op(
            "d",
            doc! {"_id": 1},
            doc! {"applyOpsTs": Timestamp { time: 99, increment: 2 }, "applyOpsIndex": 4_i64},
        ))
        .unwrap();
        assert_eq!(
            (in_txn.ts, in_txn.apply_ops_index),
            (ClusterTime::new(99, 2), 4)
        );
        assert!(
            PreImageId::of(&doc! {"op": "d", "ts": Timestamp { time: 1, increment: 1 }}).is_none()
        );
    }

    #[test]
    fn an_update_gets_its_exact_before_and_after() {
        let s = spec(FullDocument::Required, FullDocumentBeforeChange::Required);
        let update = op("u", doc! {"$v": 2, "diff": {"u": {"a": 5}}}, doc! {});
        let mut e = event("update");
        add_images(&s, &update, &mut e, &mut stored).unwrap();
        assert_eq!(
            e.doc.get_document("fullDocument").unwrap(),
            &doc! {"_id": 1, "a": 5, "b": 2}
        );
        assert_eq!(
            e.doc.get_document("fullDocumentBeforeChange").unwrap(),
            &doc! {"_id": 1, "a": 1, "b": 2}
        );
    }

    #[test]
    fn without_a_pre_image_when_available_is_null_and_required_fails() {
        let update = op("u", doc! {"$v": 2, "diff": {"u": {"a": 5}}}, doc! {});
        let mut none = |_: &PreImageId| Ok(None);
        let mut e = event("update");
        add_images(
            &spec(
                FullDocument::WhenAvailable,
                FullDocumentBeforeChange::WhenAvailable,
            ),
            &update,
            &mut e,
            &mut none,
        )
        .unwrap();
        assert_eq!(e.doc.get("fullDocument"), Some(&Bson::Null));
        assert_eq!(e.doc.get("fullDocumentBeforeChange"), Some(&Bson::Null));
        for options in [
            spec(FullDocument::Required, FullDocumentBeforeChange::Off),
            spec(FullDocument::Default, FullDocumentBeforeChange::Required),
        ] {
            let err = add_images(&options, &update, &mut event("update"), &mut none).unwrap_err();
            assert_eq!(err.code, 47);
        }
    }

    #[test]
    fn deletes_get_only_a_pre_image_and_inserts_nothing() {
        let s = spec(
            FullDocument::Required,
            FullDocumentBeforeChange::WhenAvailable,
        );
        let mut e = event("delete");
        add_images(&s, &op("d", doc! {"_id": 1}, doc! {}), &mut e, &mut stored).unwrap();
        assert!(!e.doc.contains_key("fullDocument"));
        assert!(e.doc.contains_key("fullDocumentBeforeChange"));
        let mut i = event("insert");
        add_images(&s, &op("i", doc! {"_id": 1}, doc! {}), &mut i, &mut stored).unwrap();
        assert!(!i.doc.contains_key("fullDocumentBeforeChange"));
    }

    #[test]
    fn default_options_add_nothing() {
        let s = spec(FullDocument::Default, FullDocumentBeforeChange::Off);
        assert!(!wanted(&s));
        let mut e = event("update");
        let mut never = |_: &PreImageId| -> Result<Option<Document>> { panic!("not looked up") };
        add_images(
            &s,
            &op("u", doc! {"$v": 2, "diff": {}}, doc! {}),
            &mut e,
            &mut never,
        )
        .unwrap();
        assert_eq!(e.doc.len(), 2);
    }
}
