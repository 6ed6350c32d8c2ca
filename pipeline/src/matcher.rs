//! The match-expression language of `find` filters and `$match` (MongoDB 7.0 semantics).
//!
//! A filter is parsed once into a tree of [`Node`]s and then evaluated against many documents.
//!
//! Path semantics (invariants the tests check):
//! * A dotted path descends through documents; an array met before the last component fans out
//!   over its document elements (`{"a.b": 1}` matches `{a: [{b: 1}]}`), and a numeric component
//!   indexes it (`{"a.1": 5}` matches `{a: [4, 5]}`). Nested arrays are not fanned out.
//! * At the leaf, an array value is tested as a whole *and* element by element (one level), so
//!   `{a: 2}` matches `{a: [1, 2]}` and `{a: [1, 2]}` matches `{a: [[1, 2]]}`.
//!   `$size`, `$elemMatch` and `$all` look at the array itself.
//! * A missing path is "missing", which equality with `null` (and `$lte/$gte: null`,
//!   `$in: [null]`) matches, as it matches `null` and (MongoDB 7.0, before 8.0's change)
//!   `undefined`. `{"a.b": null}` matches `{a: [{}]}` but not `{a: []}` or `{a: [5, {b: 5}]}`:
//!   non-document array elements are skipped by path traversal.
//! * Several operators on one path are independent: `{a: {$gt: 1, $lt: 3}}` holds when some
//!   element is `> 1` and some (maybe other) element is `< 3`; use `$elemMatch` for one element.
//! * `$ne`, `$nin`, `$not` and `$exists: false` are the negation of the positive predicate over
//!   the whole path, so `{a: {$ne: 1}}` fails for `{a: [1, 2]}`.
//! * Ordering comparisons only hold between values of the same canonical type (`MinKey`/`MaxKey`
//!   bounds excepted); NaN only equals NaN.
//!
//! [`Matcher::referenced_paths`] tells which top-level paths a filter reads, for pushing
//! predicates down (e.g. change-stream filters on oplog-derived fields).

use std::collections::BTreeSet;

use bson::{Bson, Document};
use wire::ErrorCode;

use crate::expr::{Env, Expr};
use crate::value::{self, compare};
use crate::{MongoError, Result};

// `$regex`'s compiled form lives in a leaf module that expressions and `$jsonSchema` share; its
// path here stays for the crate's users.
pub use crate::re::{MAX_PATTERN_LEN, Re};

/// A parsed filter.
#[derive(Debug, Clone)]
pub struct Matcher {
    root: Node,
}

/// One node of a parsed filter.
#[derive(Debug, Clone)]
enum Node {
    And(Vec<Node>),
    Or(Vec<Node>),
    Nor(Vec<Node>),
    Not(Box<Node>),
    True,
    False,
    Expr(Box<Expr>),
    /// `$jsonSchema` (see [`crate::schema`]): JSON Schema semantics on the whole document.
    Schema(Box<crate::schema::Schema>),
    /// A predicate on the values a dotted path reaches (fan-out and leaf expansion).
    Path {
        path: String,
        parts: Vec<String>,
        pred: Pred,
    },
    /// A predicate on the value at hand, inside the value form of `$elemMatch`.
    Single(Pred),
}

/// A predicate on one value (after path traversal).
#[derive(Debug, Clone)]
enum Pred {
    Eq(Bson),
    Lt(Bson),
    Lte(Bson),
    Gt(Bson),
    Gte(Bson),
    In { values: Vec<Bson>, regexes: Vec<Re> },
    Exists,
    Type { codes: Vec<i32>, number: bool },
    Regex(Re),
    Mod { divisor: i64, remainder: i64 },
    Size(i64),
    ElemMatchObject(Box<Node>),
    ElemMatchValue(Vec<Node>),
    Bits { test: BitTest, positions: Vec<u32> },
}

/// Which `$bits*` operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BitTest {
    AllSet,
    AnySet,
    AllClear,
    AnyClear,
}

/// Filters nested deeper than this are rejected before parsing (parsing and matching recurse).
pub const MAX_FILTER_DEPTH: usize = 200;

const UNKNOWN_TOP_LEVEL_HINT: &str = ". If you have a field name that starts with a '$' symbol, \
                                       consider using $getField or $setField.";

impl Matcher {
    /// Parses a filter; unknown operators are `BadValue` (2), malformed ones `BadValue` or the
    /// specific code MongoDB uses.
    pub fn parse(filter: &Document) -> Result<Matcher> {
        Matcher::parse_with_vars(filter, &[])
    }

    /// Parses a filter whose `$expr` may use the given user variables (a command's `let`).
    pub fn parse_with_vars(filter: &Document, vars: &[String]) -> Result<Matcher> {
        if value::nesting_exceeds(filter, MAX_FILTER_DEPTH) {
            return Err(MongoError::bad_value(format!(
                "exceeded maximum query tree depth of {MAX_FILTER_DEPTH}"
            )));
        }
        Ok(Matcher {
            root: parse_filter(filter, vars)?,
        })
    }

    /// A matcher that accepts every document (the empty filter).
    pub fn all() -> Matcher {
        Matcher { root: Node::True }
    }

    /// Whether the document matches. A runtime error inside `$expr` counts as no match; use
    /// [`Matcher::try_matches`] to see it.
    pub fn matches(&self, doc: &Document) -> bool {
        self.try_matches(doc).unwrap_or(false)
    }

    /// Whether the document matches, surfacing `$expr` evaluation errors (e.g. `$divide` by 0).
    pub fn try_matches(&self, doc: &Document) -> Result<bool> {
        eval_doc(&self.root, doc, &Env::default())
    }

    /// [`Matcher::try_matches`] with `$$NOW` and user variables for `$expr`.
    pub fn try_matches_in(&self, doc: &Document, env: &Env) -> Result<bool> {
        eval_doc(&self.root, doc, env)
    }

    /// Whether the filter is trivially true (`{}`).
    pub fn is_always_true(&self) -> bool {
        matches!(&self.root, Node::True) || matches!(&self.root, Node::And(v) if v.is_empty())
    }

    /// The dotted paths the filter reads, or `None` when it may read the whole document (an
    /// `$expr` using `$$ROOT`/`$$CURRENT`). Paths inside `$elemMatch` are reported as the
    /// array's path.
    pub fn referenced_paths(&self) -> Option<BTreeSet<String>> {
        let mut out = BTreeSet::new();
        collect_paths(&self.root, &mut out).then_some(out)
    }
}

fn collect_paths(node: &Node, out: &mut BTreeSet<String>) -> bool {
    match node {
        Node::And(v) | Node::Or(v) | Node::Nor(v) => v.iter().all(|n| collect_paths(n, out)),
        Node::Not(n) => collect_paths(n, out),
        Node::True | Node::False | Node::Single(_) => true,
        Node::Expr(e) => e.referenced_paths(out),
        // A schema may constrain every field (`additionalProperties`, `minProperties`).
        Node::Schema(_) => false,
        Node::Path { path, .. } => {
            out.insert(path.clone());
            true
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------

fn parse_filter(filter: &Document, vars: &[String]) -> Result<Node> {
    let mut children = Vec::new();
    for (key, value) in filter {
        if let Some(op) = key.strip_prefix('$') {
            if let Some(n) = parse_top_level(op, value, vars)? {
                children.push(n);
            }
        } else {
            parse_field(key, value, &mut children)?;
        }
    }
    Ok(and_of(children))
}

fn and_of(mut children: Vec<Node>) -> Node {
    match children.len() {
        0 => Node::True,
        1 => children.pop().unwrap_or(Node::True),
        _ => Node::And(children),
    }
}

fn parse_top_level(op: &str, value: &Bson, vars: &[String]) -> Result<Option<Node>> {
    Ok(Some(match op {
        "and" | "or" | "nor" => {
            let Bson::Array(items) = value else {
                return Err(MongoError::bad_value(format!("${op} must be an array")));
            };
            if items.is_empty() {
                return Err(MongoError::bad_value(
                    "$and/$or/$nor must be a nonempty array",
                ));
            }
            let mut children = Vec::with_capacity(items.len());
            for item in items {
                let Bson::Document(d) = item else {
                    return Err(MongoError::bad_value(
                        "$or/$and/$nor entries need to be full objects",
                    ));
                };
                children.push(parse_filter(d, vars)?);
            }
            match op {
                "and" => Node::And(children),
                "or" => Node::Or(children),
                _ => Node::Nor(children),
            }
        }
        "expr" => Node::Expr(Box::new(Expr::parse_with_vars(value, vars)?)),
        "jsonSchema" => Node::Schema(Box::new(crate::schema::Schema::parse(value)?)),
        "comment" => return Ok(None),
        "alwaysTrue" | "alwaysFalse" => {
            if value::as_f64(value) != Some(1.0) {
                return Err(MongoError::failed_to_parse(format!(
                    "${op} must be an integer value of 1"
                )));
            }
            if op == "alwaysTrue" {
                Node::True
            } else {
                Node::False
            }
        }
        "where" => {
            // No JavaScript engine: mongod's answer when it runs without one.
            return Err(MongoError::with_code(
                6108304,
                "no globalScriptEngine in $where parsing",
            ));
        }
        "text" => {
            return Err(MongoError::with_code(
                27,
                "text index required for $text query",
            ));
        }
        _ => {
            return Err(MongoError::bad_value(format!(
                "unknown top level operator: ${op}{UNKNOWN_TOP_LEVEL_HINT}"
            )));
        }
    }))
}

/// Whether a document is an operator object (`{$gt: 1}`) rather than a literal; DBRef-like
/// documents (`{$ref, $id}`) are literals.
fn is_operator_doc(d: &Document) -> bool {
    match d.keys().next() {
        Some(k) => k.starts_with('$') && !matches!(k.as_str(), "$ref" | "$id" | "$db"),
        None => false,
    }
}

fn path_node(path: &str) -> impl Fn(Pred) -> Node + '_ {
    move |pred| Node::Path {
        path: path.to_string(),
        parts: path.split('.').map(str::to_string).collect(),
        pred,
    }
}

fn parse_field(path: &str, value: &Bson, out: &mut Vec<Node>) -> Result<()> {
    value::check_path_length(path)?;
    let mk = path_node(path);
    match value {
        Bson::Document(d) if is_operator_doc(d) => parse_ops(d, &mk, out),
        Bson::RegularExpression(r) => {
            out.push(mk(Pred::Regex(Re::new(
                r.pattern.as_str(),
                r.options.as_str(),
            )?)));
            Ok(())
        }
        other => {
            out.push(mk(Pred::Eq(other.clone())));
            Ok(())
        }
    }
}

/// Parses an operator object (`{$gt: 1, $lt: 5}`) into independent nodes built with `mk`.
fn parse_ops(ops: &Document, mk: &dyn Fn(Pred) -> Node, out: &mut Vec<Node>) -> Result<()> {
    let regex_source = ops.get("$regex");
    let options = ops.get("$options");
    if let Some(options) = options {
        let Some(source) = regex_source else {
            return Err(MongoError::bad_value("$options needs a $regex"));
        };
        let Bson::String(opts) = options else {
            return Err(MongoError::bad_value("$options has to be a string"));
        };
        if let Bson::RegularExpression(r) = source
            && !r.options.as_str().is_empty()
            && !opts.is_empty()
        {
            return Err(MongoError::bad_value(
                "options set in both $regex and $options",
            ));
        }
    }
    for (key, arg) in ops {
        let Some(op) = key.strip_prefix('$') else {
            return Err(MongoError::bad_value(format!("unknown operator: {key}")));
        };
        match op {
            "options" => {}
            "regex" => {
                let extra = match options {
                    Some(Bson::String(s)) => s.as_str(),
                    _ => "",
                };
                let re = match arg {
                    Bson::String(p) => Re::new(p, extra)?,
                    Bson::RegularExpression(r) => {
                        let opts = format!("{}{}", r.options.as_str(), extra);
                        Re::new(r.pattern.as_str(), &opts)?
                    }
                    _ => return Err(MongoError::bad_value("$regex has to be a string")),
                };
                out.push(mk(Pred::Regex(re)));
            }
            "not" => {
                let inner = match arg {
                    Bson::RegularExpression(r) => mk(Pred::Regex(Re::new(
                        r.pattern.as_str(),
                        r.options.as_str(),
                    )?)),
                    Bson::Document(d) => {
                        if d.is_empty() {
                            return Err(MongoError::bad_value("$not cannot be empty"));
                        }
                        let mut inner = Vec::new();
                        parse_ops(d, mk, &mut inner)?;
                        and_of(inner)
                    }
                    _ => return Err(MongoError::bad_value("$not needs a regex or a document")),
                };
                out.push(Node::Not(Box::new(inner)));
            }
            _ => out.push(parse_op(op, arg, mk)?),
        }
    }
    Ok(())
}

fn parse_op(op: &str, arg: &Bson, mk: &dyn Fn(Pred) -> Node) -> Result<Node> {
    Ok(match op {
        "eq" => mk(Pred::Eq(arg.clone())),
        "ne" => {
            if matches!(arg, Bson::RegularExpression(_)) {
                return Err(MongoError::bad_value("Can't have regex as arg to $ne."));
            }
            Node::Not(Box::new(mk(Pred::Eq(arg.clone()))))
        }
        "lt" => mk(Pred::Lt(arg.clone())),
        "lte" => mk(Pred::Lte(arg.clone())),
        "gt" => mk(Pred::Gt(arg.clone())),
        "gte" => mk(Pred::Gte(arg.clone())),
        "in" | "nin" => {
            let Bson::Array(items) = arg else {
                return Err(MongoError::bad_value(format!("${op} needs an array")));
            };
            let mut values = Vec::new();
            let mut regexes = Vec::new();
            for item in items {
                match item {
                    Bson::RegularExpression(r) => {
                        regexes.push(Re::new(r.pattern.as_str(), r.options.as_str())?)
                    }
                    Bson::Document(d) if is_operator_doc(d) => {
                        return Err(MongoError::bad_value(format!("cannot nest $ under ${op}")));
                    }
                    other => values.push(other.clone()),
                }
            }
            let n = mk(Pred::In { values, regexes });
            if op == "in" {
                n
            } else {
                Node::Not(Box::new(n))
            }
        }
        "exists" => {
            if value::truthy(arg) {
                mk(Pred::Exists)
            } else {
                Node::Not(Box::new(mk(Pred::Exists)))
            }
        }
        "type" => {
            let mut codes = Vec::new();
            let mut number = false;
            let items: &[Bson] = match arg {
                Bson::Array(a) => a,
                single => std::slice::from_ref(single),
            };
            for item in items {
                match parse_type_alias(item)? {
                    None => number = true,
                    Some(c) => codes.push(c),
                }
            }
            mk(Pred::Type { codes, number })
        }
        "size" => {
            let n = match arg {
                Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
                    let Some(n) = value::as_i64_exact(arg) else {
                        return Err(MongoError::bad_value(format!(
                            "Failed to parse $size. Expected an integer, but found {arg}"
                        )));
                    };
                    if n < 0 {
                        return Err(MongoError::bad_value(format!(
                            "Failed to parse $size. Expected a non-negative number in: $size: {n}"
                        )));
                    }
                    n
                }
                _ => {
                    return Err(MongoError::bad_value(format!(
                        "Failed to parse $size. Expected a number in: $size: {arg}"
                    )));
                }
            };
            mk(Pred::Size(n))
        }
        "mod" => {
            let Bson::Array(items) = arg else {
                return Err(MongoError::bad_value("malformed mod, needs to be an array"));
            };
            if items.len() < 2 {
                return Err(MongoError::bad_value("malformed mod, not enough elements"));
            }
            if items.len() > 2 {
                return Err(MongoError::bad_value("malformed mod, too many elements"));
            }
            let divisor = mod_arg(&items[0], "divisor")?;
            let remainder = mod_arg(&items[1], "remainder")?;
            if divisor == 0 {
                return Err(MongoError::bad_value("divisor cannot be 0"));
            }
            mk(Pred::Mod { divisor, remainder })
        }
        "all" => {
            let Bson::Array(items) = arg else {
                return Err(MongoError::bad_value("$all needs an array"));
            };
            if items.is_empty() {
                return Ok(Node::False);
            }
            let elem_matches = items
                .iter()
                .filter(|i| matches!(i, Bson::Document(d) if d.keys().next().map(String::as_str) == Some("$elemMatch")))
                .count();
            let mut children = Vec::with_capacity(items.len());
            if elem_matches > 0 {
                if elem_matches != items.len() {
                    return Err(MongoError::bad_value(
                        "$all/$elemMatch has to be consistent",
                    ));
                }
                for item in items {
                    if let Bson::Document(d) = item {
                        parse_ops(d, mk, &mut children)?;
                    }
                }
            } else {
                for item in items {
                    match item {
                        Bson::RegularExpression(r) => children.push(mk(Pred::Regex(Re::new(
                            r.pattern.as_str(),
                            r.options.as_str(),
                        )?))),
                        Bson::Document(d) if is_operator_doc(d) => {
                            return Err(MongoError::bad_value("no $ expressions in $all"));
                        }
                        other => children.push(mk(Pred::Eq(other.clone()))),
                    }
                }
            }
            Node::And(children)
        }
        "elemMatch" => {
            let Bson::Document(d) = arg else {
                return Err(MongoError::bad_value("$elemMatch needs an Object"));
            };
            let value_form = match d.keys().next() {
                Some(k) => {
                    is_operator_doc(d)
                        && !matches!(
                            k.as_str(),
                            "$and" | "$or" | "$nor" | "$expr" | "$where" | "$text" | "$comment"
                        )
                }
                None => false,
            };
            if value_form {
                let mut inner = Vec::new();
                parse_ops(d, &Node::Single, &mut inner)?;
                mk(Pred::ElemMatchValue(inner))
            } else {
                if d.contains_key("$where") {
                    return Err(MongoError::bad_value(
                        "$elemMatch cannot contain $where expression",
                    ));
                }
                mk(Pred::ElemMatchObject(Box::new(parse_filter(d, &[])?)))
            }
        }
        "bitsAllSet" | "bitsAnySet" | "bitsAllClear" | "bitsAnyClear" => {
            let test = match op {
                "bitsAllSet" => BitTest::AllSet,
                "bitsAnySet" => BitTest::AnySet,
                "bitsAllClear" => BitTest::AllClear,
                _ => BitTest::AnyClear,
            };
            mk(Pred::Bits {
                test,
                positions: bit_positions(op, arg)?,
            })
        }
        "comment" => Node::True,
        _ => return Err(MongoError::bad_value(format!("unknown operator: ${op}"))),
    })
}

/// The bit positions a `$bits*` argument names: a non-negative integral bitmask, an array of
/// non-negative positions, or BinData (little-endian bit order).
fn bit_positions(op: &str, arg: &Bson) -> Result<Vec<u32>> {
    let bad = |what: String| MongoError::bad_value(format!("${op}{what}"));
    match arg {
        Bson::Binary(b) => Ok(binary_positions(&b.bytes)),
        Bson::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for i in items {
                let n = value::as_i64_exact(i).ok_or_else(|| {
                    bad(format!(" bit positions must be an integer but got: {i}"))
                })?;
                if n < 0 {
                    return Err(bad(format!(" bit positions must be >= 0 but got: {n}")));
                }
                out.push(u32::try_from(n).unwrap_or(u32::MAX));
            }
            Ok(out)
        }
        n if value::is_number(n) => {
            let mask = value::as_i64_exact(n)
                .ok_or_else(|| bad(format!(" cannot represent as a 64-bit integer: {n}")))?;
            if mask < 0 {
                return Err(bad(format!(" cannot take a negative number: {mask}")));
            }
            Ok((0..63).filter(|b| mask & (1i64 << b) != 0).collect())
        }
        other => Err(bad(format!(
            " takes an Array, a number, or a BinData but received: {other}"
        ))),
    }
}

fn binary_positions(bytes: &[u8]) -> Vec<u32> {
    let mut out = Vec::new();
    for (i, byte) in bytes.iter().enumerate() {
        for bit in 0..8u32 {
            if byte & (1 << bit) != 0 {
                out.push(u32::try_from(i).unwrap_or(u32::MAX / 8).saturating_mul(8) + bit);
            }
        }
    }
    out
}

/// Whether bit `p` of a value is set: integral numbers in two's complement (sign-extended
/// beyond bit 63), BinData little-endian (zero beyond its length); `None` for other values.
fn bit_of(v: &Bson, p: u32) -> Option<bool> {
    match v {
        Bson::Binary(b) => {
            let byte = b
                .bytes
                .get(usize::try_from(p / 8).ok()?)
                .copied()
                .unwrap_or(0);
            Some(byte & (1 << (p % 8)) != 0)
        }
        n if value::is_number(n) => {
            let x = value::as_i64_exact(n)?;
            Some(if p >= 64 { x < 0 } else { x & (1i64 << p) != 0 })
        }
        _ => None,
    }
}

fn mod_arg(v: &Bson, what: &str) -> Result<i64> {
    if !value::is_number(v) {
        return Err(MongoError::bad_value(format!(
            "malformed mod, {what} not a number"
        )));
    }
    let d = value::as_f64(v).unwrap_or(f64::NAN);
    match v {
        Bson::Int32(i) => Ok(i64::from(*i)),
        Bson::Int64(i) => Ok(*i),
        _ if d.is_finite() && d.abs() < 9.2e18 => Ok(d.trunc() as i64),
        _ => Err(MongoError::bad_value(format!(
            "malformed mod, {what} value is invalid :: caused by :: {v}"
        ))),
    }
}

/// A `$type` argument: a type code, or `None` for the alias `"number"`.
fn parse_type_alias(v: &Bson) -> Result<Option<i32>> {
    match v {
        Bson::String(s) if s == "number" => Ok(None),
        Bson::String(s) => value::type_code_of_name(s)
            .map(Some)
            .ok_or_else(|| MongoError::bad_value(format!("Unknown type name alias: {s}"))),
        n if value::is_number(n) => {
            let code = value::as_i64_exact(n)
                .and_then(|c| i32::try_from(c).ok())
                .filter(|c| value::type_name_of_code(*c).is_some());
            code.map(Some)
                .ok_or_else(|| MongoError::bad_value(format!("Invalid numerical type code: {n}")))
        }
        _ => Err(MongoError::new(
            ErrorCode::TYPE_MISMATCH,
            "type must be represented as a number or a string",
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------------------------

fn eval_doc(node: &Node, doc: &Document, env: &Env) -> Result<bool> {
    Ok(match node {
        Node::And(v) => {
            for n in v {
                if !eval_doc(n, doc, env)? {
                    return Ok(false);
                }
            }
            true
        }
        Node::Or(v) => {
            for n in v {
                if eval_doc(n, doc, env)? {
                    return Ok(true);
                }
            }
            false
        }
        Node::Nor(v) => {
            for n in v {
                if eval_doc(n, doc, env)? {
                    return Ok(false);
                }
            }
            true
        }
        Node::Not(n) => !eval_doc(n, doc, env)?,
        Node::True => true,
        Node::False => false,
        Node::Expr(e) => value::truthy(&e.evaluate_in(doc, env)?.unwrap_or(Bson::Null)),
        Node::Schema(s) => s.matches(doc),
        Node::Path { parts, pred, .. } => {
            let (first, rest) = match parts.split_first() {
                Some(x) => x,
                None => return Ok(false),
            };
            walk(doc.get(first), rest, pred, env)?
        }
        // A value predicate against a whole document (only reachable through a document
        // element of a value-form `$elemMatch`).
        Node::Single(p) => pred_single(p, &Bson::Document(doc.clone()), env)?,
    })
}

/// Evaluates a value-form `$elemMatch` child against one element.
fn eval_single(node: &Node, v: &Bson, env: &Env) -> Result<bool> {
    Ok(match node {
        Node::And(ns) => {
            for n in ns {
                if !eval_single(n, v, env)? {
                    return Ok(false);
                }
            }
            true
        }
        Node::Or(ns) => {
            for n in ns {
                if eval_single(n, v, env)? {
                    return Ok(true);
                }
            }
            false
        }
        Node::Nor(ns) => {
            for n in ns {
                if eval_single(n, v, env)? {
                    return Ok(false);
                }
            }
            true
        }
        Node::Not(n) => !eval_single(n, v, env)?,
        Node::True => true,
        Node::False => false,
        Node::Single(p) => pred_single(p, v, env)?,
        Node::Expr(_) | Node::Path { .. } | Node::Schema(_) => match v {
            Bson::Document(d) => eval_doc(node, d, env)?,
            _ => false,
        },
    })
}

/// Follows the remaining path components from `v`, fanning out over arrays.
fn walk(v: Option<&Bson>, rest: &[String], pred: &Pred, env: &Env) -> Result<bool> {
    let Some((part, tail)) = rest.split_first() else {
        return leaf(v, pred, env);
    };
    match v {
        Some(Bson::Document(d)) => walk(d.get(part), tail, pred, env),
        Some(Bson::Array(arr)) => {
            if let Some(i) = value::array_index(part) {
                if walk(arr.get(i), tail, pred, env)? {
                    return Ok(true);
                }
                // Also look for documents with a field literally named like the index.
                for e in arr {
                    if let Bson::Document(d) = e
                        && let Some(c) = d.get(part)
                        && walk(Some(c), tail, pred, env)?
                    {
                        return Ok(true);
                    }
                }
                return Ok(false);
            }
            for e in arr {
                if let Bson::Document(d) = e
                    && walk(d.get(part), tail, pred, env)?
                {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        // A scalar (or nothing) in the middle of the path: the path is missing.
        _ => leaf(None, pred, env),
    }
}

fn leaf(v: Option<&Bson>, pred: &Pred, env: &Env) -> Result<bool> {
    match v {
        None => Ok(pred_missing(pred)),
        Some(whole @ Bson::Array(arr)) => match pred {
            Pred::Size(_) | Pred::ElemMatchObject(_) | Pred::ElemMatchValue(_) | Pred::Exists => {
                pred_single(pred, whole, env)
            }
            _ => {
                if pred_array_whole(pred, whole, env)? {
                    return Ok(true);
                }
                for e in arr {
                    if pred_single(pred, e, env)? {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
        },
        Some(v) => pred_single(pred, v, env),
    }
}

/// The whole-array test of a leaf array: only predicates whose operand can equal or order
/// against an array (array operands, MinKey/MaxKey bounds, `$type: "array"`) can hold.
fn pred_array_whole(pred: &Pred, whole: &Bson, env: &Env) -> Result<bool> {
    Ok(match pred {
        Pred::Eq(x) | Pred::Lt(x) | Pred::Lte(x) | Pred::Gt(x) | Pred::Gte(x) => {
            matches!(x, Bson::Array(_) | Bson::MinKey | Bson::MaxKey)
                && pred_single(pred, whole, env)?
        }
        Pred::In { values, .. } => values
            .iter()
            .any(|x| matches!(x, Bson::Array(_)) && env.equal(whole, x)),
        Pred::Type { codes, .. } => codes.contains(&4),
        _ => false,
    })
}

fn pred_missing(pred: &Pred) -> bool {
    match pred {
        Pred::Eq(Bson::Null) | Pred::Lte(Bson::Null) | Pred::Gte(Bson::Null) => true,
        Pred::In { values, .. } => values.iter().any(|v| matches!(v, Bson::Null)),
        _ => false,
    }
}

fn pred_single(pred: &Pred, v: &Bson, env: &Env) -> Result<bool> {
    // MongoDB 7.0: equality to null also holds for `undefined` (changed only in 8.0).
    let nullish = matches!(v, Bson::Null | Bson::Undefined);
    Ok(match pred {
        Pred::Eq(Bson::Null) | Pred::Lte(Bson::Null) | Pred::Gte(Bson::Null) if nullish => true,
        Pred::In { values, .. } if nullish && values.iter().any(|x| matches!(x, Bson::Null)) => {
            true
        }
        Pred::Eq(x) => env.equal(v, x),
        Pred::Lt(x) => ordered(v, x, env, |o| o.is_lt()),
        Pred::Lte(x) => ordered(v, x, env, |o| o.is_le()),
        Pred::Gt(x) => ordered(v, x, env, |o| o.is_gt()),
        Pred::Gte(x) => ordered(v, x, env, |o| o.is_ge()),
        Pred::In { values, regexes } => {
            values.iter().any(|x| env.equal(v, x)) || regexes.iter().any(|r| r.matches_value(v))
        }
        Pred::Exists => true,
        Pred::Type { codes, number } => {
            (*number && value::is_number(v)) || codes.contains(&value::type_code(v))
        }
        Pred::Regex(re) => re.matches_value(v),
        Pred::Mod { divisor, remainder } => {
            let n = match v {
                Bson::Int32(i) => Some(i64::from(*i)),
                Bson::Int64(i) => Some(*i),
                Bson::Double(_) | Bson::Decimal128(_) => value::as_f64(v)
                    .filter(|d| d.is_finite())
                    .map(|d| d.trunc() as i64),
                _ => None,
            };
            n.is_some_and(|n| n.wrapping_rem(*divisor) == *remainder)
        }
        Pred::Size(n) => matches!(v, Bson::Array(a) if i64::try_from(a.len()) == Ok(*n)),
        Pred::ElemMatchObject(node) => match v {
            Bson::Array(a) => {
                for e in a {
                    let hit = match e {
                        Bson::Document(d) => eval_doc(node, d, env)?,
                        _ => false,
                    };
                    if hit {
                        return Ok(true);
                    }
                }
                false
            }
            _ => false,
        },
        Pred::Bits { test, positions } => {
            if bit_of(v, 0).is_none() {
                return Ok(false);
            }
            let set = |p: &u32| bit_of(v, *p).unwrap_or(false);
            match test {
                BitTest::AllSet => positions.iter().all(set),
                BitTest::AnySet => positions.iter().any(set),
                BitTest::AllClear => !positions.iter().any(set),
                BitTest::AnyClear => !positions.iter().all(set),
            }
        }
        Pred::ElemMatchValue(nodes) => match v {
            Bson::Array(a) => {
                for e in a {
                    let mut all = true;
                    for n in nodes {
                        if !eval_single(n, e, env)? {
                            all = false;
                            break;
                        }
                    }
                    if all {
                        return Ok(true);
                    }
                }
                false
            }
            _ => false,
        },
    })
}

/// An ordering comparison under type bracketing: only values of the same canonical type
/// compare, except that `MinKey`/`MaxKey` bound everything; NaN is only `<=`/`>=` NaN.
/// Strings compare under the command's collation.
fn ordered(v: &Bson, rhs: &Bson, env: &Env, accept: fn(std::cmp::Ordering) -> bool) -> bool {
    let (tv, tr) = (value::canonical_type(v), value::canonical_type(rhs));
    if tv != tr {
        return match rhs {
            Bson::MinKey | Bson::MaxKey => accept(compare(v, rhs)),
            _ => false,
        };
    }
    let v_nan = value::as_f64(v).is_some_and(f64::is_nan);
    let r_nan = value::as_f64(rhs).is_some_and(f64::is_nan);
    if v_nan || r_nan {
        return v_nan && r_nan && accept(std::cmp::Ordering::Equal);
    }
    accept(env.compare(v, rhs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn m(filter: Document) -> Matcher {
        Matcher::parse(&filter).unwrap_or_else(|e| panic!("{filter}: {e}"))
    }

    /// (filter, document, expected)
    fn check(cases: &[(Document, Document, bool)]) {
        for (f, d, want) in cases {
            assert_eq!(m(f.clone()).matches(d), *want, "filter {f} on {d}");
        }
    }

    #[test]
    fn implicit_equality_and_comparisons() {
        check(&[
            (doc! {"a": 1}, doc! {"a": 1.0}, true),
            (doc! {"a": 1}, doc! {"a": 2}, false),
            (doc! {"a": 1}, doc! {"b": 1}, false),
            (doc! {"a": "x"}, doc! {"a": "x"}, true),
            (doc! {"a": {"$eq": 1i64}}, doc! {"a": 1}, true),
            (doc! {"a": {"$ne": 1}}, doc! {"a": 2}, true),
            (doc! {"a": {"$ne": 1}}, doc! {}, true),
            (doc! {"a": {"$gt": 1}}, doc! {"a": 2}, true),
            (doc! {"a": {"$gt": 1}}, doc! {"a": 1}, false),
            (doc! {"a": {"$gte": 1}}, doc! {"a": 1}, true),
            (doc! {"a": {"$lt": 1}}, doc! {"a": 0.5}, true),
            (doc! {"a": {"$lte": 1}}, doc! {"a": 1i64}, true),
            (doc! {"a": {"$gt": 1, "$lt": 3}}, doc! {"a": 2}, true),
            (doc! {"a": {"$gt": 1, "$lt": 3}}, doc! {"a": 3}, false),
            // type bracketing: strings are not greater than numbers here
            (doc! {"a": {"$gt": 1}}, doc! {"a": "z"}, false),
            (doc! {"a": {"$lt": "b"}}, doc! {"a": "a"}, true),
            (doc! {"a": {"$gt": Bson::MinKey}}, doc! {"a": "z"}, true),
            (
                doc! {"a": {"$lt": Bson::MaxKey}},
                doc! {"a": {"x": 1}},
                true,
            ),
            (doc! {"a": {"$gt": f64::NAN}}, doc! {"a": 1}, false),
            (doc! {"a": {"$gte": f64::NAN}}, doc! {"a": f64::NAN}, true),
            (doc! {"a": {"$lt": 5}}, doc! {"a": f64::NAN}, false),
            (doc! {"a": {"b": 1}}, doc! {"a": {"b": 1}}, true),
            (doc! {"a": {"b": 1}}, doc! {"a": {"b": 1, "c": 2}}, false),
            (
                doc! {"a": {"b": 1, "c": 2}},
                doc! {"a": {"c": 2, "b": 1}},
                false,
            ),
        ]);
    }

    #[test]
    fn null_matches_missing_null_and_undefined() {
        check(&[
            (doc! {"a": null}, doc! {}, true),
            (doc! {"a": null}, doc! {"a": null}, true),
            (doc! {"a": null}, doc! {"a": Bson::Undefined}, true),
            (
                doc! {"a": {"$in": [null]}},
                doc! {"a": Bson::Undefined},
                true,
            ),
            // jstests/core/null2.js
            (doc! {"a.b": null}, doc! {"a": [{"b": 5}]}, false),
            (doc! {"a.b": null}, doc! {"a": [{}]}, true),
            (doc! {"a.b": null}, doc! {"a": []}, false),
            (doc! {"a.b": null}, doc! {"a": [{}, {"b": 5}]}, true),
            (doc! {"a.b": null}, doc! {"a": [5, {"b": 5}]}, false),
            (
                doc! {"a": {"$elemMatch": {"b": null}}},
                doc! {"a": [{"c": 1}]},
                true,
            ),
            (
                doc! {"a": {"$elemMatch": {"b": null}}},
                doc! {"a": [1]},
                false,
            ),
            (doc! {"a": null}, doc! {"a": 0}, false),
            (doc! {"a": null}, doc! {"a": [1, null]}, true),
            (doc! {"a": null}, doc! {"a": [1, 2]}, false),
            (doc! {"a.b": null}, doc! {"a": 5}, true),
            (doc! {"a.b": null}, doc! {"a": [{"b": 1}, {"c": 1}]}, true),
            (doc! {"a.b": null}, doc! {"a": [{"b": 1}]}, false),
            (doc! {"a": {"$ne": null}}, doc! {}, false),
            (doc! {"a": {"$ne": null}}, doc! {"a": 1}, true),
            (doc! {"a": {"$gte": null}}, doc! {}, true),
            (doc! {"a": {"$gt": null}}, doc! {}, false),
            (doc! {"a": {"$in": [null, 5]}}, doc! {}, true),
        ]);
    }

    #[test]
    fn arrays_match_whole_or_by_element_and_paths_fan_out() {
        check(&[
            (doc! {"a": 2}, doc! {"a": [1, 2, 3]}, true),
            (doc! {"a": [1, 2]}, doc! {"a": [1, 2]}, true),
            (doc! {"a": [1, 2]}, doc! {"a": [[1, 2], 3]}, true),
            (doc! {"a": [1, 2]}, doc! {"a": [2, 1]}, false),
            (doc! {"a": 1}, doc! {"a": [[1]]}, false),
            (doc! {"a": {"$gt": 2}}, doc! {"a": [1, 3]}, true),
            (doc! {"a": {"$gt": 1, "$lt": 2}}, doc! {"a": [0, 3]}, true),
            (doc! {"a": {"$ne": 1}}, doc! {"a": [1, 2]}, false),
            (doc! {"a.b": 1}, doc! {"a": [{"b": 2}, {"b": 1}]}, true),
            (doc! {"a.b": 1}, doc! {"a": [{"b": [0, 1]}]}, true),
            (doc! {"a.b.c": 1}, doc! {"a": [{"b": [{"c": 1}]}]}, true),
            (doc! {"a.1": 5}, doc! {"a": [4, 5]}, true),
            (doc! {"a.1": 5}, doc! {"a": [5, 4]}, false),
            (doc! {"a.0.b": 1}, doc! {"a": [{"b": 1}]}, true),
            (doc! {"a.b": 1}, doc! {"a": [[{"b": 1}]]}, false),
            (doc! {"a": {"$gt": [1]}}, doc! {"a": [2]}, true),
        ]);
    }

    #[test]
    fn logical_operators() {
        check(&[
            (
                doc! {"$and": [{"a": 1}, {"b": 2}]},
                doc! {"a": 1, "b": 2},
                true,
            ),
            (
                doc! {"$and": [{"a": 1}, {"b": 2}]},
                doc! {"a": 1, "b": 3},
                false,
            ),
            (doc! {"$or": [{"a": 1}, {"b": 2}]}, doc! {"b": 2}, true),
            (doc! {"$or": [{"a": 1}, {"b": 2}]}, doc! {"c": 2}, false),
            (doc! {"$nor": [{"a": 1}, {"b": 2}]}, doc! {"c": 2}, true),
            (doc! {"$nor": [{"a": 1}]}, doc! {"a": 1}, false),
            (doc! {"a": {"$not": {"$gt": 5}}}, doc! {"a": 3}, true),
            (doc! {"a": {"$not": {"$gt": 5}}}, doc! {}, true),
            (doc! {"a": {"$not": {"$gt": 5}}}, doc! {"a": 6}, false),
            (doc! {"$alwaysTrue": 1}, doc! {}, true),
            (doc! {"$alwaysFalse": 1}, doc! {}, false),
            (doc! {"$comment": "hi", "a": 1}, doc! {"a": 1}, true),
            (doc! {}, doc! {"x": 1}, true),
        ]);
    }

    #[test]
    fn element_operators() {
        check(&[
            (doc! {"a": {"$exists": true}}, doc! {"a": null}, true),
            (doc! {"a": {"$exists": true}}, doc! {}, false),
            (doc! {"a": {"$exists": false}}, doc! {}, true),
            (doc! {"a": {"$exists": 0}}, doc! {"a": 1}, false),
            (
                doc! {"a.b": {"$exists": true}},
                doc! {"a": [{"c": 1}, {"b": 1}]},
                true,
            ),
            (doc! {"a": {"$type": "string"}}, doc! {"a": "x"}, true),
            (doc! {"a": {"$type": 2}}, doc! {"a": "x"}, true),
            (doc! {"a": {"$type": "number"}}, doc! {"a": 1i64}, true),
            (doc! {"a": {"$type": "number"}}, doc! {"a": "1"}, false),
            (
                doc! {"a": {"$type": ["int", "string"]}},
                doc! {"a": "1"},
                true,
            ),
            (doc! {"a": {"$type": "array"}}, doc! {"a": [1]}, true),
            (doc! {"a": {"$type": "array"}}, doc! {"a": 1}, false),
            (doc! {"a": {"$type": "int"}}, doc! {"a": [1.5, 2]}, true),
            (doc! {"a": {"$type": "null"}}, doc! {}, false),
        ]);
    }

    #[test]
    fn array_operators() {
        check(&[
            (doc! {"a": {"$all": [1, 2]}}, doc! {"a": [2, 3, 1]}, true),
            (doc! {"a": {"$all": [1, 4]}}, doc! {"a": [2, 3, 1]}, false),
            (doc! {"a": {"$all": [1]}}, doc! {"a": 1}, true),
            (doc! {"a": {"$all": []}}, doc! {"a": [1]}, false),
            (doc! {"a": {"$size": 2}}, doc! {"a": [1, 2]}, true),
            (doc! {"a": {"$size": 1}}, doc! {"a": [1, 2]}, false),
            (doc! {"a": {"$size": 0}}, doc! {}, false),
            (
                doc! {"a": {"$elemMatch": {"b": 1, "c": 2}}},
                doc! {"a": [{"b": 1}, {"c": 2}]},
                false,
            ),
            (
                doc! {"a": {"$elemMatch": {"b": 1, "c": 2}}},
                doc! {"a": [{"b": 1, "c": 2}]},
                true,
            ),
            (
                doc! {"a": {"$elemMatch": {"$gt": 1, "$lt": 3}}},
                doc! {"a": [0, 4]},
                false,
            ),
            (
                doc! {"a": {"$elemMatch": {"$gt": 1, "$lt": 3}}},
                doc! {"a": [0, 2]},
                true,
            ),
            (doc! {"a": {"$elemMatch": {"$gt": 1}}}, doc! {"a": 5}, false),
            (
                doc! {"a": {"$all": [{"$elemMatch": {"b": 1}}, {"$elemMatch": {"b": 2}}]}},
                doc! {"a": [{"b": 1}, {"b": 2}]},
                true,
            ),
            (doc! {"a": {"$in": [1, 2]}}, doc! {"a": 2}, true),
            (doc! {"a": {"$in": [1, 2]}}, doc! {"a": [5, 1]}, true),
            (doc! {"a": {"$in": []}}, doc! {"a": 1}, false),
            (doc! {"a": {"$nin": [1, 2]}}, doc! {"a": 3}, true),
            (doc! {"a": {"$nin": [1, 2]}}, doc! {"a": [3, 2]}, false),
            (doc! {"a": {"$nin": [1]}}, doc! {}, true),
        ]);
    }

    #[test]
    fn regex_and_mod() {
        check(&[
            (doc! {"a": {"$regex": "^ab"}}, doc! {"a": "abc"}, true),
            (doc! {"a": {"$regex": "^AB"}}, doc! {"a": "abc"}, false),
            (
                doc! {"a": {"$regex": "^AB", "$options": "i"}},
                doc! {"a": "abc"},
                true,
            ),
            (
                doc! {"a": Bson::RegularExpression(bson::Regex::from_strings_for_tests("b$", "m"))},
                doc! {"a": "ab\ncd"},
                true,
            ),
            (
                doc! {"a": {"$regex": "a.b", "$options": "s"}},
                doc! {"a": "a\nb"},
                true,
            ),
            (
                doc! {"a": {"$regex": "a b", "$options": "x"}},
                doc! {"a": "ab"},
                true,
            ),
            (doc! {"a": {"$regex": "b"}}, doc! {"a": ["x", "abc"]}, true),
            (doc! {"a": {"$regex": "1"}}, doc! {"a": 1}, false),
            (
                doc! {"a": {"$not": {"$regex": "^a"}}},
                doc! {"a": "b"},
                true,
            ),
            (
                doc! {"a": {"$in": [Bson::RegularExpression(bson::Regex::from_strings_for_tests("^z", ""))]}},
                doc! {"a": "zz"},
                true,
            ),
            (doc! {"a": {"$mod": [4, 1]}}, doc! {"a": 9}, true),
            (doc! {"a": {"$mod": [4, 1]}}, doc! {"a": 9.9}, true),
            (doc! {"a": {"$mod": [4, 1]}}, doc! {"a": 8}, false),
            (doc! {"a": {"$mod": [4, -1]}}, doc! {"a": -5}, true),
            (doc! {"a": {"$mod": [4, 0]}}, doc! {"a": "8"}, false),
        ]);
    }

    #[test]
    fn bitwise_operators() {
        check(&[
            (doc! {"a": {"$bitsAllSet": 5}}, doc! {"a": 7}, true),
            (doc! {"a": {"$bitsAllSet": 5}}, doc! {"a": 6}, false),
            (doc! {"a": {"$bitsAllSet": [0, 2]}}, doc! {"a": 5.0}, true),
            (doc! {"a": {"$bitsAnySet": [1, 3]}}, doc! {"a": 2}, true),
            (doc! {"a": {"$bitsAllClear": [1, 3]}}, doc! {"a": 5}, true),
            (doc! {"a": {"$bitsAnyClear": [0, 2]}}, doc! {"a": 5}, false),
            (doc! {"a": {"$bitsAllSet": [70]}}, doc! {"a": -1}, true),
            (doc! {"a": {"$bitsAllSet": 1}}, doc! {"a": 1.5}, false),
            (doc! {"a": {"$bitsAllSet": 1}}, doc! {"a": "1"}, false),
            (
                doc! {"a": {"$bitsAllSet": [9]}},
                doc! {"a": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![0, 2] }},
                true,
            ),
        ]);
        assert_eq!(
            Matcher::parse(&doc! {"a": {"$bitsAllSet": -1}})
                .unwrap_err()
                .code,
            2
        );
        assert_eq!(
            Matcher::parse(&doc! {"a": {"$bitsAllSet": "x"}})
                .unwrap_err()
                .code,
            2
        );
    }

    trait RegexForTests {
        fn from_strings_for_tests(p: &str, o: &str) -> bson::Regex;
    }
    impl RegexForTests for bson::Regex {
        fn from_strings_for_tests(p: &str, o: &str) -> bson::Regex {
            bson::Regex {
                pattern: p.try_into().unwrap(),
                options: o.try_into().unwrap(),
            }
        }
    }

    #[test]
    fn expr_uses_aggregation_expressions() {
        check(&[
            (
                doc! {"$expr": {"$gt": ["$a", "$b"]}},
                doc! {"a": 2, "b": 1},
                true,
            ),
            (
                doc! {"$expr": {"$gt": ["$a", "$b"]}},
                doc! {"a": 1, "b": 1},
                false,
            ),
            (
                doc! {"$expr": {"$eq": ["$a", null]}},
                doc! {"a": null},
                true,
            ),
            (doc! {"$expr": "$a"}, doc! {"a": 0}, false),
        ]);
    }

    #[test]
    fn a_regex_pattern_is_at_most_32764_bytes() {
        // The length is refused before anything is compiled (a pattern at the limit compiles,
        // but slowly in a debug build: the check is on the length alone).
        let e = Re::new(&"c".repeat(MAX_PATTERN_LEN + 1), "").expect_err("one byte more");
        assert_eq!(e.code, 51091);
        assert!(Re::new(&"c".repeat(1_000), "").is_ok());
    }

    #[test]
    fn parse_errors_carry_mongodb_codes() {
        let cases: &[(Document, i32, &str)] = &[
            (doc! {"a": {"$foo": 1}}, 2, "unknown operator: $foo"),
            (doc! {"$foo": 1}, 2, "unknown top level operator: $foo"),
            (doc! {"$and": 1}, 2, "$and must be an array"),
            (doc! {"$or": []}, 2, "nonempty"),
            (doc! {"$or": [1]}, 2, "full objects"),
            (doc! {"a": {"$in": 1}}, 2, "$in needs an array"),
            (doc! {"a": {"$nin": 1}}, 2, "$nin needs an array"),
            (
                doc! {"a": {"$regex": "("}},
                51091,
                "Regular expression is invalid",
            ),
            (
                doc! {"a": {"$regex": "c".repeat(MAX_PATTERN_LEN + 1)}},
                51091,
                "longer than the limit",
            ),
            (
                doc! {"a": {"$in": [Bson::RegularExpression(bson::Regex::from_strings_for_tests(
                    &"c".repeat(MAX_PATTERN_LEN + 1),
                    "",
                ))]}},
                51091,
                "longer than the limit",
            ),
            (
                doc! {"a": {"$regex": "a", "$options": "z"}},
                51108,
                "invalid flag",
            ),
            (doc! {"a": {"$options": "i"}}, 2, "$options needs a $regex"),
            (doc! {"a": {"$mod": [0, 1]}}, 2, "divisor cannot be 0"),
            (doc! {"a": {"$mod": [1]}}, 2, "not enough elements"),
            (doc! {"a": {"$size": "x"}}, 2, "$size"),
            (doc! {"a": {"$size": -1}}, 2, "$size"),
            (
                doc! {"a": {"$type": "nope"}},
                2,
                "Unknown type name alias: nope",
            ),
            (doc! {"a": {"$type": 99}}, 2, "Invalid numerical type code"),
            (
                doc! {"a": {"$not": 1}},
                2,
                "$not needs a regex or a document",
            ),
            (doc! {"a": {"$not": {}}}, 2, "$not cannot be empty"),
            (
                doc! {"a": {"$elemMatch": 1}},
                2,
                "$elemMatch needs an Object",
            ),
            (doc! {"a": {"$all": 1}}, 2, "$all needs an array"),
            (doc! {"a": {"$gt": 1, "b": 1}}, 2, "unknown operator: b"),
            (
                doc! {"$expr": {"$foo": 1}},
                168,
                "Unrecognized expression '$foo'",
            ),
        ];
        for (f, code, msg) in cases {
            let e = Matcher::parse(f).expect_err(&format!("{f} should fail"));
            assert_eq!(e.code, *code, "{f}: {e}");
            assert!(e.errmsg.contains(msg), "{f}: {e}");
        }
    }

    #[test]
    fn referenced_paths_lists_every_leaf_path() {
        let f = m(doc! {"a.b": 1, "$or": [{"c": {"$gt": 1}}, {"d": {"$elemMatch": {"e": 1}}}]});
        let want: BTreeSet<String> = ["a.b", "c", "d"].iter().map(|s| s.to_string()).collect();
        assert_eq!(f.referenced_paths(), Some(want));
        let f = m(doc! {"$expr": {"$eq": ["$x.y", 1]}});
        assert_eq!(
            f.referenced_paths(),
            Some(BTreeSet::from(["x.y".to_string()]))
        );
        let f = m(doc! {"$expr": {"$eq": ["$$ROOT", {}]}});
        assert_eq!(f.referenced_paths(), None);
    }
}
