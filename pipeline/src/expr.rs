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

use std::collections::BTreeSet;

use bson::{Bson, Document};
use wire::ErrorCode;

use crate::collation::Collation;
use crate::value::{self, truthy, type_name};

mod size;
use crate::{MongoError, Result};

/// A parsed aggregation expression.
#[derive(Debug, Clone)]
pub struct Expr {
    node: Node,
}

/// Expressions nested deeper than this are rejected before parsing (evaluation recurses).
pub const MAX_EXPRESSION_DEPTH: usize = 200;

/// Values bound outside the expression: `$$NOW` and user variables (the command's `let`).
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub now: Option<bson::DateTime>,
    pub vars: Vec<(String, Bson)>,
    /// The other collections' documents `$lookup`, `$unionWith` and `$graphLookup` read.
    pub foreign: Option<std::sync::Arc<crate::agg::lookup::Foreign>>,
    /// The command's collation (`None`: simple), which every comparison of strings uses.
    pub collation: Option<Collation>,
    /// The command's `allowDiskUse`: blocking stages may pass their memory limit
    /// ([`crate::agg::MAX_BLOCKING_BYTES`]).
    pub allow_disk_use: bool,
}

impl Env {
    /// The environment of a command with `let`: each variable's expression evaluated once (it
    /// sees `$$NOW`, not documents or the other variables), as MongoDB does before the command
    /// runs. Names follow `$let`'s rules (16866–16868), and a missing value is `$$REMOVE`-like: the variable is not defined.
    pub fn with_let(now: Option<bson::DateTime>, spec: Option<&Document>) -> Result<Env> {
        let mut env = Env {
            now,
            ..Env::default()
        };
        let Some(spec) = spec else {
            return Ok(env);
        };
        let empty = Document::new();
        for (name, value) in spec {
            check_var_name(name)?;
            let parsed = Expr::parse(value)?;
            if let Some(v) = parsed.evaluate_in(&empty, &env)? {
                env.vars.push((name.clone(), v));
            }
        }
        Ok(env)
    }

    /// The environment of a command's `let` field (a document of variables; absent: none)
    /// and `collation` (absent: simple, which a collection's default may then replace), with
    /// `$$NOW` the time it is made.
    pub fn from_command(cmd: &Document) -> Result<Env> {
        let collation = cmd
            .get("collation")
            .map(Collation::parse)
            .transpose()?
            .flatten();
        let now = Some(bson::DateTime::now());
        let env = match cmd.get("let") {
            None => Env::with_let(now, None),
            Some(Bson::Document(spec)) => Env::with_let(now, Some(spec)),
            Some(other) => Err(MongoError::type_mismatch(format!(
                "BSON field 'let' is the wrong type '{}', expected type 'object'",
                type_name(other)
            ))),
        };
        let allow_disk_use = matches!(cmd.get("allowDiskUse"), Some(Bson::Boolean(true)));
        env.map(|env| Env {
            collation,
            allow_disk_use,
            ..env
        })
    }

    /// The environment under `doc`'s `collation` (a command's, or one write statement's), or
    /// the collection's `default` when `doc` has none; an explicit `{locale: "simple"}` is
    /// the simple collation whatever the default.
    pub fn with_collation_of(&self, doc: &Document, default: Option<&Collation>) -> Result<Env> {
        let collation = match doc.get("collation") {
            Some(v) => Collation::parse(v)?,
            None => default.cloned(),
        };
        Ok(Env {
            collation,
            ..self.clone()
        })
    }

    /// MongoDB's order under this environment's collation.
    pub fn compare(&self, a: &Bson, b: &Bson) -> std::cmp::Ordering {
        value::compare_in(a, b, self.collation.as_ref())
    }

    /// MongoDB's equality under this environment's collation.
    pub fn equal(&self, a: &Bson, b: &Bson) -> bool {
        self.compare(a, b).is_eq()
    }

    /// The user variables' names, to parse expressions that use them.
    pub fn names(&self) -> Vec<String> {
        self.vars.iter().map(|(n, _)| n.clone()).collect()
    }
}

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
}

/// (name, op, min args, max args); `usize::MAX` = variadic.
const OPS: &[(&str, Op, usize, usize)] = &[
    ("add", Op::Add, 0, usize::MAX),
    ("subtract", Op::Subtract, 2, 2),
    ("multiply", Op::Multiply, 0, usize::MAX),
    ("divide", Op::Divide, 2, 2),
    ("mod", Op::Mod, 2, 2),
    ("abs", Op::Abs, 1, 1),
    ("ceil", Op::Ceil, 1, 1),
    ("floor", Op::Floor, 1, 1),
    ("round", Op::Round, 1, 2),
    ("trunc", Op::Trunc, 1, 2),
    ("sqrt", Op::Sqrt, 1, 1),
    ("pow", Op::Pow, 2, 2),
    ("exp", Op::Exp, 1, 1),
    ("ln", Op::Ln, 1, 1),
    ("log10", Op::Log10, 1, 1),
    ("eq", Op::Eq, 2, 2),
    ("ne", Op::Ne, 2, 2),
    ("gt", Op::Gt, 2, 2),
    ("gte", Op::Gte, 2, 2),
    ("lt", Op::Lt, 2, 2),
    ("lte", Op::Lte, 2, 2),
    ("cmp", Op::Cmp, 2, 2),
    ("not", Op::Not, 1, 1),
    ("concat", Op::Concat, 0, usize::MAX),
    ("substr", Op::Substr, 3, 3),
    ("substrBytes", Op::SubstrBytes, 3, 3),
    ("substrCP", Op::SubstrCP, 3, 3),
    ("toLower", Op::ToLower, 1, 1),
    ("toUpper", Op::ToUpper, 1, 1),
    ("strLenBytes", Op::StrLenBytes, 1, 1),
    ("strLenCP", Op::StrLenCP, 1, 1),
    ("split", Op::Split, 2, 2),
    ("indexOfBytes", Op::IndexOfBytes, 2, 4),
    ("indexOfCP", Op::IndexOfCP, 2, 4),
    ("strcasecmp", Op::StrCaseCmp, 2, 2),
    ("size", Op::Size, 1, 1),
    ("arrayElemAt", Op::ArrayElemAt, 2, 2),
    ("first", Op::First, 1, 1),
    ("last", Op::Last, 1, 1),
    ("in", Op::In, 2, 2),
    ("isArray", Op::IsArray, 1, 1),
    ("concatArrays", Op::ConcatArrays, 0, usize::MAX),
    ("slice", Op::Slice, 2, 3),
    ("reverseArray", Op::ReverseArray, 1, 1),
    ("range", Op::Range, 2, 3),
    ("indexOfArray", Op::IndexOfArray, 2, 4),
    ("type", Op::Type, 1, 1),
    ("isNumber", Op::IsNumber, 1, 1),
    ("toString", Op::ToString, 1, 1),
    ("toInt", Op::ToInt, 1, 1),
    ("toLong", Op::ToLong, 1, 1),
    ("toDouble", Op::ToDouble, 1, 1),
    ("toDecimal", Op::ToDecimal, 1, 1),
    ("toBool", Op::ToBool, 1, 1),
    ("mergeObjects", Op::MergeObjects, 0, usize::MAX),
    ("objectToArray", Op::ObjectToArray, 1, 1),
    ("arrayToObject", Op::ArrayToObject, 1, 1),
    ("sum", Op::Sum, 0, usize::MAX),
    ("avg", Op::Avg, 0, usize::MAX),
    ("min", Op::Min, 0, usize::MAX),
    ("max", Op::Max, 0, usize::MAX),
    ("setUnion", Op::SetUnion, 0, usize::MAX),
    ("setIntersection", Op::SetIntersection, 0, usize::MAX),
    ("setDifference", Op::SetDifference, 2, 2),
    ("setEquals", Op::SetEquals, 2, usize::MAX),
    ("setIsSubset", Op::SetIsSubset, 2, 2),
    ("anyElementTrue", Op::AnyElementTrue, 1, 1),
    ("allElementsTrue", Op::AllElementsTrue, 1, 1),
    ("toDate", Op::ToDate, 1, 1),
    ("toObjectId", Op::ToObjectId, 1, 1),
    ("year", Op::Year, 1, 1),
    ("month", Op::Month, 1, 1),
    ("dayOfMonth", Op::DayOfMonth, 1, 1),
    ("hour", Op::Hour, 1, 1),
    ("minute", Op::Minute, 1, 1),
    ("second", Op::Second, 1, 1),
    ("millisecond", Op::Millisecond, 1, 1),
    ("dayOfWeek", Op::DayOfWeek, 1, 1),
    ("dayOfYear", Op::DayOfYear, 1, 1),
    ("week", Op::Week, 1, 1),
    ("bsonSize", Op::BsonSize, 1, 1),
    ("binarySize", Op::BinarySize, 1, 1),
];

fn err(code: i32, msg: impl Into<String>) -> MongoError {
    MongoError::with_code(code, msg)
}

/// The largest value an expression may make: a document's limit (`BSONObjMaxUserSize`).
const MAX_VALUE_BYTES: usize = 16 * 1024 * 1024;
/// How deep a value an expression makes may nest: what a command may (`maxBSONDepth`).
const MAX_VALUE_DEPTH: usize = 200;

/// A string an expression makes may not pass 16 MiB (MongoDB's 16493), checked before the
/// bytes are allocated.
fn check_string_growth(len: usize, more: usize) -> Result<()> {
    if len.saturating_add(more) > MAX_VALUE_BYTES {
        return Err(err(16493, "Tried to create string longer than 16MB"));
    }
    Ok(())
}

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

// ---------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------

/// Names in scope while parsing (user variables).
struct Scope {
    names: Vec<String>,
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
        let mut scope = Scope {
            names: vars.to_vec(),
        };
        Ok(Expr {
            node: parse_node(v, &mut scope)?,
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

fn parse_field_path(s: &str) -> Result<Vec<String>> {
    crate::value::check_path_length(s)?;
    let mut parts = Vec::new();
    for p in s.split('.') {
        if p.is_empty() {
            return Err(err(
                15998,
                "FieldPath field names may not be empty strings.",
            ));
        }
        if p.starts_with('$') {
            return Err(err(
                16410,
                "FieldPath field names may not start with '$'. Consider using $getField or $setField.",
            ));
        }
        if p.contains('\0') {
            return Err(err(16411, "FieldPath field names may not contain '\\0'."));
        }
        parts.push(p.to_string());
    }
    Ok(parts)
}

fn parse_string(s: &str, scope: &Scope) -> Result<Node> {
    if let Some(rest) = s.strip_prefix("$$") {
        let (name, path) = match rest.split_once('.') {
            Some((n, p)) => (n, parse_field_path(p)?),
            None => (rest, Vec::new()),
        };
        let var = match name {
            "ROOT" => Var::Root,
            "CURRENT" => Var::Current,
            "REMOVE" => Var::Remove,
            "NOW" => Var::Now,
            "DESCEND" => Var::Descend,
            "PRUNE" => Var::Prune,
            "KEEP" => Var::Keep,
            "" => return Err(err(16870, "empty variable names are not allowed")),
            n if scope.names.iter().any(|x| x == n) => Var::User(n.to_string()),
            n => return Err(err(17276, format!("Use of undefined variable: {n}"))),
        };
        Ok(Node::Var(var, path))
    } else if let Some(rest) = s.strip_prefix('$') {
        if rest.is_empty() {
            return Err(err(16872, "'$' by itself is not a valid FieldPath"));
        }
        Ok(Node::Field(parse_field_path(rest)?))
    } else {
        Ok(Node::Literal(Bson::String(s.to_string())))
    }
}

fn parse_node(v: &Bson, scope: &mut Scope) -> Result<Node> {
    match v {
        Bson::String(s) => parse_string(s, scope),
        Bson::Array(items) => {
            let nodes = items
                .iter()
                .map(|i| parse_node(i, scope))
                .collect::<Result<Vec<_>>>()?;
            Ok(fold_literal_array(nodes))
        }
        Bson::Document(d) => parse_document(d, scope),
        other => Ok(Node::Literal(other.clone())),
    }
}

/// An array of constants is itself a constant.
fn fold_literal_array(nodes: Vec<Node>) -> Node {
    if nodes.iter().all(|n| matches!(n, Node::Literal(_))) {
        Node::Literal(Bson::Array(
            nodes
                .into_iter()
                .filter_map(|n| match n {
                    Node::Literal(b) => Some(b),
                    _ => None,
                })
                .collect(),
        ))
    } else {
        Node::Array(nodes)
    }
}

fn parse_document(d: &Document, scope: &mut Scope) -> Result<Node> {
    let Some(first) = d.keys().next() else {
        return Ok(Node::Object(Vec::new()));
    };
    if first.starts_with('$') {
        if d.len() != 1 {
            return Err(err(
                15983,
                format!(
                    "an expression specification must contain exactly one field, the name of \
                     the expression. Found {} fields in {d}, while parsing object {d}",
                    d.len()
                ),
            ));
        }
        let (name, arg) = d
            .iter()
            .next()
            .map(|(k, v)| (k.as_str(), v))
            .ok_or_else(|| MongoError::internal("expression document lost its field"))?;
        return parse_operator(name, arg, scope);
    }
    let mut fields = Vec::with_capacity(d.len());
    for (k, v) in d {
        if k.starts_with('$') {
            return Err(err(
                16404,
                format!("FieldPath field names may not start with '$'. Given: {k}"),
            ));
        }
        if k.contains('.') {
            return Err(err(
                16412,
                format!("FieldPath field names may not contain '.'. Given: {k}"),
            ));
        }
        fields.push((k.clone(), parse_node(v, scope)?));
    }
    Ok(Node::Object(fields))
}

fn args_of(arg: &Bson) -> &[Bson] {
    match arg {
        Bson::Array(a) => a,
        other => std::slice::from_ref(other),
    }
}

fn parse_args(arg: &Bson, scope: &mut Scope) -> Result<Vec<Node>> {
    args_of(arg).iter().map(|a| parse_node(a, scope)).collect()
}

/// The fields of a named-argument operator (`{$filter: {input, as, cond}}`), rejecting
/// unknown ones.
fn named_args<'a>(
    op: &str,
    arg: &'a Bson,
    allowed: &[&str],
    not_object: (i32, &str),
    unknown: i32,
) -> Result<Vec<(&'a str, &'a Bson)>> {
    let Bson::Document(d) = arg else {
        return Err(err(not_object.0, not_object.1.to_string()));
    };
    let mut out = Vec::new();
    for (k, v) in d {
        if !allowed.contains(&k.as_str()) {
            return Err(err(unknown, format!("Unrecognized parameter to {op}: {k}")));
        }
        out.push((k.as_str(), v));
    }
    Ok(out)
}

fn get<'a>(args: &[(&str, &'a Bson)], name: &str) -> Option<&'a Bson> {
    args.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
}

pub(crate) fn check_var_name(name: &str) -> Result<()> {
    let Some(c) = name.chars().next() else {
        return Err(err(16866, "empty variable names are not allowed"));
    };
    if !c.is_ascii_lowercase() && c.is_ascii() {
        return Err(err(
            16867,
            format!("'{name}' starts with an invalid character for a user variable name"),
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || !c.is_ascii()))
    {
        return Err(err(
            16868,
            format!("'{name}' contains an invalid character for a variable name: '{bad}'"),
        ));
    }
    Ok(())
}

fn with_vars<T>(
    scope: &mut Scope,
    names: &[&str],
    f: impl FnOnce(&mut Scope) -> Result<T>,
) -> Result<T> {
    let before = scope.names.len();
    scope.names.extend(names.iter().map(|s| s.to_string()));
    let r = f(scope);
    scope.names.truncate(before);
    r
}

/// A field name given as a constant: a string, or `{$literal: <string>}` (the way to name a
/// field with a leading `$` or a dot, for `$getField` / `$setField`).
fn constant_field_name(v: &Bson) -> Option<&str> {
    match v {
        Bson::String(s) => Some(s),
        Bson::Document(d) if d.len() == 1 => match d.get("$literal") {
            Some(Bson::String(s)) => Some(s),
            _ => None,
        },
        _ => None,
    }
}

fn parse_operator(name: &str, arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let op = &name[1..];
    match op {
        "literal" => return Ok(Node::Literal(arg.clone())),
        "rand" => {
            return match arg {
                Bson::Document(d) if d.is_empty() => Ok(Node::Rand),
                _ => Err(err(10065, "invalid parameter: expected an object ($rand)")),
            };
        }
        "and" => return Ok(Node::And(parse_args(arg, scope)?)),
        "or" => return Ok(Node::Or(parse_args(arg, scope)?)),
        "ifNull" => {
            let args = parse_args(arg, scope)?;
            if args.len() < 2 {
                return Err(err(
                    1257300,
                    "$ifNull needs at least two arguments, had: ".to_string()
                        + &args.len().to_string(),
                ));
            }
            return Ok(Node::IfNull(args));
        }
        "cond" => {
            let (i, t, e) = match arg {
                Bson::Document(_) => {
                    let a = named_args(name, arg, &["if", "then", "else"], (17083, ""), 17083)?;
                    let i = get(&a, "if")
                        .ok_or_else(|| err(17080, "Missing 'if' parameter to $cond"))?;
                    let t = get(&a, "then")
                        .ok_or_else(|| err(17081, "Missing 'then' parameter to $cond"))?;
                    let e = get(&a, "else")
                        .ok_or_else(|| err(17082, "Missing 'else' parameter to $cond"))?;
                    (i, t, e)
                }
                _ => {
                    let a = args_of(arg);
                    let [i, t, e] = a else {
                        return Err(arity_error("$cond", 3, a.len()));
                    };
                    (i, t, e)
                }
            };
            return Ok(Node::Cond(Box::new((
                parse_node(i, scope)?,
                parse_node(t, scope)?,
                parse_node(e, scope)?,
            ))));
        }
        "switch" => {
            let Bson::Document(d) = arg else {
                return Err(err(
                    40060,
                    "$switch requires an object as an argument, found: ".to_string()
                        + type_name(arg),
                ));
            };
            let mut branches = Vec::new();
            let mut default = None;
            for (k, v) in d {
                match k.as_str() {
                    "branches" => {
                        let Bson::Array(bs) = v else {
                            return Err(err(
                                40061,
                                format!(
                                    "$switch expected an array for 'branches', found: {}",
                                    type_name(v)
                                ),
                            ));
                        };
                        for b in bs {
                            let Bson::Document(bd) = b else {
                                return Err(err(
                                    40062,
                                    format!(
                                        "$switch expected each branch to be an object, found: {}",
                                        type_name(b)
                                    ),
                                ));
                            };
                            let (mut case, mut then) = (None, None);
                            for (bk, bv) in bd {
                                match bk.as_str() {
                                    "case" => case = Some(parse_node(bv, scope)?),
                                    "then" => then = Some(parse_node(bv, scope)?),
                                    other => {
                                        return Err(err(
                                            40063,
                                            format!(
                                                "$switch found an unknown argument to a branch: {other}"
                                            ),
                                        ));
                                    }
                                }
                            }
                            let case = case.ok_or_else(|| {
                                err(
                                    40064,
                                    "$switch requires each branch have a 'case' expression",
                                )
                            })?;
                            let then = then.ok_or_else(|| {
                                err(
                                    40065,
                                    "$switch requires each branch have a 'then' expression.",
                                )
                            })?;
                            branches.push((case, then));
                        }
                    }
                    "default" => default = Some(Box::new(parse_node(v, scope)?)),
                    other => {
                        return Err(err(
                            40067,
                            format!("$switch found an unknown argument: {other}"),
                        ));
                    }
                }
            }
            if branches.is_empty() {
                return Err(err(40068, "$switch requires at least one branch."));
            }
            return Ok(Node::Switch { branches, default });
        }
        "let" => {
            let a = named_args(
                name,
                arg,
                &["vars", "in"],
                (16874, "invalid parameter: expected an object (vars)"),
                16875,
            )?;
            let Some(Bson::Document(vars)) = get(&a, "vars") else {
                return Err(err(16876, "Missing 'vars' parameter to $let"));
            };
            let body = get(&a, "in").ok_or_else(|| err(16877, "Missing 'in' parameter to $let"))?;
            let mut parsed = Vec::new();
            for (k, v) in vars {
                check_var_name(k)?;
                parsed.push((k.clone(), parse_node(v, scope)?));
            }
            let names: Vec<&str> = vars.keys().map(String::as_str).collect();
            let body = with_vars(scope, &names, |s| parse_node(body, s))?;
            return Ok(Node::Let {
                vars: parsed,
                body: Box::new(body),
            });
        }
        "map" => {
            let a = named_args(
                name,
                arg,
                &["input", "as", "in"],
                (16878, "$map only supports an object as its argument"),
                16879,
            )?;
            let input =
                get(&a, "input").ok_or_else(|| err(16880, "Missing 'input' parameter to $map"))?;
            let var = var_name_arg(get(&a, "as"))?;
            let body = get(&a, "in").ok_or_else(|| err(16882, "Missing 'in' parameter to $map"))?;
            let input = parse_node(input, scope)?;
            let body = with_vars(scope, &[var.as_str()], |s| parse_node(body, s))?;
            return Ok(Node::Map {
                input: Box::new(input),
                name: var,
                body: Box::new(body),
            });
        }
        "filter" => {
            let a = named_args(
                name,
                arg,
                &["input", "as", "cond", "limit"],
                (28646, "$filter only supports an object as its argument"),
                28647,
            )?;
            let input = get(&a, "input")
                .ok_or_else(|| err(28648, "Missing 'input' parameter to $filter"))?;
            let var = var_name_arg(get(&a, "as"))?;
            let cond =
                get(&a, "cond").ok_or_else(|| err(28650, "Missing 'cond' parameter to $filter"))?;
            let input = parse_node(input, scope)?;
            let limit = get(&a, "limit").map(|l| parse_node(l, scope)).transpose()?;
            let cond = with_vars(scope, &[var.as_str()], |s| parse_node(cond, s))?;
            return Ok(Node::Filter {
                input: Box::new(input),
                name: var,
                cond: Box::new(cond),
                limit: limit.map(Box::new),
            });
        }
        "reduce" => {
            let a = named_args(
                name,
                arg,
                &["input", "initialValue", "in"],
                (40075, "$reduce requires an object as an argument"),
                40076,
            )?;
            let input = get(&a, "input")
                .ok_or_else(|| err(40077, "$reduce requires 'input' to be specified"))?;
            let initial = get(&a, "initialValue")
                .ok_or_else(|| err(40078, "$reduce requires 'initialValue' to be specified"))?;
            let body =
                get(&a, "in").ok_or_else(|| err(40079, "$reduce requires 'in' to be specified"))?;
            let input = parse_node(input, scope)?;
            let initial = parse_node(initial, scope)?;
            let body = with_vars(scope, &["value", "this"], |s| parse_node(body, s))?;
            return Ok(Node::Reduce {
                input: Box::new(input),
                initial: Box::new(initial),
                body: Box::new(body),
            });
        }
        "convert" => {
            let a = named_args(
                name,
                arg,
                &["input", "to", "onError", "onNull"],
                (
                    ErrorCode::FAILED_TO_PARSE.code,
                    "$convert expects an object of named arguments but found: ",
                ),
                ErrorCode::FAILED_TO_PARSE.code,
            )?;
            let input = get(&a, "input").ok_or_else(|| {
                MongoError::failed_to_parse("Missing 'input' parameter to $convert")
            })?;
            let to = get(&a, "to")
                .ok_or_else(|| MongoError::failed_to_parse("Missing 'to' parameter to $convert"))?;
            return Ok(Node::Convert {
                input: Box::new(parse_node(input, scope)?),
                to: Box::new(parse_node(to, scope)?),
                on_error: get(&a, "onError")
                    .map(|n| parse_node(n, scope))
                    .transpose()?
                    .map(Box::new),
                on_null: get(&a, "onNull")
                    .map(|n| parse_node(n, scope))
                    .transpose()?
                    .map(Box::new),
            });
        }
        "trim" | "ltrim" | "rtrim" => {
            let kind = match op {
                "trim" => TrimKind::Both,
                "ltrim" => TrimKind::Left,
                _ => TrimKind::Right,
            };
            let a = named_args(
                name,
                arg,
                &["input", "chars"],
                (
                    50696,
                    &format!(
                        "{name} only supports an object as an argument, found: {}",
                        type_name(arg)
                    ),
                ),
                50694,
            )?;
            let input = get(&a, "input")
                .ok_or_else(|| err(50695, format!("{name} requires an 'input' field")))?;
            return Ok(Node::Trim {
                kind,
                input: Box::new(parse_node(input, scope)?),
                chars: get(&a, "chars")
                    .map(|c| parse_node(c, scope))
                    .transpose()?
                    .map(Box::new),
            });
        }
        "dateToString" => {
            let a = named_args(
                name,
                arg,
                &["format", "date", "timezone", "onNull"],
                (
                    18629,
                    "$dateToString only supports an object as its argument",
                ),
                18534,
            )?;
            let date = get(&a, "date")
                .ok_or_else(|| err(18628, "Missing 'date' parameter to $dateToString"))?;
            let opt = |k: &str, scope: &mut Scope| -> Result<Option<Box<Node>>> {
                Ok(get(&a, k)
                    .map(|n| parse_node(n, scope))
                    .transpose()?
                    .map(Box::new))
            };
            return Ok(Node::DateToString {
                format: opt("format", scope)?,
                date: Box::new(parse_node(date, scope)?),
                timezone: opt("timezone", scope)?,
                on_null: opt("onNull", scope)?,
            });
        }
        "regexMatch" | "regexFind" | "regexFindAll" => {
            let kind = match op {
                "regexMatch" => RegexOp::Match,
                "regexFind" => RegexOp::Find,
                _ => RegexOp::FindAll,
            };
            let a = named_args(
                name,
                arg,
                &["input", "regex", "options"],
                (
                    51103,
                    &format!(
                        "{name} expects an object of named arguments but found: {}",
                        type_name(arg)
                    ),
                ),
                31024,
            )?;
            let input = get(&a, "input")
                .ok_or_else(|| err(31022, format!("{name} requires 'input' parameter")))?;
            let regex = get(&a, "regex")
                .ok_or_else(|| err(31023, format!("{name} requires 'regex' parameter")))?;
            return Ok(Node::Regex {
                kind,
                input: Box::new(parse_node(input, scope)?),
                regex: Box::new(parse_node(regex, scope)?),
                options: get(&a, "options")
                    .map(|n| parse_node(n, scope))
                    .transpose()?
                    .map(Box::new),
            });
        }
        "getField" => {
            let (field, input) = match arg {
                Bson::Document(_) => {
                    let a = named_args(name, arg, &["field", "input"], (3041703, ""), 3041701)?;
                    let f = get(&a, "field").ok_or_else(|| {
                        err(3041702, "$getField requires 'field' to be specified")
                    })?;
                    let input = match get(&a, "input") {
                        Some(i) => parse_node(i, scope)?,
                        None => Node::Var(Var::Current, Vec::new()),
                    };
                    (f, input)
                }
                other => (other, Node::Var(Var::Current, Vec::new())),
            };
            let Some(field) = constant_field_name(field) else {
                return Err(err(
                    5654602,
                    "$getField requires 'field' to evaluate to type String",
                ));
            };
            return Ok(Node::GetField {
                field: field.to_string(),
                input: Box::new(input),
            });
        }
        "setField" | "unsetField" => {
            let allowed: &[&str] = if op == "setField" {
                &["field", "input", "value"]
            } else {
                &["field", "input"]
            };
            let a = named_args(
                name,
                arg,
                allowed,
                (
                    4161100,
                    &format!("{name} only supports an object as its argument"),
                ),
                4161101,
            )?;
            let Some(field) = get(&a, "field").and_then(constant_field_name) else {
                return Err(err(
                    4161106,
                    format!("{name} requires 'field' to evaluate to a constant of type String"),
                ));
            };
            if field.starts_with('$') && matches!(get(&a, "field"), Some(Bson::String(_))) {
                return Err(err(
                    4161108,
                    format!(
                        "A field path reference which is not allowed in this context. Did you mean {{$literal: '{field}'}}?"
                    ),
                ));
            }
            let input = get(&a, "input")
                .ok_or_else(|| err(4161109, format!("{name} requires 'input' to be specified")))?;
            let value = if op == "setField" {
                let v = get(&a, "value")
                    .ok_or_else(|| err(4161110, "$setField requires 'value' to be specified"))?;
                Some(Box::new(parse_node(v, scope)?))
            } else {
                None
            };
            return Ok(Node::SetField {
                field: field.to_string(),
                input: Box::new(parse_node(input, scope)?),
                value,
            });
        }
        _ => {}
    }
    if name == "$function" {
        return Err(no_javascript());
    }
    let Some((_, op, min, max)) = OPS.iter().find(|(n, ..)| *n == op) else {
        return Err(MongoError::new(
            ErrorCode::INVALID_PIPELINE_OPERATOR,
            format!("Unrecognized expression '{name}'"),
        ));
    };
    let args = parse_args(arg, scope)?;
    if args.len() < *min || args.len() > *max {
        return Err(if min == max {
            arity_error(name, *min, args.len())
        } else if *max == usize::MAX {
            err(
                16020,
                format!(
                    "Expression {name} takes at least {min} arguments, and {} were passed in.",
                    args.len()
                ),
            )
        } else {
            err(
                16020,
                format!(
                    "Expression {name} takes at least {min} arguments, and at most {max}, but {} were passed in.",
                    args.len()
                ),
            )
        });
    }
    Ok(Node::Call(*op, args))
}

/// `"$name"` of an operator, for messages.
fn op_name(op: Op) -> String {
    OPS.iter()
        .find(|(_, o, ..)| *o == op)
        .map(|(n, ..)| format!("${n}"))
        .unwrap_or_default()
}

fn arity_error(name: &str, n: usize, got: usize) -> MongoError {
    err(
        16020,
        format!("Expression {name} takes exactly {n} arguments. {got} were passed in."),
    )
}

fn var_name_arg(v: Option<&Bson>) -> Result<String> {
    match v {
        None => Ok("this".to_string()),
        Some(Bson::String(s)) => {
            check_var_name(s)?;
            Ok(s.clone())
        }
        Some(other) => Err(MongoError::failed_to_parse(format!(
            "'as' must be a string, found {}",
            type_name(other)
        ))),
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

fn eval(node: &Node, cx: &mut Cx<'_>) -> Result<Option<Bson>> {
    Ok(match node {
        Node::Literal(v) => Some(v.clone()),
        Node::Rand => Some(Bson::Double(rand::random::<f64>())),
        Node::Field(p) => field_of_doc(cx.current, p),
        Node::Var(var, path) => {
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
            path_of_value(v, path)
        }
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
        Node::Map { input, name, body } => {
            let v = eval(input, cx)?;
            let arr = match v {
                None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                Some(Bson::Array(a)) => a,
                Some(other) => {
                    return Err(err(
                        16883,
                        format!("input to $map must be an array not {}", type_name(&other)),
                    ));
                }
            };
            let mut out = Vec::with_capacity(arr.len());
            let mut size = 0_usize;
            for e in arr {
                crate::interrupt::check()?;
                cx.vars.push((name.clone(), Some(e)));
                let r = eval(body, cx);
                cx.vars.pop();
                let v = r?.unwrap_or(Bson::Null);
                size = size.saturating_add(crate::changestream::split::value_size(&v));
                if size > MAX_VALUE_BYTES {
                    return Err(too_large(size));
                }
                out.push(v);
            }
            Some(bounded(Bson::Array(out))?)
        }
        Node::Filter {
            input,
            name,
            cond,
            limit,
        } => {
            let v = eval(input, cx)?;
            let arr = match v {
                None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                Some(Bson::Array(a)) => a,
                Some(other) => {
                    return Err(err(
                        28651,
                        format!(
                            "input to $filter must be an array not {}",
                            type_name(&other)
                        ),
                    ));
                }
            };
            let limit = match limit {
                None => None,
                Some(l) => match eval(l, cx)? {
                    None | Some(Bson::Null) => None,
                    Some(v) => match value::as_i64_exact(&v) {
                        Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
                        Some(_) => {
                            return Err(err(
                                327391,
                                format!("$filter: limit must be greater than 0: {v}"),
                            ));
                        }
                        None => {
                            return Err(err(
                                327392,
                                "$filter: limit must be represented as a 32-bit integral value",
                            ));
                        }
                    },
                },
            };
            let mut out = Vec::new();
            for e in arr {
                if limit.is_some_and(|l| out.len() >= l) {
                    break;
                }
                crate::interrupt::check()?;
                cx.vars.push((name.clone(), Some(e.clone())));
                let r = eval(cond, cx);
                cx.vars.pop();
                if truthy(&r?.unwrap_or(Bson::Null)) {
                    out.push(e);
                }
            }
            Some(Bson::Array(out))
        }
        Node::Reduce {
            input,
            initial,
            body,
        } => {
            let v = eval(input, cx)?;
            let arr = match v {
                None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                Some(Bson::Array(a)) => a,
                Some(other) => {
                    return Err(err(
                        40080,
                        format!(
                            "$reduce requires that 'input' be an array, found: {}",
                            type_name(&other)
                        ),
                    ));
                }
            };
            let mut acc = eval(initial, cx)?;
            for e in arr {
                crate::interrupt::check()?;
                cx.vars.push(("value".into(), acc));
                cx.vars.push(("this".into(), Some(e)));
                let r = eval(body, cx);
                cx.vars.pop();
                cx.vars.pop();
                acc = r?.map(bounded).transpose()?;
            }
            acc
        }
        Node::Convert {
            input,
            to,
            on_error,
            on_null,
        } => {
            let v = eval(input, cx)?;
            if is_nullish(&v) {
                return match on_null {
                    Some(n) => eval(n, cx),
                    None => Ok(Some(Bson::Null)),
                };
            }
            let to = eval(to, cx)?;
            let target = match &to {
                Some(Bson::String(s)) => value::type_code_of_name(s),
                Some(n) if value::is_number(n) => value::as_i64_exact(n)
                    .and_then(|c| i32::try_from(c).ok())
                    .filter(|c| value::type_name_of_code(*c).is_some()),
                None | Some(Bson::Null) => return Ok(Some(Bson::Null)),
                _ => None,
            };
            let Some(target) = target else {
                return Err(MongoError::bad_value(format!(
                    "Unknown type name: {}",
                    to.map(|t| t.to_string()).unwrap_or_default()
                )));
            };
            let v = v.unwrap_or(Bson::Null);
            match convert(&v, target) {
                Ok(r) => Some(r),
                Err(e) => match on_error {
                    Some(n) => eval(n, cx)?,
                    None => return Err(e),
                },
            }
        }
        Node::Trim { kind, input, chars } => {
            let v = eval(input, cx)?;
            let s = match v {
                None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                Some(Bson::String(s)) => s,
                Some(other) => {
                    return Err(err(
                        50699,
                        format!(
                            "$trim requires its input to be a string, got {} (of type {}) instead.",
                            other,
                            type_name(&other)
                        ),
                    ));
                }
            };
            let set: Vec<char> = match chars {
                None => vec![
                    '\0', ' ', '\t', '\n', '\u{0B}', '\u{0C}', '\r', '\u{A0}', '\u{1680}',
                    '\u{2000}', '\u{2001}', '\u{2002}', '\u{2003}', '\u{2004}', '\u{2005}',
                    '\u{2006}', '\u{2007}', '\u{2008}', '\u{2009}', '\u{200A}', '\u{2028}',
                    '\u{2029}', '\u{202F}', '\u{205F}', '\u{3000}',
                ],
                Some(c) => match eval(c, cx)? {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => {
                        return Ok(Some(Bson::Null));
                    }
                    Some(Bson::String(c)) => c.chars().collect(),
                    Some(other) => {
                        return Err(err(
                            50700,
                            format!(
                                "$trim requires 'chars' to be a string, got {} (of type {}) instead.",
                                other,
                                type_name(&other)
                            ),
                        ));
                    }
                },
            };
            let r = match kind {
                TrimKind::Both => s.trim_matches(set.as_slice()),
                TrimKind::Left => s.trim_start_matches(set.as_slice()),
                TrimKind::Right => s.trim_end_matches(set.as_slice()),
            };
            Some(Bson::String(r.to_string()))
        }
        Node::DateToString {
            format,
            date,
            timezone,
            on_null,
        } => {
            let d = eval(date, cx)?;
            if is_nullish(&d) {
                return match on_null {
                    Some(n) => eval(n, cx),
                    None => Ok(Some(Bson::Null)),
                };
            }
            if let Some(tz) = timezone {
                check_utc("$dateToString", &eval(tz, cx)?)?;
            }
            let fmt = match format {
                None => ISO_DATE_FORMAT.to_string(),
                Some(f) => match eval(f, cx)? {
                    None | Some(Bson::Null) => return Ok(Some(Bson::Null)),
                    Some(Bson::String(s)) => s,
                    Some(other) => {
                        return Err(err(
                            18533,
                            format!(
                                "$dateToString requires that 'format' be a string, found: {} with value {other}",
                                type_name(&other)
                            ),
                        ));
                    }
                },
            };
            let ms = date_millis("$dateToString", &d)?.unwrap_or(0);
            Some(Bson::String(format_date(ms, &fmt)?))
        }
        Node::Regex {
            kind,
            input,
            regex,
            options,
        } => {
            let name = match kind {
                RegexOp::Match => "$regexMatch",
                RegexOp::Find => "$regexFind",
                RegexOp::FindAll => "$regexFindAll",
            };
            let input = eval(input, cx)?;
            let regex = eval(regex, cx)?;
            let options = match options {
                Some(o) => eval(o, cx)?,
                None => None,
            };
            let (pattern, mut flags) = match regex {
                None | Some(Bson::Null) | Some(Bson::Undefined) => (None, String::new()),
                Some(Bson::String(p)) => (Some(p), String::new()),
                Some(Bson::RegularExpression(r)) => (
                    Some(r.pattern.as_str().to_string()),
                    r.options.as_str().to_string(),
                ),
                Some(other) => {
                    return Err(err(
                        51105,
                        format!(
                            "{name} needs 'regex' to be of type string or regex, found: {}",
                            type_name(&other)
                        ),
                    ));
                }
            };
            match options {
                None | Some(Bson::Null) | Some(Bson::Undefined) => {}
                Some(Bson::String(o)) => {
                    if !flags.is_empty() && !o.is_empty() {
                        return Err(err(
                            51107,
                            format!(
                                "{name} found regex option(s) specified in both 'regex' and 'option' fields"
                            ),
                        ));
                    }
                    flags.push_str(&o);
                }
                Some(other) => {
                    return Err(err(
                        51106,
                        format!(
                            "{name} needs 'options' to be of type string, found: {}",
                            type_name(&other)
                        ),
                    ));
                }
            }
            let text = match input {
                None | Some(Bson::Null) | Some(Bson::Undefined) => None,
                Some(Bson::String(t)) => Some(t),
                Some(other) => {
                    return Err(err(
                        51104,
                        format!(
                            "{name} needs 'input' to be of type string, found: {}",
                            type_name(&other)
                        ),
                    ));
                }
            };
            let (Some(pattern), Some(text)) = (pattern, text) else {
                return Ok(Some(match kind {
                    RegexOp::Match => Bson::Boolean(false),
                    RegexOp::Find => Bson::Null,
                    RegexOp::FindAll => Bson::Array(Vec::new()),
                }));
            };
            let re = crate::matcher::Re::new(&pattern, &flags)?;
            regex_eval(*kind, &re, &text)?
        }
        Node::GetField { field, input } => match eval(input, cx)? {
            None | Some(Bson::Null) | Some(Bson::Undefined) => None,
            Some(Bson::Document(d)) => d.get(field).cloned(),
            Some(_) => None,
        },
        Node::SetField {
            field,
            input,
            value,
        } => {
            let mut d = match eval(input, cx)? {
                None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                Some(Bson::Document(d)) => d,
                Some(other) => {
                    return Err(err(
                        4161105,
                        format!(
                            "$setField requires 'input' to evaluate to type Object, got {}",
                            type_name(&other)
                        ),
                    ));
                }
            };
            match value {
                Some(n) => match eval(n, cx)? {
                    Some(v) => {
                        d.insert(field.clone(), v);
                    }
                    None => {
                        d.remove(field);
                    }
                },
                None => {
                    d.remove(field);
                }
            }
            Some(Bson::Document(d))
        }
        Node::Call(op, args) => {
            let mut vals = Vec::with_capacity(args.len());
            for a in args {
                vals.push(eval(a, cx)?);
            }
            call(*op, vals, cx.env)?
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Operators on evaluated arguments
// ---------------------------------------------------------------------------------------------

fn cmp_missing(a: &Option<Bson>, b: &Option<Bson>, env: &Env) -> std::cmp::Ordering {
    env.compare(
        a.as_ref().unwrap_or(&Bson::Undefined),
        b.as_ref().unwrap_or(&Bson::Undefined),
    )
}

fn int_result(n: i64) -> Bson {
    match i32::try_from(n) {
        Ok(i) => Bson::Int32(i),
        Err(_) => Bson::Int64(n),
    }
}

fn expect_string(op: &str, v: &Option<Bson>, code: i32) -> Result<String> {
    match v {
        Some(Bson::String(s)) | Some(Bson::Symbol(s)) => Ok(s.clone()),
        _ => Err(err(
            code,
            format!(
                "{op} requires a string argument, found: {}",
                missing_name(v)
            ),
        )),
    }
}

/// A string coerced the way `$substr`/`$toLower` coerce (null/missing → "").
fn coerce_string(v: &Option<Bson>) -> Result<String> {
    Ok(match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => String::new(),
        Some(Bson::String(s)) | Some(Bson::Symbol(s)) => s.clone(),
        Some(Bson::Int32(i)) => i.to_string(),
        Some(Bson::Int64(i)) => i.to_string(),
        Some(Bson::Double(d)) => format_double(*d),
        Some(Bson::Decimal128(d)) => d.to_string(),
        Some(Bson::DateTime(d)) => format_date(d.timestamp_millis(), ISO_DATE_FORMAT)?,
        Some(other) => {
            return Err(err(
                16007,
                format!(
                    "can't convert from BSON type {} to String",
                    type_name(other)
                ),
            ));
        }
    })
}

fn format_double(d: f64) -> String {
    if d.is_nan() {
        "NaN".into()
    } else if d.is_infinite() {
        if d > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else if d.fract() == 0.0 && d.abs() < 1e15 {
        format!("{}", d as i64)
    } else {
        format!("{d}")
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

fn numeric_unary(op: &str, v: &Option<Bson>) -> Result<Option<f64>> {
    match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => Ok(None),
        Some(b) if value::is_number(b) => Ok(value::as_f64(b)),
        _ => Err(err(
            28765,
            format!("{op} only supports numeric types, not {}", missing_name(v)),
        )),
    }
}

/// A double result, or a decimal one when the input was decimal.
fn float_like(input: &Bson, r: f64) -> Bson {
    if matches!(input, Bson::Decimal128(_)) {
        Bson::Decimal128(value::f64_to_decimal(r))
    } else {
        Bson::Double(r)
    }
}

fn round_to(v: &Bson, place: i64, trunc: bool) -> Result<Bson> {
    let roundf = |x: f64| {
        if trunc {
            x.trunc()
        } else {
            x.round_ties_even()
        }
    };
    Ok(match v {
        Bson::Int32(_) | Bson::Int64(_) => {
            if place >= 0 {
                v.clone()
            } else {
                let n = match v {
                    Bson::Int32(i) => i64::from(*i),
                    Bson::Int64(i) => *i,
                    _ => 0,
                };
                let p = 10i128.pow(u32::try_from(-place).unwrap_or(0).min(30));
                let n128 = i128::from(n);
                let q = n128 / p;
                let r = n128 % p;
                let mut q = q;
                if !trunc {
                    let twice = r.abs() * 2;
                    if twice > p || (twice == p && q % 2 != 0) {
                        q += if n128 < 0 { -1 } else { 1 };
                    }
                }
                let out = q * p;
                match (v, i64::try_from(out)) {
                    (Bson::Int32(_), Ok(o)) => match i32::try_from(o) {
                        Ok(i) => Bson::Int32(i),
                        Err(_) => Bson::Int64(o),
                    },
                    (_, Ok(o)) => Bson::Int64(o),
                    (_, Err(_)) => Bson::Double(out as f64),
                }
            }
        }
        other => {
            let x = value::as_f64(other).unwrap_or(f64::NAN);
            if !x.is_finite() {
                return Ok(other.clone());
            }
            let scale = 10f64.powi(i32::try_from(place).unwrap_or(0));
            let r = if place == 0 {
                roundf(x)
            } else {
                roundf(x * scale) / scale
            };
            float_like(other, r)
        }
    })
}

fn convert(v: &Bson, target: i32) -> Result<Bson> {
    let fail = |what: &str| {
        MongoError::with_code(
            241,
            format!(
                "Unsupported conversion from {} to {what} in $convert with no onError value",
                type_name(v)
            ),
        )
    };
    let parse_fail = |what: &str, s: &str| {
        MongoError::with_code(
            241,
            format!("Failed to parse number '{s}' in $convert with no onError value: {what}"),
        )
    };
    Ok(match target {
        // double
        1 => match v {
            Bson::Boolean(b) => Bson::Double(if *b { 1.0 } else { 0.0 }),
            Bson::DateTime(d) => Bson::Double(d.timestamp_millis() as f64),
            Bson::String(s) => Bson::Double(
                s.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|_| !s.is_empty() && s.trim() == s)
                    .ok_or_else(|| parse_fail("Did not consume whole string.", s))?,
            ),
            n if value::is_number(n) => Bson::Double(value::as_f64(n).unwrap_or(f64::NAN)),
            _ => return Err(fail("double")),
        },
        // string
        2 => match v {
            Bson::String(s) => Bson::String(s.clone()),
            Bson::Boolean(b) => Bson::String(b.to_string()),
            Bson::ObjectId(o) => Bson::String(o.to_hex()),
            Bson::DateTime(d) => Bson::String(format_date(d.timestamp_millis(), ISO_DATE_FORMAT)?),
            n if value::is_number(n) => Bson::String(coerce_string(&Some(n.clone()))?),
            _ => return Err(fail("string")),
        },
        // objectId
        7 => match v {
            Bson::ObjectId(o) => Bson::ObjectId(*o),
            Bson::String(s) => Bson::ObjectId(bson::oid::ObjectId::parse_str(s).map_err(|_| {
                MongoError::with_code(
                    241,
                    format!("Failed to parse objectId '{s}' in $convert with no onError value: Invalid string length for parsing to OID, expected 24 but found {}", s.len()),
                )
            })?),
            _ => return Err(fail("objectId")),
        },
        // bool
        8 => match v {
            Bson::Boolean(b) => Bson::Boolean(*b),
            n if value::is_number(n) => Bson::Boolean(truthy(n)),
            _ => Bson::Boolean(true),
        },
        // date
        9 => match v {
            Bson::DateTime(d) => Bson::DateTime(*d),
            Bson::Int64(i) => Bson::DateTime(bson::DateTime::from_millis(*i)),
            Bson::Double(d) if d.is_finite() => {
                Bson::DateTime(bson::DateTime::from_millis(d.trunc() as i64))
            }
            Bson::Timestamp(t) => {
                Bson::DateTime(bson::DateTime::from_millis(i64::from(t.time) * 1000))
            }
            Bson::ObjectId(o) => Bson::DateTime(o.timestamp()),
            Bson::String(s) => Bson::DateTime(bson::DateTime::parse_rfc3339_str(s).map_err(
                |_| MongoError::with_code(241, format!("Error parsing date string '{s}'")),
            )?),
            _ => return Err(fail("date")),
        },
        // int, long
        16 | 18 => {
            let what = if target == 16 { "int" } else { "long" };
            let n: i64 = match v {
                Bson::Boolean(b) => i64::from(*b),
                Bson::Int32(i) => i64::from(*i),
                Bson::Int64(i) => *i,
                Bson::DateTime(d) if target == 18 => d.timestamp_millis(),
                Bson::Double(_) | Bson::Decimal128(_) => {
                    let d = value::as_f64(v).unwrap_or(f64::NAN);
                    if !d.is_finite() {
                        return Err(MongoError::with_code(
                            241,
                            format!("Attempt to convert NaN or infinity value to integer type in $convert with no onError value: {d}"),
                        ));
                    }
                    let t = d.trunc();
                    value::f64_to_i64_exact(t).ok_or_else(|| {
                        MongoError::with_code(
                            241,
                            format!("Conversion would overflow target type in $convert with no onError value: {d}"),
                        )
                    })?
                }
                Bson::String(s) => s
                    .parse::<i64>()
                    .map_err(|_| parse_fail("Did not consume whole string.", s))?,
                _ => return Err(fail(what)),
            };
            if target == 16 {
                Bson::Int32(i32::try_from(n).map_err(|_| {
                    MongoError::with_code(
                        241,
                        format!("Conversion would overflow target type in $convert with no onError value: {n}"),
                    )
                })?)
            } else {
                Bson::Int64(n)
            }
        }
        // decimal
        19 => match v {
            Bson::Decimal128(d) => Bson::Decimal128(*d),
            Bson::Boolean(b) => Bson::Decimal128(value::f64_to_decimal(if *b { 1.0 } else { 0.0 })),
            Bson::Int32(i) => Bson::Decimal128(i.to_string().parse().map_err(|_| fail("decimal"))?),
            Bson::Int64(i) => Bson::Decimal128(i.to_string().parse().map_err(|_| fail("decimal"))?),
            Bson::Double(d) => Bson::Decimal128(value::f64_to_decimal(*d)),
            Bson::String(s) => Bson::Decimal128(
                s.parse()
                    .map_err(|_| parse_fail("Failed to parse string to decimal", s))?,
            ),
            _ => return Err(fail("decimal")),
        },
        _ => {
            return Err(MongoError::with_code(
                241,
                format!(
                    "Unsupported conversion from {} to {} in $convert with no onError value",
                    type_name(v),
                    value::type_name_of_code(target).unwrap_or("unknown")
                ),
            ));
        }
    })
}

fn set_of(op: &str, v: Option<Bson>, code: i32, env: &Env) -> Result<Option<Vec<Bson>>> {
    match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => Ok(None),
        Some(Bson::Array(a)) => {
            let mut out: Vec<Bson> = Vec::new();
            for e in a {
                if !out.iter().any(|x| env.equal(x, &e)) {
                    out.push(e);
                }
            }
            Ok(Some(out))
        }
        Some(other) => Err(err(
            code,
            format!(
                "All operands of {op} must be arrays. One argument is of type: {}",
                type_name(&other)
            ),
        )),
    }
}

fn call(op: Op, mut a: Vec<Option<Bson>>, env: &Env) -> Result<Option<Bson>> {
    use std::cmp::Ordering;
    let arg = |a: &Vec<Option<Bson>>, i: usize| a.get(i).cloned().flatten();
    Ok(match op {
        Op::Add => {
            let mut acc = Bson::Int32(0);
            let mut date: Option<i64> = None;
            for v in &a {
                match v {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                    Some(Bson::DateTime(d)) => {
                        if date.is_some() {
                            return Err(err(16612, "only one date allowed in an $add expression"));
                        }
                        date = Some(d.timestamp_millis());
                    }
                    Some(n) if value::is_number(n) => {
                        acc = value::add_numbers(&acc, n).unwrap_or(Bson::Null);
                    }
                    Some(other) => {
                        return Err(err(
                            16554,
                            format!(
                                "$add only supports numeric or date types, not {}",
                                type_name(other)
                            ),
                        ));
                    }
                }
            }
            match date {
                Some(ms) => {
                    let delta = match &acc {
                        Bson::Int32(i) => i64::from(*i),
                        Bson::Int64(i) => *i,
                        other => value::as_f64(other).unwrap_or(0.0).round() as i64,
                    };
                    Some(Bson::DateTime(bson::DateTime::from_millis(
                        ms.wrapping_add(delta),
                    )))
                }
                None => Some(acc),
            }
        }
        Op::Subtract => {
            let (x, y) = (arg(&a, 0), arg(&a, 1));
            if is_nullish(&x) || is_nullish(&y) {
                return Ok(Some(Bson::Null));
            }
            match (&x, &y) {
                (Some(Bson::DateTime(p)), Some(Bson::DateTime(q))) => Some(Bson::Int64(
                    p.timestamp_millis().wrapping_sub(q.timestamp_millis()),
                )),
                (Some(Bson::DateTime(p)), Some(n)) if value::is_number(n) => {
                    let delta = value::as_f64(n).unwrap_or(0.0).round() as i64;
                    Some(Bson::DateTime(bson::DateTime::from_millis(
                        p.timestamp_millis().wrapping_sub(delta),
                    )))
                }
                (Some(p), Some(q)) if value::is_number(p) && value::is_number(q) => {
                    value::sub_numbers(p, q)
                }
                _ => {
                    return Err(err(
                        16556,
                        format!(
                            "can't $subtract {} from {}",
                            missing_name(&y),
                            missing_name(&x)
                        ),
                    ));
                }
            }
        }
        Op::Multiply => {
            let mut acc = Bson::Int32(1);
            for v in &a {
                match v {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                    Some(n) if value::is_number(n) => {
                        acc = value::mul_numbers(&acc, n).unwrap_or(Bson::Null);
                    }
                    Some(other) => {
                        return Err(err(
                            16555,
                            format!(
                                "$multiply only supports numeric types, not {}",
                                type_name(other)
                            ),
                        ));
                    }
                }
            }
            Some(acc)
        }
        Op::Divide | Op::Mod => {
            let (x, y) = (arg(&a, 0), arg(&a, 1));
            if is_nullish(&x) || is_nullish(&y) {
                return Ok(Some(Bson::Null));
            }
            let (Some(p), Some(q)) = (&x, &y) else {
                return Ok(Some(Bson::Null));
            };
            let name = if op == Op::Divide { "$divide" } else { "$mod" };
            if !value::is_number(p) || !value::is_number(q) {
                return Err(err(
                    if op == Op::Divide { 16609 } else { 16611 },
                    format!(
                        "{name} only supports numeric types, not {} and {}",
                        type_name(p),
                        type_name(q)
                    ),
                ));
            }
            let qf = value::as_f64(q).unwrap_or(f64::NAN);
            let decimal = matches!(p, Bson::Decimal128(_)) || matches!(q, Bson::Decimal128(_));
            if op == Op::Divide {
                if qf == 0.0 {
                    return Err(err(16608, "can't $divide by zero"));
                }
                let r = value::as_f64(p).unwrap_or(f64::NAN) / qf;
                Some(if decimal {
                    Bson::Decimal128(value::f64_to_decimal(r))
                } else {
                    Bson::Double(r)
                })
            } else {
                if qf == 0.0 {
                    return Err(err(16610, "can't $mod by 0"));
                }
                match (p, q) {
                    (Bson::Int32(x), Bson::Int32(y)) => Some(Bson::Int32(x.wrapping_rem(*y))),
                    (Bson::Int32(_) | Bson::Int64(_), Bson::Int32(_) | Bson::Int64(_)) => {
                        let (x, y) = (
                            value::as_i64_exact(p).unwrap_or(0),
                            value::as_i64_exact(q).unwrap_or(1),
                        );
                        Some(Bson::Int64(x.wrapping_rem(y)))
                    }
                    _ => {
                        let r = value::as_f64(p).unwrap_or(f64::NAN) % qf;
                        Some(if decimal {
                            Bson::Decimal128(value::f64_to_decimal(r))
                        } else {
                            Bson::Double(r)
                        })
                    }
                }
            }
        }
        Op::Abs => {
            let v = arg(&a, 0);
            match v {
                None | Some(Bson::Null) | Some(Bson::Undefined) => Some(Bson::Null),
                Some(Bson::Int32(i)) => Some(match i.checked_abs() {
                    Some(x) => Bson::Int32(x),
                    None => Bson::Int64(i64::from(i).abs()),
                }),
                Some(Bson::Int64(i)) => {
                    Some(Bson::Int64(i.checked_abs().ok_or_else(|| {
                        err(28680, "can't take $abs of long long min")
                    })?))
                }
                Some(ref n) if value::is_number(n) => {
                    Some(float_like(n, value::as_f64(n).unwrap_or(f64::NAN).abs()))
                }
                Some(other) => {
                    return Err(err(
                        28765,
                        format!(
                            "$abs only supports numeric types, not {}",
                            type_name(&other)
                        ),
                    ));
                }
            }
        }
        Op::Ceil | Op::Floor => {
            let name = if op == Op::Ceil { "$ceil" } else { "$floor" };
            let v = arg(&a, 0);
            match numeric_unary(name, &v)? {
                None => Some(Bson::Null),
                Some(x) => match v {
                    Some(Bson::Int32(_)) | Some(Bson::Int64(_)) => v,
                    Some(ref n) => Some(float_like(
                        n,
                        if op == Op::Ceil { x.ceil() } else { x.floor() },
                    )),
                    None => Some(Bson::Null),
                },
            }
        }
        Op::Round | Op::Trunc => {
            let name = if op == Op::Round { "$round" } else { "$trunc" };
            let v = arg(&a, 0);
            if numeric_unary(name, &v)?.is_none() {
                return Ok(Some(Bson::Null));
            }
            let place = match a.get(1).cloned().flatten() {
                None => 0,
                Some(Bson::Null) => return Ok(Some(Bson::Null)),
                Some(p) => {
                    let n = value::as_i64_exact(&p).ok_or_else(|| {
                        err(
                            51082,
                            format!(
                                "{name}: argument \"place\" must be an integral value, got: {p}"
                            ),
                        )
                    })?;
                    if !(-20..=100).contains(&n) {
                        return Err(err(
                            51083,
                            format!(
                                "Cannot apply {name} with precision value {n} value must be in [-20, 100]"
                            ),
                        ));
                    }
                    n
                }
            };
            match v {
                Some(n) => Some(round_to(&n, place, op == Op::Trunc)?),
                None => Some(Bson::Null),
            }
        }
        Op::Sqrt | Op::Exp | Op::Ln | Op::Log10 => {
            let name = match op {
                Op::Sqrt => "$sqrt",
                Op::Exp => "$exp",
                Op::Ln => "$ln",
                _ => "$log10",
            };
            let v = arg(&a, 0);
            let Some(x) = numeric_unary(name, &v)? else {
                return Ok(Some(Bson::Null));
            };
            let r = match op {
                Op::Sqrt => {
                    if x < 0.0 {
                        return Err(err(
                            28714,
                            "$sqrt's argument must be greater than or equal to 0",
                        ));
                    }
                    x.sqrt()
                }
                Op::Exp => x.exp(),
                Op::Ln => {
                    if x <= 0.0 {
                        return Err(err(
                            28766,
                            format!("$ln's argument must be a positive number, but is {x}"),
                        ));
                    }
                    x.ln()
                }
                _ => {
                    if x <= 0.0 {
                        return Err(err(
                            28761,
                            format!("$log10's argument must be a positive number, but is {x}"),
                        ));
                    }
                    x.log10()
                }
            };
            match v {
                Some(n @ Bson::Decimal128(_)) => Some(float_like(&n, r)),
                _ => Some(Bson::Double(r)),
            }
        }
        Op::Pow => {
            let (x, y) = (arg(&a, 0), arg(&a, 1));
            if is_nullish(&x) || is_nullish(&y) {
                return Ok(Some(Bson::Null));
            }
            let (Some(p), Some(q)) = (x, y) else {
                return Ok(Some(Bson::Null));
            };
            if !value::is_number(&p) {
                return Err(err(
                    28762,
                    format!("$pow's base must be numeric, not {}", type_name(&p)),
                ));
            }
            if !value::is_number(&q) {
                return Err(err(
                    28763,
                    format!("$pow's exponent must be numeric, not {}", type_name(&q)),
                ));
            }
            let (bf, ef) = (
                value::as_f64(&p).unwrap_or(f64::NAN),
                value::as_f64(&q).unwrap_or(f64::NAN),
            );
            if bf == 0.0 && ef < 0.0 {
                return Err(err(
                    28764,
                    "$pow cannot take a base of 0 and a negative exponent",
                ));
            }
            let ints = matches!(p, Bson::Int32(_) | Bson::Int64(_))
                && matches!(q, Bson::Int32(_) | Bson::Int64(_));
            if ints && ef >= 0.0 {
                let (b, e) = (
                    value::as_i64_exact(&p).unwrap_or(0),
                    value::as_i64_exact(&q).unwrap_or(0),
                );
                let exact = u32::try_from(e).ok().and_then(|e| b.checked_pow(e));
                match exact {
                    Some(r) if matches!(p, Bson::Int32(_)) && matches!(q, Bson::Int32(_)) => {
                        Some(int_result(r))
                    }
                    Some(r) => Some(Bson::Int64(r)),
                    None => Some(Bson::Double(bf.powf(ef))),
                }
            } else if matches!(p, Bson::Decimal128(_)) || matches!(q, Bson::Decimal128(_)) {
                Some(Bson::Decimal128(value::f64_to_decimal(bf.powf(ef))))
            } else {
                Some(Bson::Double(bf.powf(ef)))
            }
        }
        Op::Eq | Op::Ne | Op::Gt | Op::Gte | Op::Lt | Op::Lte => {
            let o = cmp_missing(&arg(&a, 0), &arg(&a, 1), env);
            Some(Bson::Boolean(match op {
                Op::Eq => o == Ordering::Equal,
                Op::Ne => o != Ordering::Equal,
                Op::Gt => o == Ordering::Greater,
                Op::Gte => o != Ordering::Less,
                Op::Lt => o == Ordering::Less,
                _ => o != Ordering::Greater,
            }))
        }
        Op::Cmp => Some(Bson::Int32(
            match cmp_missing(&arg(&a, 0), &arg(&a, 1), env) {
                Ordering::Less => -1,
                Ordering::Equal => 0,
                Ordering::Greater => 1,
            },
        )),
        Op::Not => Some(Bson::Boolean(!truthy(&arg(&a, 0).unwrap_or(Bson::Null)))),
        Op::Concat => {
            let mut s = String::new();
            for v in &a {
                match v {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                    Some(Bson::String(x)) | Some(Bson::Symbol(x)) => {
                        check_string_growth(s.len(), x.len())?;
                        s.push_str(x);
                    }
                    Some(other) => {
                        return Err(err(
                            16702,
                            format!("$concat only supports strings, not {}", type_name(other)),
                        ));
                    }
                }
            }
            Some(Bson::String(s))
        }
        Op::Substr | Op::SubstrBytes => {
            let s = coerce_string(&arg(&a, 0))?;
            let start = match arg(&a, 1) {
                Some(n) if value::is_number(&n) => value::as_f64(&n).unwrap_or(0.0),
                other => {
                    return Err(err(
                        16034,
                        format!(
                            "$substrBytes: starting index must be a numeric type (is BSON type {})",
                            missing_name(&other)
                        ),
                    ));
                }
            };
            let len = match arg(&a, 2) {
                Some(n) if value::is_number(&n) => value::as_f64(&n).unwrap_or(0.0),
                other => {
                    return Err(err(
                        16035,
                        format!(
                            "$substrBytes: length must be a numeric type (is BSON type {})",
                            missing_name(&other)
                        ),
                    ));
                }
            };
            let bytes = s.as_bytes();
            let start = if start < 0.0 {
                usize::MAX
            } else {
                start as usize
            };
            if start >= bytes.len() {
                return Ok(Some(Bson::String(String::new())));
            }
            let end = if len < 0.0 {
                bytes.len()
            } else {
                start.saturating_add(len as usize).min(bytes.len())
            };
            if !s.is_char_boundary(start) {
                return Err(err(
                    28656,
                    "$substrBytes:  Invalid range, starting index is a UTF-8 continuation byte.",
                ));
            }
            if !s.is_char_boundary(end) {
                return Err(err(
                    28657,
                    "$substrBytes:  Invalid range, ending index is in the middle of a UTF-8 character.",
                ));
            }
            Some(Bson::String(s.get(start..end).unwrap_or("").to_string()))
        }
        Op::SubstrCP => {
            let s = coerce_string(&arg(&a, 0))?;
            let start = match arg(&a, 1) {
                Some(n) if value::is_number(&n) => value::as_i64_exact(&n).ok_or_else(|| err(34452, "$substrCP: starting index cannot be represented as a 32-bit integral value"))?,
                other => return Err(err(34450, format!("$substrCP: starting index must be a numeric type (is BSON type {})", missing_name(&other)))),
            };
            let len = match arg(&a, 2) {
                Some(n) if value::is_number(&n) => value::as_i64_exact(&n).ok_or_else(|| {
                    err(
                        34453,
                        "$substrCP: length cannot be represented as a 32-bit integral value",
                    )
                })?,
                other => {
                    return Err(err(
                        34451,
                        format!(
                            "$substrCP: length must be a numeric type (is BSON type {})",
                            missing_name(&other)
                        ),
                    ));
                }
            };
            if start < 0 {
                return Err(err(
                    34455,
                    "$substrCP: the starting index must be nonnegative integer.",
                ));
            }
            if len < 0 {
                return Err(err(
                    34454,
                    "$substrCP: length must be a nonnegative integer.",
                ));
            }
            let r: String = s
                .chars()
                .skip(usize::try_from(start).unwrap_or(usize::MAX))
                .take(usize::try_from(len).unwrap_or(usize::MAX))
                .collect();
            Some(Bson::String(r))
        }
        Op::ToLower => Some(Bson::String(
            coerce_string(&arg(&a, 0))?.to_ascii_lowercase(),
        )),
        Op::ToUpper => Some(Bson::String(
            coerce_string(&arg(&a, 0))?.to_ascii_uppercase(),
        )),
        Op::StrLenBytes => {
            let s = expect_string("$strLenBytes", &arg(&a, 0), 34473)?;
            Some(int_result(i64::try_from(s.len()).unwrap_or(i64::MAX)))
        }
        Op::StrLenCP => {
            let s = expect_string("$strLenCP", &arg(&a, 0), 34471)?;
            Some(int_result(
                i64::try_from(s.chars().count()).unwrap_or(i64::MAX),
            ))
        }
        Op::Split => {
            let (x, y) = (arg(&a, 0), arg(&a, 1));
            if is_nullish(&x) || is_nullish(&y) {
                return Ok(Some(Bson::Null));
            }
            let s = match &x {
                Some(Bson::String(s)) => s.clone(),
                _ => {
                    return Err(err(
                        40085,
                        format!(
                            "$split requires an expression that evaluates to a string as a first argument, found: {}",
                            missing_name(&x)
                        ),
                    ));
                }
            };
            let d = match &y {
                Some(Bson::String(s)) => s.clone(),
                _ => {
                    return Err(err(
                        40086,
                        format!(
                            "$split requires an expression that evaluates to a string as a second argument, found: {}",
                            missing_name(&y)
                        ),
                    ));
                }
            };
            if d.is_empty() {
                return Err(err(40087, "$split requires a non-empty separator"));
            }
            Some(Bson::Array(
                s.split(d.as_str())
                    .map(|p| Bson::String(p.to_string()))
                    .collect(),
            ))
        }
        Op::IndexOfBytes | Op::IndexOfCP => {
            let name = if op == Op::IndexOfBytes {
                "$indexOfBytes"
            } else {
                "$indexOfCP"
            };
            let x = arg(&a, 0);
            if is_nullish(&x) {
                return Ok(Some(Bson::Null));
            }
            let s = match &x {
                Some(Bson::String(s)) => s.clone(),
                _ => {
                    return Err(err(
                        if op == Op::IndexOfBytes { 40091 } else { 40093 },
                        format!(
                            "{name} requires a string as the first argument, found: {}",
                            missing_name(&x)
                        ),
                    ));
                }
            };
            let y = arg(&a, 1);
            let sub = match &y {
                Some(Bson::String(s)) => s.clone(),
                _ => {
                    return Err(err(
                        if op == Op::IndexOfBytes { 40092 } else { 40094 },
                        format!(
                            "{name} requires a string as the second argument, found: {}",
                            missing_name(&y)
                        ),
                    ));
                }
            };
            let units: Vec<usize> = if op == Op::IndexOfBytes {
                (0..=s.len()).collect()
            } else {
                s.char_indices()
                    .map(|(i, _)| i)
                    .chain(std::iter::once(s.len()))
                    .collect()
            };
            let n = units.len().saturating_sub(1);
            let start = match a.get(2).cloned().flatten() {
                None => 0,
                v => usize::try_from(int_arg(name, &v, 40096)?.max(0)).unwrap_or(0),
            };
            let end = match a.get(3).cloned().flatten() {
                None => n,
                v => usize::try_from(int_arg(name, &v, 40096)?.max(0))
                    .unwrap_or(0)
                    .min(n),
            };
            let mut found = -1i64;
            let mut i = start;
            while i <= end && i < units.len() {
                let bi = units[i];
                if s.is_char_boundary(bi)
                    && s[bi..].starts_with(sub.as_str())
                    && bi + sub.len() <= units.get(end).copied().unwrap_or(s.len())
                {
                    found = i64::try_from(i).unwrap_or(-1);
                    break;
                }
                i += 1;
            }
            Some(int_result(found))
        }
        Op::StrCaseCmp => {
            let x = coerce_string(&arg(&a, 0))?.to_ascii_lowercase();
            let y = coerce_string(&arg(&a, 1))?.to_ascii_lowercase();
            Some(Bson::Int32(match x.cmp(&y) {
                Ordering::Less => -1,
                Ordering::Equal => 0,
                Ordering::Greater => 1,
            }))
        }
        Op::Size => {
            let v = arg(&a, 0);
            match v {
                Some(Bson::Array(x)) => {
                    Some(int_result(i64::try_from(x.len()).unwrap_or(i64::MAX)))
                }
                other => {
                    return Err(err(
                        17124,
                        format!(
                            "The argument to $size must be an array. Type of the argument was: {}",
                            missing_name(&other)
                        ),
                    ));
                }
            }
        }
        Op::ArrayElemAt => {
            let (x, y) = (arg(&a, 0), arg(&a, 1));
            if is_nullish(&x) || is_nullish(&y) {
                return Ok(Some(Bson::Null));
            }
            let arr = array_arg(
                "$arrayElemAt",
                x,
                28689,
                "'s first argument must be an array, but is ",
            )?;
            let idx = match &y {
                Some(n) if value::is_number(n) => value::as_i64_exact(n).ok_or_else(|| {
                    err(28691, format!("$arrayElemAt's second argument must be representable as a 32-bit integer: {n}"))
                })?,
                _ => return Err(err(28690, format!("$arrayElemAt's second argument must be a numeric value, but is {}", missing_name(&y)))),
            };
            element_at(arr, idx)
        }
        Op::First | Op::Last => {
            let name = if op == Op::First { "$first" } else { "$last" };
            let x = arg(&a, 0);
            if is_nullish(&x) {
                return Ok(Some(Bson::Null));
            }
            let arr = array_arg(name, x, 28689, "'s argument must be an array, but is ")?;
            element_at(arr, if op == Op::First { 0 } else { -1 })
        }
        Op::In => {
            let x = arg(&a, 0).unwrap_or(Bson::Undefined);
            let arr = array_arg(
                "$in",
                arg(&a, 1),
                40081,
                " requires an array as a second argument, found: ",
            )?;
            Some(Bson::Boolean(arr.iter().any(|e| env.equal(e, &x))))
        }
        Op::IsArray => Some(Bson::Boolean(matches!(arg(&a, 0), Some(Bson::Array(_))))),
        Op::ConcatArrays => {
            let mut out = Vec::new();
            for v in a.drain(..) {
                match v {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(Some(Bson::Null)),
                    Some(Bson::Array(x)) => out.extend(x),
                    Some(other) => {
                        return Err(err(
                            28664,
                            format!(
                                "$concatArrays only supports arrays, not {}",
                                type_name(&other)
                            ),
                        ));
                    }
                }
            }
            Some(bounded(Bson::Array(out))?)
        }
        Op::Slice => {
            let x = arg(&a, 0);
            if a.iter().any(is_nullish) {
                return Ok(Some(Bson::Null));
            }
            let arr = array_arg(
                "$slice",
                x,
                28724,
                ": First argument to $slice must be an array, but is of type: ",
            )?;
            let len = i64::try_from(arr.len()).unwrap_or(i64::MAX);
            let (start, count) = if a.len() == 2 {
                let n = int_arg("$slice", &arg(&a, 1), 28725)?;
                if n >= 0 {
                    (0, n)
                } else {
                    ((len + n).max(0), -n)
                }
            } else {
                let p = int_arg("$slice", &arg(&a, 1), 28725)?;
                let n = int_arg("$slice", &arg(&a, 2), 28726)?;
                if n <= 0 {
                    return Err(err(
                        28729,
                        format!("Third argument to $slice must be positive: {n}"),
                    ));
                }
                let start = if p >= 0 { p.min(len) } else { (len + p).max(0) };
                (start, n)
            };
            let start = usize::try_from(start).unwrap_or(0);
            let count = usize::try_from(count).unwrap_or(0);
            Some(Bson::Array(
                arr.into_iter().skip(start).take(count).collect(),
            ))
        }
        Op::ReverseArray => {
            let x = arg(&a, 0);
            if is_nullish(&x) {
                return Ok(Some(Bson::Null));
            }
            let mut arr = array_arg("$reverseArray", x, 34435, " must be an array, found: ")?;
            arr.reverse();
            Some(Bson::Array(arr))
        }
        Op::Range => {
            let start = int_arg("$range", &arg(&a, 0), 34443)?;
            let end = int_arg("$range", &arg(&a, 1), 34445)?;
            let step = match a.get(2) {
                Some(v) => int_arg("$range", v, 34447)?,
                None => 1,
            };
            if step == 0 {
                return Err(err(34449, "$range requires a non-zero step value"));
            }
            let mut out = Vec::new();
            let mut i = start;
            while (step > 0 && i < end) || (step < 0 && i > end) {
                crate::interrupt::check()?;
                if out.len() >= RANGE_MAX_ELEMENTS {
                    return Err(MongoError::new(
                        ErrorCode {
                            code: 146,
                            name: "ExceededMemoryLimit",
                        },
                        "$range would use too much memory",
                    ));
                }
                out.push(int_result(i));
                match i.checked_add(step) {
                    Some(n) => i = n,
                    None => break,
                }
            }
            Some(Bson::Array(out))
        }
        Op::IndexOfArray => {
            let x = arg(&a, 0);
            if is_nullish(&x) {
                return Ok(Some(Bson::Null));
            }
            let arr = array_arg(
                "$indexOfArray",
                x,
                40090,
                " requires an array as a first argument, found: ",
            )?;
            let needle = arg(&a, 1).unwrap_or(Bson::Undefined);
            let start = match a.get(2) {
                Some(v) => usize::try_from(int_arg("$indexOfArray", v, 40097)?.max(0)).unwrap_or(0),
                None => 0,
            };
            let end = match a.get(3) {
                Some(v) => usize::try_from(int_arg("$indexOfArray", v, 40097)?.max(0)).unwrap_or(0),
                None => arr.len(),
            }
            .min(arr.len());
            let found = (start..end).find(|i| arr.get(*i).is_some_and(|e| env.equal(e, &needle)));
            Some(int_result(
                found.and_then(|i| i64::try_from(i).ok()).unwrap_or(-1),
            ))
        }
        Op::BsonSize => size::bson_size(arg(&a, 0))?,
        Op::BinarySize => size::binary_size(arg(&a, 0))?,
        Op::Type => Some(Bson::String(missing_name(&arg(&a, 0)).to_string())),
        Op::IsNumber => Some(Bson::Boolean(
            arg(&a, 0).is_some_and(|v| value::is_number(&v)),
        )),
        Op::ToString | Op::ToInt | Op::ToLong | Op::ToDouble | Op::ToDecimal | Op::ToBool => {
            let v = arg(&a, 0);
            if is_nullish(&v) {
                return Ok(Some(Bson::Null));
            }
            let target = match op {
                Op::ToString => 2,
                Op::ToInt => 16,
                Op::ToLong => 18,
                Op::ToDouble => 1,
                Op::ToDecimal => 19,
                _ => 8,
            };
            Some(convert(&v.unwrap_or(Bson::Null), target)?)
        }
        Op::MergeObjects => {
            let mut out = Document::new();
            for (i, v) in a.into_iter().enumerate() {
                match v {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => {}
                    Some(Bson::Document(d)) => {
                        for (k, v) in d {
                            out.insert(k, v);
                        }
                    }
                    Some(other) => {
                        return Err(err(
                            40400,
                            format!(
                                "$mergeObjects requires object inputs, but input {} is of type {}",
                                i,
                                type_name(&other)
                            ),
                        ));
                    }
                }
            }
            Some(bounded(Bson::Document(out))?)
        }
        Op::ObjectToArray => match arg(&a, 0) {
            None | Some(Bson::Null) | Some(Bson::Undefined) => Some(Bson::Null),
            Some(Bson::Document(d)) => Some(Bson::Array(
                d.into_iter()
                    .map(|(k, v)| Bson::Document(bson::doc! {"k": k, "v": v}))
                    .collect(),
            )),
            Some(other) => {
                return Err(err(
                    40390,
                    format!(
                        "$objectToArray requires a document input, found: {}",
                        type_name(&other)
                    ),
                ));
            }
        },
        Op::ArrayToObject => {
            let x = arg(&a, 0);
            if is_nullish(&x) {
                return Ok(Some(Bson::Null));
            }
            let arr = array_arg(
                "$arrayToObject",
                x,
                40386,
                " requires an array input, found: ",
            )?;
            let mut out = Document::new();
            for e in arr {
                let (k, v) = match e {
                    Bson::Array(kv) => {
                        let [k, v] = <[Bson; 2]>::try_from(kv).map_err(|kv| {
                            err(40397, format!("$arrayToObject requires an array of size 2 arrays,found array of size: {}", kv.len()))
                        })?;
                        (k, v)
                    }
                    Bson::Document(mut d) => {
                        if d.len() != 2 {
                            return Err(err(
                                40392,
                                format!(
                                    "$arrayToObject requires an object keys of 'k' and 'v'. Found incorrect number of keys:{}",
                                    d.len()
                                ),
                            ));
                        }
                        match (d.remove("k"), d.remove("v")) {
                            (Some(k), Some(v)) => (k, v),
                            _ => {
                                return Err(err(
                                    40393,
                                    "$arrayToObject requires an object with keys 'k' and 'v'.",
                                ));
                            }
                        }
                    }
                    other => {
                        return Err(err(
                            40398,
                            format!(
                                "Unrecognised input type format for $arrayToObject: {}",
                                type_name(&other)
                            ),
                        ));
                    }
                };
                let Bson::String(k) = k else {
                    return Err(err(
                        40394,
                        format!(
                            "$arrayToObject requires an object with keys 'k' and 'v', where the value of 'k' must be of type string. Found type: {}",
                            type_name(&k)
                        ),
                    ));
                };
                if k.contains('\0') {
                    return Err(err(
                        4940400,
                        "Key field cannot contain an embedded null byte",
                    ));
                }
                out.insert(k, v);
            }
            Some(Bson::Document(out))
        }
        Op::Sum | Op::Avg | Op::Min | Op::Max => {
            let items: Vec<Bson> = if a.len() == 1 {
                match arg(&a, 0) {
                    Some(Bson::Array(x)) => x,
                    Some(v) => vec![v],
                    None => vec![],
                }
            } else {
                a.into_iter().flatten().collect()
            };
            match op {
                Op::Sum | Op::Avg => {
                    let mut acc = Bson::Int32(0);
                    let mut n = 0u64;
                    for v in &items {
                        if value::is_number(v) {
                            acc = value::add_numbers(&acc, v).unwrap_or(Bson::Null);
                            n += 1;
                        }
                    }
                    if op == Op::Sum {
                        Some(acc)
                    } else if n == 0 {
                        Some(Bson::Null)
                    } else if matches!(acc, Bson::Decimal128(_)) {
                        Some(Bson::Decimal128(value::f64_to_decimal(
                            value::as_f64(&acc).unwrap_or(f64::NAN) / n as f64,
                        )))
                    } else {
                        Some(Bson::Double(
                            value::as_f64(&acc).unwrap_or(f64::NAN) / n as f64,
                        ))
                    }
                }
                _ => {
                    let mut best: Option<Bson> = None;
                    for v in items {
                        if matches!(v, Bson::Null | Bson::Undefined) {
                            continue;
                        }
                        let replace = match &best {
                            None => true,
                            Some(b) => {
                                let o = env.compare(&v, b);
                                if op == Op::Min { o.is_lt() } else { o.is_gt() }
                            }
                        };
                        if replace {
                            best = Some(v);
                        }
                    }
                    Some(best.unwrap_or(Bson::Null))
                }
            }
        }
        Op::SetUnion | Op::SetIntersection => {
            let name = if op == Op::SetUnion {
                "$setUnion"
            } else {
                "$setIntersection"
            };
            let code = if op == Op::SetUnion { 17043 } else { 17047 };
            let mut acc: Option<Vec<Bson>> = None;
            for v in a {
                let Some(s) = set_of(name, v, code, env)? else {
                    return Ok(Some(Bson::Null));
                };
                acc = Some(match acc {
                    None => s,
                    Some(mut cur) => {
                        if op == Op::SetUnion {
                            for e in s {
                                if !cur.iter().any(|x| env.equal(x, &e)) {
                                    cur.push(e);
                                }
                            }
                            cur
                        } else {
                            cur.retain(|x| s.iter().any(|e| env.equal(x, e)));
                            cur
                        }
                    }
                });
            }
            let mut out = acc.unwrap_or_default();
            out.sort_by(|x, y| env.compare(x, y));
            Some(Bson::Array(out))
        }
        Op::SetDifference => {
            let mut it = a.into_iter();
            let x = set_of("$setDifference", it.next().flatten(), 17048, env)?;
            let y = set_of("$setDifference", it.next().flatten(), 17049, env)?;
            match (x, y) {
                (Some(x), Some(y)) => Some(Bson::Array(
                    x.into_iter()
                        .filter(|e| !y.iter().any(|f| env.equal(e, f)))
                        .collect(),
                )),
                _ => Some(Bson::Null),
            }
        }
        Op::SetEquals | Op::SetIsSubset => {
            let name = if op == Op::SetEquals {
                "$setEquals"
            } else {
                "$setIsSubset"
            };
            let mut sets = Vec::new();
            for v in a {
                match set_of(name, v.clone(), 17044, env)? {
                    Some(s) => sets.push(s),
                    None => {
                        return Err(err(
                            17044,
                            format!(
                                "All operands of {name} must be arrays. One argument is of type: {}",
                                missing_name(&v)
                            ),
                        ));
                    }
                }
            }
            let subset =
                |x: &Vec<Bson>, y: &Vec<Bson>| x.iter().all(|e| y.iter().any(|f| env.equal(e, f)));
            let r = match sets.as_slice() {
                [first, rest @ ..] if op == Op::SetEquals => {
                    rest.iter().all(|s| subset(first, s) && subset(s, first))
                }
                [x, y] => subset(x, y),
                _ => false,
            };
            Some(Bson::Boolean(r))
        }
        Op::ToDate | Op::ToObjectId => {
            let v = arg(&a, 0);
            if is_nullish(&v) {
                return Ok(Some(Bson::Null));
            }
            let target = if op == Op::ToDate { 9 } else { 7 };
            Some(convert(&v.unwrap_or(Bson::Null), target)?)
        }
        Op::Year
        | Op::Month
        | Op::DayOfMonth
        | Op::Hour
        | Op::Minute
        | Op::Second
        | Op::Millisecond
        | Op::DayOfWeek
        | Op::DayOfYear
        | Op::Week => {
            let name = op_name(op);
            let mut v = arg(&a, 0);
            if let Some(Bson::Document(d)) = &v
                && d.contains_key("date")
            {
                check_utc(&name, &d.get("timezone").cloned())?;
                v = d.get("date").cloned();
            }
            if is_nullish(&v) {
                return Ok(Some(Bson::Null));
            }
            let ms = date_millis(&name, &v)?.unwrap_or(0);
            let p = DateParts::of(ms);
            Some(Bson::Int32(match op {
                Op::Year => i32::try_from(p.year).unwrap_or(i32::MAX),
                Op::Month => p.month,
                Op::DayOfMonth => p.day,
                Op::Hour => p.hour,
                Op::Minute => p.minute,
                Op::Second => p.second,
                Op::Millisecond => p.millis,
                Op::DayOfWeek => p.weekday + 1,
                Op::DayOfYear => p.yday + 1,
                _ => p.week(),
            }))
        }
        Op::AnyElementTrue | Op::AllElementsTrue => {
            let name = if op == Op::AnyElementTrue {
                "$anyElementTrue"
            } else {
                "$allElementsTrue"
            };
            let arr = array_arg(
                name,
                arg(&a, 0),
                if op == Op::AnyElementTrue {
                    17041
                } else {
                    17040
                },
                "'s argument must be an array, but is ",
            )?;
            Some(Bson::Boolean(if op == Op::AnyElementTrue {
                arr.iter().any(truthy)
            } else {
                arr.iter().all(truthy)
            }))
        }
    })
}

/// MongoDB's default date rendering (`$dateToString`, `$toString`): always milliseconds.
const ISO_DATE_FORMAT: &str = "%Y-%m-%dT%H:%M:%S.%LZ";

/// The calendar fields of a UTC instant.
struct DateParts {
    year: i64,
    month: i32,
    day: i32,
    hour: i32,
    minute: i32,
    second: i32,
    millis: i32,
    /// 0 = Sunday.
    weekday: i32,
    /// 0-based day of the year.
    yday: i32,
}

impl DateParts {
    fn of(ms: i64) -> DateParts {
        let days = ms.div_euclid(86_400_000);
        let in_day = ms.rem_euclid(86_400_000);
        let (year, month, day) = civil_from_days(days);
        let small = |x: i64| i32::try_from(x).unwrap_or(0);
        DateParts {
            year,
            month: small(month),
            day: small(day),
            hour: small(in_day / 3_600_000),
            minute: small(in_day / 60_000 % 60),
            second: small(in_day / 1000 % 60),
            millis: small(in_day % 1000),
            weekday: small((days + 4).rem_euclid(7)),
            yday: small(days - days_from_civil(year, 1, 1)),
        }
    }

    /// `%U`: weeks start on Sunday; days before the year's first Sunday are week 0.
    fn week(&self) -> i32 {
        (self.yday + 7 - self.weekday) / 7
    }
}

/// Days since 1970-01-01 → (year, month 1-12, day 1-31), proleptic Gregorian.
pub(crate) fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// (year, month, day) → days since 1970-01-01.
pub(crate) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Milliseconds since the epoch of a date-like value; `Ok(None)` for null/missing.
fn date_millis(op: &str, v: &Option<Bson>) -> Result<Option<i64>> {
    Ok(match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => None,
        Some(Bson::DateTime(d)) => Some(d.timestamp_millis()),
        Some(Bson::Timestamp(t)) => Some(i64::from(t.time) * 1000),
        Some(Bson::ObjectId(o)) => Some(o.timestamp().timestamp_millis()),
        Some(other) => {
            return Err(err(
                16006,
                format!(
                    "{op}: can't convert from BSON type {} to Date",
                    type_name(other)
                ),
            ));
        }
    })
}

/// Only UTC is supported as a timezone (there is no timezone database here).
fn check_utc(op: &str, tz: &Option<Bson>) -> Result<()> {
    match tz {
        None | Some(Bson::Null) => Ok(()),
        Some(Bson::String(s))
            if matches!(
                s.as_str(),
                "UTC" | "GMT" | "Z" | "+00:00" | "+0000" | "Etc/UTC"
            ) =>
        {
            Ok(())
        }
        Some(other) => Err(err(
            40485,
            format!("{op}: unrecognized time zone identifier: {other} (only UTC is supported)"),
        )),
    }
}

fn format_date(ms: i64, fmt: &str) -> Result<String> {
    let p = DateParts::of(ms);
    let mut out = String::with_capacity(fmt.len() + 8);
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&format!("{:04}", p.year)),
            Some('m') => out.push_str(&format!("{:02}", p.month)),
            Some('d') => out.push_str(&format!("{:02}", p.day)),
            Some('H') => out.push_str(&format!("{:02}", p.hour)),
            Some('M') => out.push_str(&format!("{:02}", p.minute)),
            Some('S') => out.push_str(&format!("{:02}", p.second)),
            Some('L') => out.push_str(&format!("{:03}", p.millis)),
            Some('j') => out.push_str(&format!("{:03}", p.yday + 1)),
            Some('w') => out.push_str(&(p.weekday + 1).to_string()),
            Some('u') => out.push_str(&(if p.weekday == 0 { 7 } else { p.weekday }).to_string()),
            Some('U') => out.push_str(&format!("{:02}", p.week())),
            Some('z') => out.push_str("+0000"),
            Some('Z') => out.push('0'),
            Some('%') => out.push('%'),
            Some(other) => {
                return Err(err(
                    18536,
                    format!("Invalid format character '%{other}' in format string"),
                ));
            }
            None => {
                return Err(err(18535, "Unmatched '%' at end of format string"));
            }
        }
    }
    Ok(out)
}

fn regex_eval(kind: RegexOp, re: &crate::matcher::Re, text: &str) -> Result<Option<Bson>> {
    let to_doc = |caps: regex::Captures<'_>| -> Bson {
        let whole = caps.get(0);
        let start = whole.map(|m| m.start()).unwrap_or(0);
        let idx = text.get(..start).map(|p| p.chars().count()).unwrap_or(0);
        let captures: Vec<Bson> = caps
            .iter()
            .skip(1)
            .map(|c| match c {
                Some(m) => Bson::String(m.as_str().to_string()),
                None => Bson::Null,
            })
            .collect();
        Bson::Document(bson::doc! {
            "match": whole.map(|m| m.as_str()).unwrap_or(""),
            "idx": i32::try_from(idx).unwrap_or(i32::MAX),
            "captures": captures,
        })
    };
    Ok(Some(match kind {
        RegexOp::Match => Bson::Boolean(re.is_match(text)),
        RegexOp::Find => re.regex().captures(text).map(to_doc).unwrap_or(Bson::Null),
        RegexOp::FindAll => Bson::Array(re.regex().captures_iter(text).map(to_doc).collect()),
    }))
}

/// The most elements `$range` may produce (MongoDB bounds it by a 64MB memory limit).
const RANGE_MAX_ELEMENTS: usize = 1_000_000;

fn element_at(arr: Vec<Bson>, idx: i64) -> Option<Bson> {
    let len = i64::try_from(arr.len()).unwrap_or(i64::MAX);
    let i = if idx < 0 { len + idx } else { idx };
    if i < 0 || i >= len {
        return None;
    }
    arr.into_iter().nth(usize::try_from(i).ok()?)
}

#[cfg(test)]
mod tests;

/// `$function` and `$accumulator` run JavaScript, and there is no JavaScript engine: the answer
/// of a 7.0 server without one.
pub fn no_javascript() -> MongoError {
    MongoError::with_code(
        31264,
        "Cannot run server-side javascript without the javascript engine enabled",
    )
}
