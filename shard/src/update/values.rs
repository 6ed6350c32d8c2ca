//! Small BSON helpers the update module needs beyond `pipeline::value`: binary (byte-for-byte)
//! equality, and an `_id` shown for messages (values are shown through `crate::shown`; encoded
//! sizes are `pipeline::changestream::split`'s).
//!
//! Invariants:
//! * [`binary_eq`] is MongoDB's `binaryEqual`: same type, same field order, same bytes (so
//!   `1 != 1.0`, `{a,b} != {b,a}`, `0.0 != -0.0`, and a NaN equals the same NaN). It is what
//!   no-op detection and the diff use; `bson::Document`'s own `==` ignores field order.

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

/// `_id: <value>` of a document for messages, or `no id`.
pub fn render_id(doc: &Document) -> String {
    match doc.get("_id") {
        Some(id) => format!("_id: {}", crate::shown::render(id)),
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
}
