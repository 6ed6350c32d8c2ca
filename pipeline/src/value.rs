//! BSON values as MongoDB compares them: canonical type order, numbers by value across
//! int32/int64/double/decimal, documents and arrays element-wise; dotted-path lookup;
//! truthiness; and numeric arithmetic with MongoDB's promotion rules.
//!
//! Invariants:
//! * [`compare`] is a total order (reflexive, antisymmetric, transitive) over every `Bson`
//!   value, matching `BSONElement::woCompare` without collation: first by [`canonical_type`],
//!   then by value within the type. NaN equals NaN and sorts below every other number; `-0.0`
//!   equals `0.0`; `1 == 1.0 == NumberLong(1)`. [`compare_in`] is the same order with strings
//!   compared by a collation (also a total order: the collator's is).
//! * Int64 vs double comparisons are exact (no rounding through `f64`). Decimal128 comparisons
//!   are exact against integers and decimals, and against doubles rounded to 34 digits
//!   ([`decimal`]); decimal `+ - *` are exact where the coefficients fit in 128 bits, other
//!   decimal arithmetic goes through `f64` (bson 3.1 has no decimal arithmetic).
//! * [`add_numbers`]/[`mul_numbers`]/[`sub_numbers`] never panic: int32 overflow promotes to
//!   int64, int64 overflow to double; any double makes a double, any decimal a decimal.
//!
//! Type ranks, codes and names are in [`types`], reading and converting numbers in [`number`]
//! (leaves, which collations use too); both are re-exported here.

use std::cmp::Ordering;

use bson::{Bson, Document};

use crate::collation::Collation;

pub mod decimal;
pub mod hash;
pub mod number;
pub mod types;

pub use number::{
    as_f64, as_i64_exact, decimal_to_f64, f64_to_decimal, f64_to_i64_exact, is_number,
};
pub use types::{canonical_type, type_code, type_code_of_name, type_name, type_name_of_code};

/// MongoDB's truthiness (`$cond`, `$and`, `$expr`): false, null, undefined and numeric zero are
/// false; everything else (including NaN, empty strings and empty arrays) is true.
pub fn truthy(v: &Bson) -> bool {
    match v {
        Bson::Boolean(b) => *b,
        Bson::Null | Bson::Undefined => false,
        Bson::Int32(i) => *i != 0,
        Bson::Int64(i) => *i != 0,
        Bson::Double(d) => *d != 0.0,
        Bson::Decimal128(d) => decimal_to_f64(d) != 0.0,
        _ => true,
    }
}

/// MongoDB's total order over BSON values (`BSONElement::woCompare` semantics, no collation).
pub fn compare(a: &Bson, b: &Bson) -> Ordering {
    compare_in(a, b, None)
}

/// [`compare`] under a collation: strings (and symbols), wherever they are inside the values,
/// compare by the collation; field names and everything else as without one.
pub fn compare_in(a: &Bson, b: &Bson, collation: Option<&Collation>) -> Ordering {
    let (ta, tb) = (canonical_type(a), canonical_type(b));
    if ta != tb {
        return ta.cmp(&tb);
    }
    match (a, b) {
        (Bson::String(x) | Bson::Symbol(x), Bson::String(y) | Bson::Symbol(y)) => match collation {
            Some(c) => c.compare_str(x, y),
            None => x.as_bytes().cmp(y.as_bytes()),
        },
        (Bson::Document(x), Bson::Document(y)) => compare_documents_in(x, y, collation),
        (Bson::Array(x), Bson::Array(y)) => compare_arrays_in(x, y, collation),
        (Bson::Binary(x), Bson::Binary(y)) => x
            .bytes
            .len()
            .cmp(&y.bytes.len())
            .then_with(|| u8::from(x.subtype).cmp(&u8::from(y.subtype)))
            .then_with(|| x.bytes.cmp(&y.bytes)),
        (Bson::ObjectId(x), Bson::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (Bson::Boolean(x), Bson::Boolean(y)) => x.cmp(y),
        (Bson::DateTime(x), Bson::DateTime(y)) => x.timestamp_millis().cmp(&y.timestamp_millis()),
        (Bson::Timestamp(x), Bson::Timestamp(y)) => {
            (x.time, x.increment).cmp(&(y.time, y.increment))
        }
        (Bson::RegularExpression(x), Bson::RegularExpression(y)) => x
            .pattern
            .as_str()
            .cmp(y.pattern.as_str())
            .then_with(|| x.options.as_str().cmp(y.options.as_str())),
        (Bson::JavaScriptCode(x), Bson::JavaScriptCode(y)) => x.cmp(y),
        (Bson::JavaScriptCodeWithScope(x), Bson::JavaScriptCodeWithScope(y)) => x
            .code
            .cmp(&y.code)
            .then_with(|| compare_documents(&x.scope, &y.scope)),
        // DBPointer's fields are private in bson 3.1; its debug form is deterministic.
        (Bson::DbPointer(x), Bson::DbPointer(y)) => format!("{x:?}").cmp(&format!("{y:?}")),
        _ if ta == 10 => compare_numbers(a, b),
        // MinKey, MaxKey, Null, Undefined: one value per type.
        _ => Ordering::Equal,
    }
}

/// Equality in MongoDB's sense (`1 == 1.0 == NumberLong(1)`).
pub fn equal(a: &Bson, b: &Bson) -> bool {
    compare(a, b) == Ordering::Equal
}

/// [`equal`] under a collation.
pub fn equal_in(a: &Bson, b: &Bson, collation: Option<&Collation>) -> bool {
    compare_in(a, b, collation) == Ordering::Equal
}

/// Documents compare element by element: canonical type, then field name, then value; a
/// prefix sorts first.
pub fn compare_documents(a: &Document, b: &Document) -> Ordering {
    compare_documents_in(a, b, None)
}

fn compare_documents_in(a: &Document, b: &Document, collation: Option<&Collation>) -> Ordering {
    let mut ia = a.iter();
    let mut ib = b.iter();
    loop {
        match (ia.next(), ib.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some((ka, va)), Some((kb, vb))) => {
                let ord = canonical_type(va)
                    .cmp(&canonical_type(vb))
                    .then_with(|| ka.as_bytes().cmp(kb.as_bytes()))
                    .then_with(|| compare_in(va, vb, collation));
                if ord != Ordering::Equal {
                    return ord;
                }
            }
        }
    }
}

/// Arrays compare element-wise (type first, then value); a prefix sorts first.
pub fn compare_arrays(a: &[Bson], b: &[Bson]) -> Ordering {
    compare_arrays_in(a, b, None)
}

fn compare_arrays_in(a: &[Bson], b: &[Bson], collation: Option<&Collation>) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let ord = canonical_type(x)
            .cmp(&canonical_type(y))
            .then_with(|| compare_in(x, y, collation));
        if ord != Ordering::Equal {
            return ord;
        }
    }
    a.len().cmp(&b.len())
}

/// Numeric comparison across the four numeric types. Non-numbers compare equal (callers only
/// pass numbers).
fn compare_numbers(a: &Bson, b: &Bson) -> Ordering {
    match (a, b) {
        (Bson::Decimal128(_), _) | (_, Bson::Decimal128(_)) => {
            match (decimal::Dec::of_bson(a), decimal::Dec::of_bson(b)) {
                (Some(x), Some(y)) => decimal::compare(x, y),
                _ => Ordering::Equal,
            }
        }
        (Bson::Int32(x), Bson::Int32(y)) => x.cmp(y),
        (Bson::Int32(_) | Bson::Int64(_), Bson::Int32(_) | Bson::Int64(_)) => {
            int_of(a).cmp(&int_of(b))
        }
        (Bson::Int32(_) | Bson::Int64(_), _) => {
            compare_i64_f64(int_of(a), as_f64(b).unwrap_or(f64::NAN))
        }
        (_, Bson::Int32(_) | Bson::Int64(_)) => {
            compare_i64_f64(int_of(b), as_f64(a).unwrap_or(f64::NAN)).reverse()
        }
        _ => compare_f64(as_f64(a).unwrap_or(f64::NAN), as_f64(b).unwrap_or(f64::NAN)),
    }
}

fn int_of(v: &Bson) -> i64 {
    match v {
        Bson::Int32(i) => i64::from(*i),
        Bson::Int64(i) => *i,
        _ => 0,
    }
}

/// Doubles in MongoDB order: NaN == NaN < -inf < ... < inf; -0 == 0.
pub fn compare_f64(x: f64, y: f64) -> Ordering {
    match (x.is_nan(), y.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
    }
}

/// Exact comparison of an int64 with a double.
fn compare_i64_f64(l: i64, d: f64) -> Ordering {
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if d.is_nan() {
        return Ordering::Greater;
    }
    if d >= TWO_63 {
        return Ordering::Less;
    }
    if d < -TWO_63 {
        return Ordering::Greater;
    }
    let t = d.trunc();
    // t is integral and within [-2^63, 2^63): the cast is exact.
    let ti = t as i64;
    match l.cmp(&ti) {
        Ordering::Equal => compare_f64(0.0, d - t),
        o => o,
    }
}

/// The most components a dotted path may have, as MongoDB's `FieldPath` (its
/// `BSONDepth::getMaxAllowableDepth()`): a longer path names nothing any document can hold, and
/// walking it costs one step (often one stack frame) per component.
pub const MAX_PATH_COMPONENTS: usize = 200;

/// `Overflow` (15, `FieldPath is too long`) for a path of more than [`MAX_PATH_COMPONENTS`]
/// components. Every parser of a client's dotted path calls this before splitting it.
pub fn check_path_length(path: &str) -> wire::Result<()> {
    if path.bytes().filter(|b| *b == b'.').count() >= MAX_PATH_COMPONENTS {
        return Err(wire::MongoError::new(
            wire::ErrorCode::OVERFLOW,
            "FieldPath is too long",
        ));
    }
    Ok(())
}

/// The value at a dotted path without array traversal (`a.0.b` indexes arrays); `None` when missing.
pub fn get_path<'a>(doc: &'a Document, path: &str) -> Option<&'a Bson> {
    let mut parts = path.split('.');
    let first = parts.next()?;
    let mut cur = doc.get(first)?;
    for part in parts {
        cur = child(cur, part)?;
    }
    Some(cur)
}

/// One step of a dotted path without fan-out: a document's field or an array's element.
pub fn child<'a>(v: &'a Bson, part: &str) -> Option<&'a Bson> {
    match v {
        Bson::Document(d) => d.get(part),
        Bson::Array(a) => array_index(part).and_then(|i| a.get(i)),
        _ => None,
    }
}

/// A path component as an array index: plain decimal digits, no sign, no leading zero (unless
/// it is `0` itself), as MongoDB's positional path components.
pub fn array_index(part: &str) -> Option<usize> {
    if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if part.len() > 1 && part.starts_with('0') {
        return None;
    }
    part.parse().ok()
}

/// Every value a dotted path reaches with MongoDB's implicit array traversal (the semantics of
/// `$match` paths and `$a.b` expressions before leaf expansion): arrays met before the last
/// component fan out over their document elements (and are indexed by numeric components).
/// The leaf values themselves are returned as stored (an array leaf is one value).
pub fn path_values<'a>(doc: &'a Document, path: &str) -> Vec<&'a Bson> {
    let parts: Vec<&str> = path.split('.').collect();
    let mut out = Vec::new();
    if let Some((first, rest)) = parts.split_first()
        && let Some(v) = doc.get(*first)
    {
        collect_path(v, rest, &mut out);
    }
    out
}

fn collect_path<'a>(v: &'a Bson, rest: &[&str], out: &mut Vec<&'a Bson>) {
    let Some((part, tail)) = rest.split_first() else {
        out.push(v);
        return;
    };
    match v {
        Bson::Document(d) => {
            if let Some(c) = d.get(*part) {
                collect_path(c, tail, out);
            }
        }
        Bson::Array(arr) => {
            if let Some(i) = array_index(part) {
                if let Some(c) = arr.get(i) {
                    collect_path(c, tail, out);
                }
            } else {
                for e in arr {
                    if let Bson::Document(d) = e
                        && let Some(c) = d.get(*part)
                    {
                        collect_path(c, tail, out);
                    }
                }
            }
        }
        _ => {}
    }
}

/// Sets `path` (dotted, through documents only) to `value`, creating intermediate documents.
/// Returns false (and changes nothing) when a non-document is in the way.
pub fn set_path(doc: &mut Document, path: &str, value: Bson) -> bool {
    match path.split_once('.') {
        None => {
            doc.insert(path, value);
            true
        }
        Some((head, tail)) => {
            if !doc.contains_key(head) {
                doc.insert(head, Document::new());
            }
            match doc.get_mut(head) {
                Some(Bson::Document(sub)) => set_path(sub, tail, value),
                _ => false,
            }
        }
    }
}

/// Removes `path` (dotted, through documents only); returns the removed value.
pub fn remove_path(doc: &mut Document, path: &str) -> Option<Bson> {
    match path.split_once('.') {
        None => doc.remove(path),
        Some((head, tail)) => match doc.get_mut(head) {
            Some(Bson::Document(sub)) => remove_path(sub, tail),
            _ => None,
        },
    }
}

/// The deepest nesting of documents and arrays in `doc` exceeds `limit` (top level = 1).
/// Recursion stops at `limit`, so this is safe on arbitrarily deep input.
pub fn nesting_exceeds(doc: &Document, limit: usize) -> bool {
    limit == 0 || doc.values().any(|v| value_nesting_exceeds(v, limit - 1))
}

/// [`nesting_exceeds`] for a value: a scalar has depth 0, `[]` and `{}` depth 1.
pub fn value_nesting_exceeds(v: &Bson, limit: usize) -> bool {
    match v {
        Bson::Document(d) => nesting_exceeds(d, limit),
        Bson::Array(a) => limit == 0 || a.iter().any(|e| value_nesting_exceeds(e, limit - 1)),
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Arithmetic
// ---------------------------------------------------------------------------------------------

/// The widest numeric type among two operands, MongoDB's promotion order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Width {
    Int,
    Long,
    Double,
    Decimal,
}

fn width(v: &Bson) -> Option<Width> {
    match v {
        Bson::Int32(_) => Some(Width::Int),
        Bson::Int64(_) => Some(Width::Long),
        Bson::Double(_) => Some(Width::Double),
        Bson::Decimal128(_) => Some(Width::Decimal),
        _ => None,
    }
}

fn arith(
    a: &Bson,
    b: &Bson,
    int_op: fn(i64, i64) -> Option<i64>,
    f_op: fn(f64, f64) -> f64,
    dec_op: fn(decimal::Dec, decimal::Dec) -> Option<decimal::Dec>,
) -> Option<Bson> {
    let w = width(a)?.max(width(b)?);
    Some(match w {
        Width::Int | Width::Long => {
            let (x, y) = (int_of(a), int_of(b));
            match int_op(x, y) {
                Some(r) if w == Width::Int => match i32::try_from(r) {
                    Ok(small) => Bson::Int32(small),
                    Err(_) => Bson::Int64(r),
                },
                Some(r) => Bson::Int64(r),
                None => Bson::Double(f_op(x as f64, y as f64)),
            }
        }
        Width::Double => Bson::Double(f_op(as_f64(a)?, as_f64(b)?)),
        Width::Decimal => {
            let exact = dec_op(decimal::Dec::of_bson(a)?, decimal::Dec::of_bson(b)?)
                .and_then(decimal::Dec::to_decimal);
            Bson::Decimal128(match exact {
                Some(d) => d,
                None => f64_to_decimal(f_op(as_f64(a)?, as_f64(b)?)),
            })
        }
    })
}

/// `a + b` with MongoDB's promotion (int32 → int64 → double on overflow); `None` unless both
/// are numbers.
pub fn add_numbers(a: &Bson, b: &Bson) -> Option<Bson> {
    arith(a, b, i64::checked_add, |x, y| x + y, decimal::add)
}

/// `a - b`, promoted like [`add_numbers`].
pub fn sub_numbers(a: &Bson, b: &Bson) -> Option<Bson> {
    arith(a, b, i64::checked_sub, |x, y| x - y, decimal::sub)
}

/// `a * b`, promoted like [`add_numbers`].
pub fn mul_numbers(a: &Bson, b: &Bson) -> Option<Bson> {
    arith(a, b, i64::checked_mul, |x, y| x * y, decimal::mul)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, oid::ObjectId};

    fn ordered(values: &[Bson]) {
        for (i, a) in values.iter().enumerate() {
            for (j, b) in values.iter().enumerate() {
                assert_eq!(compare(a, b), i.cmp(&j), "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn canonical_type_order_puts_types_in_mongodb_order() {
        ordered(&[
            Bson::MinKey,
            Bson::Undefined,
            Bson::Null,
            Bson::Int32(1),
            Bson::String("a".into()),
            Bson::Document(doc! {}),
            Bson::Array(vec![]),
            Bson::Binary(bson::Binary {
                subtype: bson::spec::BinarySubtype::Generic,
                bytes: vec![],
            }),
            Bson::ObjectId(ObjectId::from_bytes([0; 12])),
            Bson::Boolean(false),
            Bson::DateTime(bson::DateTime::from_millis(0)),
            Bson::Timestamp(bson::Timestamp {
                time: 0,
                increment: 0,
            }),
            Bson::JavaScriptCode("x".into()),
            Bson::MaxKey,
        ]);
    }

    #[test]
    fn numbers_compare_by_value_across_types() {
        ordered(&[
            Bson::Double(f64::NAN),
            Bson::Double(f64::NEG_INFINITY),
            Bson::Int64(i64::MIN),
            Bson::Int32(-1),
            Bson::Double(-0.5),
            Bson::Int32(0),
            Bson::Double(0.5),
            Bson::Int64(1 << 53),
            Bson::Int64((1 << 53) + 1),
            Bson::Int64(i64::MAX),
            Bson::Double(9_223_372_036_854_775_808.0),
            Bson::Double(f64::INFINITY),
        ]);
        assert!(equal(&Bson::Int32(1), &Bson::Double(1.0)));
        assert!(equal(&Bson::Int64(1), &Bson::Double(1.0)));
        assert!(equal(&Bson::Double(-0.0), &Bson::Int32(0)));
        assert!(equal(&Bson::Double(f64::NAN), &Bson::Double(f64::NAN)));
        assert!(equal(
            &Bson::Decimal128("1.5".parse().unwrap()),
            &Bson::Double(1.5)
        ));
        assert!(equal(&Bson::String("a".into()), &Bson::Symbol("a".into())));
    }

    #[test]
    fn documents_compare_field_by_field_type_then_name_then_value() {
        ordered(&[
            Bson::Document(doc! {}),
            Bson::Document(doc! {"a": 1}),
            Bson::Document(doc! {"a": 1, "b": 1}),
            Bson::Document(doc! {"a": 2}),
            Bson::Document(doc! {"b": 0}),
            Bson::Document(doc! {"a": "x"}),
        ]);
        ordered(&[
            Bson::Array(vec![]),
            Bson::Array(vec![Bson::Int32(1)]),
            Bson::Array(vec![Bson::Int32(1), Bson::Int32(0)]),
            Bson::Array(vec![Bson::Int32(2)]),
            Bson::Array(vec![Bson::String("a".into())]),
        ]);
    }

    #[test]
    fn get_path_indexes_arrays_without_fan_out() {
        let d = doc! {"a": {"b": [10, {"c": 5}]}, "x": [{"y": 1}]};
        assert_eq!(get_path(&d, "a.b.0"), Some(&Bson::Int32(10)));
        assert_eq!(get_path(&d, "a.b.1.c"), Some(&Bson::Int32(5)));
        assert_eq!(get_path(&d, "a.b.2"), None);
        assert_eq!(get_path(&d, "x.y"), None);
        assert_eq!(get_path(&d, "nope"), None);
        assert_eq!(
            path_values(&d, "x.y")
                .into_iter()
                .cloned()
                .collect::<Vec<_>>(),
            vec![Bson::Int32(1)]
        );
    }

    #[test]
    fn arithmetic_promotes_on_overflow() {
        assert_eq!(
            add_numbers(&Bson::Int32(1), &Bson::Int32(2)),
            Some(Bson::Int32(3))
        );
        assert_eq!(
            add_numbers(&Bson::Int32(i32::MAX), &Bson::Int32(1)),
            Some(Bson::Int64(i64::from(i32::MAX) + 1))
        );
        assert_eq!(
            add_numbers(&Bson::Int64(i64::MAX), &Bson::Int32(1)),
            Some(Bson::Double(i64::MAX as f64 + 1.0))
        );
        assert_eq!(
            mul_numbers(&Bson::Int32(3), &Bson::Double(0.5)),
            Some(Bson::Double(1.5))
        );
        assert_eq!(
            sub_numbers(&Bson::Int64(5), &Bson::Int32(7)),
            Some(Bson::Int64(-2))
        );
        assert_eq!(
            add_numbers(&Bson::Int32(1), &Bson::String("x".into())),
            None
        );
        let dec = add_numbers(&Bson::Decimal128("1.5".parse().unwrap()), &Bson::Int32(1));
        assert!(matches!(dec, Some(Bson::Decimal128(_))));
        assert!(equal(&dec.unwrap(), &Bson::Double(2.5)));
    }

    #[test]
    fn nesting_depth_is_measured_without_deep_recursion() {
        let mut d = doc! {"x": 1};
        for _ in 0..9 {
            d = doc! {"a": d};
        }
        // ten documents deep
        assert!(!nesting_exceeds(&d, 10));
        assert!(nesting_exceeds(&d, 9));
        let arr = doc! {"a": [[1]]};
        assert!(!nesting_exceeds(&arr, 3));
        assert!(nesting_exceeds(&arr, 2));
    }

    #[test]
    fn truthiness_follows_mongodb() {
        for v in [
            Bson::Boolean(false),
            Bson::Null,
            Bson::Undefined,
            Bson::Int32(0),
            Bson::Int64(0),
            Bson::Double(0.0),
        ] {
            assert!(!truthy(&v), "{v:?}");
        }
        for v in [
            Bson::Boolean(true),
            Bson::String(String::new()),
            Bson::Array(vec![]),
            Bson::Double(f64::NAN),
            Bson::Int32(-1),
        ] {
            assert!(truthy(&v), "{v:?}");
        }
    }
}
