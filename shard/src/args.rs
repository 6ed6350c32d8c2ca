//! Command arguments read as MongoDB reads them: a flag may be any number (non-zero is
//! true), a count may be a whole double. Pure functions of one value; nothing else here.

use bson::Bson;

/// A flag: a boolean, or a number (non-zero is true).
pub fn as_bool(v: &Bson) -> Option<bool> {
    match v {
        Bson::Boolean(b) => Some(*b),
        Bson::Int32(i) => Some(*i != 0),
        Bson::Int64(i) => Some(*i != 0),
        Bson::Double(d) => Some(*d != 0.0),
        _ => None,
    }
}

/// A whole number: an integer, or a double without a fraction.
pub fn as_i64(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(d) if d.fract() == 0.0 && d.is_finite() => Some(*d as i64),
        _ => None,
    }
}
