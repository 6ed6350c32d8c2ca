//! Bitwise operators on evaluated arguments: `$bitAnd`, `$bitOr`, `$bitXor` (any number of
//! operands) and `$bitNot` (one), on ints and longs.
//!
//! Invariants: a null or missing operand makes `null`; the result is an int when every operand
//! is, else a long; any other operand type fails with 14 (`TypeMismatch`), as in MongoDB.

use bson::Bson;

use super::{Op, missing_name};
use crate::Result;

/// `$bitAnd`, `$bitOr` or `$bitXor` over the operands (none: the operation's identity).
pub(super) fn fold(op: Op, a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let (name, identity): (&str, i64) = match op {
        Op::BitAnd => ("$bitAnd", -1),
        Op::BitOr => ("$bitOr", 0),
        _ => ("$bitXor", 0),
    };
    let mut acc = identity;
    let mut long = false;
    for v in a {
        let Some((n, is_long)) = integer(name, v)? else {
            return Ok(Some(Bson::Null));
        };
        long |= is_long;
        acc = match op {
            Op::BitAnd => acc & n,
            Op::BitOr => acc | n,
            _ => acc ^ n,
        };
    }
    Ok(Some(if long {
        Bson::Int64(acc)
    } else {
        // Every operand was an int: so is every bit of the result.
        Bson::Int32(acc as i32)
    }))
}

/// `$bitNot`: the complement, of the operand's own width.
pub(super) fn not(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let v = a.first().cloned().flatten();
    Ok(Some(match integer("$bitNot", &v)? {
        None => Bson::Null,
        Some((n, true)) => Bson::Int64(!n),
        Some((n, false)) => Bson::Int32(!(n as i32)),
    }))
}

/// An int or long operand, and whether it is a long; `None` for null or missing.
fn integer(name: &str, v: &Option<Bson>) -> Result<Option<(i64, bool)>> {
    match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => Ok(None),
        Some(Bson::Int32(n)) => Ok(Some((i64::from(*n), false))),
        Some(Bson::Int64(n)) => Ok(Some((*n, true))),
        _ => Err(wire::MongoError::new(
            wire::ErrorCode::TYPE_MISMATCH,
            format!(
                "{name} only supports int and long operands, not {}",
                missing_name(v)
            ),
        )),
    }
}
