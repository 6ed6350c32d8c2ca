//! Small BSON helpers the update module needs beyond `pipeline::value`: binary (byte-for-byte)
//! equality, encoded sizes, and MongoDB-style value rendering for error messages.
//!
//! Invariants:
//! * [`binary_eq`] is MongoDB's `binaryEqual`: same type, same field order, same bytes (so
//!   `1 != 1.0`, `{a,b} != {b,a}`, `0.0 != -0.0`, and a NaN equals the same NaN). It is what
//!   no-op detection and the diff use; `bson::Document`'s own `==` ignores field order.
//! * [`bson_size`] is the exact encoded size of a value (without its field name).

use bson::{Bson, Document};

/// Byte-for-byte equality of two values, field order included.
pub fn binary_eq(a: &Bson, b: &Bson) -> bool {
    match (a, b) {
        (Bson::Double(x), Bson::Double(y)) => x.to_bits() == y.to_bits(),
        (Bson::Document(x), Bson::Document(y)) => doc_binary_eq(x, y),
        (Bson::Array(x), Bson::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| binary_eq(p, q))
        }
        (Bson::JavaScriptCodeWithScope(x), Bson::JavaScriptCodeWithScope(y)) => {
            x.code == y.code && doc_binary_eq(&x.scope, &y.scope)
        }
        _ => std::mem::discriminant(a) == std::mem::discriminant(b) && a == b,
    }
}

/// Byte-for-byte equality of two documents, field order included.
pub fn doc_binary_eq(a: &Document, b: &Document) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b.iter())
            .all(|((ka, va), (kb, vb))| ka == kb && binary_eq(va, vb))
}

/// The encoded size of a document.
pub fn doc_size(d: &Document) -> usize {
    4 + d
        .iter()
        .map(|(k, v)| 2 + k.len() + bson_size(v))
        .sum::<usize>()
        + 1
}

/// The encoded size of a value (the bytes after its type byte and field name).
pub fn bson_size(v: &Bson) -> usize {
    match v {
        Bson::Double(_) | Bson::Int64(_) | Bson::DateTime(_) | Bson::Timestamp(_) => 8,
        Bson::String(s) | Bson::JavaScriptCode(s) | Bson::Symbol(s) => 5 + s.len(),
        Bson::Array(a) => {
            4 + a
                .iter()
                .enumerate()
                .map(|(i, v)| 2 + decimal_len(i) + bson_size(v))
                .sum::<usize>()
                + 1
        }
        Bson::Document(d) => doc_size(d),
        Bson::Boolean(_) => 1,
        Bson::Null | Bson::Undefined | Bson::MaxKey | Bson::MinKey => 0,
        Bson::RegularExpression(r) => r.pattern.as_str().len() + r.options.as_str().len() + 2,
        Bson::JavaScriptCodeWithScope(c) => 4 + 5 + c.code.len() + doc_size(&c.scope),
        Bson::Int32(_) => 4,
        Bson::Binary(b) => 5 + b.bytes.len(),
        Bson::ObjectId(_) => 12,
        Bson::Decimal128(_) => 16,
        // A DBPointer is a namespace string and an ObjectId; bson keeps its fields private,
        // so estimate with its extended-JSON rendering (only sizes for heuristics use this).
        Bson::DbPointer(_) => 5 + 12 + 32,
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

/// A value rendered roughly as MongoDB's `BSONElement::toString` renders it in messages.
pub fn render(v: &Bson) -> String {
    match v {
        Bson::String(s) => format!("\"{s}\""),
        Bson::Document(d) => render_doc(d),
        Bson::Array(a) => {
            if a.is_empty() {
                return "[]".to_string();
            }
            let parts: Vec<String> = a.iter().map(render).collect();
            format!("[ {} ]", parts.join(", "))
        }
        Bson::Int64(i) => i.to_string(),
        other => other.to_string(),
    }
}

/// A document rendered as in MongoDB messages: `{ a: 1, b: "x" }`.
pub fn render_doc(d: &Document) -> String {
    if d.is_empty() {
        return "{}".to_string();
    }
    let parts: Vec<String> = d
        .iter()
        .map(|(k, v)| format!("{k}: {}", render(v)))
        .collect();
    format!("{{ {} }}", parts.join(", "))
}

/// `_id: <value>` of a document for messages, or `no id`.
pub fn render_id(doc: &Document) -> String {
    match doc.get("_id") {
        Some(id) => format!("_id: {}", render(id)),
        None => "no id".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn binary_eq_is_order_and_type_sensitive() {
        assert!(!binary_eq(&Bson::Int32(1), &Bson::Double(1.0)));
        assert!(!doc_binary_eq(
            &doc! {"a": 1, "b": 2},
            &doc! {"b": 2, "a": 1}
        ));
        assert!(doc_binary_eq(
            &doc! {"a": [1, {"x": 2.5}]},
            &doc! {"a": [1, {"x": 2.5}]}
        ));
        assert!(binary_eq(&Bson::Double(f64::NAN), &Bson::Double(f64::NAN)));
        assert!(!binary_eq(&Bson::Double(0.0), &Bson::Double(-0.0)));
    }

    #[test]
    fn sizes_match_the_encoder() {
        let d = doc! {
            "a": 1, "b": "xyz", "c": [1_i64, 2.5, null, true, {"d": []}],
            "e": bson::oid::ObjectId::new(), "f": bson::DateTime::from_millis(5),
            "g": bson::Timestamp { time: 1, increment: 2 },
            "h": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![1, 2, 3] },
        };
        let bytes = d.to_vec().unwrap();
        assert_eq!(doc_size(&d), bytes.len());
    }
}
