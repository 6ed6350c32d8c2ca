//! BSON values as MongoDB compares them: canonical type order, numbers by value across
//! int32/int64/double/decimal, documents and arrays element-wise; dotted-path lookup.

use std::cmp::Ordering;

use bson::{Bson, Document};

/// MongoDB's total order over BSON values (`BSONElement::woCompare` semantics, no collation).
pub fn compare(a: &Bson, b: &Bson) -> Ordering {
    let _ = (a, b);
    unimplemented!("pipeline helper")
}

/// Equality in MongoDB's sense (`1 == 1.0 == NumberLong(1)`).
pub fn equal(a: &Bson, b: &Bson) -> bool {
    compare(a, b) == Ordering::Equal
}

/// The value at a dotted path without array traversal (`a.0.b` indexes arrays); `None` when missing.
pub fn get_path<'a>(doc: &'a Document, path: &str) -> Option<&'a Bson> {
    let _ = (doc, path);
    unimplemented!("pipeline helper")
}
