//! `$densify` (generate the missing steps of a numeric or date sequence) and `$fill` (fill
//! null and missing fields), as MongoDB 7.0 runs them.
//!
//! `$densify` semantics:
//! * Input is sorted by `partitionByFields` then `field` (`bounds: "full"` sorts by `field`
//!   only), then streamed. Documents whose `field` is null or missing pass through unchanged.
//! * Values are generated on a grid of `step`s anchored at the range's lower end: the global
//!   minimum (`"full"`), each partition's minimum (`"partition"`), or `lo` (`[lo, hi]`).
//!   Before each document, its partition gets every grid value it has not reached that is
//!   below the document's value (and, for explicit bounds, below `hi`). At the end, `"full"`
//!   fills every partition up to the global maximum (inclusive) and `[lo, hi]` up to `hi`
//!   (exclusive; without partitions the range is generated even when no document has the
//!   field). A grid value equal to an existing document's value is not generated.
//! * A generated document holds only the partition fields and `field`. Dates step by whole
//!   `unit`s (calendar arithmetic for month, quarter and year); numbers take no unit.
//! * Generating more than [`MAX_GENERATED`] documents is an error (5897900), as MongoDB's
//!   `internalQueryMaxAllowedDensifyDocs` default.
//!
//! `$fill` is rewritten as MongoDB does: methods (`locf`, `linear`) become one
//! `$setWindowFields` (`$locf`/`$linearFill` of the field itself, with the `$fill`'s
//! `partitionBy`/`partitionByFields` and `sortBy`) and values become one `$addFields` of
//! `{$ifNull: ["$field", value]}`, in that order (a `sortBy` with only values sorts nothing).

use std::collections::{BTreeMap, VecDeque};

use bson::{Bson, Document, doc};

use super::time_unit::TimeUnit;
use super::window::{self, Func, Partition, SetWindowFields, check_field_path};
use super::{GroupKey, Stage};
use crate::expr::{Env, Expr};
use crate::projection::{Projection, Syntax};
use crate::sort::SortSpec;
use crate::value::{self, compare, type_name};
use crate::{MongoError, Result};

/// The most documents one `$densify` may generate.
pub const MAX_GENERATED: usize = 500_000;

/// A parsed `$densify` stage.
#[derive(Debug, Clone)]
pub struct Densify {
    field: String,
    partition_fields: Vec<String>,
    step: Bson,
    unit: Option<TimeUnit>,
    bounds: RangeBounds,
}

#[derive(Debug, Clone)]
enum RangeBounds {
    Full,
    Partition,
    /// `[lo, hi]`.
    Explicit(Box<(Bson, Bson)>),
}

fn unknown_field(stage: &str, path: &str) -> MongoError {
    MongoError::with_code(
        40415,
        format!("BSON field '{stage}.{path}' is an unknown field."),
    )
}

fn missing_field(stage: &str, path: &str) -> MongoError {
    MongoError::with_code(
        40414,
        format!("BSON field '{stage}.{path}' is missing but a required field"),
    )
}

fn wrong_type(stage: &str, path: &str, v: &Bson, expected: &str) -> MongoError {
    MongoError::type_mismatch(format!(
        "BSON field '{stage}.{path}' is the wrong type '{}', expected type '{expected}'",
        type_name(v)
    ))
}

fn string_list(stage: &str, path: &str, v: &Bson) -> Result<Vec<String>> {
    let Bson::Array(items) = v else {
        return Err(wrong_type(stage, path, v, "array"));
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Bson::String(s) = item else {
            return Err(wrong_type(stage, path, item, "string"));
        };
        check_field_path(s)?;
        out.push(s.clone());
    }
    Ok(out)
}

impl Densify {
    /// Parses the stage's argument.
    pub fn parse(arg: &Bson) -> Result<Densify> {
        const STAGE: &str = "$densify";
        let Bson::Document(d) = arg else {
            return Err(MongoError::failed_to_parse(format!(
                "The $densify stage specification must be an object, found {}",
                type_name(arg)
            )));
        };
        let (mut field, mut partition_fields, mut range) = (None, Vec::new(), None);
        for (k, v) in d {
            match k.as_str() {
                "field" => match v {
                    Bson::String(s) => {
                        check_field_path(s)?;
                        field = Some(s.clone());
                    }
                    other => return Err(wrong_type(STAGE, "field", other, "string")),
                },
                "partitionByFields" => {
                    partition_fields = string_list(STAGE, "partitionByFields", v)?;
                }
                "range" => match v {
                    Bson::Document(r) => range = Some(r),
                    other => return Err(wrong_type(STAGE, "range", other, "object")),
                },
                other => return Err(unknown_field(STAGE, other)),
            }
        }
        let field = field.ok_or_else(|| missing_field(STAGE, "field"))?;
        let range = range.ok_or_else(|| missing_field(STAGE, "range"))?;
        let (mut step, mut unit, mut bounds) = (None, None, None);
        for (k, v) in range {
            match k.as_str() {
                "step" => {
                    if !value::is_number(v) {
                        return Err(wrong_type(STAGE, "range.step", v, "number"));
                    }
                    step = Some(v.clone());
                }
                "unit" => match v {
                    Bson::String(s) => unit = Some(TimeUnit::parse(s)?),
                    other => return Err(wrong_type(STAGE, "range.unit", other, "string")),
                },
                "bounds" => bounds = Some(v.clone()),
                other => return Err(unknown_field(STAGE, &format!("range.{other}"))),
            }
        }
        let step = step.ok_or_else(|| missing_field(STAGE, "range.step"))?;
        let bounds = bounds.ok_or_else(|| missing_field(STAGE, "range.bounds"))?;
        if compare(&step, &Bson::Int32(0)).is_le() || value::as_f64(&step).is_some_and(f64::is_nan)
        {
            return Err(MongoError::with_code(
                5733401,
                "The step parameter in a range statement must be a strictly positive numeric value",
            ));
        }
        if unit.is_some() && value::as_i64_exact(&step).is_none() {
            return Err(MongoError::with_code(
                6586400,
                "The step parameter in a range statement must be a whole number when densifying a date range",
            ));
        }
        let bounds = match &bounds {
            Bson::String(s) if s == "full" => RangeBounds::Full,
            Bson::String(s) if s == "partition" => RangeBounds::Partition,
            Bson::String(_) => {
                return Err(MongoError::with_code(
                    5946802,
                    "Bounds string must either be 'full' or 'partition'",
                ));
            }
            Bson::Array(a) => {
                let [lo, hi] = a.as_slice() else {
                    return Err(MongoError::with_code(
                        5733403,
                        "A bounding array in a range statement must have exactly two elements",
                    ));
                };
                if compare(lo, hi).is_gt() {
                    return Err(MongoError::with_code(
                        5733402,
                        "A bounding array must be an ascending array of either two dates or two numbers",
                    ));
                }
                if value::is_number(lo) {
                    if unit.is_some() {
                        return Err(MongoError::with_code(
                            5733409,
                            "Numeric bounds may not have unit parameter",
                        ));
                    }
                    if !value::is_number(hi) {
                        return Err(MongoError::with_code(
                            5733406,
                            "A bounding array must contain either both dates or both numeric types",
                        ));
                    }
                    if value::type_code(lo) != value::type_code(hi)
                        || value::type_code(lo) != value::type_code(&step)
                    {
                        return Err(MongoError::with_code(
                            5876900,
                            "Upper bound, lower bound, and step must all have the same type",
                        ));
                    }
                } else if matches!(lo, Bson::DateTime(_)) {
                    if !matches!(hi, Bson::DateTime(_)) {
                        return Err(MongoError::with_code(
                            5733405,
                            "A bounding array must contain either both dates or both numeric types",
                        ));
                    }
                    if unit.is_none() {
                        return Err(MongoError::with_code(
                            5733410,
                            "A bounding array of dates must specify a unit",
                        ));
                    }
                } else {
                    return Err(MongoError::with_code(
                        5946800,
                        "Explicit bounds must be numeric or dates",
                    ));
                }
                RangeBounds::Explicit(Box::new((lo.clone(), hi.clone())))
            }
            _ => {
                return Err(MongoError::with_code(
                    5733404,
                    "The bounds in a range statement must be the string 'full', 'partition', or an ascending array of two numbers or two dates",
                ));
            }
        };
        for p in &partition_fields {
            if p.starts_with(field.as_str()) {
                return Err(MongoError::with_code(
                    8993000,
                    format!(
                        "partitionByFields '{p}' cannot include field '{field}' that is being densified."
                    ),
                ));
            }
            if field.starts_with(p.as_str()) {
                return Err(MongoError::with_code(
                    9554500,
                    format!(
                        "field '{field}' that is being densified cannot include partitionByFields '{p}'."
                    ),
                ));
            }
        }
        if matches!(bounds, RangeBounds::Partition) && partition_fields.is_empty() {
            return Err(MongoError::with_code(
                5733408,
                "One cannot specify the bounds as 'partition' without specifying a non-empty array of partitionByFields. You may have meant to specify 'full' bounds.",
            ));
        }
        Ok(Densify {
            field,
            partition_fields,
            step,
            unit,
            bounds,
        })
    }

    /// The grid value after `v`.
    fn next(&self, v: &Bson) -> Result<Bson> {
        match (v, self.unit) {
            (Bson::DateTime(d), Some(unit)) => {
                let amount = value::as_i64_exact(&self.step).unwrap_or(1);
                unit.add(d.timestamp_millis(), amount)
                    .map(|ms| Bson::DateTime(bson::DateTime::from_millis(ms)))
                    .ok_or_else(|| MongoError::bad_value("$densify date overflow"))
            }
            _ => value::add_numbers(v, &self.step)
                .ok_or_else(|| MongoError::bad_value("$densify could not add the step")),
        }
    }

    /// Checks a value of `field` against the range's type (numbers, or dates with a unit).
    fn check_value(&self, v: &Bson) -> Result<()> {
        match (v, self.unit) {
            (Bson::DateTime(_), Some(_)) => Ok(()),
            (n, None) if value::is_number(n) => Ok(()),
            (Bson::DateTime(_), None) => Err(MongoError::with_code(
                6053600,
                "Encountered date densify value in collection when step does not have a date unit.",
            )),
            (n, Some(_)) if value::is_number(n) => Err(MongoError::with_code(
                6053600,
                "Encountered numeric densify value in collection when step has a date unit.",
            )),
            _ => Err(MongoError::with_code(
                5733201,
                "Densify field type must be numeric or a date",
            )),
        }
    }

    /// The order its input must come in: by the partition fields (unless the range is
    /// `"full"`), then by `field`.
    pub fn input_order(&self) -> Result<SortSpec> {
        let mut sort = Document::new();
        if !matches!(self.bounds, RangeBounds::Full) {
            for p in &self.partition_fields {
                sort.insert(p.clone(), 1);
            }
        }
        sort.insert(self.field.clone(), 1);
        SortSpec::parse(&sort)
    }

    /// Runs the stage over a batch.
    pub fn run(&self, mut docs: Vec<Document>) -> Result<Vec<Document>> {
        self.input_order()?.sort(&mut docs);
        self.over_sorted(docs.into_iter().map(Ok)).collect()
    }

    /// The stage's output over `input` in [`Densify::input_order`], pulled one document at a
    /// time: what it holds is one document's generated steps and a partition table, never
    /// its input.
    pub fn over_sorted<I>(&self, input: I) -> Densified<I>
    where
        I: Iterator<Item = Result<Document>>,
    {
        let mut run = Densified {
            spec: self.clone(),
            input,
            pending: VecDeque::new(),
            partitions: BTreeMap::new(),
            order: Vec::new(),
            range: None,
            generated: 0,
            done: false,
        };
        if matches!(self.bounds, RangeBounds::Explicit(_)) && self.partition_fields.is_empty() {
            // Without partitions an explicit range is generated even from no documents.
            run.partitions
                .insert(GroupKey::new(Bson::Document(Document::new()), None), 0);
            run.order.push((Document::new(), None));
        }
        run
    }

    fn partition_key(&self, d: &Document) -> Document {
        let mut key = Document::new();
        for p in &self.partition_fields {
            if let Some(v) = value::get_path(d, p) {
                value::set_path(&mut key, p, v.clone());
            }
        }
        key
    }

    fn generate(
        &self,
        key: &Document,
        v: &Bson,
        out: &mut VecDeque<Document>,
        generated: &mut usize,
    ) -> Result<()> {
        *generated += 1;
        if *generated > MAX_GENERATED {
            return Err(MongoError::with_code(
                5897900,
                format!(
                    "Generated {MAX_GENERATED} documents in $densify, which is over the limit of {MAX_GENERATED}. Increase the 'internalQueryMaxAllowedDensifyDocs' parameter to allow more generated documents"
                ),
            ));
        }
        let mut d = key.clone();
        value::set_path(&mut d, &self.field, v.clone());
        out.push_back(d);
        Ok(())
    }
}

/// A `$densify` over sorted input ([`Densify::over_sorted`]).
pub struct Densified<I> {
    spec: Densify,
    input: I,
    /// Output made and not yet taken: a document's generated steps, then the document.
    pending: VecDeque<Document>,
    /// Partition key -> its position in `order`.
    partitions: BTreeMap<GroupKey, usize>,
    /// Each partition's key and the next grid value it would generate, in first appearance.
    order: Vec<(Document, Option<Bson>)>,
    /// The lowest and highest values of `field` so far (the input is sorted: the first and
    /// the latest).
    range: Option<(Bson, Bson)>,
    generated: usize,
    done: bool,
}

impl<I: Iterator<Item = Result<Document>>> Iterator for Densified<I> {
    type Item = Result<Document>;

    fn next(&mut self) -> Option<Result<Document>> {
        loop {
            if let Some(d) = self.pending.pop_front() {
                return Some(Ok(d));
            }
            if self.done {
                return None;
            }
            let step = match self.input.next() {
                Some(Ok(d)) => self.take(d),
                Some(Err(e)) => Err(e),
                None => {
                    self.done = true;
                    self.finish()
                }
            };
            if let Err(e) = step {
                self.done = true;
                self.pending.clear();
                return Some(Err(e));
            }
        }
    }
}

impl<I> Densified<I> {
    /// One input document: its partition's missing steps below it, then it.
    fn take(&mut self, d: Document) -> Result<()> {
        crate::interrupt::check()?;
        let spec = &self.spec;
        let Some(v) = value::get_path(&d, &spec.field)
            .filter(|v| !is_nullish(v))
            .cloned()
        else {
            self.pending.push_back(d);
            return Ok(());
        };
        spec.check_value(&v)?;
        let lowest = match &mut self.range {
            Some((lo, hi)) => {
                *hi = v.clone();
                lo.clone()
            }
            None => {
                self.range = Some((v.clone(), v.clone()));
                v.clone()
            }
        };
        let key = spec.partition_key(&d);
        let order = &mut self.order;
        let slot = *self
            .partitions
            .entry(GroupKey::new(Bson::Document(key.clone()), None))
            .or_insert_with(|| {
                order.push((key, None));
                order.len() - 1
            });
        let Some((key, next)) = self.order.get_mut(slot) else {
            self.pending.push_back(d);
            return Ok(());
        };
        let start = match (&*next, &spec.bounds) {
            (Some(n), _) => Some(n.clone()),
            (None, RangeBounds::Full) => Some(lowest),
            (None, RangeBounds::Partition) => Some(v.clone()),
            (None, RangeBounds::Explicit(b)) => {
                let lo = &b.0;
                if compare(&v, lo).is_lt() {
                    None
                } else {
                    Some(lo.clone())
                }
            }
        };
        if let Some(mut g) = start {
            let hi = match &spec.bounds {
                RangeBounds::Explicit(b) => Some(&b.1),
                _ => None,
            };
            while compare(&g, &v).is_lt() && hi.is_none_or(|h| compare(&g, h).is_lt()) {
                spec.generate(key, &g, &mut self.pending, &mut self.generated)?;
                g = spec.next(&g)?;
            }
            if compare(&g, &v).is_eq() {
                g = spec.next(&g)?;
            }
            *next = Some(g);
        }
        self.pending.push_back(d);
        Ok(())
    }

    /// The end of the input: `"full"` fills every partition up to the highest value
    /// (inclusive), `[lo, hi]` up to `hi` (exclusive).
    fn finish(&mut self) -> Result<()> {
        let spec = &self.spec;
        for (key, next) in &self.order {
            let (end, inclusive) = match &spec.bounds {
                RangeBounds::Full => match &self.range {
                    Some((_, hi)) => (hi.clone(), true),
                    None => continue,
                },
                RangeBounds::Explicit(b) => ((b.1).clone(), false),
                RangeBounds::Partition => continue,
            };
            let mut g = match (next, &spec.bounds) {
                (Some(g), _) => g.clone(),
                (None, RangeBounds::Explicit(b)) => b.0.clone(),
                (None, _) => continue,
            };
            while compare(&g, &end).is_lt() || (inclusive && compare(&g, &end).is_eq()) {
                crate::interrupt::check()?;
                spec.generate(key, &g, &mut self.pending, &mut self.generated)?;
                g = spec.next(&g)?;
            }
        }
        Ok(())
    }
}

fn is_nullish(v: &Bson) -> bool {
    matches!(v, Bson::Null | Bson::Undefined)
}

/// Parses `$fill` into the stages it stands for.
pub fn parse_fill(arg: &Bson, vars: &[String]) -> Result<Vec<Stage>> {
    const STAGE: &str = "$fill";
    let Bson::Document(d) = arg else {
        return Err(MongoError::failed_to_parse(format!(
            "The $fill stage specification must be an object, found {}",
            type_name(arg)
        )));
    };
    let (mut sort_by, mut partition_by, mut partition_fields, mut output) =
        (None, None, None, None);
    for (k, v) in d {
        match k.as_str() {
            "sortBy" => match v {
                Bson::Document(s) => sort_by = Some(SortSpec::parse(s)?),
                other => return Err(wrong_type(STAGE, "sortBy", other, "object")),
            },
            "partitionBy" => match v {
                Bson::String(_) | Bson::Document(_) => {
                    partition_by = Some(Expr::parse_with_vars(v, vars)?);
                }
                other => {
                    return Err(MongoError::type_mismatch(format!(
                        "BSON field '$fill.partitionBy' is the wrong type '{}', expected types '[string, object]'",
                        type_name(other)
                    )));
                }
            },
            "partitionByFields" => {
                partition_fields = Some(string_list(STAGE, "partitionByFields", v)?);
            }
            "output" => match v {
                Bson::Document(o) => output = Some(o),
                other => return Err(wrong_type(STAGE, "output", other, "object")),
            },
            other => return Err(unknown_field(STAGE, other)),
        }
    }
    let output = output.ok_or_else(|| missing_field(STAGE, "output"))?;
    let partition = match (partition_by, partition_fields) {
        (Some(_), Some(_)) => {
            return Err(MongoError::with_code(
                6050204,
                "Maximum one of 'partitionBy' and 'partitionByFields can be specified in '$fill'",
            ));
        }
        (Some(e), None) => Partition::Expr(e),
        (None, Some(f)) => Partition::Fields(f),
        (None, None) => Partition::None,
    };
    if output.is_empty() {
        return Err(MongoError::with_code(
            6050203,
            "The output field in '$fill' must contain an object with at least one element",
        ));
    }
    let mut methods = Vec::new();
    let mut values = Document::new();
    for (field, spec) in output {
        let Bson::Document(spec) = spec else {
            return Err(MongoError::with_code(
                6050200,
                "Each fill output specification must be an object with exactly one field",
            ));
        };
        check_field_path(field)?;
        let (mut method, mut value) = (None, None);
        for (k, v) in spec {
            match (k.as_str(), v) {
                ("method", Bson::String(m)) => method = Some(m),
                ("method", other) => return Err(wrong_type(STAGE, "method", other, "string")),
                ("value", v) => value = Some(v),
                (other, _) => return Err(unknown_field(STAGE, other)),
            }
        }
        if let Some(m) = method {
            if value.is_some() {
                return Err(MongoError::with_code(
                    6050201,
                    "Each fill output specification must have exactly one of 'method' or 'value' fields, not both",
                ));
            }
            let function = match m.as_str() {
                "locf" => "$locf",
                "linear" => "$linearFill",
                _ => {
                    return Err(MongoError::with_code(
                        6050202,
                        "Method must be either locf or linear",
                    ));
                }
            };
            let mut f = Document::new();
            f.insert(function, format!("${field}"));
            methods.push((field.clone(), f));
        }
        if let Some(v) = value {
            values.insert(
                field.clone(),
                doc! {"$ifNull": [format!("${field}"), v.clone()]},
            );
        }
    }
    let mut stages = Vec::new();
    if !methods.is_empty() {
        let mut outputs: Vec<(String, Func)> = Vec::with_capacity(methods.len());
        for (field, f) in methods {
            outputs.push((field, window::parse_function(&f, sort_by.as_ref(), vars)?));
        }
        stages.push(Stage::SetWindowFields(Box::new(
            SetWindowFields::from_parts(partition, sort_by, outputs),
        )));
    }
    if !values.is_empty() {
        stages.push(Stage::AddFields(Projection::parse_with_vars(
            &values,
            Syntax::AddFields,
            None,
            vars,
        )?));
    }
    Ok(stages)
}

/// Runs a parsed `$fill` (its stages in order).
pub fn run_fill(stages: &[Stage], mut docs: Vec<Document>, env: &Env) -> Result<Vec<Document>> {
    for s in stages {
        docs = s.run_in(docs, env)?;
    }
    Ok(docs)
}

#[cfg(test)]
mod tests;
