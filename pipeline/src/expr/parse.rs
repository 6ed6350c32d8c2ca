//! Parsing: BSON into the expression tree ([`Node`]), once per expression.
//!
//! Invariants: an expression's shape is checked here, once, with MongoDB's codes: operator
//! names (168), arities (16020), each operator's named arguments, field paths and variable
//! names; a `$$name` is in scope exactly where `$let`, `$map`, `$filter` or `$reduce` binds it,
//! or where the caller's variables are (17276 elsewhere). An array of constants folds into one
//! constant.

use bson::{Bson, Document};
use wire::ErrorCode;

use super::{Node, Op, RegexOp, TrimKind, Var, err, no_javascript};
use crate::value::type_name;
use crate::{MongoError, Result};

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
    ("log", Op::Log, 2, 2),
    ("sin", Op::Sin, 1, 1),
    ("cos", Op::Cos, 1, 1),
    ("tan", Op::Tan, 1, 1),
    ("asin", Op::Asin, 1, 1),
    ("acos", Op::Acos, 1, 1),
    ("atan", Op::Atan, 1, 1),
    ("atan2", Op::Atan2, 2, 2),
    ("sinh", Op::Sinh, 1, 1),
    ("cosh", Op::Cosh, 1, 1),
    ("tanh", Op::Tanh, 1, 1),
    ("asinh", Op::Asinh, 1, 1),
    ("acosh", Op::Acosh, 1, 1),
    ("atanh", Op::Atanh, 1, 1),
    ("degreesToRadians", Op::DegreesToRadians, 1, 1),
    ("radiansToDegrees", Op::RadiansToDegrees, 1, 1),
    ("bitAnd", Op::BitAnd, 0, usize::MAX),
    ("bitOr", Op::BitOr, 0, usize::MAX),
    ("bitXor", Op::BitXor, 0, usize::MAX),
    ("bitNot", Op::BitNot, 1, 1),
    ("tsSecond", Op::TsSecond, 1, 1),
    ("tsIncrement", Op::TsIncrement, 1, 1),
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

/// Names in scope while parsing (user variables).
struct Scope {
    names: Vec<String>,
}

/// The tree of `v`, where `vars` (e.g. a command's `let`) are defined.
pub(super) fn parse(v: &Bson, vars: &[String]) -> Result<Node> {
    let mut scope = Scope {
        names: vars.to_vec(),
    };
    parse_node(v, &mut scope)
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
        "literal" => Ok(Node::Literal(arg.clone())),
        "rand" => match arg {
            Bson::Document(d) if d.is_empty() => Ok(Node::Rand),
            _ => Err(err(10065, "invalid parameter: expected an object ($rand)")),
        },
        "and" => Ok(Node::And(parse_args(arg, scope)?)),
        "or" => Ok(Node::Or(parse_args(arg, scope)?)),
        "ifNull" => parse_if_null(arg, scope),
        "cond" => parse_cond(name, arg, scope),
        "switch" => parse_switch(arg, scope),
        "let" => parse_let(name, arg, scope),
        "map" => parse_map(name, arg, scope),
        "filter" => parse_filter(name, arg, scope),
        "reduce" => parse_reduce(name, arg, scope),
        "convert" => parse_convert(name, arg, scope),
        "trim" | "ltrim" | "rtrim" => parse_trim(name, op, arg, scope),
        "dateToString" => parse_date_to_string(name, arg, scope),
        "regexMatch" | "regexFind" | "regexFindAll" => parse_regex(name, op, arg, scope),
        "getField" => parse_get_field(name, arg, scope),
        "setField" | "unsetField" => parse_set_field(name, op, arg, scope),
        _ => parse_call(name, op, arg, scope),
    }
}

/// `$ifNull`: at least two arguments.
fn parse_if_null(arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let args = parse_args(arg, scope)?;
    if args.len() < 2 {
        return Err(err(
            1257300,
            "$ifNull needs at least two arguments, had: ".to_string() + &args.len().to_string(),
        ));
    }
    Ok(Node::IfNull(args))
}

/// `$cond`: `[if, then, else]` or `{if, then, else}`.
fn parse_cond(name: &str, arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let (i, t, e) = match arg {
        Bson::Document(_) => {
            let a = named_args(name, arg, &["if", "then", "else"], (17083, ""), 17083)?;
            let i = get(&a, "if").ok_or_else(|| err(17080, "Missing 'if' parameter to $cond"))?;
            let t =
                get(&a, "then").ok_or_else(|| err(17081, "Missing 'then' parameter to $cond"))?;
            let e =
                get(&a, "else").ok_or_else(|| err(17082, "Missing 'else' parameter to $cond"))?;
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
    Ok(Node::Cond(Box::new((
        parse_node(i, scope)?,
        parse_node(t, scope)?,
        parse_node(e, scope)?,
    ))))
}

/// `$switch`: `{branches: [{case, then}, ...], default}`.
fn parse_switch(arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let Bson::Document(d) = arg else {
        return Err(err(
            40060,
            "$switch requires an object as an argument, found: ".to_string() + type_name(arg),
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
    Ok(Node::Switch { branches, default })
}

/// `$let`: `{vars, in}`, the variables in scope in `in` only.
fn parse_let(name: &str, arg: &Bson, scope: &mut Scope) -> Result<Node> {
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
    Ok(Node::Let {
        vars: parsed,
        body: Box::new(body),
    })
}

/// `$map`: `{input, as, in}`.
fn parse_map(name: &str, arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let a = named_args(
        name,
        arg,
        &["input", "as", "in"],
        (16878, "$map only supports an object as its argument"),
        16879,
    )?;
    let input = get(&a, "input").ok_or_else(|| err(16880, "Missing 'input' parameter to $map"))?;
    let var = var_name_arg(get(&a, "as"))?;
    let body = get(&a, "in").ok_or_else(|| err(16882, "Missing 'in' parameter to $map"))?;
    let input = parse_node(input, scope)?;
    let body = with_vars(scope, &[var.as_str()], |s| parse_node(body, s))?;
    Ok(Node::Map {
        input: Box::new(input),
        name: var,
        body: Box::new(body),
    })
}

/// `$filter`: `{input, as, cond, limit}`.
fn parse_filter(name: &str, arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let a = named_args(
        name,
        arg,
        &["input", "as", "cond", "limit"],
        (28646, "$filter only supports an object as its argument"),
        28647,
    )?;
    let input =
        get(&a, "input").ok_or_else(|| err(28648, "Missing 'input' parameter to $filter"))?;
    let var = var_name_arg(get(&a, "as"))?;
    let cond = get(&a, "cond").ok_or_else(|| err(28650, "Missing 'cond' parameter to $filter"))?;
    let input = parse_node(input, scope)?;
    let limit = get(&a, "limit").map(|l| parse_node(l, scope)).transpose()?;
    let cond = with_vars(scope, &[var.as_str()], |s| parse_node(cond, s))?;
    Ok(Node::Filter {
        input: Box::new(input),
        name: var,
        cond: Box::new(cond),
        limit: limit.map(Box::new),
    })
}

/// `$reduce`: `{input, initialValue, in}`, with `$$value` and `$$this` in scope in `in`.
fn parse_reduce(name: &str, arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let a = named_args(
        name,
        arg,
        &["input", "initialValue", "in"],
        (40075, "$reduce requires an object as an argument"),
        40076,
    )?;
    let input =
        get(&a, "input").ok_or_else(|| err(40077, "$reduce requires 'input' to be specified"))?;
    let initial = get(&a, "initialValue")
        .ok_or_else(|| err(40078, "$reduce requires 'initialValue' to be specified"))?;
    let body = get(&a, "in").ok_or_else(|| err(40079, "$reduce requires 'in' to be specified"))?;
    let input = parse_node(input, scope)?;
    let initial = parse_node(initial, scope)?;
    let body = with_vars(scope, &["value", "this"], |s| parse_node(body, s))?;
    Ok(Node::Reduce {
        input: Box::new(input),
        initial: Box::new(initial),
        body: Box::new(body),
    })
}

/// `$convert`: `{input, to, onError, onNull}`.
fn parse_convert(name: &str, arg: &Bson, scope: &mut Scope) -> Result<Node> {
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
    let input = get(&a, "input")
        .ok_or_else(|| MongoError::failed_to_parse("Missing 'input' parameter to $convert"))?;
    let to = get(&a, "to")
        .ok_or_else(|| MongoError::failed_to_parse("Missing 'to' parameter to $convert"))?;
    Ok(Node::Convert {
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
    })
}

/// `$trim`, `$ltrim`, `$rtrim`: `{input, chars}`.
fn parse_trim(name: &str, op: &str, arg: &Bson, scope: &mut Scope) -> Result<Node> {
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
    let input =
        get(&a, "input").ok_or_else(|| err(50695, format!("{name} requires an 'input' field")))?;
    Ok(Node::Trim {
        kind,
        input: Box::new(parse_node(input, scope)?),
        chars: get(&a, "chars")
            .map(|c| parse_node(c, scope))
            .transpose()?
            .map(Box::new),
    })
}

/// `$dateToString`: `{format, date, timezone, onNull}`.
fn parse_date_to_string(name: &str, arg: &Bson, scope: &mut Scope) -> Result<Node> {
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
    let date =
        get(&a, "date").ok_or_else(|| err(18628, "Missing 'date' parameter to $dateToString"))?;
    let opt = |k: &str, scope: &mut Scope| -> Result<Option<Box<Node>>> {
        Ok(get(&a, k)
            .map(|n| parse_node(n, scope))
            .transpose()?
            .map(Box::new))
    };
    Ok(Node::DateToString {
        format: opt("format", scope)?,
        date: Box::new(parse_node(date, scope)?),
        timezone: opt("timezone", scope)?,
        on_null: opt("onNull", scope)?,
    })
}

/// `$regexMatch`, `$regexFind`, `$regexFindAll`: `{input, regex, options}`.
fn parse_regex(name: &str, op: &str, arg: &Bson, scope: &mut Scope) -> Result<Node> {
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
    let input =
        get(&a, "input").ok_or_else(|| err(31022, format!("{name} requires 'input' parameter")))?;
    let regex =
        get(&a, "regex").ok_or_else(|| err(31023, format!("{name} requires 'regex' parameter")))?;
    Ok(Node::Regex {
        kind,
        input: Box::new(parse_node(input, scope)?),
        regex: Box::new(parse_node(regex, scope)?),
        options: get(&a, "options")
            .map(|n| parse_node(n, scope))
            .transpose()?
            .map(Box::new),
    })
}

/// `$getField`: `{field, input}`, or the field alone (of `$$CURRENT`); the field a constant.
fn parse_get_field(name: &str, arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let (field, input) = match arg {
        Bson::Document(_) => {
            let a = named_args(name, arg, &["field", "input"], (3041703, ""), 3041701)?;
            let f = get(&a, "field")
                .ok_or_else(|| err(3041702, "$getField requires 'field' to be specified"))?;
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
    Ok(Node::GetField {
        field: field.to_string(),
        input: Box::new(input),
    })
}

/// `$setField` (`{field, input, value}`) and `$unsetField` (`{field, input}`); the field a
/// constant.
fn parse_set_field(name: &str, op: &str, arg: &Bson, scope: &mut Scope) -> Result<Node> {
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
    Ok(Node::SetField {
        field: field.to_string(),
        input: Box::new(parse_node(input, scope)?),
        value,
    })
}

/// An operator whose arguments are all evaluated before it runs ([`Op`]): its arity checked.
fn parse_call(name: &str, op: &str, arg: &Bson, scope: &mut Scope) -> Result<Node> {
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
pub(super) fn op_name(op: Op) -> String {
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
