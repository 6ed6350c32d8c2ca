//! String operators: `$concat`, `$substr`/`$substrBytes`, `$substrCP`, `$toLower`,
//! `$toUpper`, `$strLenBytes`, `$strLenCP`, `$split`, `$indexOfBytes`, `$indexOfCP`,
//! `$strcasecmp`, `$trim`/`$ltrim`/`$rtrim`, and the regular-expression ones (`$regexMatch`,
//! `$regexFind`, `$regexFindAll`).
//!
//! Invariants: a byte range never splits a UTF-8 character (`$substrBytes` refuses one,
//! 28656/28657); code-point operators count `char`s, and `$regexFind`'s `idx` is in code
//! points; case mapping and `$strcasecmp` are ASCII-only, as MongoDB's are; `$concat` stays
//! within 16 MiB, checked before the bytes are allocated (16493).

use std::cmp::Ordering;

use bson::Bson;

use super::dates::{ISO_DATE_FORMAT, format_date};
use super::{
    Cx, MAX_VALUE_BYTES, Node, Op, RegexOp, TrimKind, arg, err, eval, int_arg, int_result,
    is_nullish, missing_name,
};
use crate::Result;
use crate::re::Re;
use crate::value::{self, type_name};

/// `$concat`.
pub(super) fn concat(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let mut s = String::new();
    for v in a {
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
    Ok(Some(Bson::String(s)))
}

/// `$substr` and `$substrBytes`: a byte range.
pub(super) fn substr_bytes(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let s = coerce_string(&arg(a, 0))?;
    let start = match arg(a, 1) {
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
    let len = match arg(a, 2) {
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
    Ok(Some(Bson::String(
        s.get(start..end).unwrap_or("").to_string(),
    )))
}

/// `$substrCP`: a range of code points.
pub(super) fn substr_cp(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let s = coerce_string(&arg(a, 0))?;
    let start = match arg(a, 1) {
        Some(n) if value::is_number(&n) => value::as_i64_exact(&n).ok_or_else(|| {
            err(
                34452,
                "$substrCP: starting index cannot be represented as a 32-bit integral value",
            )
        })?,
        other => {
            return Err(err(
                34450,
                format!(
                    "$substrCP: starting index must be a numeric type (is BSON type {})",
                    missing_name(&other)
                ),
            ));
        }
    };
    let len = match arg(a, 2) {
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
    Ok(Some(Bson::String(r)))
}

/// `$toLower`.
pub(super) fn to_lower(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    Ok(Some(Bson::String(
        coerce_string(&arg(a, 0))?.to_ascii_lowercase(),
    )))
}

/// `$toUpper`.
pub(super) fn to_upper(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    Ok(Some(Bson::String(
        coerce_string(&arg(a, 0))?.to_ascii_uppercase(),
    )))
}

/// `$strLenBytes`.
pub(super) fn str_len_bytes(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let s = expect_string("$strLenBytes", &arg(a, 0), 34473)?;
    Ok(Some(int_result(i64::try_from(s.len()).unwrap_or(i64::MAX))))
}

/// `$strLenCP`.
pub(super) fn str_len_cp(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let s = expect_string("$strLenCP", &arg(a, 0), 34471)?;
    Ok(Some(int_result(
        i64::try_from(s.chars().count()).unwrap_or(i64::MAX),
    )))
}

/// `$split`.
pub(super) fn split(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let (x, y) = (arg(a, 0), arg(a, 1));
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
    Ok(Some(Bson::Array(
        s.split(d.as_str())
            .map(|p| Bson::String(p.to_string()))
            .collect(),
    )))
}

/// `$indexOfBytes` and `$indexOfCP`: -1 when not found.
pub(super) fn index_of(op: Op, a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let name = if op == Op::IndexOfBytes {
        "$indexOfBytes"
    } else {
        "$indexOfCP"
    };
    let x = arg(a, 0);
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
    let y = arg(a, 1);
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
    Ok(Some(int_result(found)))
}

/// `$strcasecmp`: -1, 0 or 1.
pub(super) fn strcasecmp(a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let x = coerce_string(&arg(a, 0))?.to_ascii_lowercase();
    let y = coerce_string(&arg(a, 1))?.to_ascii_lowercase();
    Ok(Some(Bson::Int32(match x.cmp(&y) {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    })))
}

/// `$trim`, `$ltrim` and `$rtrim`: by default, the whitespace MongoDB trims (Unicode's).
pub(super) fn eval_trim(
    kind: TrimKind,
    input: &Node,
    chars: Option<&Node>,
    cx: &mut Cx<'_>,
) -> Result<Option<Bson>> {
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
            '\0', ' ', '\t', '\n', '\u{0B}', '\u{0C}', '\r', '\u{A0}', '\u{1680}', '\u{2000}',
            '\u{2001}', '\u{2002}', '\u{2003}', '\u{2004}', '\u{2005}', '\u{2006}', '\u{2007}',
            '\u{2008}', '\u{2009}', '\u{200A}', '\u{2028}', '\u{2029}', '\u{202F}', '\u{205F}',
            '\u{3000}',
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
    Ok(Some(Bson::String(r.to_string())))
}

/// `$regexMatch`, `$regexFind` and `$regexFindAll`.
pub(super) fn eval_regex(
    kind: RegexOp,
    input: &Node,
    regex: &Node,
    options: Option<&Node>,
    cx: &mut Cx<'_>,
) -> Result<Option<Bson>> {
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
    let re = Re::new(&pattern, &flags)?;
    regex_eval(kind, &re, &text)
}

/// A string an expression makes may not pass 16 MiB (MongoDB's 16493), checked before the
/// bytes are allocated.
fn check_string_growth(len: usize, more: usize) -> Result<()> {
    if len.saturating_add(more) > MAX_VALUE_BYTES {
        return Err(err(16493, "Tried to create string longer than 16MB"));
    }
    Ok(())
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
pub(super) fn coerce_string(v: &Option<Bson>) -> Result<String> {
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

fn regex_eval(kind: RegexOp, re: &Re, text: &str) -> Result<Option<Bson>> {
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
