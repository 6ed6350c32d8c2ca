//! MongoDB Extended JSON (v2, relaxed or canonical) written straight from BSON bytes: what the
//! HTTP feeds send for each event and document.
//!
//! Pure. Invariants: the output is the `bson` crate's `into_relaxed_extjson` /
//! `into_canonical_extjson` of the same value (checked against them in the tests below), but
//! for field order, which stays the document's (theirs goes through a sorted map), and the text
//! of doubles and dates, which parse to the same values; nothing is decoded into an
//! intermediate tree; the writer never fails on a well-formed document and reports a
//! malformed one.

use std::fmt::Write as _;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bson::{RawBsonRef, RawDocument};
use wire::{MongoError, Result};

/// Extended JSON's two forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Relaxed,
    Canonical,
}

fn malformed(e: impl std::fmt::Display) -> MongoError {
    MongoError::internal(format!("a malformed BSON document: {e}"))
}

/// Appends `doc` to `out` as Extended JSON.
pub fn write_document(out: &mut String, doc: &RawDocument, form: Form) -> Result<()> {
    out.push('{');
    for (i, element) in doc.iter().enumerate() {
        let (key, value) = element.map_err(malformed)?;
        if i > 0 {
            out.push(',');
        }
        write_str(out, key.as_str());
        out.push(':');
        write_value(out, value, form)?;
    }
    out.push('}');
    Ok(())
}

fn write_array(out: &mut String, array: &bson::RawArray, form: Form) -> Result<()> {
    out.push('[');
    for (i, value) in array.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_value(out, value.map_err(malformed)?, form)?;
    }
    out.push(']');
    Ok(())
}

/// A JSON string, escaped.
pub fn write_str(out: &mut String, s: &str) {
    out.push('"');
    let mut plain = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[plain..i]);
        if escape.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(escape);
        }
        plain = i + 1;
    }
    out.push_str(&s[plain..]);
    out.push('"');
}

/// `{"<key>": "<text>"}`.
fn wrapped(out: &mut String, key: &str, text: &str) {
    out.push_str("{\"");
    out.push_str(key);
    out.push_str("\":");
    write_str(out, text);
    out.push('}');
}

fn write_double(out: &mut String, v: f64, form: Form) {
    if v.is_nan() {
        let s = if v.is_sign_negative() { "-NaN" } else { "NaN" };
        return wrapped(out, "$numberDouble", s);
    }
    if v.is_infinite() {
        let s = if v.is_sign_negative() {
            "-Infinity"
        } else {
            "Infinity"
        };
        return wrapped(out, "$numberDouble", s);
    }
    match form {
        // The shortest text that reads back as the same double, always with a point or an
        // exponent so that it reads back as a double.
        Form::Relaxed => {
            let _ = write!(out, "{v:?}");
        }
        Form::Canonical => {
            let mut s = v.to_string();
            if v.fract() == 0.0 && !s.contains(['e', 'E']) {
                s.push_str(".0");
            }
            wrapped(out, "$numberDouble", &s);
        }
    }
}

fn write_value(out: &mut String, value: RawBsonRef<'_>, form: Form) -> Result<()> {
    match value {
        RawBsonRef::Double(v) => write_double(out, v, form),
        RawBsonRef::String(s) => write_str(out, s),
        RawBsonRef::Document(d) => write_document(out, d, form)?,
        RawBsonRef::Array(a) => write_array(out, a, form)?,
        RawBsonRef::Boolean(b) => out.push_str(if b { "true" } else { "false" }),
        RawBsonRef::Null => out.push_str("null"),
        RawBsonRef::Int32(i) => match form {
            Form::Relaxed => {
                let _ = write!(out, "{i}");
            }
            Form::Canonical => wrapped(out, "$numberInt", &i.to_string()),
        },
        RawBsonRef::Int64(i) => match form {
            Form::Relaxed => {
                let _ = write!(out, "{i}");
            }
            Form::Canonical => wrapped(out, "$numberLong", &i.to_string()),
        },
        RawBsonRef::Timestamp(t) => {
            let _ = write!(
                out,
                "{{\"$timestamp\":{{\"t\":{},\"i\":{}}}}}",
                t.time, t.increment
            );
        }
        RawBsonRef::DateTime(d) => {
            let millis = d.timestamp_millis();
            let iso = (form == Form::Relaxed && millis >= 0)
                .then(|| d.try_to_rfc3339_string().ok())
                .flatten()
                .filter(|s| s.len() >= 4 && s.as_bytes()[..4].iter().all(u8::is_ascii_digit));
            match iso {
                Some(iso) => wrapped(out, "$date", &iso),
                None => {
                    let _ = write!(out, "{{\"$date\":{{\"$numberLong\":\"{millis}\"}}}}");
                }
            }
        }
        RawBsonRef::ObjectId(id) => wrapped(out, "$oid", &id.to_hex()),
        RawBsonRef::Binary(b) => {
            let subtype: u8 = b.subtype.into();
            out.push_str("{\"$binary\":{\"base64\":");
            write_str(out, &B64.encode(b.bytes));
            let _ = write!(out, ",\"subType\":\"{subtype:02x}\"}}}}");
        }
        RawBsonRef::RegularExpression(r) => {
            let mut options: Vec<char> = r.options.as_str().chars().collect();
            options.sort_unstable();
            let options: String = options.into_iter().collect();
            out.push_str("{\"$regularExpression\":{\"pattern\":");
            write_str(out, r.pattern.as_str());
            out.push_str(",\"options\":");
            write_str(out, &options);
            out.push_str("}}");
        }
        RawBsonRef::JavaScriptCode(code) => wrapped(out, "$code", code),
        RawBsonRef::JavaScriptCodeWithScope(c) => {
            out.push_str("{\"$code\":");
            write_str(out, c.code);
            out.push_str(",\"$scope\":");
            write_document(out, c.scope, form)?;
            out.push('}');
        }
        RawBsonRef::Symbol(s) => wrapped(out, "$symbol", s),
        RawBsonRef::Decimal128(d) => wrapped(out, "$numberDecimal", &d.to_string()),
        RawBsonRef::Undefined => out.push_str("{\"$undefined\":true}"),
        RawBsonRef::MinKey => out.push_str("{\"$minKey\":1}"),
        RawBsonRef::MaxKey => out.push_str("{\"$maxKey\":1}"),
        RawBsonRef::DbPointer(_) => {
            // Deprecated and rare: through the owned form.
            let owned = bson::Bson::try_from(value).map_err(malformed)?;
            out.push_str(&owned.into_relaxed_extjson().to_string());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use bson::{Binary, Bson, DateTime, Decimal128, Document, Regex, Timestamp, doc, oid};

    use super::*;

    fn ours(d: &Document, form: Form) -> serde_json::Value {
        let raw = bson::RawDocumentBuf::try_from(d).expect("encode");
        let mut out = String::new();
        write_document(&mut out, &raw, form).expect("write");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON: {e}: {out}"))
    }

    #[test]
    fn every_type_is_written_as_the_bson_crate_writes_it() {
        let d = doc! {
            "double": 1.5, "whole": 2.0, "big": 1e300, "neg0": -0.0,
            "inf": f64::INFINITY, "ninf": f64::NEG_INFINITY, "nan": f64::NAN,
            "s": "a \"quoted\" \\ line\nwith\ttabs \u{1} and ünïcode",
            "doc": {"x": 1, "y": [1, "two", {"three": 3_i64}]},
            "t": true, "f": false, "null": Bson::Null,
            "i32": 7, "i64": 1_i64 << 40, "ts": Timestamp { time: 5, increment: 9 },
            "date": DateTime::from_millis(1_700_000_000_123),
            "old": DateTime::from_millis(-5), "far": DateTime::from_millis(300_000_000_000_000),
            "oid": oid::ObjectId::parse_str("64b7f1f2a1b2c3d4e5f60718").expect("oid"),
            "bin": Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![1; 16] },
            "generic": Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![0, 255] },
            "re": Regex {
                pattern: bson::raw::CString::try_from("a.*b").expect("cstr"),
                options: bson::raw::CString::try_from("xi").expect("cstr"),
            },
            "code": Bson::JavaScriptCode("f()".into()),
            "sym": Bson::Symbol("s".into()),
            "dec": Decimal128::from_bytes([0; 16]),
            "undef": Bson::Undefined, "min": Bson::MinKey, "max": Bson::MaxKey,
        };
        for form in [Form::Relaxed, Form::Canonical] {
            let theirs = match form {
                Form::Relaxed => Bson::Document(d.clone()).into_relaxed_extjson(),
                Form::Canonical => Bson::Document(d.clone()).into_canonical_extjson(),
            };
            let ours = ours(&d, form);
            let (serde_json::Value::Object(a), serde_json::Value::Object(b)) = (&ours, &theirs)
            else {
                panic!("objects");
            };
            assert_eq!(
                a.keys().collect::<Vec<_>>().len(),
                b.keys().collect::<Vec<_>>().len()
            );
            for (k, v) in b {
                let mine = &a[k];
                // Dates and doubles may differ in text, never in value.
                let same = match (mine, v) {
                    (serde_json::Value::Number(x), serde_json::Value::Number(y)) => {
                        x.as_f64() == y.as_f64()
                    }
                    _ if k == "date" && form == Form::Relaxed => {
                        let read = |v: &serde_json::Value| {
                            v["$date"]
                                .as_str()
                                .and_then(|s| DateTime::parse_rfc3339_str(s).ok())
                        };
                        read(mine) == read(v) && read(mine).is_some()
                    }
                    _ => mine == v,
                };
                assert!(same, "{form:?} {k}: ours {mine}, theirs {v}");
            }
        }
    }

    #[test]
    fn field_order_is_the_documents() {
        let d = doc! {"z": 1, "a": 2, "m": {"y": 1, "b": 2}};
        let raw = bson::RawDocumentBuf::try_from(&d).expect("encode");
        let mut out = String::new();
        write_document(&mut out, &raw, Form::Relaxed).expect("write");
        assert_eq!(out, r#"{"z":1,"a":2,"m":{"y":1,"b":2}}"#);
    }

    #[test]
    fn relaxed_doubles_read_back_as_doubles() {
        for v in [1.0, 0.1, 1e21, 1e-7, -3.0, 123456789.125] {
            let mut out = String::new();
            write_double(&mut out, v, Form::Relaxed);
            assert!(
                out.contains(['.', 'e']),
                "{v} written as {out}, which reads back as an integer"
            );
            assert_eq!(out.parse::<f64>().ok(), Some(v));
        }
    }
}
