//! The leaf modifiers of operator-style updates (`$set`, `$inc`, `$push`, ...): parsing each
//! operator's argument, and applying it to one field that either exists or is missing.
//!
//! Semantics (MongoDB 7.0):
//! * A modifier applied to an existing value reports a [`Change`]: `NoOp` when the value is
//!   left byte-for-byte identical (so a no-op update writes no oplog entry), `Updated` when it
//!   was replaced, `Deleted` when the field must be removed (`$unset` in a document), and
//!   `Appended` when only new elements were added at the end of an array (`$push` without
//!   `$sort`/`$slice`/`$position`, `$addToSet`), which the oplog records element by element.
//! * For a missing field, [`Modifier::create_value`] says what value to create (`None`: the
//!   modifier does nothing there, e.g. `$unset`, `$pop`, `$pull`).
//! * Numbers follow MongoDB's promotion: int32 overflow becomes int64; an int64 overflow in
//!   `$inc`/`$mul` is an error (BadValue), as with MongoDB's `SafeNum`.
//! * Array element equality (`$addToSet`, `$pullAll`, `$pull`) and `$min`/`$max` use
//!   `pipeline::value` (MongoDB equality: `1 == 1.0`) under the statement's collation; no-op
//!   detection uses binary equality.

use std::cmp::Ordering;

use bson::{Bson, Document, doc};
use pipeline::Matcher;
use pipeline::value::{self, equal, is_number, type_name};
use wire::{MongoError, Result};

use super::UpdateContext;
use super::path::UpdatePath;
use super::values::binary_eq;
use crate::shown::{render, render_doc};

/// What applying a modifier to an existing value did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    NoOp,
    Updated,
    Deleted,
    Appended { old_len: usize },
}

/// `$currentDate`'s type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DateKind {
    Date,
    Timestamp,
}

/// `$bit` operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BitOp {
    And,
    Or,
    Xor,
}

/// `$push`'s `$sort` clause.
#[derive(Debug, Clone, PartialEq)]
pub enum SortSpec {
    /// `$sort: 1 | -1`: the elements themselves.
    Whole { ascending: bool },
    /// `$sort: {field: 1 | -1, ...}`: by fields of document elements.
    Fields(Vec<(String, bool)>),
}

/// `$push`'s argument.
#[derive(Debug, Clone, PartialEq)]
pub struct PushSpec {
    pub each: Vec<Bson>,
    pub slice: Option<i64>,
    pub sort: Option<SortSpec>,
    pub position: Option<i64>,
}

/// `$pull`'s condition.
#[derive(Debug, Clone)]
pub enum PullCond {
    /// A non-document value: elements equal to it.
    Equal(Bson),
    /// A document of field conditions: document elements matching it as a query.
    Object(Box<Matcher>),
    /// An operator document or regex (`{$gte: 5}`): elements satisfying it as a value.
    Wrapped(Box<Matcher>),
}

/// The field name a wrapped `$pull` condition is evaluated under.
const WRAP: &str = "x";

/// One leaf of the update tree.
#[derive(Debug, Clone)]
pub enum Modifier {
    Set(Bson),
    SetOnInsert(Bson),
    Unset,
    Inc(Bson),
    Mul(Bson),
    Min(Bson),
    Max(Bson),
    CurrentDate(DateKind),
    /// Placed at the destination path; moves the value found at `from`.
    Rename {
        from: UpdatePath,
    },
    /// Placed at the source path of a `$rename` to reserve it (conflict detection only).
    RenameSource,
    Push(PushSpec),
    AddToSet(Vec<Bson>),
    Pop {
        first: bool,
    },
    Pull(PullCond),
    PullAll(Vec<Bson>),
    Bit(Vec<(BitOp, Bson)>),
}

/// The operators this module knows, in the order MongoDB lists them.
pub const OPERATORS: &[&str] = &[
    "$set",
    "$setOnInsert",
    "$unset",
    "$inc",
    "$mul",
    "$min",
    "$max",
    "$currentDate",
    "$rename",
    "$push",
    "$addToSet",
    "$pop",
    "$pull",
    "$pullAll",
    "$bit",
];

/// Data a modifier needs while applying: the context and the document's `_id` for messages.
pub struct Env<'a> {
    pub ctx: &'a UpdateContext,
    pub id: String,
}

impl Env<'_> {
    /// MongoDB equality under the statement's collation.
    fn equal(&self, a: &Bson, b: &Bson) -> bool {
        value::equal_in(a, b, self.ctx.collation.as_ref())
    }
}

fn integral(v: &Bson) -> Option<i64> {
    if is_number(v) {
        value::as_i64_exact(v)
    } else {
        None
    }
}

fn one_field(field: &str, v: &Bson) -> String {
    render_doc(&doc! { field: v.clone() })
}

impl Modifier {
    /// Parses one `field: value` entry of operator `op` (one of [`OPERATORS`]).
    pub fn parse(op: &str, field: &str, v: &Bson) -> Result<Modifier> {
        Ok(match op {
            "$set" => Modifier::Set(v.clone()),
            "$setOnInsert" => Modifier::SetOnInsert(v.clone()),
            "$unset" => Modifier::Unset,
            "$inc" | "$mul" => {
                if !is_number(v) {
                    let verb = if op == "$inc" {
                        "increment"
                    } else {
                        "multiply"
                    };
                    return Err(MongoError::type_mismatch(format!(
                        "Cannot {verb} with non-numeric argument: {}",
                        one_field(field, v)
                    )));
                }
                if op == "$inc" {
                    Modifier::Inc(v.clone())
                } else {
                    Modifier::Mul(v.clone())
                }
            }
            "$min" => Modifier::Min(v.clone()),
            "$max" => Modifier::Max(v.clone()),
            "$currentDate" => Modifier::CurrentDate(parse_current_date(v)?),
            "$push" => Modifier::Push(parse_push(v)?),
            "$addToSet" => Modifier::AddToSet(parse_add_to_set(v)?),
            "$pop" => {
                let n = if is_number(v) { value::as_f64(v) } else { None };
                match n {
                    Some(1.0) => Modifier::Pop { first: false },
                    Some(-1.0) => Modifier::Pop { first: true },
                    Some(_) => {
                        return Err(MongoError::failed_to_parse(format!(
                            "$pop expects 1 or -1, found: {}",
                            render(v)
                        )));
                    }
                    None => {
                        return Err(MongoError::failed_to_parse(format!(
                            "Expected a number in: {}",
                            one_field(field, v)
                        )));
                    }
                }
            }
            "$pull" => Modifier::Pull(parse_pull(v)?),
            "$pullAll" => match v {
                Bson::Array(a) => Modifier::PullAll(a.clone()),
                other => {
                    return Err(MongoError::bad_value(format!(
                        "$pullAll requires an array argument but was given a {}",
                        type_name(other)
                    )));
                }
            },
            "$bit" => Modifier::Bit(parse_bit(field, v)?),
            _ => {
                return Err(MongoError::failed_to_parse(format!(
                    "Unknown modifier: {op}. Expected a valid update modifier or pipeline-style update specified as an array"
                )));
            }
        })
    }

    /// The operator this modifier came from, for messages.
    pub fn op_name(&self) -> &'static str {
        match self {
            Modifier::Set(_) => "$set",
            Modifier::SetOnInsert(_) => "$setOnInsert",
            Modifier::Unset => "$unset",
            Modifier::Inc(_) => "$inc",
            Modifier::Mul(_) => "$mul",
            Modifier::Min(_) => "$min",
            Modifier::Max(_) => "$max",
            Modifier::CurrentDate(_) => "$currentDate",
            Modifier::Rename { .. } | Modifier::RenameSource => "$rename",
            Modifier::Push(_) => "$push",
            Modifier::AddToSet(_) => "$addToSet",
            Modifier::Pop { .. } => "$pop",
            Modifier::Pull(_) => "$pull",
            Modifier::PullAll(_) => "$pullAll",
            Modifier::Bit(_) => "$bit",
        }
    }

    /// The value to create where the field is missing; `None` when the modifier leaves a
    /// missing field missing.
    pub fn create_value(&self, env: &Env<'_>) -> Result<Option<Bson>> {
        Ok(match self {
            Modifier::Set(v) | Modifier::Inc(v) | Modifier::Min(v) | Modifier::Max(v) => {
                Some(v.clone())
            }
            Modifier::SetOnInsert(v) => env.ctx.is_upsert_insert.then(|| v.clone()),
            Modifier::Mul(v) => Some(match v {
                Bson::Int32(_) => Bson::Int32(0),
                Bson::Int64(_) => Bson::Int64(0),
                Bson::Decimal128(_) => Bson::Decimal128(value::f64_to_decimal(0.0)),
                _ => Bson::Double(0.0),
            }),
            Modifier::CurrentDate(kind) => Some(now_value(*kind, env.ctx)),
            Modifier::Push(spec) => {
                let mut arr = Vec::new();
                push_into(&mut arr, spec, env);
                Some(Bson::Array(arr))
            }
            Modifier::AddToSet(items) => Some(Bson::Array(items.clone())),
            Modifier::Bit(ops) => Some(apply_bits(&Bson::Int32(0), ops).unwrap_or(Bson::Int32(0))),
            Modifier::Unset
            | Modifier::Pop { .. }
            | Modifier::Pull(_)
            | Modifier::PullAll(_)
            | Modifier::RenameSource
            | Modifier::Rename { .. } => None,
        })
    }

    /// Applies the modifier to the existing value `v` at `path` (dotted, concrete).
    /// `in_array` says whether `v` is an array element (then `$unset` sets it to null).
    pub fn apply_existing(
        &self,
        v: &mut Bson,
        in_array: bool,
        path: &str,
        env: &Env<'_>,
    ) -> Result<Change> {
        match self {
            Modifier::Set(new) => Ok(replace(v, new.clone())),
            Modifier::SetOnInsert(new) => {
                if env.ctx.is_upsert_insert {
                    Ok(replace(v, new.clone()))
                } else {
                    Ok(Change::NoOp)
                }
            }
            Modifier::Unset => {
                if in_array {
                    // An array element is nulled, not removed (indexes of the others hold).
                    Ok(replace(v, Bson::Null))
                } else {
                    Ok(Change::Deleted)
                }
            }
            Modifier::Inc(n) | Modifier::Mul(n) => {
                let is_inc = matches!(self, Modifier::Inc(_));
                let name = if is_inc { "$inc" } else { "$mul" };
                if !is_number(v) {
                    let field = path.rsplit('.').next().unwrap_or(path);
                    return Err(MongoError::type_mismatch(format!(
                        "Cannot apply {name} to a value of non-numeric type. {{{}}} has the field '{field}' of non-numeric type {}",
                        env.id,
                        type_name(v)
                    )));
                }
                let result = if is_inc {
                    value::add_numbers(v, n)
                } else {
                    value::mul_numbers(v, n)
                };
                let integer_operands = is_integer(v) && is_integer(n);
                match result {
                    Some(r) if !integer_operands || is_integer(&r) => Ok(replace(v, r)),
                    _ => Err(MongoError::bad_value(format!(
                        "Failed to apply {name} operations to current value ({}) for document {{{}}}",
                        render(v),
                        env.id
                    ))),
                }
            }
            Modifier::Min(new) | Modifier::Max(new) => {
                let wanted = if matches!(self, Modifier::Min(_)) {
                    Ordering::Less
                } else {
                    Ordering::Greater
                };
                if value::compare_in(new, v, env.ctx.collation.as_ref()) == wanted {
                    Ok(replace(v, new.clone()))
                } else {
                    Ok(Change::NoOp)
                }
            }
            Modifier::CurrentDate(kind) => Ok(replace(v, now_value(*kind, env.ctx))),
            Modifier::Push(spec) => {
                let Bson::Array(arr) = v else {
                    return Err(MongoError::bad_value(format!(
                        "The field '{path}' must be an array but is of type {} in document {{{}}}",
                        type_name(v),
                        env.id
                    )));
                };
                let old_len = arr.len();
                let before = arr.clone();
                let appended_only = old_len > 0
                    && spec.sort.is_none()
                    && spec.position.is_none_or(|p| p > old_len as i64);
                push_into(arr, spec, env);
                if appended_only && arr.len() == old_len + spec.each.len() && !spec.each.is_empty()
                {
                    Ok(Change::Appended { old_len })
                } else if before.len() == arr.len()
                    && before.iter().zip(arr.iter()).all(|(a, b)| binary_eq(a, b))
                {
                    Ok(Change::NoOp)
                } else {
                    Ok(Change::Updated)
                }
            }
            Modifier::AddToSet(items) => {
                let Bson::Array(arr) = v else {
                    let field = path.rsplit('.').next().unwrap_or(path);
                    return Err(MongoError::bad_value(format!(
                        "Cannot apply $addToSet to non-array field. Field named '{field}' has non-array type {}",
                        type_name(v)
                    )));
                };
                let old_len = arr.len();
                for item in items {
                    if !arr.iter().any(|e| env.equal(e, item)) {
                        arr.push(item.clone());
                    }
                }
                if arr.len() == old_len {
                    Ok(Change::NoOp)
                } else {
                    Ok(Change::Appended { old_len })
                }
            }
            Modifier::Pop { first } => {
                let Bson::Array(arr) = v else {
                    return Err(MongoError::type_mismatch(format!(
                        "Path '{path}' contains an element of non-array type '{}'",
                        type_name(v)
                    )));
                };
                if arr.is_empty() {
                    return Ok(Change::NoOp);
                }
                if *first {
                    arr.remove(0);
                } else {
                    arr.pop();
                }
                Ok(Change::Updated)
            }
            Modifier::Pull(cond) => {
                let Bson::Array(arr) = v else {
                    return Err(MongoError::bad_value(
                        "Cannot apply $pull to a non-array value",
                    ));
                };
                let before = arr.len();
                arr.retain(|e| !pull_matches(cond, e, env));
                Ok(if arr.len() == before {
                    Change::NoOp
                } else {
                    Change::Updated
                })
            }
            Modifier::PullAll(items) => {
                let Bson::Array(arr) = v else {
                    return Err(MongoError::bad_value(
                        "Cannot apply $pull to a non-array value",
                    ));
                };
                let before = arr.len();
                arr.retain(|e| !items.iter().any(|i| env.equal(i, e)));
                Ok(if arr.len() == before {
                    Change::NoOp
                } else {
                    Change::Updated
                })
            }
            Modifier::Bit(ops) => match apply_bits(v, ops) {
                Some(r) => Ok(replace(v, r)),
                None => {
                    let field = path.rsplit('.').next().unwrap_or(path);
                    Err(MongoError::bad_value(format!(
                        "Cannot apply $bit to a value of non-integral type.{{{}}} has the field {field} of non-integer type {}",
                        env.id,
                        type_name(v)
                    )))
                }
            },
            // Renames are carried out by the tree (they touch two paths); the source
            // placeholder does nothing by itself.
            Modifier::Rename { .. } | Modifier::RenameSource => Ok(Change::NoOp),
        }
    }
}

fn is_integer(v: &Bson) -> bool {
    matches!(v, Bson::Int32(_) | Bson::Int64(_))
}

/// Replaces `v` with `new` unless they are byte-for-byte equal.
fn replace(v: &mut Bson, new: Bson) -> Change {
    if binary_eq(v, &new) {
        Change::NoOp
    } else {
        *v = new;
        Change::Updated
    }
}

fn now_value(kind: DateKind, ctx: &UpdateContext) -> Bson {
    match kind {
        DateKind::Date => Bson::DateTime(ctx.now),
        DateKind::Timestamp => Bson::Timestamp(ctx.now_ts),
    }
}

fn parse_current_date(v: &Bson) -> Result<DateKind> {
    match v {
        Bson::Boolean(_) => Ok(DateKind::Date),
        Bson::Document(d) if d.len() == 1 && d.contains_key("$type") => match d.get("$type") {
            Some(Bson::String(s)) if s == "date" => Ok(DateKind::Date),
            Some(Bson::String(s)) if s == "timestamp" => Ok(DateKind::Timestamp),
            _ => Err(MongoError::bad_value(
                "The '$type' string field is required to be 'date' or 'timestamp': {$currentDate: {field : {$type: 'date'}}}",
            )),
        },
        Bson::Document(d) => Err(MongoError::bad_value(format!(
            "Unrecognized $currentDate option: {}",
            render_doc(d)
        ))),
        other => Err(MongoError::bad_value(format!(
            "{} is not valid type for $currentDate. Please use a boolean ('true') or a $type expression ({{$type: 'timestamp/date'}}).",
            render(other)
        ))),
    }
}

fn parse_push(v: &Bson) -> Result<PushSpec> {
    let Bson::Document(d) = v else {
        return Ok(PushSpec {
            each: vec![v.clone()],
            slice: None,
            sort: None,
            position: None,
        });
    };
    if !d.contains_key("$each") {
        return Ok(PushSpec {
            each: vec![v.clone()],
            slice: None,
            sort: None,
            position: None,
        });
    }
    let mut spec = PushSpec {
        each: Vec::new(),
        slice: None,
        sort: None,
        position: None,
    };
    for (k, m) in d {
        match k.as_str() {
            "$each" => match m {
                Bson::Array(a) => spec.each = a.clone(),
                other => {
                    return Err(MongoError::bad_value(format!(
                        "The argument to $each in $push must be an array but it was of type: {}",
                        type_name(other)
                    )));
                }
            },
            "$slice" => {
                spec.slice = Some(integral(m).ok_or_else(|| {
                    MongoError::bad_value(format!(
                        "The value for $slice must be an integer value but was given type: {}",
                        type_name(m)
                    ))
                })?)
            }
            "$position" => {
                spec.position = Some(integral(m).ok_or_else(|| {
                    MongoError::bad_value(format!(
                        "The value for $position must be an integer value, not of type: {}",
                        type_name(m)
                    ))
                })?)
            }
            "$sort" => spec.sort = Some(parse_sort(m)?),
            other => {
                return Err(MongoError::bad_value(format!(
                    "Unrecognized clause in $push: {other}"
                )));
            }
        }
    }
    Ok(spec)
}

fn parse_sort(m: &Bson) -> Result<SortSpec> {
    let invalid = || {
        MongoError::bad_value(
            "The $sort is invalid: use 1/-1 to sort the whole element, or {field:1/-1} to sort embedded fields",
        )
    };
    let direction = |v: &Bson| match integral(v) {
        Some(1) => Ok(true),
        Some(-1) => Ok(false),
        _ => Err(invalid()),
    };
    match m {
        Bson::Document(d) => {
            if d.is_empty() {
                return Err(MongoError::bad_value(
                    "The $sort pattern is empty when it should be a set of fields.",
                ));
            }
            let mut fields = Vec::new();
            for (k, v) in d {
                if k.is_empty() || k.starts_with('.') || k.ends_with('.') || k.contains("..") {
                    return Err(MongoError::bad_value(
                        "The $sort field is a dotted field but has an empty part",
                    ));
                }
                fields.push((k.clone(), direction(v)?));
            }
            Ok(SortSpec::Fields(fields))
        }
        other if is_number(other) => Ok(SortSpec::Whole {
            ascending: direction(other)?,
        }),
        _ => Err(invalid()),
    }
}

/// Inserts `spec.each` at its position, then sorts, then slices (MongoDB's order).
fn push_into(arr: &mut Vec<Bson>, spec: &PushSpec, env: &Env<'_>) {
    let len = arr.len() as i64;
    let at = match spec.position {
        None => len,
        Some(p) if p >= 0 => p.min(len),
        Some(p) => (len + p).max(0),
    };
    let at = usize::try_from(at).unwrap_or(arr.len()).min(arr.len());
    let tail = arr.split_off(at);
    arr.extend(spec.each.iter().cloned());
    arr.extend(tail);
    if let Some(sort) = &spec.sort {
        sort_elements(arr, sort, env);
    }
    if let Some(n) = spec.slice {
        let keep = usize::try_from(n.unsigned_abs()).unwrap_or(usize::MAX);
        if arr.len() > keep {
            if n >= 0 {
                arr.truncate(keep);
            } else {
                arr.drain(..arr.len() - keep);
            }
        }
    }
}

/// `$push`'s `$sort`, under the statement's collation.
fn sort_elements(arr: &mut [Bson], sort: &SortSpec, env: &Env<'_>) {
    let compare = |a: &Bson, b: &Bson| value::compare_in(a, b, env.ctx.collation.as_ref());
    match sort {
        SortSpec::Whole { ascending } => arr.sort_by(|a, b| {
            let o = compare(a, b);
            if *ascending { o } else { o.reverse() }
        }),
        SortSpec::Fields(fields) => {
            let key = |e: &Bson, f: &str| -> Bson {
                match e {
                    Bson::Document(d) => value::get_path(d, f).cloned().unwrap_or(Bson::Null),
                    _ => Bson::Null,
                }
            };
            arr.sort_by(|a, b| {
                for (f, asc) in fields {
                    let o = compare(&key(a, f), &key(b, f));
                    let o = if *asc { o } else { o.reverse() };
                    if o != Ordering::Equal {
                        return o;
                    }
                }
                Ordering::Equal
            });
        }
    }
}

fn parse_add_to_set(v: &Bson) -> Result<Vec<Bson>> {
    let items = match v {
        Bson::Document(d) if d.keys().next().is_some_and(|k| k == "$each") => {
            if d.len() > 1 {
                return Err(MongoError::bad_value(format!(
                    "Found unexpected fields after $each in $addToSet: {}",
                    render_doc(d)
                )));
            }
            match d.get("$each") {
                Some(Bson::Array(a)) => a.clone(),
                other => {
                    return Err(MongoError::type_mismatch(format!(
                        "The argument to $each in $addToSet must be an array but it was of type {}",
                        other.map(type_name).unwrap_or("missing")
                    )));
                }
            }
        }
        other => vec![other.clone()],
    };
    // Duplicates among the values to add are added once.
    let mut unique: Vec<Bson> = Vec::with_capacity(items.len());
    for item in items {
        if !unique.iter().any(|u| equal(u, &item)) {
            unique.push(item);
        }
    }
    Ok(unique)
}

/// Match-expression operators that take a path (`{$gte: 5}` is a value condition); any other
/// `$`-keyword (`$and`, `$or`, ...) starts a query over document elements.
fn is_path_accepting_keyword(k: &str) -> bool {
    !matches!(
        k,
        "$and"
            | "$or"
            | "$nor"
            | "$expr"
            | "$where"
            | "$text"
            | "$comment"
            | "$jsonSchema"
            | "$alwaysTrue"
            | "$alwaysFalse"
            | "$sampleRate"
    ) && k.starts_with('$')
}

fn parse_pull(v: &Bson) -> Result<PullCond> {
    match v {
        Bson::Document(d) => {
            let wrapped = d
                .keys()
                .next()
                .is_some_and(|k| is_path_accepting_keyword(k));
            if wrapped {
                Ok(PullCond::Wrapped(Box::new(Matcher::parse(
                    &doc! { WRAP: v.clone() },
                )?)))
            } else {
                Ok(PullCond::Object(Box::new(Matcher::parse(d)?)))
            }
        }
        Bson::RegularExpression(_) => Ok(PullCond::Wrapped(Box::new(Matcher::parse(
            &doc! { WRAP: v.clone() },
        )?))),
        other => Ok(PullCond::Equal(other.clone())),
    }
}

fn pull_matches(cond: &PullCond, e: &Bson, env: &Env<'_>) -> bool {
    let under = pipeline::expr::Env {
        collation: env.ctx.collation.clone(),
        ..pipeline::expr::Env::default()
    };
    let matches = |m: &Matcher, d: &Document| m.try_matches_in(d, &under).unwrap_or(false);
    match cond {
        PullCond::Equal(v) => env.equal(v, e),
        PullCond::Object(m) => match e {
            Bson::Document(d) => matches(m, d),
            _ => false,
        },
        PullCond::Wrapped(m) => matches(m, &doc! { WRAP: e.clone() }),
    }
}

fn parse_bit(field: &str, v: &Bson) -> Result<Vec<(BitOp, Bson)>> {
    let Bson::Document(d) = v else {
        return Err(MongoError::bad_value(format!(
            "The $bit modifier is not compatible with a {}. You must pass in an embedded document: {{$bit: {{field: {{and/or/xor: #}}}}}}",
            type_name(v)
        )));
    };
    let _ = field;
    let mut ops = Vec::new();
    for (k, n) in d {
        let op = match k.as_str() {
            "and" => BitOp::And,
            "or" => BitOp::Or,
            "xor" => BitOp::Xor,
            other => {
                return Err(MongoError::bad_value(format!(
                    "The $bit modifier only supports 'and', 'or', and 'xor', not '{other}' which is an unknown operator: {}",
                    one_field(other, n)
                )));
            }
        };
        if !is_integer(n) {
            return Err(MongoError::bad_value(format!(
                "The $bit modifier field must be an Integer(32/64 bit); a '{}' is not supported here: {}",
                type_name(n),
                one_field(k, n)
            )));
        }
        ops.push((op, n.clone()));
    }
    if ops.is_empty() {
        return Err(MongoError::bad_value(
            "You must pass in at least one bitwise operation. The format is: {$bit: {field: {and/or/xor: #}}}",
        ));
    }
    Ok(ops)
}

/// Applies bitwise ops to an integer; `None` when `v` is not an int32/int64.
fn apply_bits(v: &Bson, ops: &[(BitOp, Bson)]) -> Option<Bson> {
    let mut cur = v.clone();
    for (op, n) in ops {
        let f = |a: i64, b: i64| match op {
            BitOp::And => a & b,
            BitOp::Or => a | b,
            BitOp::Xor => a ^ b,
        };
        cur = match (&cur, n) {
            (Bson::Int32(a), Bson::Int32(b)) => {
                Bson::Int32(i32::try_from(f(i64::from(*a), i64::from(*b))).ok()?)
            }
            (Bson::Int32(a), Bson::Int64(b)) => Bson::Int64(f(i64::from(*a), *b)),
            (Bson::Int64(a), Bson::Int32(b)) => Bson::Int64(f(*a, i64::from(*b))),
            (Bson::Int64(a), Bson::Int64(b)) => Bson::Int64(f(*a, *b)),
            _ => return None,
        };
    }
    Some(cur)
}

/// `{field: value}` as a one-field document (for array-filter and positional matching).
pub fn wrap(field: &str, v: &Bson) -> Document {
    doc! { field: v.clone() }
}
