//! `$setWindowFields`: window functions computed over partitions of the input.
//!
//! Semantics (MongoDB 7.0):
//! * Documents are grouped by `partitionBy` (an expression; missing is `null`, an array is
//!   TypeMismatch) and sorted within a partition by `sortBy`; output is partition after
//!   partition (partitions in `partitionBy` order), each sorted by `sortBy`. Both sorts are
//!   stable, so equal documents keep their input order.
//! * Every output field is computed from the documents as they came in (outputs do not see each
//!   other) and then set on the document by dotted path; a missing result removes the field.
//! * A window is `documents: [l, u]` (positions relative to the current document) or
//!   `range: [l, u]` (sortBy values within `[v + l, v + u]`; with `unit`, dates moved by whole
//!   units); either bound may be `"unbounded"` or `"current"`. Without `window` the window is
//!   the whole partition. Document windows other than the whole partition need a `sortBy`
//!   (5339901); range windows need a single ascending sortBy field (5339902, 8947401) whose
//!   values are numbers (5429414; dates need a `unit`, 5429413) or, with `unit`, dates (5429513).
//! * `$sum $count` over an empty window are 0, `$avg $min $max $first $last $stdDev*` null,
//!   (`$first`/`$last` of a document whose value is missing leave the field unset),
//!   `$push $addToSet` `[]`; `$addToSet` yields its values in ascending order. Non-numbers are
//!   ignored by `$sum $avg $stdDev*`, null and missing by `$min $max`, missing by `$push`.
//! * `$rank $denseRank $documentNumber` take `{}`, no window, and a single-field sortBy; ranks
//!   of documents with equal sort values are equal. `$shift` reads `output` from the document
//!   `by` positions away in the partition, else `default` (null). `$locf` carries the last
//!   non-null value forward; `$linearFill` interpolates nulls between the surrounding non-null
//!   values along the single sortBy field. `$derivative` and `$integral` use the sortBy field
//!   as the x axis (milliseconds divided by `unit` for dates). `$expMovingAvg` (sortBy required)
//!   smooths numbers with `alpha` (or `2 / (N + 1)`); `$covariancePop`/`$covarianceSamp` take
//!   `[x, y]` and ignore pairs that are not two numbers.
//! * Other MongoDB window functions are CommandNotSupported (115); unknown names FailedToParse.

use std::collections::BTreeMap;
use std::sync::Arc;

use bson::{Bson, Document};

use super::GroupKey;
use super::spill::{Compare, Purpose, Sorted, Sorter, Spool, Spooled};
use super::time_unit::TimeUnit;
use crate::expr::{Env, Expr};
use crate::sort::SortSpec;
use crate::value::{self, compare, type_name};
use crate::{MongoError, Result};

/// A parsed `$setWindowFields` stage.
#[derive(Debug, Clone)]
pub struct SetWindowFields {
    partition: Partition,
    sort_by: Option<SortSpec>,
    outputs: Vec<(String, Func)>,
}

/// How documents are partitioned.
#[derive(Debug, Clone)]
pub(super) enum Partition {
    None,
    Expr(Expr),
    /// `$fill`'s `partitionByFields`: the key is the document of those fields.
    Fields(Vec<String>),
}

/// One window function.
#[derive(Debug, Clone)]
pub(super) enum Func {
    Acc {
        kind: AccKind,
        input: Expr,
        bounds: Bounds,
    },
    Rank(RankKind),
    Shift {
        output: Expr,
        by: i64,
        default: Bson,
    },
    Locf(Expr),
    LinearFill(Expr),
    Derivative {
        input: Expr,
        unit: Option<TimeUnit>,
        bounds: Bounds,
    },
    Integral {
        input: Expr,
        unit: Option<TimeUnit>,
        bounds: Bounds,
    },
    /// `$expMovingAvg` with its smoothing factor (`2 / (N + 1)` or `alpha`).
    ExpMovingAvg {
        input: Expr,
        alpha: f64,
    },
    /// `$covariancePop` / `$covarianceSamp` of `[x, y]` pairs.
    Covariance {
        input: Expr,
        bounds: Bounds,
        sample: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AccKind {
    Sum,
    Avg,
    Min,
    Max,
    First,
    Last,
    Push,
    AddToSet,
    StdDevPop,
    StdDevSamp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RankKind {
    Rank,
    DenseRank,
    DocumentNumber,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Bound<T> {
    Unbounded,
    Current,
    At(T),
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Bounds {
    Documents(Bound<i64>, Bound<i64>),
    Range(Bound<Bson>, Bound<Bson>, Option<TimeUnit>),
}

impl Bounds {
    fn whole() -> Bounds {
        Bounds::Documents(Bound::Unbounded, Bound::Unbounded)
    }
}

/// MongoDB window functions this server knows by name but does not compute.
const UNSUPPORTED_FUNCTIONS: &[&str] = &[
    "$mergeObjects",
    "$concatArrays",
    "$setUnion",
    "$minN",
    "$maxN",
    "$firstN",
    "$lastN",
    "$topN",
    "$bottomN",
    "$top",
    "$bottom",
    "$percentile",
    "$median",
    "$minMaxScalar",
];

fn parse_err(msg: impl Into<String>) -> MongoError {
    MongoError::failed_to_parse(msg)
}

/// Checks an output (or densify/fill) field path as MongoDB's `FieldPath` does.
pub(super) fn check_field_path(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(MongoError::with_code(
            40352,
            "FieldPath cannot be constructed with empty string",
        ));
    }
    if name.starts_with('$') {
        return Err(MongoError::with_code(
            16410,
            "FieldPath field names may not start with '$'. Consider using $getField or $setField.",
        ));
    }
    if name.split('.').any(str::is_empty) {
        return Err(MongoError::with_code(
            15998,
            "FieldPath field names may not be empty strings.",
        ));
    }
    Ok(())
}

impl SetWindowFields {
    /// Parses the stage's argument.
    pub fn parse(arg: &Bson, vars: &[String]) -> Result<SetWindowFields> {
        let Bson::Document(d) = arg else {
            return Err(parse_err(format!(
                "the $setWindowFields stage specification must be an object, found {}",
                type_name(arg)
            )));
        };
        let (mut partition, mut sort_by, mut output) = (Partition::None, None, None);
        for (k, v) in d {
            match k.as_str() {
                "partitionBy" => {
                    let e = Expr::parse_with_vars(v, vars)?;
                    if matches!(e.as_literal(), Some(Bson::Array(_))) {
                        return Err(MongoError::type_mismatch(
                            "An expression used to partition cannot evaluate to value of type array",
                        ));
                    }
                    partition = Partition::Expr(e);
                }
                "sortBy" => match v {
                    Bson::Document(s) => sort_by = Some(SortSpec::parse(s)?),
                    other => return Err(wrong_type("sortBy", other)),
                },
                "output" => match v {
                    Bson::Document(o) => output = Some(o),
                    other => return Err(wrong_type("output", other)),
                },
                other => {
                    return Err(MongoError::with_code(
                        40415,
                        format!("BSON field '$setWindowFields.{other}' is an unknown field."),
                    ));
                }
            }
        }
        let output = output.ok_or_else(|| {
            MongoError::with_code(
                40414,
                "BSON field '$setWindowFields.output' is missing but a required field",
            )
        })?;
        let mut outputs = Vec::with_capacity(output.len());
        for (name, spec) in output {
            let Bson::Document(spec) = spec else {
                return Err(parse_err(format!("The field '{name}' must be an object")));
            };
            check_field_path(name)?;
            outputs.push((name.clone(), parse_function(spec, sort_by.as_ref(), vars)?));
        }
        Ok(SetWindowFields {
            partition,
            sort_by,
            outputs,
        })
    }

    /// A stage built by `$fill` (already validated).
    pub(super) fn from_parts(
        partition: Partition,
        sort_by: Option<SortSpec>,
        outputs: Vec<(String, Func)>,
    ) -> SetWindowFields {
        SetWindowFields {
            partition,
            sort_by,
            outputs,
        }
    }

    /// Runs the stage over a batch.
    pub fn run(&self, docs: Vec<Document>, env: &Env) -> Result<Vec<Document>> {
        // Partitions and the window order compare strings under the command's collation.
        let sort_by = self
            .sort_by
            .clone()
            .map(|s| s.with_collation(env.collation.clone()));
        let mut keyed = Vec::with_capacity(docs.len());
        for (i, d) in docs.iter().enumerate() {
            let part = self.partition_key(d, env)?;
            let sort = sort_by.as_ref().map(|s| s.sort_key(d)).unwrap_or_default();
            keyed.push((part, sort, i));
        }
        keyed.sort_by(|(pa, sa, ia), (pb, sb, ib)| {
            env.compare(pa, pb)
                .then_with(|| match &sort_by {
                    Some(s) => s.compare_keys(sa, sb),
                    None => std::cmp::Ordering::Equal,
                })
                .then(ia.cmp(ib))
        });
        let mut slots: Vec<Option<Document>> = docs.into_iter().map(Some).collect();
        let mut out = Vec::with_capacity(slots.len());
        let mut start = 0;
        while start < keyed.len() {
            let mut end = start + 1;
            while end < keyed.len()
                && keyed
                    .get(start)
                    .zip(keyed.get(end))
                    .is_some_and(|(a, b)| env.equal(&a.0, &b.0))
            {
                end += 1;
            }
            let mut part = Vec::with_capacity(end - start);
            let mut keys = Vec::with_capacity(end - start);
            for (_, sort, i) in keyed.get(start..end).unwrap_or_default() {
                if let Some(d) = slots.get_mut(*i).and_then(Option::take) {
                    part.push(d);
                    keys.push(sort.first().cloned().unwrap_or(Bson::Null));
                }
            }
            self.partition_output(part, keys, env, &mut out)?;
            start = end;
        }
        Ok(out)
    }

    /// One partition's documents (sorted, with their first sort values) with the outputs set.
    fn partition_output(
        &self,
        part: Vec<Document>,
        keys: Vec<Bson>,
        env: &Env,
        out: &mut Vec<Document>,
    ) -> Result<()> {
        let mut gathered = Gathered::new(self, false);
        for (d, key) in part.iter().zip(keys) {
            gathered.add(d, key, env)?;
        }
        let mut columns = gathered.columns()?;
        for mut d in part {
            self.set_outputs(&mut d, &mut columns, env);
            out.push(d);
        }
        Ok(())
    }

    /// Sets each output on the next document of a partition from the functions' columns: a
    /// missing value removes the field.
    fn set_outputs(&self, d: &mut Document, columns: &mut [Column], env: &Env) {
        for ((path, _), column) in self.outputs.iter().zip(columns) {
            match column.next(env) {
                Some(v) => {
                    value::set_path(d, path, v);
                }
                None => {
                    value::remove_path(d, path);
                }
            }
        }
    }

    fn partition_key(&self, d: &Document, env: &Env) -> Result<Bson> {
        match &self.partition {
            Partition::None => Ok(Bson::Null),
            Partition::Expr(e) => match e.evaluate_in(d, env)? {
                None | Some(Bson::Undefined) => Ok(Bson::Null),
                Some(Bson::Array(_)) => Err(MongoError::type_mismatch(
                    "An expression used to partition cannot evaluate to value of type array",
                )),
                Some(v) => Ok(v),
            },
            Partition::Fields(fields) => {
                let mut key = Document::new();
                for f in fields {
                    match value::get_path(d, f) {
                        Some(Bson::Array(_)) => {
                            return Err(MongoError::type_mismatch(
                                "An expression used to partition cannot evaluate to value of type array",
                            ));
                        }
                        Some(v) => {
                            key.insert(f.clone(), v.clone());
                        }
                        None => {}
                    }
                }
                Ok(Bson::Document(key))
            }
        }
    }
}

fn wrong_type(field: &str, v: &Bson) -> MongoError {
    MongoError::type_mismatch(format!(
        "BSON field '$setWindowFields.{field}' is the wrong type '{}', expected type 'object'",
        type_name(v)
    ))
}

/// Parses one output field's window-function specification.
pub(super) fn parse_function(
    spec: &Document,
    sort_by: Option<&SortSpec>,
    vars: &[String],
) -> Result<Func> {
    let Some(name) = spec.keys().find(|k| k.starts_with('$')).cloned() else {
        return Err(parse_err(match spec.keys().next() {
            Some(first) => format!("Expected a $-prefixed window function, {first}"),
            None => "Expected a $-prefixed window function".to_string(),
        }));
    };
    if UNSUPPORTED_FUNCTIONS.contains(&name.as_str()) {
        return Err(MongoError::new(
            wire::ErrorCode::COMMAND_NOT_SUPPORTED,
            format!("Window function {name} is not supported by this server"),
        ));
    }
    let kind = match name.as_str() {
        "$sum" | "$count" => Some(AccKind::Sum),
        "$avg" => Some(AccKind::Avg),
        "$min" => Some(AccKind::Min),
        "$max" => Some(AccKind::Max),
        "$first" => Some(AccKind::First),
        "$last" => Some(AccKind::Last),
        "$push" => Some(AccKind::Push),
        "$addToSet" => Some(AccKind::AddToSet),
        "$stdDevPop" => Some(AccKind::StdDevPop),
        "$stdDevSamp" => Some(AccKind::StdDevSamp),
        "$rank" | "$denseRank" | "$documentNumber" | "$shift" | "$locf" | "$linearFill"
        | "$expMovingAvg" | "$covariancePop" | "$covarianceSamp" | "$derivative" | "$integral" => {
            None
        }
        other => return Err(parse_err(format!("Unrecognized window function, {other}"))),
    };
    // Every other field must be `window` (or a second function, refused).
    let mut window = None;
    let mut operand = None;
    for (k, v) in spec {
        if k == "window" {
            if window.is_some() {
                return Err(parse_err(format!(
                    "saw multiple 'window' fields in '{name}' expression"
                )));
            }
            window = Some(v);
        } else if *k == name {
            operand = Some(v);
        } else if k.starts_with('$') {
            return Err(parse_err(
                "Cannot specify two functions in window function spec",
            ));
        } else {
            return Err(parse_err(format!(
                "Window function found an unknown argument: {k}"
            )));
        }
    }
    let operand = operand.unwrap_or(&Bson::Null);
    if let Some(kind) = kind {
        let bounds = match window {
            Some(w) => parse_bounds(w, sort_by)?,
            None => Bounds::whole(),
        };
        let input = super::accumulator_input(name == "$count", operand, vars)?;
        return Ok(Func::Acc {
            kind,
            input,
            bounds,
        });
    }
    match name.as_str() {
        "$covariancePop" | "$covarianceSamp" => {
            let bounds = match window {
                Some(w) => parse_bounds(w, sort_by)?,
                None => Bounds::whole(),
            };
            Ok(Func::Covariance {
                input: Expr::parse_with_vars(operand, vars)?,
                bounds,
                sample: name == "$covarianceSamp",
            })
        }
        "$expMovingAvg" => parse_exp_moving_avg(spec, operand, sort_by, vars),
        "$rank" | "$denseRank" | "$documentNumber" => {
            if spec.len() != 1 {
                return Err(MongoError::with_code(
                    5371601,
                    "Rank style window functions take no other arguments",
                ));
            }
            if !matches!(operand, Bson::Document(d) if d.is_empty()) {
                return Err(MongoError::with_code(
                    5371603,
                    format!("{name} must be specified with '{{}}' as the value"),
                ));
            }
            if sort_by.is_none_or(|s| s.fields().count() != 1) {
                return Err(MongoError::with_code(
                    5371602,
                    format!(
                        "{name} must be specified with a top level sortBy expression with exactly one element"
                    ),
                ));
            }
            Ok(Func::Rank(match name.as_str() {
                "$rank" => RankKind::Rank,
                "$denseRank" => RankKind::DenseRank,
                _ => RankKind::DocumentNumber,
            }))
        }
        "$shift" => {
            if window.is_some() {
                return Err(parse_err("$shift does not accept a 'window' field"));
            }
            let Bson::Document(args) = operand else {
                return Err(parse_err("Argument to $shift must be an object"));
            };
            let (mut output, mut by, mut default) = (None, None, Bson::Null);
            for (k, v) in args {
                match k.as_str() {
                    "output" => output = Some(Expr::parse_with_vars(v, vars)?),
                    "by" => {
                        let n = value::is_number(v)
                            .then(|| value::as_i64_exact(v))
                            .flatten()
                            .filter(|n| i32::try_from(*n).is_ok());
                        by = Some(n.ok_or_else(|| {
                            parse_err(format!(
                                "'$shift:by' field must be an integer, but found  by: {v}"
                            ))
                        })?);
                    }
                    "default" => {
                        let e = Expr::parse_with_vars(v, vars)?;
                        let mut paths = std::collections::BTreeSet::new();
                        let constant = e.referenced_paths(&mut paths) && paths.is_empty();
                        let value = if constant {
                            e.evaluate(&Document::new()).ok().flatten()
                        } else {
                            None
                        };
                        default = value.ok_or_else(|| {
                            parse_err("'$shift:default' expression must yield a constant value.")
                        })?;
                    }
                    _ => return Err(parse_err("Unknown argument in $shift")),
                }
            }
            let output =
                output.ok_or_else(|| parse_err("$shift requires an 'output' expression."))?;
            let by = by.ok_or_else(|| parse_err("$shift requires 'by' as an integer value."))?;
            if sort_by.is_none() {
                return Err(parse_err("'$shift' requires a sortBy"));
            }
            Ok(Func::Shift {
                output,
                by,
                default,
            })
        }
        "$locf" | "$linearFill" => {
            if window.is_some() {
                return Err(parse_err(format!(
                    "'window' field is not allowed in {name}"
                )));
            }
            let input = Expr::parse_with_vars(operand, vars)?;
            if name == "$locf" {
                return Ok(Func::Locf(input));
            }
            if sort_by.is_none_or(|s| s.fields().count() != 1) {
                return Err(MongoError::with_code(
                    605001,
                    "$linearFill must be specified with a top level sortBy expression with exactly one element",
                ));
            }
            Ok(Func::LinearFill(input))
        }
        _ => {
            // $derivative / $integral: {input, unit?}, a single-field sortBy.
            match sort_by {
                None => return Err(parse_err(format!("{name} requires a sortBy"))),
                Some(s) if s.fields().count() != 1 => {
                    return Err(parse_err(format!("{name} requires a non-compound sortBy")));
                }
                Some(_) => {}
            }
            let Bson::Document(args) = operand else {
                return Err(parse_err(format!(
                    "{name} expects an object, but got a {}: {operand}",
                    type_name(operand)
                )));
            };
            let (mut input, mut unit) = (None, None);
            for (k, v) in args {
                match k.as_str() {
                    "input" => input = Some(Expr::parse_with_vars(v, vars)?),
                    "unit" => {
                        let Bson::String(u) = v else {
                            return Err(parse_err(format!(
                                "unit' must be a string, but got {}",
                                type_name(v)
                            )));
                        };
                        let u = TimeUnit::parse(u)?;
                        if u.fixed_millis().is_none() {
                            return Err(MongoError::with_code(
                                5490710,
                                "unit must be 'week' or smaller",
                            ));
                        }
                        unit = Some(u);
                    }
                    other => {
                        return Err(parse_err(format!(
                            "{name} got unexpected argument: {other}"
                        )));
                    }
                }
            }
            let input =
                input.ok_or_else(|| parse_err(format!("{name} requires an 'input' expression")))?;
            let bounds = match window {
                Some(w) => parse_bounds(w, sort_by)?,
                None if name == "$derivative" => {
                    return Err(parse_err("$derivative requires explicit window bounds"));
                }
                None => Bounds::whole(),
            };
            Ok(if name == "$derivative" {
                Func::Derivative {
                    input,
                    unit,
                    bounds,
                }
            } else {
                Func::Integral {
                    input,
                    unit,
                    bounds,
                }
            })
        }
    }
}

/// Parses `{$expMovingAvg: {input, N | alpha}}` (no window: it is always `[unbounded, current]`).
fn parse_exp_moving_avg(
    spec: &Document,
    operand: &Bson,
    sort_by: Option<&SortSpec>,
    vars: &[String],
) -> Result<Func> {
    let Bson::Document(args) = operand else {
        return Err(parse_err(
            "$expMovingAvg must have exactly one argument that is an object",
        ));
    };
    if spec.len() != 1 {
        return Err(parse_err(
            "$expMovingAvg must have exactly one argument that is an object",
        ));
    }
    let shape = "$expMovingAvg sub object must have exactly two fields: An 'input' field, and either an 'N' field or an 'alpha' field";
    let Some(input) = args.get("input").filter(|_| args.len() == 2) else {
        return Err(parse_err(shape));
    };
    if sort_by.is_none() {
        return Err(parse_err("$expMovingAvg requires an explicit 'sortBy'"));
    }
    let input = Expr::parse_with_vars(input, vars)?;
    let alpha = if let Some(n) = args.get("N") {
        if !value::is_number(n) {
            return Err(parse_err(format!(
                "'N' field must be an integer, but found type {}",
                type_name(n)
            )));
        }
        let Some(n) = value::as_i64_exact(n) else {
            return Err(parse_err(format!(
                "'N' field must be an integer, but found  N: {n}. To use a non-integer, use the 'alpha' argument instead"
            )));
        };
        if n <= 0 {
            return Err(parse_err(format!("'N' must be greater than zero. Got {n}")));
        }
        2.0 / (n as f64 + 1.0)
    } else if let Some(a) = args.get("alpha") {
        if !value::is_number(a) {
            return Err(parse_err("'alpha' must be a number"));
        }
        let alpha = value::as_f64(a).unwrap_or(f64::NAN);
        if !(alpha > 0.0 && alpha < 1.0) {
            return Err(parse_err(format!(
                "'alpha' must be between 0 and 1 (exclusive), found alpha: {a}"
            )));
        }
        alpha
    } else {
        return Err(parse_err(format!(
            "Got unrecognized field in $expMovingAvg{shape}"
        )));
    };
    Ok(Func::ExpMovingAvg { input, alpha })
}

/// Parses `window: {documents: [l, u]}` or `window: {range: [l, u], unit?}`.
fn parse_bounds(w: &Bson, sort_by: Option<&SortSpec>) -> Result<Bounds> {
    let Bson::Document(w) = w else {
        return Err(parse_err("'window' field must be an object"));
    };
    let (documents, range, unit) = (w.get("documents"), w.get("range"), w.get("unit"));
    if documents.is_some() && range.is_some() {
        return Err(parse_err(
            "Window bounds can specify either 'documents' or 'unit', not both.",
        ));
    }
    if range.is_none() && unit.is_some() {
        return Err(parse_err(
            "Window bounds can only specify 'unit' with range-based bounds.",
        ));
    }
    let pair = |e: &Bson| -> Result<(Bson, Bson)> {
        match e {
            Bson::Array(a) if a.len() == 2 => Ok((a[0].clone(), a[1].clone())),
            _ => Err(parse_err(format!(
                "Window bounds must be a 2-element array: {e}"
            ))),
        }
    };
    if let Some(documents) = documents {
        if w.len() != 1 {
            return Err(parse_err(
                "'window' field that specifies documents cannot have other fields",
            ));
        }
        let (l, u) = pair(documents)?;
        let int = |v: Bson| -> Result<i64> {
            if !value::is_number(&v) {
                return Err(parse_err("Window bounds expression must be a constant."));
            }
            value::as_i64_exact(&v)
                .filter(|n| i32::try_from(*n).is_ok())
                .ok_or_else(|| parse_err("Numeric document-based bounds must be an integer"))
        };
        let (l, u) = (parse_bound(l, int)?, parse_bound(u, int)?);
        let at = |b: &Bound<i64>| match b {
            Bound::Current => Some(0),
            Bound::At(n) => Some(*n),
            Bound::Unbounded => None,
        };
        if let (Some(a), Some(b)) = (at(&l), at(&u))
            && a > b
        {
            return Err(MongoError::with_code(
                5339900,
                format!("Lower bound must not exceed upper bound: [{a}, {b}]"),
            ));
        }
        let whole = l == Bound::Unbounded && u == Bound::Unbounded;
        if !whole && sort_by.is_none() {
            return Err(MongoError::with_code(
                5339901,
                "Document-based bounds require a sortBy",
            ));
        }
        return Ok(Bounds::Documents(l, u));
    }
    let Some(range) = range else {
        if !w.is_empty() {
            return Err(parse_err(
                "'window' field can only contain 'documents' as the only argument or 'range' with an optional 'unit' field",
            ));
        }
        return Ok(Bounds::whole());
    };
    let (l, u) = pair(range)?;
    let unit = match unit {
        Some(unit) => {
            if w.len() != 2 {
                return Err(parse_err(
                    "'window' field that specifies unit cannot have other fields besides 'range'",
                ));
            }
            let Bson::String(unit) = unit else {
                return Err(parse_err("'unit' must be a string"));
            };
            Some(TimeUnit::parse(unit)?)
        }
        None => {
            if w.len() != 1 {
                return Err(parse_err(
                    "'window' field that specifies range cannot have other fields besides 'unit'",
                ));
            }
            None
        }
    };
    let number = |v: Bson| -> Result<Bson> {
        if matches!(v, Bson::Document(_) | Bson::Array(_)) {
            return Err(parse_err("Window bounds expression must be a constant."));
        }
        if unit.is_some() {
            if value::is_number(&v) && value::as_i64_exact(&v).is_some() {
                Ok(v)
            } else {
                Err(parse_err(
                    "With 'unit', range-based bounds must be an integer",
                ))
            }
        } else if value::is_number(&v) {
            Ok(v)
        } else {
            Err(parse_err("Range-based bounds expression must be a number"))
        }
    };
    let (l, u) = (parse_bound(l, number)?, parse_bound(u, number)?);
    let at = |b: &Bound<Bson>| match b {
        Bound::Current => Some(Bson::Int32(0)),
        Bound::At(n) => Some(n.clone()),
        Bound::Unbounded => None,
    };
    if let (Some(a), Some(b)) = (at(&l), at(&u))
        && compare(&a, &b).is_gt()
    {
        return Err(MongoError::with_code(
            5339900,
            format!("Lower bound must not exceed upper bound: [{a}, {b}]"),
        ));
    }
    let mut fields = sort_by
        .map(|s| s.fields().collect::<Vec<_>>())
        .unwrap_or_default();
    if fields.len() != 1 {
        return Err(MongoError::with_code(
            5339902,
            "Range-based bounds require sortBy a single field",
        ));
    }
    if fields.pop().is_some_and(|(_, ascending)| !ascending) {
        return Err(MongoError::with_code(
            8947401,
            "Range-based bounds require an ascending sortBy",
        ));
    }
    Ok(Bounds::Range(l, u, unit))
}

fn parse_bound<T>(v: Bson, at: impl Fn(Bson) -> Result<T>) -> Result<Bound<T>> {
    match v {
        Bson::String(s) if s == "unbounded" => Ok(Bound::Unbounded),
        Bson::String(s) if s == "current" => Ok(Bound::Current),
        Bson::String(_) => Err(parse_err(
            "Window bounds must be 'unbounded', 'current', or a number.",
        )),
        other => Ok(Bound::At(at(other)?)),
    }
}

impl Func {
    /// What the function reads from each document: `None` for the rank functions, which read
    /// only the sortBy values.
    fn input(&self) -> Option<&Expr> {
        match self {
            Func::Acc { input, .. }
            | Func::Derivative { input, .. }
            | Func::Integral { input, .. }
            | Func::ExpMovingAvg { input, .. }
            | Func::Covariance { input, .. }
            | Func::Locf(input)
            | Func::LinearFill(input)
            | Func::Shift { output: input, .. } => Some(input),
            Func::Rank(_) => None,
        }
    }

    /// The function's values over a sorted partition (`None` = missing), from each document's
    /// [`Func::input`] (`inputs`; empty for the rank functions) and first sortBy value (`keys`).
    fn compute(&self, inputs: Vec<Option<Bson>>, keys: &[Bson]) -> Result<Column> {
        let n = keys.len();
        Ok(Column::Ready(
            match self {
                Func::Acc { kind, bounds, .. } => {
                    return Ok(Column::Windows(Accumulation {
                        kind: *kind,
                        state: State::new(*kind),
                        current: None,
                        windows: windows(bounds, keys, n)?.into_iter(),
                        inputs,
                    }));
                }
                Func::Rank(kind) => {
                    let mut out = Vec::with_capacity(n);
                    let (mut rank, mut dense) = (0usize, 0usize);
                    for (i, k) in keys.iter().enumerate() {
                        let new_value =
                            i == 0 || keys.get(i - 1).is_none_or(|p| !value::equal(p, k));
                        if new_value {
                            rank = i + 1;
                            dense += 1;
                        }
                        let r = match kind {
                            RankKind::Rank => rank,
                            RankKind::DenseRank => dense,
                            RankKind::DocumentNumber => i + 1,
                        };
                        out.push(Some(int_or_long(r)));
                    }
                    out
                }
                Func::Shift { by, default, .. } => {
                    let mut out = Vec::with_capacity(n);
                    for i in 0..n {
                        let j = i64::try_from(i).ok().and_then(|i| i.checked_add(*by));
                        match j
                            .and_then(|j| usize::try_from(j).ok())
                            .and_then(|j| inputs.get(j))
                        {
                            Some(v) => out.push(v.clone()),
                            None => out.push(Some(default.clone())),
                        }
                    }
                    out
                }
                Func::Locf(_) => {
                    let mut last = Bson::Null;
                    let mut out = Vec::with_capacity(n);
                    for v in inputs {
                        match v {
                            None | Some(Bson::Null) | Some(Bson::Undefined) => {
                                out.push(Some(last.clone()))
                            }
                            Some(v) => {
                                last = v.clone();
                                out.push(Some(v));
                            }
                        }
                    }
                    out
                }
                Func::LinearFill(_) => linear_fill(&inputs, keys)?,
                Func::ExpMovingAvg { alpha, .. } => {
                    let mut out = Vec::with_capacity(n);
                    let (mut avg, mut decimal) = (None::<f64>, false);
                    for v in inputs {
                        if let Some(v) = v.filter(value::is_number) {
                            decimal |= matches!(v, Bson::Decimal128(_));
                            let x = value::as_f64(&v).unwrap_or(f64::NAN);
                            avg = Some(match avg {
                                None => x,
                                Some(prev) => alpha * x + (1.0 - alpha) * prev,
                            });
                        }
                        out.push(Some(match avg {
                            None => Bson::Null,
                            Some(a) if decimal => Bson::Decimal128(value::f64_to_decimal(a)),
                            Some(a) => Bson::Double(a),
                        }));
                    }
                    out
                }
                Func::Covariance { bounds, sample, .. } => {
                    let pairs: Vec<Option<(f64, f64)>> = inputs
                        .iter()
                        .map(|v| match v {
                            Some(Bson::Array(a)) => match a.as_slice() {
                                [x, y] if value::is_number(x) && value::is_number(y) => {
                                    value::as_f64(x).zip(value::as_f64(y))
                                }
                                _ => None,
                            },
                            _ => None,
                        })
                        .collect();
                    let windows = windows(bounds, keys, n)?;
                    windows
                        .into_iter()
                        .map(|(lo, hi)| {
                            let pts: Vec<(f64, f64)> = pairs
                                .get(lo..hi.max(lo))
                                .unwrap_or_default()
                                .iter()
                                .flatten()
                                .copied()
                                .collect();
                            Some(covariance(&pts, *sample))
                        })
                        .collect()
                }
                Func::Derivative { unit, bounds, .. } | Func::Integral { unit, bounds, .. } => {
                    let windows = windows(bounds, keys, n)?;
                    let derivative = matches!(self, Func::Derivative { .. });
                    let name = if derivative {
                        "$derivative"
                    } else {
                        "$integral"
                    };
                    let xs = keys
                        .iter()
                        .map(|k| x_of(name, k, *unit))
                        .collect::<Result<Vec<_>>>()?;
                    let mut out = Vec::with_capacity(n);
                    for (lo, hi) in windows {
                        out.push(Some(if derivative {
                            derivative_of(&inputs, &xs, lo, hi)?
                        } else {
                            integral_of(&inputs, &xs, lo, hi)?
                        }));
                    }
                    out
                }
            }
            .into_iter(),
        ))
    }
}

/// Population (or sample) covariance; null for no points (or fewer than two for a sample).
fn covariance(pts: &[(f64, f64)], sample: bool) -> Bson {
    let n = pts.len();
    if n == 0 || (sample && n < 2) {
        return Bson::Null;
    }
    let nf = n as f64;
    let (mx, my) = pts
        .iter()
        .fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (mx, my) = (mx / nf, my / nf);
    let c: f64 = pts.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    Bson::Double(c / if sample { nf - 1.0 } else { nf })
}

/// A function's values for a partition's documents, given out in order, one per document.
enum Column {
    /// Computed ahead: values no larger than the function's inputs (numbers, ranks, or inputs
    /// moved along).
    Ready(std::vec::IntoIter<Option<Bson>>),
    /// An accumulator's, computed as each document comes: over wide windows its values (a
    /// `$push`'s arrays) together take far more than the partition.
    Windows(Accumulation),
}

impl Column {
    fn next(&mut self, env: &Env) -> Option<Bson> {
        match self {
            Column::Ready(values) => values.next().flatten(),
            Column::Windows(acc) => acc.next(env),
        }
    }
}

/// An accumulator's value over each document's window in turn. A window that extends the
/// previous one (same start, later end) adds only what is new, so `[unbounded, current]`
/// windows are linear.
struct Accumulation {
    kind: AccKind,
    inputs: Vec<Option<Bson>>,
    windows: std::vec::IntoIter<(usize, usize)>,
    state: State,
    /// The window `state` holds.
    current: Option<(usize, usize)>,
}

impl Accumulation {
    fn next(&mut self, env: &Env) -> Option<Bson> {
        let (lo, hi) = self.windows.next()?;
        let hi = hi.max(lo);
        let kind = self.kind;
        if matches!(kind, AccKind::First | AccKind::Last) {
            let at = if kind == AccKind::First {
                Some(lo)
            } else {
                hi.checked_sub(1)
            };
            // An empty window is null; a missing value at the window's end stays missing.
            return if lo < hi {
                at.and_then(|i| self.inputs.get(i)).cloned().flatten()
            } else {
                Some(Bson::Null)
            };
        }
        let from = match self.current {
            Some((clo, chi)) if clo == lo && chi <= hi => chi,
            _ => {
                self.state = State::new(kind);
                lo
            }
        };
        for v in self.inputs.get(from..hi).unwrap_or_default() {
            self.state.add(kind, v, env);
        }
        self.current = Some((lo, hi));
        Some(self.state.value(kind))
    }
}

/// What a partition's functions read, gathered document by document before they compute:
/// each function's input and each document's first sortBy value, counted against the
/// stage's memory limit (5414201 past it) together with the documents themselves when they
/// are held in memory too.
struct Gathered<'a> {
    stage: &'a SetWindowFields,
    inputs: Vec<Vec<Option<Bson>>>,
    keys: Vec<Bson>,
    bytes: usize,
    /// Whether the documents are counted: not when they may wait on disk, nor when the caller
    /// holds them already (a batch run).
    count_documents: bool,
}

impl<'a> Gathered<'a> {
    fn new(stage: &'a SetWindowFields, count_documents: bool) -> Gathered<'a> {
        Gathered {
            stage,
            inputs: vec![Vec::new(); stage.outputs.len()],
            keys: Vec::new(),
            bytes: 0,
            count_documents,
        }
    }

    /// The next document of the partition, and its first sortBy value.
    fn add(&mut self, d: &Document, key: Bson, env: &Env) -> Result<()> {
        crate::interrupt::check()?;
        let mut bytes = value_size(&key);
        if self.count_documents {
            bytes += crate::changestream::split::document_size(d);
        }
        for ((_, f), inputs) in self.stage.outputs.iter().zip(&mut self.inputs) {
            if let Some(input) = f.input() {
                let v = input.evaluate_in(d, env)?;
                bytes += v.as_ref().map_or(0, value_size);
                inputs.push(v);
            }
        }
        self.bytes += bytes;
        let limit = super::spill::sort_limit();
        if self.bytes > limit {
            return Err(MongoError::with_code(
                5414201,
                format!(
                    "Exceeded memory limit in DocumentSourceSetWindowFields, used {} bytes but \
                     max allowed is {limit}",
                    self.bytes
                ),
            ));
        }
        self.keys.push(key);
        Ok(())
    }

    /// Every function's column over the partition.
    fn columns(self) -> Result<Vec<Column>> {
        let keys = self.keys;
        self.stage
            .outputs
            .iter()
            .zip(self.inputs)
            .map(|((_, f), inputs)| f.compute(inputs, &keys))
            .collect()
    }
}

fn value_size(v: &Bson) -> usize {
    crate::changestream::split::value_size(v)
}

fn int_or_long(n: usize) -> Bson {
    match i32::try_from(n) {
        Ok(i) => Bson::Int32(i),
        Err(_) => Bson::Int64(i64::try_from(n).unwrap_or(i64::MAX)),
    }
}

/// Each document's window as a half-open index range `[lo, hi)` (empty when `lo >= hi`).
fn windows(bounds: &Bounds, keys: &[Bson], n: usize) -> Result<Vec<(usize, usize)>> {
    match bounds {
        Bounds::Documents(l, u) => Ok((0..n)
            .map(|i| {
                let pos = |b: &Bound<i64>, unbounded: usize, upper: bool| -> usize {
                    let off = match b {
                        Bound::Unbounded => return unbounded,
                        Bound::Current => 0,
                        Bound::At(k) => *k,
                    };
                    let p = i64::try_from(i).unwrap_or(i64::MAX) + off + i64::from(upper);
                    usize::try_from(p.max(0)).unwrap_or(0).min(n)
                };
                (pos(l, 0, false), pos(u, n, true))
            })
            .collect()),
        Bounds::Range(l, u, unit) => {
            for k in keys {
                let err = match (unit, k) {
                    (None, Bson::DateTime(_)) => Some(MongoError::with_code(
                        5429413,
                        "Invalid range: For windows that involve date or time ranges, a unit must be provided.",
                    )),
                    (None, k) if !value::is_number(k) => Some(MongoError::with_code(
                        5429414,
                        format!(
                            "Invalid range: Expected the sortBy field to be a number, but it was {}",
                            type_name(k)
                        ),
                    )),
                    (Some(_), k) if !matches!(k, Bson::DateTime(_)) => Some(MongoError::with_code(
                        5429513,
                        format!(
                            "Invalid range: Expected the sortBy field to be a Date, but it was {}",
                            type_name(k)
                        ),
                    )),
                    _ => None,
                };
                if let Some(e) = err {
                    return Err(e);
                }
            }
            let shifted = |v: &Bson, b: &Bound<Bson>| -> Result<Option<Bson>> {
                let off = match b {
                    Bound::Unbounded => return Ok(None),
                    Bound::Current => return Ok(Some(v.clone())),
                    Bound::At(off) => off,
                };
                Ok(Some(match (unit, v) {
                    (Some(unit), Bson::DateTime(d)) => {
                        let amount = value::as_i64_exact(off).unwrap_or(0);
                        let ms = unit.add(d.timestamp_millis(), amount).ok_or_else(|| {
                            MongoError::bad_value("Date overflow in a range-based window")
                        })?;
                        Bson::DateTime(bson::DateTime::from_millis(ms))
                    }
                    _ => value::add_numbers(v, off).unwrap_or(Bson::Null),
                }))
            };
            let mut out = Vec::with_capacity(n);
            for v in keys {
                let lo = match shifted(v, l)? {
                    None => 0,
                    Some(lv) => keys.partition_point(|k| compare(k, &lv).is_lt()),
                };
                let hi = match shifted(v, u)? {
                    None => n,
                    Some(uv) => keys.partition_point(|k| compare(k, &uv).is_le()),
                };
                out.push((lo, hi));
            }
            Ok(out)
        }
    }
}

/// Running state of one accumulator over a window.
enum State {
    Sum(Bson),
    Avg(Bson, u64),
    Best(Option<Bson>),
    Push(Vec<Bson>),
    /// Each distinct value (under the collation) by its key, first one seen kept.
    Set(BTreeMap<GroupKey, Bson>),
    /// Welford's running count, mean and sum of squared deviations.
    StdDev(u64, f64, f64),
    /// `$first`/`$last` read the window's ends directly.
    Ends,
}

impl State {
    fn new(kind: AccKind) -> State {
        match kind {
            AccKind::Sum => State::Sum(Bson::Int32(0)),
            AccKind::Avg => State::Avg(Bson::Int32(0), 0),
            AccKind::Min | AccKind::Max => State::Best(None),
            AccKind::Push => State::Push(Vec::new()),
            AccKind::AddToSet => State::Set(BTreeMap::new()),
            AccKind::StdDevPop | AccKind::StdDevSamp => State::StdDev(0, 0.0, 0.0),
            AccKind::First | AccKind::Last => State::Ends,
        }
    }

    fn add(&mut self, kind: AccKind, v: &Option<Bson>, env: &Env) {
        let number = v.as_ref().filter(|x| value::is_number(x));
        match self {
            State::Sum(acc) => {
                if let Some(x) = number {
                    *acc = value::add_numbers(acc, x).unwrap_or(Bson::Null);
                }
            }
            State::Avg(acc, count) => {
                if let Some(x) = number {
                    *acc = value::add_numbers(acc, x).unwrap_or(Bson::Null);
                    *count += 1;
                }
            }
            State::Best(best) => {
                if let Some(x) = v
                    .as_ref()
                    .filter(|x| !matches!(x, Bson::Null | Bson::Undefined))
                    && super::beats(kind == AccKind::Min, x, best.as_ref(), env)
                {
                    *best = Some(x.clone());
                }
            }
            State::Push(items) => {
                if let Some(x) = v {
                    items.push(x.clone());
                }
            }
            State::Set(items) => {
                if let Some(x) = v {
                    items
                        .entry(GroupKey::new(x.clone(), env.collation.as_ref()))
                        .or_insert_with(|| x.clone());
                }
            }
            State::StdDev(count, mean, m2) => {
                if let Some(x) = number.and_then(value::as_f64) {
                    *count += 1;
                    let delta = x - *mean;
                    *mean += delta / *count as f64;
                    *m2 += delta * (x - *mean);
                }
            }
            State::Ends => {}
        }
    }

    fn value(&self, kind: AccKind) -> Bson {
        match self {
            State::Sum(acc) => acc.clone(),
            State::Avg(_, 0) => Bson::Null,
            State::Avg(acc, n) => {
                let avg = value::as_f64(acc).unwrap_or(f64::NAN) / *n as f64;
                if matches!(acc, Bson::Decimal128(_)) {
                    Bson::Decimal128(value::f64_to_decimal(avg))
                } else {
                    Bson::Double(avg)
                }
            }
            State::Best(b) => b.clone().unwrap_or(Bson::Null),
            State::Push(items) => Bson::Array(items.clone()),
            State::Set(items) => Bson::Array(items.values().cloned().collect()),
            State::StdDev(count, _, m2) => {
                let n = *count as f64;
                match kind {
                    AccKind::StdDevPop if *count > 0 => Bson::Double((m2 / n).sqrt()),
                    AccKind::StdDevSamp if *count > 1 => Bson::Double((m2 / (n - 1.0)).sqrt()),
                    _ => Bson::Null,
                }
            }
            State::Ends => Bson::Null,
        }
    }
}

/// The x coordinate of a sortBy value for `name` (`$derivative`/`$integral`): numbers as they
/// are without a unit, dates in `unit`s with one (MongoDB's 5624900-5624902 otherwise).
fn x_of(name: &str, k: &Bson, unit: Option<TimeUnit>) -> Result<Option<f64>> {
    match (k, unit) {
        (Bson::DateTime(d), Some(u)) => Ok(Some(
            d.timestamp_millis() as f64 / u.fixed_millis().unwrap_or(1) as f64,
        )),
        (_, Some(_)) => Err(MongoError::with_code(
            5624900,
            format!("{name} with 'unit' expects the sortBy field to be a Date"),
        )),
        (Bson::DateTime(_), None) => Err(MongoError::with_code(
            5624901,
            format!("{name} where the sortBy is a Date requires an 'unit'"),
        )),
        (v, None) if value::is_number(v) => Ok(value::as_f64(v)),
        (_, None) => Err(MongoError::with_code(
            5624902,
            format!("{name} (with no 'unit') expects the sortBy field to be numeric"),
        )),
    }
}

fn y_of(v: &Option<Bson>) -> Option<f64> {
    v.as_ref()
        .filter(|x| value::is_number(x))
        .and_then(value::as_f64)
}

/// `$derivative`: slope between the window's first and last documents (null for fewer than 2).
fn derivative_of(
    inputs: &[Option<Bson>],
    xs: &[Option<f64>],
    lo: usize,
    hi: usize,
) -> Result<Bson> {
    if hi <= lo + 1 {
        return Ok(Bson::Null);
    }
    let last = hi - 1;
    let (Some(x0), Some(x1)) = (
        xs.get(lo).copied().flatten(),
        xs.get(last).copied().flatten(),
    ) else {
        return Ok(Bson::Null);
    };
    let y = |i: usize| -> Result<f64> {
        match inputs.get(i).cloned().flatten() {
            None | Some(Bson::Null) | Some(Bson::Undefined) => Err(MongoError::with_code(
                5624903,
                "$derivative input must not be null or missing",
            )),
            Some(v) => value::as_f64(&v)
                .filter(|_| value::is_number(&v))
                .ok_or_else(|| {
                    MongoError::with_code(
                        16556,
                        format!(
                            "cant $subtract a {} from a {}",
                            type_name(&v),
                            type_name(&v)
                        ),
                    )
                }),
        }
    };
    let (y0, y1) = (y(lo)?, y(last)?);
    if x1 == x0 {
        return Ok(Bson::Null);
    }
    Ok(Bson::Double((y1 - y0) / (x1 - x0)))
}

/// `$integral`: trapezoidal area under the window's points (0 for one point, null for none).
fn integral_of(inputs: &[Option<Bson>], xs: &[Option<f64>], lo: usize, hi: usize) -> Result<Bson> {
    if hi <= lo {
        return Ok(Bson::Null);
    }
    let mut sum = 0.0;
    let mut prev: Option<(f64, f64)> = None;
    for i in lo..hi {
        let (Some(x), Some(y)) = (xs.get(i).copied().flatten(), inputs.get(i).and_then(y_of))
        else {
            continue;
        };
        if let Some((px, py)) = prev {
            sum += (x - px) * (y + py) / 2.0;
        }
        prev = Some((x, y));
    }
    Ok(Bson::Double(sum))
}

/// `$linearFill` over one sorted partition: `y1 + (x - x1) * (y2 - y1) / (x2 - x1)` between the
/// surrounding non-null values (a double), null without both neighbours.
fn linear_fill(ys: &[Option<Bson>], keys: &[Bson]) -> Result<Vec<Option<Bson>>> {
    let nullish = |v: &Option<Bson>| matches!(v, None | Some(Bson::Null) | Some(Bson::Undefined));
    let mut xs = Vec::with_capacity(keys.len());
    let mut last: Option<&Bson> = None;
    for (y, x) in ys.iter().zip(keys) {
        if let Some(v) = y.as_ref().filter(|v| !value::is_number(v) && !nullish(y)) {
            return Err(MongoError::type_mismatch(format!(
                "Value to be filled must be numeric or nullish, but found {}",
                type_name(v)
            )));
        }
        let xf = match x {
            Bson::DateTime(d) => d.timestamp_millis() as f64,
            v if value::is_number(v) => value::as_f64(v).unwrap_or(f64::NAN),
            v => {
                return Err(MongoError::type_mismatch(format!(
                    "Value of the sortBy field must be numeric or a date, but found {}",
                    type_name(v)
                )));
            }
        };
        if let Some(prev) = last {
            if value::equal(prev, x) {
                return Err(MongoError::with_code(
                    6050106,
                    "There can be no repeated values in the sort field",
                ));
            }
            if matches!(prev, Bson::DateTime(_)) != matches!(x, Bson::DateTime(_)) {
                return Err(MongoError::type_mismatch(format!(
                    "Conflicting sort value types, previously received type {}, but found {}",
                    type_name(prev),
                    type_name(x)
                )));
            }
        }
        last = Some(x);
        xs.push(xf);
    }
    let mut out = Vec::with_capacity(ys.len());
    let mut prev: Option<usize> = None;
    for (i, y) in ys.iter().enumerate() {
        if !nullish(y) {
            prev = Some(i);
            out.push(y.clone());
            continue;
        }
        let next = (i + 1..ys.len()).find(|j| ys.get(*j).is_some_and(|v| !nullish(v)));
        let point = |j: usize| (xs.get(j).copied(), ys.get(j).and_then(y_of));
        let filled = match (prev.map(point), next.map(point), xs.get(i)) {
            (Some((Some(x1), Some(y1))), Some((Some(x2), Some(y2))), Some(x)) => {
                Bson::Double(y1 + (x - x1) * ((y2 - y1) / (x2 - x1)))
            }
            _ => Bson::Null,
        };
        out.push(Some(filled));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;

/// A `$setWindowFields` fed one document at a time: each goes to a sorter by partition and
/// `sortBy` (holding its limit in memory, spilling under `allowDiskUse`, 292 past it without);
/// at the end the partitions are read back one at a time. A partition's documents wait in a
/// spool (under `allowDiskUse` on disk past 16 MiB, as MongoDB 7.0's spills them) while its
/// functions compute from their inputs; what the functions hold, and without `allowDiskUse`
/// the documents too, stops at `internalDocumentSourceSetWindowFieldsMaxMemoryBytes` (the
/// sort limit; 5414201 past it).
pub(super) struct WindowSink {
    stage: SetWindowFields,
    env: Env,
    sort_by: Option<SortSpec>,
    sorter: Sorter,
}

impl WindowSink {
    pub(super) fn new(stage: &SetWindowFields, env: &Env) -> WindowSink {
        let sort_by = stage
            .sort_by
            .clone()
            .map(|s| s.with_collation(env.collation.clone()));
        let (by, within) = (env.clone(), sort_by.clone());
        let order: Compare = Arc::new(move |a: &Document, b: &Document| {
            let part = |d: &Document| d.get("p").cloned().unwrap_or(Bson::Null);
            by.compare(&part(a), &part(b)).then_with(|| match &within {
                Some(s) => s.compare_keys(
                    a.get_array("s").map(Vec::as_slice).unwrap_or_default(),
                    b.get_array("s").map(Vec::as_slice).unwrap_or_default(),
                ),
                None => std::cmp::Ordering::Equal,
            })
        });
        WindowSink {
            stage: stage.clone(),
            env: env.clone(),
            sort_by,
            sorter: Sorter::new(order, Purpose::Sort, env.allow_disk_use),
        }
    }

    pub(super) fn push(&mut self, d: Document) -> Result<()> {
        let p = self.stage.partition_key(&d, &self.env)?;
        let s = self
            .sort_by
            .as_ref()
            .map(|s| s.sort_key(&d))
            .unwrap_or_default();
        self.sorter.push(bson::doc! {"p": p, "s": s, "d": d})
    }

    pub(super) fn finish(self) -> Result<super::Docs> {
        Ok(Box::new(Partitions {
            stage: self.stage,
            env: self.env,
            records: self.sorter.finish()?.peekable(),
            current: None,
            failed: false,
        }))
    }
}

/// The output of a [`WindowSink`], one partition at a time.
struct Partitions {
    stage: SetWindowFields,
    env: Env,
    records: std::iter::Peekable<Sorted>,
    /// The partition being put out: its documents in order and each function's column.
    current: Option<(Spooled, Vec<Column>)>,
    failed: bool,
}

impl Partitions {
    /// Reads the next partition into a spool and computes its functions' columns.
    fn next_partition(&mut self) -> Result<(Spooled, Vec<Column>)> {
        let disk = self.env.allow_disk_use;
        let mut docs = Spool::new("A $setWindowFields partition", disk);
        let mut gathered = Gathered::new(&self.stage, !disk);
        let mut partition: Option<Bson> = None;
        loop {
            let same = match (self.records.peek(), &partition) {
                (None, _) => false,
                (Some(Err(_)), _) | (Some(Ok(_)), None) => true,
                (Some(Ok(r)), Some(p)) => self.env.equal(r.get("p").unwrap_or(&Bson::Null), p),
            };
            if !same {
                break;
            }
            let Some(record) = self.records.next().transpose()? else {
                break;
            };
            let (p, key, d) = record_parts(record)?;
            // Without disk use the documents count in `gathered`, which stops them at the
            // limit before the spool would.
            gathered.add(&d, key, &self.env)?;
            docs.push(d)?;
            partition.get_or_insert(p);
        }
        Ok((docs.finish()?, gathered.columns()?))
    }
}

/// A sorted record's partition, first sort value and document.
fn record_parts(mut r: Document) -> Result<(Bson, Bson, Document)> {
    let p = r.remove("p").unwrap_or(Bson::Null);
    let key = match r.remove("s") {
        Some(Bson::Array(s)) => s.into_iter().next().unwrap_or(Bson::Null),
        _ => Bson::Null,
    };
    match r.remove("d") {
        Some(Bson::Document(d)) => Ok((p, key, d)),
        _ => Err(MongoError::internal(
            "a $setWindowFields record without its document",
        )),
    }
}

impl Iterator for Partitions {
    type Item = Result<Document>;

    fn next(&mut self) -> Option<Result<Document>> {
        loop {
            if self.failed {
                return None;
            }
            if let Some((docs, columns)) = &mut self.current {
                match docs.next() {
                    Some(Ok(mut d)) => {
                        self.stage.set_outputs(&mut d, columns, &self.env);
                        return Some(Ok(d));
                    }
                    Some(Err(e)) => {
                        self.failed = true;
                        return Some(Err(e));
                    }
                    None => self.current = None,
                }
            }
            self.records.peek()?;
            match self.next_partition() {
                Ok(next) => self.current = Some(next),
                Err(e) => {
                    // Nothing after an error.
                    self.failed = true;
                    return Some(Err(e));
                }
            }
        }
    }
}
