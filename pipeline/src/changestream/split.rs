//! Event size limits and `$changeStreamSplitLargeEvent` (reference §8).
//!
//! Owns: the BSON size of an event (computed, not serialized), the 16 MiB check of streams
//! without the split stage, and the split of a large event into fragments.
//!
//! Invariants:
//! * without the split stage an event over 16 MiB fails with `BSONObjectTooLarge` (10334);
//! * with it, an event over the threshold (16 MiB + 16 KiB − 8 KiB) becomes fragments: the
//!   top-level fields other than `_id` sorted by (serialized size, name), filled greedily, each
//!   fragment within the threshold minus the resume token's size and holding at least one field;
//!   fragment k (1-based) has `_id` = the event's token with `fragmentNum = k − 1` and
//!   `splitEvent: {fragment: k, of: n}`; a field that alone does not fit fails with 7182500;
//! * fragment tokens sort after the event's own position and before the next event, in
//!   fragment order, so the merge and the resume proof treat fragments as events.

use bson::{Bson, Document, doc};
use wire::{ErrorCode, MongoError, Result};

use super::ChangeEvent;

/// `BSONObjMaxUserSize`.
pub const BSON_OBJ_MAX_USER_SIZE: usize = 16 * 1024 * 1024;
/// `BSONObjMaxInternalSize`.
pub const BSON_OBJ_MAX_INTERNAL_SIZE: usize = BSON_OBJ_MAX_USER_SIZE + 16 * 1024;
/// Events larger than this are split by `$changeStreamSplitLargeEvent`.
pub const SPLIT_THRESHOLD: usize = BSON_OBJ_MAX_INTERNAL_SIZE - 8 * 1024;

/// Fails with 10334 when the event is over 16 MiB (streams without the split stage).
pub fn check_size(event: &ChangeEvent) -> Result<()> {
    check_encoded_size(document_size(&event.doc))
}

/// [`check_size`] for an event of `size` encoded bytes.
pub fn check_encoded_size(size: usize) -> Result<()> {
    if size > BSON_OBJ_MAX_USER_SIZE {
        return Err(MongoError::new(
            ErrorCode::BSON_OBJECT_TOO_LARGE,
            format!(
                "Executor error during getMore :: caused by :: BSONObj size: {size} is invalid. \
                 Size must be between 0 and {BSON_OBJ_MAX_USER_SIZE}(16MB)"
            ),
        ));
    }
    Ok(())
}

/// Splits `event` into fragments when it is over [`SPLIT_THRESHOLD`]; otherwise returns it.
pub fn split_event(event: ChangeEvent) -> Result<Vec<ChangeEvent>> {
    split_event_at(event, SPLIT_THRESHOLD)
}

/// [`split_event`] with an explicit threshold (tests use small ones).
pub fn split_event_at(event: ChangeEvent, threshold: usize) -> Result<Vec<ChangeEvent>> {
    if document_size(&event.doc) <= threshold {
        return Ok(vec![event]);
    }
    let max_fragment = threshold.saturating_sub(document_size(&event.token.to_document()));
    let mut fields: Vec<(usize, &String, &Bson)> = event
        .doc
        .iter()
        .filter(|(k, _)| k.as_str() != "_id")
        .map(|(k, v)| (element_size(k, v), k, v))
        .collect();
    fields.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));

    let mut fragments: Vec<(ChangeEvent, usize)> = Vec::new();
    let mut it = fields.into_iter().peekable();
    while it.peek().is_some() {
        let k = fragments.len();
        let data = event
            .data
            .clone()
            .with_fragment_num(Some(u32::try_from(k).unwrap_or(u32::MAX)))?;
        let token = data.encode();
        let mut d = doc! {
            "_id": token.to_document(),
            "splitEvent": {"fragment": i32::try_from(k + 1).unwrap_or(i32::MAX), "of": 0_i32},
        };
        let mut size = document_size(&d);
        let mut any = false;
        while let Some((field_size, name, value)) = it.peek().copied() {
            if any && size + field_size > max_fragment {
                break;
            }
            d.insert(name.clone(), value.clone());
            size += field_size;
            any = true;
            it.next();
        }
        if size > max_fragment {
            return Err(MongoError::with_code(
                7182500,
                format!("Serialized fragment size {size} exceeds maximum {max_fragment}"),
            ));
        }
        fragments.push((
            ChangeEvent {
                token,
                data,
                doc: d,
            },
            size,
        ));
    }
    let of = i32::try_from(fragments.len()).unwrap_or(i32::MAX);
    Ok(fragments
        .into_iter()
        .map(|(mut e, _)| {
            if let Ok(s) = e.doc.get_document_mut("splitEvent") {
                s.insert("of", of);
            }
            e
        })
        .collect())
}

/// The BSON size of a document, without serializing it.
pub fn document_size(d: &Document) -> usize {
    4 + d.iter().map(|(k, v)| element_size(k, v)).sum::<usize>() + 1
}

fn element_size(name: &str, v: &Bson) -> usize {
    1 + name.len() + 1 + value_size(v)
}

/// The BSON size of a value as an element's payload (recursion as deep as the value nests).
pub fn value_size(v: &Bson) -> usize {
    match v {
        Bson::Double(_) | Bson::DateTime(_) | Bson::Timestamp(_) | Bson::Int64(_) => 8,
        Bson::Int32(_) => 4,
        Bson::Decimal128(_) => 16,
        Bson::ObjectId(_) => 12,
        Bson::Boolean(_) => 1,
        Bson::Null | Bson::Undefined | Bson::MinKey | Bson::MaxKey => 0,
        Bson::String(s) | Bson::Symbol(s) | Bson::JavaScriptCode(s) => 4 + s.len() + 1,
        Bson::Document(d) => document_size(d),
        Bson::Array(a) => {
            let mut n = 5;
            for (i, e) in a.iter().enumerate() {
                n += 1 + decimal_len(i) + 1 + value_size(e);
            }
            n
        }
        Bson::Binary(b) => {
            let old = b.subtype == bson::spec::BinarySubtype::BinaryOld;
            4 + 1 + if old { 4 } else { 0 } + b.bytes.len()
        }
        Bson::RegularExpression(r) => r.pattern.len() + 1 + r.options.len() + 1,
        Bson::JavaScriptCodeWithScope(c) => 4 + (4 + c.code.len() + 1) + document_size(&c.scope),
        // DbPointer's fields are private; measure it the slow way (it never occurs in events).
        Bson::DbPointer(_) => {
            let d = doc! {"": v.clone()};
            d.to_vec().map(|b| b.len().saturating_sub(7)).unwrap_or(0)
        }
    }
}

fn decimal_len(mut i: usize) -> usize {
    let mut n = 1;
    while i >= 10 {
        i /= 10;
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests;
