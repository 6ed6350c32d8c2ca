//! Comparison and negation on evaluated arguments: `$eq`, `$ne`, `$gt`, `$gte`, `$lt`, `$lte`,
//! `$cmp` and `$not`. (`$and`, `$or`, `$cond`, `$switch` and `$ifNull` evaluate their arguments
//! lazily: they are the evaluator's own.)
//!
//! Invariants: values compare in MongoDB's total order under the environment's collation
//! ([`Env::compare`]); a missing operand compares as `undefined`, below `null`, so
//! `{$eq: ["$nope", null]}` is false.

use std::cmp::Ordering;

use bson::Bson;

use super::{Env, Op, arg};
use crate::Result;
use crate::value::truthy;

/// `$eq`, `$ne`, `$gt`, `$gte`, `$lt` and `$lte`.
pub(super) fn comparison(op: Op, a: &[Option<Bson>], env: &Env) -> Result<Option<Bson>> {
    let o = cmp_missing(&arg(a, 0), &arg(a, 1), env);
    Ok(Some(Bson::Boolean(match op {
        Op::Eq => o == Ordering::Equal,
        Op::Ne => o != Ordering::Equal,
        Op::Gt => o == Ordering::Greater,
        Op::Gte => o != Ordering::Less,
        Op::Lt => o == Ordering::Less,
        _ => o != Ordering::Greater,
    })))
}

/// `$cmp`: -1, 0 or 1.
pub(super) fn cmp(a: &[Option<Bson>], env: &Env) -> Result<Option<Bson>> {
    Ok(Some(Bson::Int32(
        match cmp_missing(&arg(a, 0), &arg(a, 1), env) {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        },
    )))
}

/// `$not`: the negation of the argument's truthiness.
pub(super) fn not(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    Ok(Some(Bson::Boolean(!truthy(
        &arg(a, 0).unwrap_or(Bson::Null),
    ))))
}

fn cmp_missing(a: &Option<Bson>, b: &Option<Bson>, env: &Env) -> std::cmp::Ordering {
    env.compare(
        a.as_ref().unwrap_or(&Bson::Undefined),
        b.as_ref().unwrap_or(&Bson::Undefined),
    )
}
