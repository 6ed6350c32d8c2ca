//! KeyString encoding straight from BSON bytes: what [`Builder::append_document`] writes for
//! the document the bytes decode to, without decoding them into a [`bson::Document`] first
//! (the per-event path of a change stream encodes each document key this way).
//!
//! Invariant: where [`Builder::append_raw_document`] or [`Builder::field_raw_document`] answers
//! `true`, the builder holds exactly what the decoded form would have given it, type bits
//! included (property-tested over every BSON type). Where the two could differ, or the bytes
//! are malformed, it answers `false` and leaves the builder as it was, so the caller decodes
//! the document and encodes that instead (which also reports the malformed ones). It declines:
//! * an object holding a field name twice (decoding keeps one field where the bytes have two);
//! * an object of more than [`MAX_FIELDS`] fields (the repeat check is quadratic);
//! * a DBPointer (the `bson` crate does not expose its parts);
//! * nesting deeper than [`MAX_DEPTH`].
//!
//! Decoding sorts a regular expression's options, so they are sorted here too.

use bson::RawBsonRef;
use bson::raw::{RawArray, RawDocument};

use super::{
    Builder, MAX_DEPTH, TypeBits, append_binary, append_bool, append_code,
    append_code_with_scope_code, append_date, append_decimal, append_double, append_int32,
    append_int64, append_object_id, append_regex, append_string, append_symbol, append_timestamp,
    ctype, field_name,
};

/// The most fields one object may have for this encoder (see the module note).
const MAX_FIELDS: usize = 32;

impl Builder {
    /// Appends one top-level object from its BSON bytes, as [`Builder::append_document`] would
    /// append the decoded document; `false`, with the builder unchanged, where it declines
    /// (see the module note).
    pub fn append_raw_document(&mut self, d: &RawDocument) -> bool {
        self.all_or_nothing(|buf, bits| {
            buf.push(ctype::OBJECT);
            object_body(buf, bits, d, 1)
        })
    }

    /// Appends a sub-document field from its BSON bytes to the open object, as
    /// [`Builder::field_document`] would; `false`, with the builder unchanged, where it
    /// declines.
    pub fn field_raw_document(&mut self, name: &str, d: &RawDocument) -> bool {
        self.all_or_nothing(|buf, bits| {
            field_name(buf, ctype::OBJECT, name);
            buf.push(ctype::OBJECT);
            object_body(buf, bits, d, 1)
        })
    }

    /// Runs `write` on the buffers; when it fails, puts them back as they were.
    fn all_or_nothing(
        &mut self,
        write: impl FnOnce(&mut Vec<u8>, &mut TypeBits) -> Option<()>,
    ) -> bool {
        let (len, bits) = (self.buf.len(), self.type_bits.clone());
        if write(&mut self.buf, &mut self.type_bits).is_some() {
            return true;
        }
        self.buf.truncate(len);
        self.type_bits = bits;
        false
    }
}

/// The fields of an object (as `append_object_body`), then its terminating NUL. `depth` is the
/// nesting of this object, 1 for a top-level one.
fn object_body(buf: &mut Vec<u8>, bits: &mut TypeBits, d: &RawDocument, depth: u32) -> Option<()> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut names = [""; MAX_FIELDS];
    for (n, field) in d.iter().enumerate() {
        let (name, v) = field.ok()?;
        let name = name.as_str();
        if names.get(..n)?.contains(&name) {
            return None;
        }
        *names.get_mut(n)? = name;
        buf.push(generic_ctype(v)?);
        // A BSON field name holds no NUL.
        buf.extend_from_slice(name.as_bytes());
        buf.push(0);
        value(buf, bits, v, depth)?;
    }
    buf.push(0);
    Some(())
}

fn array(buf: &mut Vec<u8>, bits: &mut TypeBits, a: &RawArray, depth: u32) -> Option<()> {
    if depth > MAX_DEPTH {
        return None;
    }
    buf.push(ctype::ARRAY);
    for v in a {
        value(buf, bits, v.ok()?, depth)?;
    }
    buf.push(0);
    Some(())
}

/// One value inside an object or array at nesting `depth` (as `append_value`).
fn value(buf: &mut Vec<u8>, bits: &mut TypeBits, v: RawBsonRef<'_>, depth: u32) -> Option<()> {
    match v {
        RawBsonRef::MinKey | RawBsonRef::MaxKey | RawBsonRef::Null | RawBsonRef::Undefined => {
            buf.push(generic_ctype(v)?)
        }
        RawBsonRef::Double(d) => append_double(buf, bits, d),
        RawBsonRef::Int32(i) => append_int32(buf, bits, i),
        RawBsonRef::Int64(i) => append_int64(buf, bits, i),
        RawBsonRef::Decimal128(d) => append_decimal(buf, bits, &d),
        RawBsonRef::String(s) => append_string(buf, bits, s),
        RawBsonRef::Symbol(s) => append_symbol(buf, bits, s),
        RawBsonRef::Document(d) => {
            buf.push(ctype::OBJECT);
            object_body(buf, bits, d, depth + 1)?;
        }
        RawBsonRef::Array(a) => array(buf, bits, a, depth + 1)?,
        RawBsonRef::Binary(b) => append_binary(buf, b.subtype, b.bytes),
        RawBsonRef::ObjectId(o) => append_object_id(buf, &o),
        RawBsonRef::Boolean(b) => append_bool(buf, b),
        RawBsonRef::DateTime(d) => append_date(buf, d),
        RawBsonRef::Timestamp(t) => append_timestamp(buf, t),
        RawBsonRef::RegularExpression(r) => {
            let options = r.options.as_str();
            if options.chars().is_sorted() {
                append_regex(buf, r.pattern.as_str(), options);
            } else {
                // As decoding does (`bson`'s `RawBson::from`).
                let mut chars: Vec<char> = options.chars().collect();
                chars.sort_unstable();
                let sorted: String = chars.into_iter().collect();
                append_regex(buf, r.pattern.as_str(), &sorted);
            }
        }
        RawBsonRef::DbPointer(_) => return None,
        RawBsonRef::JavaScriptCode(c) => append_code(buf, c),
        RawBsonRef::JavaScriptCodeWithScope(c) => {
            append_code_with_scope_code(buf, c.code);
            object_body(buf, bits, c.scope, depth + 1)?;
        }
    }
    Some(())
}

/// [`super::generic_ctype`] of a raw value (`None` for the DBPointer this encoder declines).
fn generic_ctype(v: RawBsonRef<'_>) -> Option<u8> {
    Some(match v {
        RawBsonRef::MinKey => ctype::MIN_KEY,
        RawBsonRef::Null => ctype::NULLISH,
        RawBsonRef::Undefined => ctype::UNDEFINED,
        RawBsonRef::Double(_)
        | RawBsonRef::Int32(_)
        | RawBsonRef::Int64(_)
        | RawBsonRef::Decimal128(_) => ctype::NUMERIC,
        RawBsonRef::String(_) | RawBsonRef::Symbol(_) => ctype::STRING_LIKE,
        RawBsonRef::Document(_) => ctype::OBJECT,
        RawBsonRef::Array(_) => ctype::ARRAY,
        RawBsonRef::Binary(_) => ctype::BIN_DATA,
        RawBsonRef::ObjectId(_) => ctype::OID,
        RawBsonRef::Boolean(_) => ctype::BOOL,
        RawBsonRef::DateTime(_) => ctype::DATE,
        RawBsonRef::Timestamp(_) => ctype::TIMESTAMP,
        RawBsonRef::RegularExpression(_) => ctype::REGEX,
        RawBsonRef::DbPointer(_) => return None,
        RawBsonRef::JavaScriptCode(_) => ctype::CODE,
        RawBsonRef::JavaScriptCodeWithScope(_) => ctype::CODE_WITH_SCOPE,
        RawBsonRef::MaxKey => ctype::MAX_KEY,
    })
}
