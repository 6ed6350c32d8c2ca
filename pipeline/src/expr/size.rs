//! `$bsonSize` and `$binarySize`: sizes in bytes of values as MongoDB stores them.
//!
//! Invariants: `null`, `undefined` and missing give `null`; `$bsonSize` of a document is the
//! length of its BSON encoding (what `bson::Document::to_vec` writes), other types are 31393;
//! `$binarySize` of a string is its UTF-8 length (no terminating NUL) and of binData its payload
//! length, other types are 51276. Both results are int32 (BSON documents and strings are
//! bounded well below 2^31; a larger size saturates to int64).

use bson::Bson;

use super::err;
use crate::Result;
use crate::value::type_name;

fn int_or_long(n: usize) -> Bson {
    match i32::try_from(n) {
        Ok(i) => Bson::Int32(i),
        Err(_) => Bson::Int64(i64::try_from(n).unwrap_or(i64::MAX)),
    }
}

/// `$bsonSize`.
pub(super) fn bson_size(v: Option<Bson>) -> Result<Option<Bson>> {
    match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => Ok(Some(Bson::Null)),
        Some(Bson::Document(d)) => {
            let bytes = d.to_vec().map_err(|e| {
                err(
                    31393,
                    format!("$bsonSize could not encode its input as BSON: {e}"),
                )
            })?;
            Ok(Some(int_or_long(bytes.len())))
        }
        Some(other) => Err(err(
            31393,
            format!(
                "$bsonSize requires a document input, found: {}",
                type_name(&other)
            ),
        )),
    }
}

/// `$binarySize`.
pub(super) fn binary_size(v: Option<Bson>) -> Result<Option<Bson>> {
    match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => Ok(Some(Bson::Null)),
        Some(Bson::String(s)) => Ok(Some(int_or_long(s.len()))),
        Some(Bson::Binary(b)) => Ok(Some(int_or_long(b.bytes.len()))),
        Some(other) => Err(err(
            51276,
            format!(
                "$binarySize requires a string or BinData argument, found: {}",
                type_name(&other)
            ),
        )),
    }
}
