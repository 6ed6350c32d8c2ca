//! Aggregation expressions (`$add`, `$concat`, `$cond`, field paths, `$$ROOT`, ...).
//!
//! An expression is parsed once into a tree ([`Expr`]) and evaluated many times against a
//! document ([`Expr::evaluate`]) or with an explicit environment ([`Expr::evaluate_in`]).
//!
//! Semantics and invariants:
//! * Evaluation yields `Option<Bson>`: `None` is MongoDB's *missing* value, distinct from
//!   `null` (a `$project`ed missing value is omitted; `{$eq: ["$nope", null]}` is false, since
//!   missing compares like `undefined`, below `null`).
//! * `$a.b` traverses arrays as MongoDB does: over an array of documents it yields the array of
//!   each element's `b` (missing ones skipped, nested arrays kept nested); numeric components
//!   are field names, never indexes.
//! * Operator arguments: an array operand is the argument list, anything else one argument.
//!   Fixed-arity operators check the count at parse time (16020).
//! * Variables are lexically scoped (`$let`, `$map`, `$filter`, `$reduce`); an undefined
//!   `$$name` is rejected at parse time (17276). `$$NOW` comes from the [`Env`], never a clock
//!   (a command's is read once, when its [`Env::from_command`] is made, so it is one value
//!   throughout the command in a process); a command's `let` variables are evaluated once into
//!   the [`Env`].
//!   `$rand` is the one operator whose value is not a function of its inputs.
//! * Unknown operators are InvalidPipelineOperator (168) "Unrecognized expression '$foo'".
//!   Runtime type errors carry MongoDB's location codes (e.g. 16554 for `$add` on a string).
//!
//! Layout: this file holds the tree ([`Expr`] and its nodes), the evaluator and the dispatch of
//! the operators whose arguments are evaluated first (`Op`, one `match`: a static call per
//! operator, no dynamic dispatch); [`Env`] is in `env.rs`, parsing in `parse.rs`, and each
//! family of operators in a file of its own: `arith`, `compare`, `strings`, `arrays`, `sets`,
//! `objects`, `dates`, `convert`, `size`. The operators that evaluate their arguments lazily
//! (`$and`, `$or`, `$cond`, `$switch`, `$ifNull`, `$let`) are the evaluator's own; those that
//! bind variables or take named arguments (`$map`, `$convert`, ...) are their family's `eval_*`
//! functions, which the evaluator hands the unevaluated arguments.

use std::collections::BTreeSet;

use bson::{Bson, Document};

use crate::value::{self, truthy, type_name};
use crate::{MongoError, Result};

mod arith;
mod arrays;
mod bits;
mod compare;
mod convert;
mod dates;
mod env;
mod objects;
mod parse;
mod sets;
mod size;
mod strings;
mod trig;

pub(crate) use dates::{civil_from_days, days_from_civil};
pub use env::Env;
pub(crate) use parse::check_var_name;

/// A parsed aggregation expression.
#[derive(Debug, Clone)]
pub struct Expr {
    node: Node,
}

/// Expressions nested deeper than this are rejected before parsing (evaluation recurses).
pub const MAX_EXPRESSION_DEPTH: usize = 200;

/// The value `$$DESCEND`, `$$PRUNE` and `$$KEEP` evaluate to, for `$redact`.
pub const REDACT_DESCEND: &str = "descend";
pub const REDACT_PRUNE: &str = "prune";
pub const REDACT_KEEP: &str = "keep";

#[derive(Debug, Clone)]
enum Node {
    Literal(Bson),
    /// `$rand`: a double in [0, 1), drawn at each evaluation.
    Rand,
    /// `$a.b`: a path from `$$CURRENT`.
    Field(Vec<String>),
    /// `$$name.a.b`.
    Var(Var, Vec<String>),
    Object(Vec<(String, Node)>),
    Array(Vec<Node>),
    Call(Op, Vec<Node>),
    And(Vec<Node>),
    Or(Vec<Node>),
    IfNull(Vec<Node>),
    Cond(Box<(Node, Node, Node)>),
    Switch {
        branches: Vec<(Node, Node)>,
        default: Option<Box<Node>>,
    },
    Let {
        vars: Vec<(String, Node)>,
        body: Box<Node>,
    },
    Map {
        input: Box<Node>,
        name: String,
        body: Box<Node>,
    },
    Filter {
        input: Box<Node>,
        name: String,
        cond: Box<Node>,
        limit: Option<Box<Node>>,
    },
    Reduce {
        input: Box<Node>,
        initial: Box<Node>,
        body: Box<Node>,
    },
    Convert {
        input: Box<Node>,
        to: Box<Node>,
        on_error: Option<Box<Node>>,
        on_null: Option<Box<Node>>,
    },
    Trim {
        kind: TrimKind,
        input: Box<Node>,
        chars: Option<Box<Node>>,
    },
    GetField {
        field: String,
        input: Box<Node>,
    },
    DateToString {
        format: Option<Box<Node>>,
        date: Box<Node>,
        timezone: Option<Box<Node>>,
        on_null: Option<Box<Node>>,
    },
    Regex {
        kind: RegexOp,
        input: Box<Node>,
        regex: Box<Node>,
        options: Option<Box<Node>>,
    },
    SetField {
        field: String,
        input: Box<Node>,
        /// `None` for `$unsetField`.
        value: Option<Box<Node>>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Var {
    Root,
    Current,
    Remove,
    Now,
    Descend,
    Prune,
    Keep,
    User(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RegexOp {
    Match,
    Find,
    FindAll,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TrimKind {
    Both,
    Left,
    Right,
}

/// Operators whose arguments are all evaluated before the operator runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Add,
    Subtract,
    Multiply,
    Divide,
    Mod,
    Abs,
    Ceil,
    Floor,
    Round,
    Trunc,
    Sqrt,
    Pow,
    Exp,
    Ln,
    Log10,
    Eq,
    Ne,
    Gt,
    Gte,
    Lt,
    Lte,
    Cmp,
    Not,
    Concat,
    Substr,
    SubstrBytes,
    SubstrCP,
    ToLower,
    ToUpper,
    StrLenBytes,
    StrLenCP,
    Split,
    IndexOfBytes,
    IndexOfCP,
    StrCaseCmp,
    Size,
    ArrayElemAt,
    First,
    Last,
    In,
    IsArray,
    ConcatArrays,
    Slice,
    ReverseArray,
    Range,
    IndexOfArray,
    Type,
    IsNumber,
    ToString,
    ToInt,
    ToLong,
    ToDouble,
    ToDecimal,
    ToBool,
    MergeObjects,
    ObjectToArray,
    ArrayToObject,
    Sum,
    Avg,
    Min,
    Max,
    SetUnion,
    SetIntersection,
    SetDifference,
    SetEquals,
    SetIsSubset,
    AnyElementTrue,
    AllElementsTrue,
    ToDate,
    ToObjectId,
    Year,
    Month,
    DayOfMonth,
    Hour,
    Minute,
    Second,
    Millisecond,
    DayOfWeek,
    DayOfYear,
    Week,
    BsonSize,
    BinarySize,
    Log,
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Atan2,
    Sinh,
    Cosh,
    Tanh,
    Asinh,
    Acosh,
    Atanh,
    DegreesToRadians,
    RadiansToDegrees,
    BitAnd,
    BitOr,
    BitXor,
    BitNot,
    TsSecond,
    TsIncrement,
}

impl Expr {
    /// Parses an expression with no user variables in scope.
    pub fn parse(v: &Bson) -> Result<Expr> {
        Expr::parse_with_vars(v, &[])
    }

    /// Parses an expression where the given user variables (e.g. a command's `let`) are defined.
    pub fn parse_with_vars(v: &Bson, vars: &[String]) -> Result<Expr> {
        if value::value_nesting_exceeds(v, MAX_EXPRESSION_DEPTH) {
            return Err(MongoError::bad_value(format!(
                "expression exceeds the maximum nesting depth of {MAX_EXPRESSION_DEPTH}"
            )));
        }
        Ok(Expr {
            node: parse::parse(v, vars)?,
        })
    }

    /// A constant expression.
    pub fn literal(v: Bson) -> Expr {
        Expr {
            node: Node::Literal(v),
        }
    }

    /// Evaluates against `doc` (as `$$ROOT` and `$$CURRENT`); `Ok(None)` is missing.
    pub fn evaluate(&self, doc: &Document) -> Result<Option<Bson>> {
        self.evaluate_in(doc, &Env::default())
    }

    /// Evaluates with an explicit environment (`$$NOW`, user variables).
    pub fn evaluate_in(&self, doc: &Document, env: &Env) -> Result<Option<Bson>> {
        self.evaluate_at(doc, doc, env)
    }

    /// Evaluates with `$$CURRENT` (and so plain field paths) bound to `current`, a part of
    /// `root` (as `$redact` does at each level).
    pub fn evaluate_at(
        &self,
        root: &Document,
        current: &Document,
        env: &Env,
    ) -> Result<Option<Bson>> {
        let mut cx = Cx {
            root,
            current,
            env,
            vars: Vec::new(),
        };
        eval(&self.node, &mut cx)
    }

    /// The constant value, when the expression is a literal.
    pub fn as_literal(&self) -> Option<&Bson> {
        match &self.node {
            Node::Literal(v) => Some(v),
            _ => None,
        }
    }

    /// The dotted path, when the expression is a plain field path (`$a.b`).
    pub fn as_field_path(&self) -> Option<String> {
        match &self.node {
            Node::Field(p) => Some(p.join(".")),
            _ => None,
        }
    }

    /// Adds the document paths the expression reads to `out`; false when it may read the whole
    /// document (`$$ROOT`, `$$CURRENT`).
    pub fn referenced_paths(&self, out: &mut BTreeSet<String>) -> bool {
        refs(&self.node, out)
    }
}

fn refs(node: &Node, out: &mut BTreeSet<String>) -> bool {
    let all = |nodes: &mut dyn Iterator<Item = &Node>, out: &mut BTreeSet<String>| {
        let mut ok = true;
        for n in nodes {
            ok &= refs(n, out);
        }
        ok
    };
    match node {
        Node::Literal(_) | Node::Rand => true,
        Node::Field(p) => {
            out.insert(p.join("."));
            true
        }
        Node::Var(Var::Root | Var::Current, p) => {
            if p.is_empty() {
                false
            } else {
                out.insert(p.join("."));
                true
            }
        }
        Node::Var(..) => true,
        Node::Object(fields) => all(&mut fields.iter().map(|(_, n)| n), out),
        Node::Array(v) | Node::Call(_, v) | Node::And(v) | Node::Or(v) | Node::IfNull(v) => {
            all(&mut v.iter(), out)
        }
        Node::Cond(b) => all(&mut [&b.0, &b.1, &b.2].into_iter(), out),
        Node::Switch { branches, default } => {
            all(&mut branches.iter().flat_map(|(a, b)| [a, b]), out)
                & default.as_ref().is_none_or(|d| refs(d, out))
        }
        Node::Let { vars, body } => all(&mut vars.iter().map(|(_, n)| n), out) & refs(body, out),
        Node::Map { input, body, .. } => refs(input, out) & refs(body, out),
        Node::Filter {
            input, cond, limit, ..
        } => refs(input, out) & refs(cond, out) & limit.as_ref().is_none_or(|l| refs(l, out)),
        Node::Reduce {
            input,
            initial,
            body,
        } => refs(input, out) & refs(initial, out) & refs(body, out),
        Node::Convert {
            input,
            to,
            on_error,
            on_null,
        } => {
            refs(input, out)
                & refs(to, out)
                & on_error.as_ref().is_none_or(|n| refs(n, out))
                & on_null.as_ref().is_none_or(|n| refs(n, out))
        }
        Node::Trim { input, chars, .. } => {
            refs(input, out) & chars.as_ref().is_none_or(|n| refs(n, out))
        }
        Node::GetField { input, .. } => refs(input, out),
        Node::DateToString {
            format,
            date,
            timezone,
            on_null,
        } => {
            refs(date, out)
                & format.as_ref().is_none_or(|n| refs(n, out))
                & timezone.as_ref().is_none_or(|n| refs(n, out))
                & on_null.as_ref().is_none_or(|n| refs(n, out))
        }
        Node::Regex {
            input,
            regex,
            options,
            ..
        } => refs(input, out) & refs(regex, out) & options.as_ref().is_none_or(|n| refs(n, out)),
        Node::SetField { input, value, .. } => {
            refs(input, out) & value.as_ref().is_none_or(|n| refs(n, out))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------------------------

struct Cx<'a> {
    root: &'a Document,
    current: &'a Document,
    env: &'a Env,
    vars: Vec<(String, Option<Bson>)>,
}

impl Cx<'_> {
    fn lookup(&self, name: &str) -> Option<Bson> {
        if let Some((_, v)) = self.vars.iter().rev().find(|(n, _)| n == name) {
            return v.clone();
        }
        self.env
            .vars
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }
}

/// `$a.b.c` from a document, MongoDB style (arrays of documents fan out into arrays).
fn field_of_doc(doc: &Document, path: &[String]) -> Option<Bson> {
    let (first, rest) = path.split_first()?;
    let v = doc.get(first)?;
    descend(v, rest)
}

fn descend(v: &Bson, rest: &[String]) -> Option<Bson> {
    if rest.is_empty() {
        return Some(v.clone());
    }
    match v {
        Bson::Document(d) => field_of_doc(d, rest),
        Bson::Array(a) => Some(Bson::Array(descend_array(a, rest))),
        _ => None,
    }
}

fn descend_array(a: &[Bson], rest: &[String]) -> Vec<Bson> {
    let mut out = Vec::new();
    for e in a {
        match e {
            Bson::Document(d) => {
                if let Some(v) = field_of_doc(d, rest) {
                    out.push(v);
                }
            }
            Bson::Array(inner) => out.push(Bson::Array(descend_array(inner, rest))),
            _ => {}
        }
    }
    out
}

/// MongoDB's "field path on a value" used by `$$var.a.b`.
fn path_of_value(v: Option<Bson>, path: &[String]) -> Option<Bson> {
    if path.is_empty() {
        return v;
    }
    descend(&v?, path)
}

/// `$$name.a.b`.
fn variable(var: &Var, path: &[String], cx: &Cx<'_>) -> Result<Option<Bson>> {
    let v = match var {
        Var::Root | Var::Current => {
            let base = if *var == Var::Root {
                cx.root
            } else {
                cx.current
            };
            if let Some((first, rest)) = path.split_first() {
                return Ok(base.get(first).and_then(|v| descend(v, rest)));
            }
            Some(Bson::Document(base.clone()))
        }
        Var::Remove => None,
        Var::Now => match cx.env.now {
            Some(t) => Some(Bson::DateTime(t)),
            None => {
                return Err(MongoError::internal(
                    "$$NOW is not available in this context",
                ));
            }
        },
        Var::Descend => Some(Bson::String(REDACT_DESCEND.into())),
        Var::Prune => Some(Bson::String(REDACT_PRUNE.into())),
        Var::Keep => Some(Bson::String(REDACT_KEEP.into())),
        Var::User(n) => cx.lookup(n),
    };
    Ok(path_of_value(v, path))
}

fn eval(node: &Node, cx: &mut Cx<'_>) -> Result<Option<Bson>> {
    Ok(match node {
        Node::Literal(v) => Some(v.clone()),
        Node::Rand => Some(Bson::Double(rand::random::<f64>())),
        Node::Field(p) => field_of_doc(cx.current, p),
        Node::Var(var, path) => variable(var, path, cx)?,
        Node::Object(fields) => {
            let mut d = Document::new();
            for (k, n) in fields {
                if let Some(v) = eval(n, cx)? {
                    d.insert(k.clone(), v);
                }
            }
            Some(bounded(Bson::Document(d))?)
        }
        Node::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for n in items {
                // Missing array elements become null, as in MongoDB.
                out.push(eval(n, cx)?.unwrap_or(Bson::Null));
            }
            Some(bounded(Bson::Array(out))?)
        }
        Node::And(items) => {
            for n in items {
                if !truthy(&eval(n, cx)?.unwrap_or(Bson::Null)) {
                    return Ok(Some(Bson::Boolean(false)));
                }
            }
            Some(Bson::Boolean(true))
        }
        Node::Or(items) => {
            for n in items {
                if truthy(&eval(n, cx)?.unwrap_or(Bson::Null)) {
                    return Ok(Some(Bson::Boolean(true)));
                }
            }
            Some(Bson::Boolean(false))
        }
        Node::IfNull(items) => {
            let (last, init) = match items.split_last() {
                Some(x) => x,
                None => return Ok(None),
            };
            for n in init {
                let v = eval(n, cx)?;
                if !is_nullish(&v) {
                    return Ok(v);
                }
            }
            eval(last, cx)?
        }
        Node::Cond(b) => {
            if truthy(&eval(&b.0, cx)?.unwrap_or(Bson::Null)) {
                eval(&b.1, cx)?
            } else {
                eval(&b.2, cx)?
            }
        }
        Node::Switch { branches, default } => {
            for (case, then) in branches {
                if truthy(&eval(case, cx)?.unwrap_or(Bson::Null)) {
                    return eval(then, cx);
                }
            }
            match default {
                Some(d) => eval(d, cx)?,
                None => {
                    return Err(err(
                        40066,
                        "$switch could not find a matching branch for an input, and no default was specified.",
                    ));
                }
            }
        }
        Node::Let { vars, body } => {
            let mut values = Vec::with_capacity(vars.len());
            for (name, n) in vars {
                values.push((name.clone(), eval(n, cx)?));
            }
            let before = cx.vars.len();
            cx.vars.extend(values);
            let r = eval(body, cx);
            cx.vars.truncate(before);
            r?
        }
        Node::Map { input, name, body } => arrays::eval_map(input, name, body, cx)?,
        Node::Filter {
            input,
            name,
            cond,
            limit,
        } => arrays::eval_filter(input, name, cond, limit.as_deref(), cx)?,
        Node::Reduce {
            input,
            initial,
            body,
        } => arrays::eval_reduce(input, initial, body, cx)?,
        Node::Convert {
            input,
            to,
            on_error,
            on_null,
        } => convert::eval_convert(input, to, on_error.as_deref(), on_null.as_deref(), cx)?,
        Node::Trim { kind, input, chars } => {
            strings::eval_trim(*kind, input, chars.as_deref(), cx)?
        }
        Node::DateToString {
            format,
            date,
            timezone,
            on_null,
        } => dates::eval_date_to_string(
            format.as_deref(),
            date,
            timezone.as_deref(),
            on_null.as_deref(),
            cx,
        )?,
        Node::Regex {
            kind,
            input,
            regex,
            options,
        } => strings::eval_regex(*kind, input, regex, options.as_deref(), cx)?,
        Node::GetField { field, input } => match eval(input, cx)? {
            None | Some(Bson::Null) | Some(Bson::Undefined) => None,
            Some(Bson::Document(d)) => d.get(field).cloned(),
            Some(_) => None,
        },
        Node::SetField {
            field,
            input,
            value,
        } => objects::eval_set_field(field, input, value.as_deref(), cx)?,
        Node::Call(op, args) => {
            let mut vals = Vec::with_capacity(args.len());
            for a in args {
                vals.push(eval(a, cx)?);
            }
            call(*op, vals, cx.env)?
        }
    })
}

/// An operator on its evaluated arguments (`None`: missing), by family.
fn call(op: Op, a: Vec<Option<Bson>>, env: &Env) -> Result<Option<Bson>> {
    match op {
        Op::Add => arith::add(&a),
        Op::Subtract => arith::subtract(&a),
        Op::Multiply => arith::multiply(&a),
        Op::Divide | Op::Mod => arith::divide_or_mod(op, &a),
        Op::Abs => arith::abs(&a),
        Op::Ceil | Op::Floor => arith::ceil_or_floor(op, &a),
        Op::Round | Op::Trunc => arith::round_or_trunc(op, &a),
        Op::Sqrt | Op::Exp | Op::Ln | Op::Log10 => arith::sqrt_exp_or_log(op, &a),
        Op::Pow => arith::pow(&a),
        Op::Log => arith::log(&a),
        Op::Sin
        | Op::Cos
        | Op::Tan
        | Op::Asin
        | Op::Acos
        | Op::Atan
        | Op::Sinh
        | Op::Cosh
        | Op::Tanh
        | Op::Asinh
        | Op::Acosh
        | Op::Atanh
        | Op::DegreesToRadians
        | Op::RadiansToDegrees => trig::unary(op, &a),
        Op::Atan2 => trig::atan2(&a),
        Op::BitAnd | Op::BitOr | Op::BitXor => bits::fold(op, &a),
        Op::BitNot => bits::not(&a),
        Op::TsSecond | Op::TsIncrement => dates::timestamp_part(op, &a),
        Op::Sum | Op::Avg | Op::Min | Op::Max => arith::sum_avg_min_max(op, a, env),
        Op::Eq | Op::Ne | Op::Gt | Op::Gte | Op::Lt | Op::Lte => compare::comparison(op, &a, env),
        Op::Cmp => compare::cmp(&a, env),
        Op::Not => compare::not(&a),
        Op::Concat => strings::concat(&a),
        Op::Substr | Op::SubstrBytes => strings::substr_bytes(&a),
        Op::SubstrCP => strings::substr_cp(&a),
        Op::ToLower => strings::to_lower(&a),
        Op::ToUpper => strings::to_upper(&a),
        Op::StrLenBytes => strings::str_len_bytes(&a),
        Op::StrLenCP => strings::str_len_cp(&a),
        Op::Split => strings::split(&a),
        Op::IndexOfBytes | Op::IndexOfCP => strings::index_of(op, &a),
        Op::StrCaseCmp => strings::strcasecmp(&a),
        Op::Size => arrays::size(&a),
        Op::ArrayElemAt => arrays::array_elem_at(&a),
        Op::First | Op::Last => arrays::first_or_last(op, &a),
        Op::In => arrays::in_array(&a, env),
        Op::IsArray => arrays::is_array(&a),
        Op::ConcatArrays => arrays::concat_arrays(a),
        Op::Slice => arrays::slice(&a),
        Op::ReverseArray => arrays::reverse_array(&a),
        Op::Range => arrays::range(&a),
        Op::IndexOfArray => arrays::index_of_array(&a, env),
        Op::SetUnion | Op::SetIntersection => sets::union_or_intersection(op, a, env),
        Op::SetDifference => sets::difference(a, env),
        Op::SetEquals | Op::SetIsSubset => sets::equals_or_subset(op, a, env),
        Op::AnyElementTrue | Op::AllElementsTrue => sets::any_or_all_elements_true(op, &a),
        Op::MergeObjects => objects::merge_objects(a),
        Op::ObjectToArray => objects::object_to_array(&a),
        Op::ArrayToObject => objects::array_to_object(&a),
        Op::Type => convert::type_of(&a),
        Op::IsNumber => convert::is_number(&a),
        Op::ToString | Op::ToInt | Op::ToLong | Op::ToDouble | Op::ToDecimal | Op::ToBool => {
            convert::to_type(op, &a)
        }
        Op::ToDate | Op::ToObjectId => convert::to_date_or_object_id(op, &a),
        Op::Year
        | Op::Month
        | Op::DayOfMonth
        | Op::Hour
        | Op::Minute
        | Op::Second
        | Op::Millisecond
        | Op::DayOfWeek
        | Op::DayOfYear
        | Op::Week => dates::date_part(op, &a),
        Op::BsonSize => size::bson_size(arg(&a, 0)),
        Op::BinarySize => size::binary_size(arg(&a, 0)),
    }
}

// ---------------------------------------------------------------------------------------------
// Shared by the evaluator and the operator families
// ---------------------------------------------------------------------------------------------

fn err(code: i32, msg: impl Into<String>) -> MongoError {
    MongoError::with_code(code, msg)
}

/// The largest value an expression may make: a document's limit (`BSONObjMaxUserSize`).
const MAX_VALUE_BYTES: usize = 16 * 1024 * 1024;
/// How deep a value an expression makes may nest: what a command may (`maxBSONDepth`).
const MAX_VALUE_DEPTH: usize = 200;

/// A value that an expression builds out of others (a literal document or array, `$map`,
/// `$concatArrays`, `$mergeObjects`, `$reduce`'s accumulator) is bounded before it is kept:
/// nested at most 200 deep, at most 16 MiB. Without this, `$reduce` doubling an array or
/// nesting `$$value` in a document grows without bound. Checking costs no more than the
/// copies that built the value.
fn bounded(v: Bson) -> Result<Bson> {
    if !matches!(v, Bson::Document(_) | Bson::Array(_)) {
        return Ok(v);
    }
    if value::value_nesting_exceeds(&v, MAX_VALUE_DEPTH) {
        return Err(MongoError::new(
            wire::ErrorCode::OVERFLOW,
            format!("BSONObj exceeded maximum nested object depth: {MAX_VALUE_DEPTH}"),
        ));
    }
    let size = crate::changestream::split::value_size(&v);
    if size > MAX_VALUE_BYTES {
        return Err(too_large(size));
    }
    Ok(v)
}

fn too_large(size: usize) -> MongoError {
    MongoError::new(
        wire::ErrorCode::BSON_OBJECT_TOO_LARGE,
        format!(
            "BSONObj size: {size} ({size:#X}) is invalid. Size must be between 0 and {MAX_VALUE_BYTES}(16MB)"
        ),
    )
}

fn missing_name(v: &Option<Bson>) -> &'static str {
    match v {
        None => "missing",
        Some(b) => type_name(b),
    }
}

fn is_nullish(v: &Option<Bson>) -> bool {
    matches!(v, None | Some(Bson::Null) | Some(Bson::Undefined))
}

/// The `i`th argument (`None`: missing, or not passed).
fn arg(a: &[Option<Bson>], i: usize) -> Option<Bson> {
    a.get(i).cloned().flatten()
}

fn int_result(n: i64) -> Bson {
    match i32::try_from(n) {
        Ok(i) => Bson::Int32(i),
        Err(_) => Bson::Int64(n),
    }
}

fn int_arg(op: &str, v: &Option<Bson>, code: i32) -> Result<i64> {
    match v {
        Some(b) if value::is_number(b) => value::as_i64_exact(b)
            .ok_or_else(|| err(code, format!("{op}: argument must be an integral value"))),
        _ => Err(err(
            code,
            format!(
                "{op}: argument must be a numeric value, found {}",
                missing_name(v)
            ),
        )),
    }
}

fn array_arg(op: &str, v: Option<Bson>, code: i32, what: &str) -> Result<Vec<Bson>> {
    match v {
        Some(Bson::Array(a)) => Ok(a),
        other => Err(err(code, format!("{op}{what}{}", missing_name(&other)))),
    }
}

/// `$function` and `$accumulator` run JavaScript, and there is no JavaScript engine: the answer
/// of a 7.0 server without one.
pub fn no_javascript() -> MongoError {
    MongoError::with_code(
        31264,
        "Cannot run server-side javascript without the javascript engine enabled",
    )
}

#[cfg(test)]
mod tests;
