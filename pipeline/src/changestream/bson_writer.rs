//! Writing a BSON document straight into a byte buffer, element by element, with nested
//! documents and arrays opened and closed in place (the length is written when one closes):
//! how the encoded path of the transform builds an event and its `updateDescription` without
//! intermediate documents.
//!
//! Owns: the element layout of the values the change-stream code writes.
//!
//! Invariants:
//! * each element is written with the bytes `RawDocumentBuf::append` writes for the same name
//!   and value (tested over every BSON type);
//! * names are `&CStr`, so they hold no NUL; array elements are named `0`, `1`, ... by the
//!   caller through [`index_name`];
//! * a document or array is complete once [`end`] has closed what [`begin`] opened; one that
//!   would exceed `i32::MAX` bytes is an error, never a wrong length.

// The small writers are `#[inline]`: most names are literals, whose copies then compile to
// plain stores instead of calls to `memcpy`.

use bson::raw::{CStr, RawDocument, RawDocumentBuf};
use bson::spec::{BinarySubtype, ElementType};
use bson::{RawBsonRef, Timestamp};
use wire::{MongoError, Result};

/// A document (or array) opened by [`begin`], to be closed by [`end`].
#[must_use = "an open document must be closed with `end`"]
pub(crate) struct Open(usize);

/// Opens a document (or array) at the end of `out`: its length, written by [`end`].
#[inline]
pub(crate) fn begin(out: &mut Vec<u8>) -> Open {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    Open(at)
}

/// Closes `open`: the terminating NUL, and the length in front.
#[inline]
pub(crate) fn end(out: &mut Vec<u8>, open: Open) -> Result<()> {
    out.push(0);
    let len = out.len().saturating_sub(open.0);
    let len = i32::try_from(len)
        .map_err(|_| MongoError::internal("a change event larger than a BSON document"))?;
    if let Some(prefix) = out.get_mut(open.0..open.0 + 4) {
        prefix.copy_from_slice(&len.to_le_bytes());
    }
    Ok(())
}

/// The type byte and name of an element; its value follows.
#[inline]
pub(crate) fn element_name(out: &mut Vec<u8>, kind: ElementType, name: &CStr) {
    out.push(kind as u8);
    out.extend_from_slice(name.as_str().as_bytes());
    out.push(0);
}

/// The type byte and name of the `i`th element of an array: `i` in decimal.
#[inline]
pub(crate) fn index_name(out: &mut Vec<u8>, kind: ElementType, i: usize) {
    out.push(kind as u8);
    // The digits, last first, into the end of a buffer large enough for any usize.
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = i;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(digits.get(at..).unwrap_or_default());
    out.push(0);
}

/// A string value (after its name): length with the NUL, bytes, NUL.
#[inline]
pub(crate) fn string_value(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as i32 + 1).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

#[inline]
pub(crate) fn string(out: &mut Vec<u8>, name: &CStr, s: &str) {
    element_name(out, ElementType::String, name);
    string_value(out, s);
}

#[inline]
pub(crate) fn int32(out: &mut Vec<u8>, name: &CStr, i: i32) {
    element_name(out, ElementType::Int32, name);
    out.extend_from_slice(&i.to_le_bytes());
}

#[inline]
pub(crate) fn timestamp(out: &mut Vec<u8>, name: &CStr, t: Timestamp) {
    element_name(out, ElementType::Timestamp, name);
    out.extend_from_slice(&t.increment.to_le_bytes());
    out.extend_from_slice(&t.time.to_le_bytes());
}

/// An embedded document, copied.
#[inline]
pub(crate) fn document(out: &mut Vec<u8>, name: &CStr, d: &RawDocument) {
    element_name(out, ElementType::EmbeddedDocument, name);
    out.extend_from_slice(d.as_bytes());
}

/// Any value, as `RawDocumentBuf::append` writes it.
pub(crate) fn value(out: &mut Vec<u8>, name: &CStr, v: RawBsonRef<'_>) {
    if let RawBsonRef::DbPointer(_) = v {
        // Its parts are private to `bson`: let it write the element, and copy that.
        let mut d = RawDocumentBuf::new();
        d.append(name, v);
        let bytes = d.as_bytes();
        out.extend_from_slice(bytes.get(4..bytes.len() - 1).unwrap_or_default());
        return;
    }
    element_name(out, v.element_type(), name);
    match v {
        RawBsonRef::Double(d) => out.extend_from_slice(&d.to_le_bytes()),
        RawBsonRef::String(s) | RawBsonRef::Symbol(s) | RawBsonRef::JavaScriptCode(s) => {
            string_value(out, s)
        }
        RawBsonRef::Document(d) => out.extend_from_slice(d.as_bytes()),
        RawBsonRef::Array(a) => out.extend_from_slice(a.as_bytes()),
        RawBsonRef::Binary(b) => {
            // The old binary subtype repeats the length of the bytes inside the value.
            let old = b.subtype == BinarySubtype::BinaryOld;
            let len = b.bytes.len() as i32 + if old { 4 } else { 0 };
            out.extend_from_slice(&len.to_le_bytes());
            out.push(u8::from(b.subtype));
            if old {
                out.extend_from_slice(&(len - 4).to_le_bytes());
            }
            out.extend_from_slice(b.bytes);
        }
        RawBsonRef::ObjectId(o) => out.extend_from_slice(&o.bytes()),
        RawBsonRef::Boolean(b) => out.push(u8::from(b)),
        RawBsonRef::DateTime(d) => out.extend_from_slice(&d.timestamp_millis().to_le_bytes()),
        RawBsonRef::RegularExpression(r) => {
            out.extend_from_slice(r.pattern.as_str().as_bytes());
            out.push(0);
            out.extend_from_slice(r.options.as_str().as_bytes());
            out.push(0);
        }
        RawBsonRef::JavaScriptCodeWithScope(c) => {
            let scope = c.scope.as_bytes();
            let len = 4 + 4 + c.code.len() as i32 + 1 + scope.len() as i32;
            out.extend_from_slice(&len.to_le_bytes());
            string_value(out, c.code);
            out.extend_from_slice(scope);
        }
        RawBsonRef::Int32(i) => out.extend_from_slice(&i.to_le_bytes()),
        RawBsonRef::Timestamp(t) => {
            out.extend_from_slice(&t.increment.to_le_bytes());
            out.extend_from_slice(&t.time.to_le_bytes());
        }
        RawBsonRef::Int64(i) => out.extend_from_slice(&i.to_le_bytes()),
        RawBsonRef::Decimal128(d) => out.extend_from_slice(&d.bytes()),
        RawBsonRef::Null | RawBsonRef::Undefined | RawBsonRef::MinKey | RawBsonRef::MaxKey => {}
        // Written whole above.
        RawBsonRef::DbPointer(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use bson::raw::{RawArrayBuf, cstr};
    use bson::{Binary, Bson, DateTime, JavaScriptCodeWithScope, Regex, doc};

    use super::*;

    /// A DBPointer element `p`, written by hand (`bson` builds one only by parsing).
    fn with_dbpointer() -> RawDocumentBuf {
        let mut b = vec![0x0C];
        b.extend_from_slice(b"p\0");
        b.extend_from_slice(&5_i32.to_le_bytes());
        b.extend_from_slice(b"db.c\0");
        b.extend_from_slice(&[7; 12]);
        let mut d = ((b.len() + 5) as i32).to_le_bytes().to_vec();
        d.extend_from_slice(&b);
        d.push(0);
        RawDocumentBuf::from_bytes(d).expect("a document")
    }

    fn every_type() -> RawDocumentBuf {
        let d = doc! {
            "dbl": -1.5, "str": "a\u{e9}", "doc": {"x": [1, {"y": 2_i64}]}, "arr": [1, "s"],
            "bin": Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![1, 2, 3] },
            "old": Binary { subtype: BinarySubtype::BinaryOld, bytes: vec![4, 5] },
            "undef": Bson::Undefined, "oid": bson::oid::ObjectId::from_bytes([3; 12]),
            "t": true, "f": false, "dt": DateTime::from_millis(-5), "null": Bson::Null,
            "re": Bson::RegularExpression(Regex {
                pattern: bson::raw::CString::try_from("a.c").expect("no NUL"),
                options: bson::raw::CString::try_from("im").expect("no NUL"),
            }),
            "code": Bson::JavaScriptCode("f()".into()),
            "sym": Bson::Symbol("sym".into()),
            "cws": Bson::JavaScriptCodeWithScope(JavaScriptCodeWithScope {
                code: "g()".into(),
                scope: doc! {"x": 1},
            }),
            "i": -7, "ts": Timestamp { time: 1, increment: 2 }, "l": i64::MIN,
            "dec": Bson::Decimal128(bson::Decimal128::from_bytes([3; 16])),
            "min": Bson::MinKey, "max": Bson::MaxKey,
        };
        let mut raw = RawDocumentBuf::try_from(&d).expect("encodes");
        for (k, v) in with_dbpointer().iter().map(|e| e.expect("valid")) {
            raw.append(k, v);
        }
        raw
    }

    #[test]
    fn values_are_written_as_bson_appends_them() {
        let all = every_type();
        for (k, v) in all.iter().map(|e| e.expect("valid")) {
            let mut want = RawDocumentBuf::new();
            want.append(k, v);
            let mut out = vec![9];
            let open = begin(&mut out);
            value(&mut out, k, v);
            end(&mut out, open).expect("closes");
            assert_eq!(&out[1..], want.as_bytes(), "{k:?}");
        }
    }

    #[test]
    fn helpers_write_what_bson_writes() {
        let nested = RawDocumentBuf::try_from(&doc! {"a": 1}).expect("encodes");
        let mut want = RawDocumentBuf::new();
        want.append(cstr!("s"), "x\u{e9}");
        want.append(cstr!("i"), -3);
        want.append(
            cstr!("t"),
            Timestamp {
                time: 4,
                increment: 5,
            },
        );
        want.append(cstr!("d"), &nested);
        let mut arr = RawArrayBuf::new();
        for i in 0..123 {
            arr.push(format!("p{i}").as_str());
        }
        want.append(cstr!("a"), arr);

        let mut out = Vec::new();
        let open = begin(&mut out);
        string(&mut out, cstr!("s"), "x\u{e9}");
        int32(&mut out, cstr!("i"), -3);
        timestamp(
            &mut out,
            cstr!("t"),
            Timestamp {
                time: 4,
                increment: 5,
            },
        );
        document(&mut out, cstr!("d"), &nested);
        element_name(&mut out, ElementType::Array, cstr!("a"));
        let a = begin(&mut out);
        for i in 0..123 {
            index_name(&mut out, ElementType::String, i);
            string_value(&mut out, &format!("p{i}"));
        }
        end(&mut out, a).expect("closes");
        end(&mut out, open).expect("closes");
        assert_eq!(out, want.as_bytes());
    }

    #[test]
    fn index_names_are_decimal() {
        for i in [0usize, 9, 10, 99, 100, 12345, usize::MAX] {
            let mut out = Vec::new();
            index_name(&mut out, ElementType::Int32, i);
            assert_eq!(out, [&[0x10][..], i.to_string().as_bytes(), &[0]].concat());
        }
    }
}
