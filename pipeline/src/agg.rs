//! Aggregation stages over documents: parsing a pipeline once and running it over an input.
//!
//! Supported stages: `$match $project $addFields $set $unset $replaceRoot $replaceWith $redact`
//! (single-document transforms, see [`Stage::is_single_document_transform`]) and
//! `$group $sort $limit $skip $count $unwind $sortByCount $bucket $bucketAuto $facet $sample
//! $setWindowFields $densify $fill` (which need the whole stream), and `$lookup $unionWith
//! $graphLookup $documents` ([`lookup`]: other collections' documents come in the run
//! environment). Stages that need server state (`$out`, ...; see [`UNSUPPORTED_STAGES`]) are
//! CommandNotSupported (115), unknown names 40324.
//!
//! Families with their own module: `window` (`$setWindowFields` and its window functions),
//! `densify` (`$densify`, and `$fill` rewritten onto `$setWindowFields`/`$addFields`),
//! `bucket_auto`, `sample`, `time_unit` (date units shared by windows and densify), `lookup`
//! and `split` (the shards' and the router's parts of a pipeline).
//!
//! Invariants:
//! * A stage specification is a document with exactly one field (40323) naming a known stage
//!   (40324); parse errors carry MongoDB's location codes.
//! * Single-document transforms map one document to at most one document and keep no state,
//!   so change streams can run them one event at a time with [`Stage::apply_one`]; running a
//!   pipeline of such stages over a batch equals applying them to each document in order.
//! * `$group` groups by [`crate::value::compare`] equality (so `1` and `1.0` share a group) and
//!   outputs groups in order of first appearance; `$sort` is stable.
//! * `$sample` is the one stage whose output is not a function of its input (random choice and
//!   order); every other stage is deterministic.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use bson::{Bson, Document, doc};

use crate::collation::Collation;
use crate::expr::{self, Env, Expr};
use crate::matcher::Matcher;
use crate::projection::{Projection, Syntax};
use crate::sort::SortSpec;
use crate::value::{self, compare};
use crate::{MongoError, Result};

mod bucket_auto;
mod densify;
mod sample;
pub mod spill;
mod stream;
mod time_unit;
mod window;

pub use bucket_auto::BucketAuto;
pub use densify::Densify;
pub use stream::{Docs, FacetOutput, PushRun};
pub use time_unit::TimeUnit;
pub use window::SetWindowFields;
pub mod lookup;
pub mod split;

/// A parsed pipeline.
#[derive(Debug, Clone)]
pub struct Pipeline {
    stages: Vec<Stage>,
}

/// One parsed stage.
#[derive(Debug, Clone)]
pub enum Stage {
    Match(Matcher),
    /// `$project` and `$unset`.
    Project(Projection),
    /// `$addFields` and `$set`.
    AddFields(Projection),
    /// `$replaceRoot` and `$replaceWith`.
    ReplaceRoot(Expr),
    Redact(Expr),
    Group(Group),
    Sort(SortSpec),
    Limit(u64),
    Skip(u64),
    Count(String),
    Unwind(Unwind),
    /// `$sortByCount`: group by the expression, count, sort by count descending.
    SortByCount(Group),
    Bucket(Bucket),
    /// `$facet`: named sub-pipelines over the same input, one output document.
    Facet(Vec<(String, Pipeline)>),
    /// `$sample`: the requested size.
    Sample(u64),
    BucketAuto(Box<BucketAuto>),
    SetWindowFields(Box<SetWindowFields>),
    Densify(Box<Densify>),
    /// `$fill`, as the `$setWindowFields`/`$addFields` stages it stands for.
    Fill(Vec<Stage>),
    /// `$lookup`, `$unionWith`, `$graphLookup`: read other collections ([`lookup::Foreign`]).
    Lookup(Box<lookup::Lookup>),
    UnionWith(Box<lookup::UnionWith>),
    GraphLookup(Box<lookup::GraphLookup>),
    /// `$documents`: literal documents as the stream (first stage only).
    Documents(Expr),
}

/// A `$bucket` specification: `groupBy` (the group's `_id`), sorted boundaries, a default.
#[derive(Debug, Clone)]
pub struct Bucket {
    group: Group,
    boundaries: Vec<Bson>,
    default: Option<Bson>,
}

/// A `$unwind` specification.
#[derive(Debug, Clone)]
pub struct Unwind {
    pub path: String,
    pub include_array_index: Option<String>,
    pub preserve_null_and_empty_arrays: bool,
}

/// A `$group` specification: the `_id` expression and the named accumulators.
#[derive(Debug, Clone)]
pub struct Group {
    id: Expr,
    accumulators: Vec<(String, AccKind, Expr)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AccKind {
    Sum,
    Avg,
    Min,
    Max,
    First,
    Last,
    Push,
    AddToSet,
    Count,
    MergeObjects,
}

impl Pipeline {
    /// Parses the stages of a pipeline.
    pub fn parse(stages: &[Document]) -> Result<Pipeline> {
        Pipeline::parse_with_vars(stages, &[])
    }

    /// Parses the stages where expressions may use the given user variables (the command's
    /// `let`); their values come with [`Pipeline::run_in`].
    pub fn parse_with_vars(stages: &[Document], vars: &[String]) -> Result<Pipeline> {
        if let Some(name) = stages
            .iter()
            .skip(1)
            .filter_map(|s| s.keys().next())
            .find(|name| FIRST_STAGE_ONLY.contains(&name.as_str()))
        {
            return Err(stage_err(
                40602,
                format!("{name} is only valid as the first stage in a pipeline"),
            ));
        }
        let stages: Vec<Stage> = stages
            .iter()
            .map(|s| Stage::parse_with_vars(s, vars))
            .collect::<Result<_>>()?;
        Ok(Pipeline { stages })
    }

    /// The pipeline of parsed `stages`.
    pub fn from_stages(stages: Vec<Stage>) -> Pipeline {
        Pipeline { stages }
    }

    /// The parsed stages.
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// Whether every stage is a single-document transform.
    pub fn is_single_document_transform(&self) -> bool {
        self.stages.iter().all(Stage::is_single_document_transform)
    }

    /// Runs the pipeline over the input, in order.
    pub fn run(&self, input: impl IntoIterator<Item = Document>) -> Result<Vec<Document>> {
        self.run_in(input, &Env::default())
    }

    /// Runs the pipeline with `$$NOW` and user variable values.
    pub fn run_in(
        &self,
        input: impl IntoIterator<Item = Document>,
        env: &Env,
    ) -> Result<Vec<Document>> {
        let mut docs: Vec<Document> = input.into_iter().collect();
        for stage in &self.stages {
            docs = stage.run_in(docs, env)?;
        }
        Ok(docs)
    }
}

fn stage_err(code: i32, msg: impl Into<String>) -> MongoError {
    MongoError::with_code(code, msg)
}

/// The memory a blocking stage ($sort, $group, $bucket, $bucketAuto, $setWindowFields) may
/// hold without `allowDiskUse` by default, as MongoDB's
/// `internalQueryMaxBlockingSortMemoryUsageBytes` and
/// `internalDocumentSourceGroupMaxMemoryBytes` (100 MiB each; [`spill`] has the values in
/// force).
pub const MAX_BLOCKING_BYTES: usize = spill::DEFAULT_LIMIT;

/// `QueryExceededMemoryLimitNoDiskUseAllowed` (292).
fn over_memory_limit(msg: String) -> MongoError {
    MongoError::new(
        wire::ErrorCode::QUERY_EXCEEDED_MEMORY_LIMIT_NO_DISK_USE_ALLOWED,
        msg,
    )
}

/// A stage that holds all of `docs` at once stops at the sort limit ([`spill::sort_limit`])
/// without `allowDiskUse`. With it, `$sort` and `$group` spill to disk when they run over a
/// stream ([`Pipeline::push_run`], [`Pipeline::stream`]); the other blocking stages run in
/// memory.
fn check_blocking(stage: &str, docs: &[Document], env: &Env) -> Result<()> {
    if env.allow_disk_use {
        return Ok(());
    }
    let limit = spill::sort_limit();
    let mut bytes = 0_usize;
    for d in docs {
        bytes += crate::changestream::split::document_size(d);
        if bytes > limit {
            return Err(over_memory_limit(match stage {
                "$sort" => format!(
                    "Sort exceeded memory limit of {limit} bytes, but did not opt in to \
                     external sorting."
                ),
                _ => format!(
                    "{stage} exceeded memory limit of {limit} bytes, but did not opt in to \
                     external sorting. Pass allowDiskUse:true to opt in."
                ),
            }));
        }
    }
    Ok(())
}

impl Stage {
    /// Parses one `{$stage: spec}` document.
    pub fn parse(spec: &Document) -> Result<Stage> {
        Stage::parse_with_vars(spec, &[])
    }

    /// Parses one stage where expressions may use the given user variables.
    pub fn parse_with_vars(spec: &Document, vars: &[String]) -> Result<Stage> {
        if spec.len() != 1 {
            return Err(stage_err(
                40323,
                "A pipeline stage specification object must contain exactly one field.",
            ));
        }
        let Some((name, arg)) = spec.iter().next() else {
            return Err(stage_err(
                40323,
                "A pipeline stage specification object must contain exactly one field.",
            ));
        };
        Ok(match name.as_str() {
            "$match" => match arg {
                Bson::Document(d) => Stage::Match(Matcher::parse_with_vars(d, vars)?),
                _ => {
                    return Err(stage_err(
                        15959,
                        "the match filter must be an expression in an object",
                    ));
                }
            },
            "$project" => match arg {
                Bson::Document(d) => {
                    Stage::Project(Projection::parse_with_vars(d, Syntax::Project, None, vars)?)
                }
                _ => {
                    return Err(stage_err(15969, "$project specification must be an object"));
                }
            },
            "$addFields" | "$set" => match arg {
                Bson::Document(d) => Stage::AddFields(Projection::parse_with_vars(
                    d,
                    Syntax::AddFields,
                    None,
                    vars,
                )?),
                other => {
                    return Err(stage_err(
                        40272,
                        format!(
                            "{name} specification stage must be an object, got {}",
                            value::type_name(other)
                        ),
                    ));
                }
            },
            "$unset" => {
                let fields: Vec<&Bson> = match arg {
                    Bson::String(_) => vec![arg],
                    Bson::Array(a) if a.is_empty() => {
                        return Err(stage_err(
                            31119,
                            "$unset specification must be a string or an array with at least one field",
                        ));
                    }
                    Bson::Array(a) => a.iter().collect(),
                    _ => {
                        return Err(stage_err(
                            31002,
                            "$unset specification must be a string or an array",
                        ));
                    }
                };
                let mut spec = Document::new();
                for f in fields {
                    let Bson::String(s) = f else {
                        return Err(stage_err(
                            31120,
                            "$unset specification must be a string or an array containing only string values",
                        ));
                    };
                    spec.insert(s.clone(), 0);
                }
                Stage::Project(Projection::parse_with(&spec, Syntax::Project, None)?)
            }
            "$replaceRoot" => {
                let Bson::Document(d) = arg else {
                    return Err(stage_err(
                        40228,
                        format!(
                            "expected an object as specification for $replaceRoot stage, got {}",
                            value::type_name(arg)
                        ),
                    ));
                };
                let mut new_root = None;
                for (k, v) in d {
                    if k == "newRoot" {
                        new_root = Some(Expr::parse_with_vars(v, vars)?);
                    } else {
                        return Err(stage_err(
                            40415,
                            format!("BSON field '$replaceRoot.{k}' is an unknown field."),
                        ));
                    }
                }
                Stage::ReplaceRoot(new_root.ok_or_else(|| {
                    stage_err(
                        40414,
                        "BSON field '$replaceRoot.newRoot' is missing but a required field",
                    )
                })?)
            }
            "$replaceWith" => Stage::ReplaceRoot(Expr::parse_with_vars(arg, vars)?),
            "$redact" => Stage::Redact(Expr::parse_with_vars(arg, vars)?),
            "$group" => Stage::Group(Group::parse(arg, vars)?),
            "$sort" => {
                let Bson::Document(d) = arg else {
                    return Err(stage_err(
                        15973,
                        "the $sort key specification must be an object",
                    ));
                };
                if d.is_empty() {
                    return Err(stage_err(
                        15976,
                        "$sort stage must have at least one sort key",
                    ));
                }
                Stage::Sort(SortSpec::parse(d)?)
            }
            "$limit" => {
                let n = integral_arg(arg)
                    .ok_or_else(|| stage_err(15957, "the limit must be specified as a number"))?;
                if n <= 0 {
                    return Err(stage_err(15958, "the limit must be positive"));
                }
                Stage::Limit(u64::try_from(n).unwrap_or(u64::MAX))
            }
            "$skip" => {
                let n = integral_arg(arg)
                    .ok_or_else(|| stage_err(15972, "Argument to $skip must be a number"))?;
                if n < 0 {
                    return Err(stage_err(15956, "Argument to $skip cannot be negative"));
                }
                Stage::Skip(u64::try_from(n).unwrap_or(0))
            }
            "$count" => {
                let Bson::String(f) = arg else {
                    return Err(stage_err(
                        40156,
                        "the count field must be a non-empty string",
                    ));
                };
                if f.is_empty() {
                    return Err(stage_err(
                        40157,
                        "the count field must be a non-empty string",
                    ));
                }
                if f.starts_with('$') {
                    return Err(stage_err(
                        40158,
                        "the count field cannot be a $-prefixed path",
                    ));
                }
                if f.contains('\0') {
                    return Err(stage_err(
                        40159,
                        "the count field cannot contain a null byte",
                    ));
                }
                if f.contains('.') {
                    return Err(stage_err(40160, "the count field cannot contain '.'"));
                }
                Stage::Count(f.clone())
            }
            "$unwind" => Stage::Unwind(Unwind::parse(arg)?),
            "$sortByCount" => {
                match arg {
                    Bson::String(s) if s.starts_with('$') => {}
                    Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {}
                    Bson::Document(_) => {
                        return Err(stage_err(
                            40147,
                            "the sortByCount field must be specified as a single expression",
                        ));
                    }
                    _ => {
                        return Err(stage_err(
                            40148,
                            "the sortByCount field must be defined as a $-prefixed path or an expression",
                        ));
                    }
                }
                Stage::SortByCount(Group {
                    id: Expr::parse_with_vars(arg, vars)?,
                    accumulators: vec![(
                        "count".into(),
                        AccKind::Sum,
                        Expr::literal(Bson::Int32(1)),
                    )],
                })
            }
            "$bucket" => Stage::Bucket(Bucket::parse(arg, vars)?),
            "$facet" => {
                let Bson::Document(d) = arg else {
                    return Err(stage_err(
                        40169,
                        "the $facet specification must be a non-empty object",
                    ));
                };
                if d.is_empty() {
                    return Err(stage_err(
                        40169,
                        "the $facet specification must be a non-empty object",
                    ));
                }
                let mut facets = Vec::with_capacity(d.len());
                for (name, v) in d {
                    if name.is_empty() || name.starts_with('$') || name.contains('.') {
                        return Err(stage_err(
                            40353,
                            format!(
                                "FieldPath field names may not start with '$' or contain '.': {name}"
                            ),
                        ));
                    }
                    let Bson::Array(items) = v else {
                        return Err(stage_err(
                            40170,
                            format!(
                                "arguments to $facet must be arrays, {name} is type {}",
                                value::type_name(v)
                            ),
                        ));
                    };
                    let mut stages = Vec::with_capacity(items.len());
                    for item in items {
                        let Bson::Document(sd) = item else {
                            return Err(stage_err(
                                40171,
                                format!(
                                    "subpipeline of $facet must be an array of objects, found {}",
                                    value::type_name(item)
                                ),
                            ));
                        };
                        if sd.contains_key("$facet") {
                            return Err(stage_err(
                                40600,
                                "$facet is not allowed to be used within a $facet stage",
                            ));
                        }
                        stages.push(sd.clone());
                    }
                    facets.push((name.clone(), Pipeline::parse_with_vars(&stages, vars)?));
                }
                Stage::Facet(facets)
            }
            "$sample" => Stage::Sample(sample::parse(arg)?),
            "$bucketAuto" => Stage::BucketAuto(Box::new(BucketAuto::parse(arg, vars)?)),
            "$setWindowFields" => {
                Stage::SetWindowFields(Box::new(SetWindowFields::parse(arg, vars)?))
            }
            "$densify" => Stage::Densify(Box::new(Densify::parse(arg)?)),
            "$fill" => Stage::Fill(densify::parse_fill(arg, vars)?),
            "$lookup" => Stage::Lookup(Box::new(lookup::Lookup::parse(arg, vars)?)),
            "$unionWith" => Stage::UnionWith(Box::new(lookup::UnionWith::parse(arg, vars)?)),
            "$graphLookup" => Stage::GraphLookup(Box::new(lookup::GraphLookup::parse(arg, vars)?)),
            "$documents" => Stage::Documents(Expr::parse_with_vars(arg, vars)?),
            name if UNSUPPORTED_STAGES.contains(&name) => {
                return Err(MongoError::new(
                    wire::ErrorCode::COMMAND_NOT_SUPPORTED,
                    format!("{name} is not supported by this server"),
                ));
            }
            other => {
                return Err(stage_err(
                    40324,
                    format!("Unrecognized pipeline stage name: '{other}'"),
                ));
            }
        })
    }

    /// The stage's name as written (`"$match"`, ...; `$set` reports `"$addFields"`).
    pub fn name(&self) -> &'static str {
        match self {
            Stage::Match(_) => "$match",
            Stage::Project(_) => "$project",
            Stage::AddFields(_) => "$addFields",
            Stage::ReplaceRoot(_) => "$replaceRoot",
            Stage::Redact(_) => "$redact",
            Stage::Group(_) => "$group",
            Stage::Sort(_) => "$sort",
            Stage::Limit(_) => "$limit",
            Stage::Skip(_) => "$skip",
            Stage::Count(_) => "$count",
            Stage::Unwind(_) => "$unwind",
            Stage::SortByCount(_) => "$sortByCount",
            Stage::Bucket(_) => "$bucket",
            Stage::Facet(_) => "$facet",
            Stage::Sample(_) => "$sample",
            Stage::BucketAuto(_) => "$bucketAuto",
            Stage::SetWindowFields(_) => "$setWindowFields",
            Stage::Densify(_) => "$densify",
            Stage::Fill(_) => "$fill",
            Stage::Lookup(_) => "$lookup",
            Stage::UnionWith(_) => "$unionWith",
            Stage::GraphLookup(_) => "$graphLookup",
            Stage::Documents(_) => "$documents",
        }
    }

    /// Whether the stage maps each document to at most one document without state.
    pub fn is_single_document_transform(&self) -> bool {
        matches!(
            self,
            Stage::Match(_)
                | Stage::Project(_)
                | Stage::AddFields(_)
                | Stage::ReplaceRoot(_)
                | Stage::Redact(_)
        )
    }

    /// Applies a single-document transform; `Ok(None)` drops the document. Other stages are
    /// an error (callers check [`Stage::is_single_document_transform`] first).
    pub fn apply_one(&self, doc: Document) -> Result<Option<Document>> {
        self.apply_one_in(doc, &Env::default())
    }

    /// [`Stage::apply_one`] with `$$NOW` and user variable values.
    pub fn apply_one_in(&self, doc: Document, env: &Env) -> Result<Option<Document>> {
        match self {
            Stage::Match(m) => Ok(m.try_matches_in(&doc, env)?.then_some(doc)),
            Stage::Project(p) | Stage::AddFields(p) => p.apply_in(&doc, env).map(Some),
            Stage::ReplaceRoot(e) => match e.evaluate_in(&doc, env)? {
                Some(Bson::Document(d)) => Ok(Some(d)),
                other => Err(stage_err(
                    40228,
                    format!(
                        "'newRoot' expression must evaluate to an object, but resulting value was: {}. Type of resulting value: '{}'. Input document: {doc}",
                        other
                            .as_ref()
                            .map(|v| v.to_string())
                            .unwrap_or_else(|| "MISSING".into()),
                        other.as_ref().map(value::type_name).unwrap_or("missing"),
                    ),
                )),
            },
            Stage::Redact(e) => redact(e, &doc, &doc, env),
            _ => Err(MongoError::internal(format!(
                "{} is not a single-document stage",
                self.name()
            ))),
        }
    }

    /// Runs the stage over a batch.
    pub fn run(&self, docs: Vec<Document>) -> Result<Vec<Document>> {
        self.run_in(docs, &Env::default())
    }

    /// Runs the stage over a batch with `$$NOW` and user variable values.
    pub fn run_in(&self, docs: Vec<Document>, env: &Env) -> Result<Vec<Document>> {
        crate::interrupt::check_now()?;
        Ok(match self {
            s if s.is_single_document_transform() => {
                let mut out = Vec::with_capacity(docs.len());
                for d in docs {
                    crate::interrupt::check()?;
                    if let Some(d) = s.apply_one_in(d, env)? {
                        out.push(d);
                    }
                }
                out
            }
            Stage::Group(g) => g.run(docs, env)?,
            Stage::SortByCount(g) => {
                let mut out = g.run(docs, env)?;
                let spec = SortSpec::parse(&doc! {"count": -1})?;
                spec.sort(&mut out);
                out
            }
            Stage::Bucket(b) => b.run(docs, env)?,
            Stage::Sample(n) => sample::sample(docs, *n),
            Stage::BucketAuto(b) => {
                check_blocking("$bucketAuto", &docs, env)?;
                b.run(docs, env)?
            }
            Stage::SetWindowFields(w) => {
                check_blocking("$setWindowFields", &docs, env)?;
                w.run(docs, env)?
            }
            Stage::Densify(d) => d.run(docs)?,
            Stage::Fill(stages) => densify::run_fill(stages, docs, env)?,
            Stage::Facet(facets) => vec![stream::FacetSink::run(facets, docs, env)?],
            Stage::Sort(spec) => {
                check_blocking("$sort", &docs, env)?;
                let mut docs = docs;
                spec.sort_in(&mut docs, env.collation.as_ref());
                docs
            }
            Stage::Limit(n) => docs
                .into_iter()
                .take(usize::try_from(*n).unwrap_or(usize::MAX))
                .collect(),
            Stage::Skip(n) => docs
                .into_iter()
                .skip(usize::try_from(*n).unwrap_or(usize::MAX))
                .collect(),
            Stage::Count(f) => count_document(f, docs.len() as u64).into_iter().collect(),
            Stage::Unwind(u) => {
                let mut out = Vec::with_capacity(docs.len());
                for d in docs {
                    u.apply(d, &mut out);
                }
                out
            }
            Stage::Lookup(l) => l.run(docs, env)?,
            Stage::UnionWith(u) => u.run(docs, env)?,
            Stage::GraphLookup(g) => g.run(docs, env)?,
            Stage::Documents(e) => lookup::documents(e, env)?,
            _ => docs,
        })
    }
}

/// MongoDB stages this crate knows by name but does not run (they need other collections or
/// server state); the router may implement some of them itself.
/// Stages MongoDB accepts only first in a pipeline (40602 elsewhere).
const FIRST_STAGE_ONLY: &[&str] = &[
    "$documents",
    "$currentOp",
    "$listLocalSessions",
    "$listSessions",
    "$collStats",
    "$indexStats",
    "$planCacheStats",
    "$changeStream",
    "$geoNear",
    "$search",
    "$searchMeta",
];

pub const UNSUPPORTED_STAGES: &[&str] = &[
    "$out",
    "$merge",
    "$geoNear",
    "$collStats",
    "$indexStats",
    "$currentOp",
    "$listSessions",
    "$listLocalSessions",
    "$planCacheStats",
    "$search",
    "$searchMeta",
    "$changeStreamSplitLargeEvent",
];

impl Bucket {
    fn parse(arg: &Bson, vars: &[String]) -> Result<Bucket> {
        let Bson::Document(d) = arg else {
            return Err(stage_err(
                40201,
                format!(
                    "Argument to $bucket stage must be an object, but found type: {}",
                    value::type_name(arg)
                ),
            ));
        };
        let (mut group_by, mut boundaries, mut default, mut output) = (None, None, None, None);
        for (k, v) in d {
            match k.as_str() {
                "groupBy" => {
                    let ok = matches!(v, Bson::String(s) if s.starts_with('$'))
                        || matches!(v, Bson::Document(_));
                    if !ok {
                        return Err(stage_err(
                            40202,
                            format!(
                                "The $bucket 'groupBy' field must be defined as a $-prefixed path or an expression, but found: {v}"
                            ),
                        ));
                    }
                    group_by = Some(Expr::parse_with_vars(v, vars)?);
                }
                "boundaries" => {
                    let Bson::Array(b) = v else {
                        return Err(stage_err(
                            40200,
                            format!(
                                "The $bucket 'boundaries' field must be an array, but found type: {}",
                                value::type_name(v)
                            ),
                        ));
                    };
                    boundaries = Some(b.clone());
                }
                "default" => default = Some(v.clone()),
                "output" => {
                    let Bson::Document(o) = v else {
                        return Err(stage_err(
                            40196,
                            format!(
                                "The $bucket 'output' field must be an object, but found type: {}",
                                value::type_name(v)
                            ),
                        ));
                    };
                    output = Some(parse_accumulators(o, vars)?);
                }
                other => {
                    return Err(stage_err(
                        40197,
                        format!("Unrecognized option to $bucket: {other}."),
                    ));
                }
            }
        }
        let (Some(group_by), Some(boundaries)) = (group_by, boundaries) else {
            return Err(stage_err(
                40198,
                "$bucket requires 'groupBy' and 'boundaries' to be specified.",
            ));
        };
        if boundaries.len() < 2 {
            return Err(stage_err(
                40192,
                format!(
                    "The $bucket 'boundaries' field must have at least 2 values, but found {} value(s).",
                    boundaries.len()
                ),
            ));
        }
        for w in boundaries.windows(2) {
            if let [a, b] = w {
                if value::canonical_type(a) != value::canonical_type(b) {
                    return Err(stage_err(
                        40193,
                        format!(
                            "All values in the the 'boundaries' option to $bucket must have the same type. Found conflicting types {} and {}.",
                            value::type_name(a),
                            value::type_name(b)
                        ),
                    ));
                }
                if compare(a, b) != Ordering::Less {
                    return Err(stage_err(
                        40194,
                        format!(
                            "The 'boundaries' option to $bucket must be sorted in ascending order, but elements {a} and {b} are not in ascending order."
                        ),
                    ));
                }
            }
        }
        if let (Some(dv), Some(first), Some(last)) =
            (&default, boundaries.first(), boundaries.last())
            && value::canonical_type(dv) == value::canonical_type(first)
            && compare(dv, first) != Ordering::Less
            && compare(dv, last) == Ordering::Less
        {
            return Err(stage_err(
                40199,
                "The $bucket 'default' field must be less than the lowest boundary or greater than or equal to the highest boundary.",
            ));
        }
        let accumulators = output
            .unwrap_or_else(|| vec![("count".into(), AccKind::Sum, Expr::literal(Bson::Int32(1)))]);
        Ok(Bucket {
            group: Group {
                id: group_by,
                accumulators,
            },
            boundaries,
            default,
        })
    }

    /// Groups into buckets `[b[i], b[i+1])` (or the default), sorted by bucket.
    fn run(&self, docs: Vec<Document>, env: &Env) -> Result<Vec<Document>> {
        let mut out = self.group.run_keyed(docs, env, |v| self.slot(v, env))?;
        Bucket::sort(&mut out, env)?;
        Ok(out)
    }

    /// The bucket a `groupBy` value falls in: the lower bound of its boundaries, or the
    /// default (40066 when there is none, as MongoDB's `$switch` says).
    fn slot(&self, v: Bson, env: &Env) -> Result<Bson> {
        let slot = self.boundaries.windows(2).find(
            |w| matches!(w, [lo, hi] if env.compare(&v, lo).is_ge() && env.compare(&v, hi).is_lt()),
        );
        match (slot, &self.default) {
            (Some([lo, _]), _) => Ok(lo.clone()),
            (_, Some(d)) => Ok(d.clone()),
            _ => Err(stage_err(
                40066,
                "$switch could not find a matching branch for an input, and no default was specified.",
            )),
        }
    }

    /// Buckets in their output order (by `_id`).
    fn sort(buckets: &mut [Document], env: &Env) -> Result<()> {
        SortSpec::parse(&doc! {"_id": 1})?.sort_in(buckets, env.collation.as_ref());
        Ok(())
    }
}

/// `$count`'s output for `n` documents: `{field: n}` (an int when it fits), nothing for none.
fn count_document(field: &str, n: u64) -> Option<Document> {
    if n == 0 {
        return None;
    }
    let n = i64::try_from(n).unwrap_or(i64::MAX);
    let v = match i32::try_from(n) {
        Ok(i) => Bson::Int32(i),
        Err(_) => Bson::Int64(n),
    };
    let mut d = Document::new();
    d.insert(field, v);
    Some(d)
}

/// An integral number argument (`$limit`, `$skip`).
fn integral_arg(v: &Bson) -> Option<i64> {
    if value::is_number(v) {
        value::as_i64_exact(v)
    } else {
        None
    }
}

fn redact(e: &Expr, root: &Document, current: &Document, env: &Env) -> Result<Option<Document>> {
    let verdict = e.evaluate_at(root, current, env)?;
    match verdict.as_ref() {
        Some(Bson::String(s)) if s == expr::REDACT_KEEP => Ok(Some(current.clone())),
        Some(Bson::String(s)) if s == expr::REDACT_PRUNE => Ok(None),
        Some(Bson::String(s)) if s == expr::REDACT_DESCEND => {
            let mut out = Document::new();
            for (k, v) in current {
                match v {
                    Bson::Document(d) => {
                        if let Some(r) = redact(e, root, d, env)? {
                            out.insert(k.clone(), r);
                        }
                    }
                    Bson::Array(a) => {
                        out.insert(k.clone(), redact_array(e, root, a, env)?);
                    }
                    other => {
                        out.insert(k.clone(), other.clone());
                    }
                }
            }
            Ok(Some(out))
        }
        other => Err(stage_err(
            17053,
            format!(
                "$redact's expression should not return anything aside from the variables $$KEEP, $$DESCEND, and $$PRUNE, but returned {}",
                other
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "MISSING".into())
            ),
        )),
    }
}

fn redact_array(e: &Expr, root: &Document, a: &[Bson], env: &Env) -> Result<Bson> {
    let mut out = Vec::with_capacity(a.len());
    for v in a {
        match v {
            Bson::Document(d) => {
                if let Some(r) = redact(e, root, d, env)? {
                    out.push(Bson::Document(r));
                }
            }
            Bson::Array(inner) => out.push(redact_array(e, root, inner, env)?),
            other => out.push(other.clone()),
        }
    }
    Ok(Bson::Array(out))
}

impl Unwind {
    fn parse(arg: &Bson) -> Result<Unwind> {
        let check_path = |p: &str| -> Result<String> {
            match p.strip_prefix('$') {
                Some(rest) if !rest.is_empty() && !rest.starts_with('$') => Ok(rest.to_string()),
                _ => Err(stage_err(
                    28818,
                    format!("path option to $unwind stage should be prefixed with a '$': {p}"),
                )),
            }
        };
        match arg {
            Bson::String(s) => Ok(Unwind {
                path: check_path(s)?,
                include_array_index: None,
                preserve_null_and_empty_arrays: false,
            }),
            Bson::Document(d) => {
                let mut path = None;
                let mut index = None;
                let mut preserve = false;
                for (k, v) in d {
                    match k.as_str() {
                        "path" => match v {
                            Bson::String(s) => path = Some(check_path(s)?),
                            other => {
                                return Err(stage_err(
                                    28808,
                                    format!(
                                        "expected a string as the path for $unwind stage, got {}",
                                        value::type_name(other)
                                    ),
                                ));
                            }
                        },
                        "includeArrayIndex" => match v {
                            Bson::String(s) if s.is_empty() || s.starts_with('$') => {
                                return Err(stage_err(
                                    28822,
                                    format!(
                                        "includeArrayIndex option to $unwind stage should not be prefixed with a '$': {s}"
                                    ),
                                ));
                            }
                            Bson::String(s) => index = Some(s.clone()),
                            other => {
                                return Err(stage_err(
                                    28810,
                                    format!(
                                        "expected a non-empty string for the includeArrayIndex option to $unwind stage, got {}",
                                        value::type_name(other)
                                    ),
                                ));
                            }
                        },
                        "preserveNullAndEmptyArrays" => match v {
                            Bson::Boolean(b) => preserve = *b,
                            other => {
                                return Err(stage_err(
                                    28809,
                                    format!(
                                        "expected a boolean for the preserveNullAndEmptyArrays option to $unwind stage, got {}",
                                        value::type_name(other)
                                    ),
                                ));
                            }
                        },
                        other => {
                            return Err(stage_err(
                                28811,
                                format!("unrecognized option to $unwind stage: {other}"),
                            ));
                        }
                    }
                }
                Ok(Unwind {
                    path: path
                        .ok_or_else(|| stage_err(28812, "no path specified to $unwind stage"))?,
                    include_array_index: index,
                    preserve_null_and_empty_arrays: preserve,
                })
            }
            other => Err(stage_err(
                15981,
                format!(
                    "expected either a string or an object as specification for $unwind stage, got {}",
                    value::type_name(other)
                ),
            )),
        }
    }

    /// Unwinds one document into `out`.
    pub fn apply(&self, doc: Document, out: &mut Vec<Document>) {
        let with_index = |mut d: Document, i: Option<usize>| {
            if let Some(f) = &self.include_array_index {
                let v = match i {
                    Some(i) => Bson::Int64(i64::try_from(i).unwrap_or(i64::MAX)),
                    None => Bson::Null,
                };
                value::set_path(&mut d, f, v);
            }
            d
        };
        match value::get_path(&doc, &self.path).cloned() {
            Some(Bson::Array(a)) => {
                if a.is_empty() {
                    if self.preserve_null_and_empty_arrays {
                        let mut d = doc;
                        value::remove_path(&mut d, &self.path);
                        out.push(with_index(d, None));
                    }
                    return;
                }
                for (i, e) in a.into_iter().enumerate() {
                    let mut d = doc.clone();
                    value::set_path(&mut d, &self.path, e);
                    out.push(with_index(d, Some(i)));
                }
            }
            None | Some(Bson::Null) | Some(Bson::Undefined) => {
                if self.preserve_null_and_empty_arrays {
                    out.push(with_index(doc, None));
                }
            }
            Some(_) => out.push(with_index(doc, None)),
        }
    }
}

/// A BSON value ordered by MongoDB's comparison, for grouping. Under a collation the value is
/// folded first ([`Collation::fold`]), so strings equal under it share a key.
struct GroupKey(Bson);

impl GroupKey {
    fn new(v: Bson, collation: Option<&Collation>) -> GroupKey {
        match collation {
            Some(c) if crate::collation::has_string(&v) => GroupKey(c.fold(&v)),
            _ => GroupKey(v),
        }
    }
}

impl PartialEq for GroupKey {
    fn eq(&self, other: &Self) -> bool {
        compare(&self.0, &other.0) == Ordering::Equal
    }
}
impl Eq for GroupKey {}
impl PartialOrd for GroupKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for GroupKey {
    fn cmp(&self, other: &Self) -> Ordering {
        compare(&self.0, &other.0)
    }
}

/// One accumulator's running state.
#[derive(Debug, Clone)]
enum AccState {
    Sum(Bson),
    Avg(Bson, u64),
    Best(Option<Bson>),
    First(Option<Bson>),
    Last(Option<Bson>),
    Push(Vec<Bson>),
    Set(Vec<Bson>, BTreeMap<GroupKey, ()>),
    Merge(Document),
}

impl std::fmt::Debug for GroupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl Clone for GroupKey {
    fn clone(&self) -> Self {
        GroupKey(self.0.clone())
    }
}

impl Group {
    fn parse(arg: &Bson, vars: &[String]) -> Result<Group> {
        let Bson::Document(d) = arg else {
            return Err(stage_err(
                15947,
                "a group's fields must be specified in an object",
            ));
        };
        let mut id = None;
        let mut fields = Document::new();
        for (k, v) in d {
            if k == "_id" {
                id = Some(Expr::parse_with_vars(v, vars)?);
            } else {
                fields.insert(k.clone(), v.clone());
            }
        }
        Ok(Group {
            id: id.ok_or_else(|| stage_err(15955, "a group specification must include an _id"))?,
            accumulators: parse_accumulators(&fields, vars)?,
        })
    }
}

/// Named accumulators (`{total: {$sum: "$x"}, ...}`) of `$group` and `$bucket`'s `output`.
fn parse_accumulators(d: &Document, vars: &[String]) -> Result<Vec<(String, AccKind, Expr)>> {
    let mut accumulators = Vec::new();
    for (k, v) in d {
        if k.contains('.') {
            return Err(stage_err(
                40235,
                format!("The field name '{k}' cannot contain '.'"),
            ));
        }
        if k.starts_with('$') {
            return Err(stage_err(
                40236,
                format!("The field name '{k}' cannot be an operator name"),
            ));
        }
        let Bson::Document(acc) = v else {
            return Err(stage_err(
                40234,
                format!("The field '{k}' must be an accumulator object"),
            ));
        };
        if acc.len() != 1 {
            return Err(stage_err(
                40238,
                format!("The field '{k}' must specify one accumulator"),
            ));
        }
        let Some((op, operand)) = acc.iter().next() else {
            return Err(stage_err(
                40238,
                format!("The field '{k}' must specify one accumulator"),
            ));
        };
        let kind = match op.as_str() {
            "$sum" => AccKind::Sum,
            "$avg" => AccKind::Avg,
            "$min" => AccKind::Min,
            "$max" => AccKind::Max,
            "$first" => AccKind::First,
            "$last" => AccKind::Last,
            "$push" => AccKind::Push,
            "$addToSet" => AccKind::AddToSet,
            "$count" => AccKind::Count,
            "$mergeObjects" => AccKind::MergeObjects,
            "$accumulator" => return Err(crate::expr::no_javascript()),
            other => {
                return Err(stage_err(
                    15952,
                    format!("unknown group operator '{other}'"),
                ));
            }
        };
        if matches!(operand, Bson::Array(_)) && kind != AccKind::Count {
            return Err(stage_err(
                40237,
                format!("The {op} accumulator is a unary operator"),
            ));
        }
        let e = accumulator_input(kind == AccKind::Count, operand, vars)?;
        accumulators.push((k.clone(), kind, e));
    }
    Ok(accumulators)
}

impl Group {
    fn init(&self) -> Vec<AccState> {
        self.accumulators
            .iter()
            .map(|(_, kind, _)| match kind {
                AccKind::Sum | AccKind::Count => AccState::Sum(Bson::Int32(0)),
                AccKind::Avg => AccState::Avg(Bson::Int32(0), 0),
                AccKind::Min | AccKind::Max => AccState::Best(None),
                AccKind::First => AccState::First(None),
                AccKind::Last => AccState::Last(None),
                AccKind::Push => AccState::Push(Vec::new()),
                AccKind::AddToSet => AccState::Set(Vec::new(), BTreeMap::new()),
                AccKind::MergeObjects => AccState::Merge(Document::new()),
            })
            .collect()
    }

    /// Runs the grouping over a batch; groups come out in order of first appearance.
    pub fn run(&self, docs: Vec<Document>, env: &Env) -> Result<Vec<Document>> {
        self.run_keyed(docs, env, Ok)
    }

    /// Runs the grouping with the group key derived from the `_id` expression's value.
    fn run_keyed(
        &self,
        docs: Vec<Document>,
        env: &Env,
        key_of: impl Fn(Bson) -> Result<Bson>,
    ) -> Result<Vec<Document>> {
        let limit = (!env.allow_disk_use).then(spill::group_limit);
        let mut table = Table::default();
        for d in &docs {
            crate::interrupt::check()?;
            let key = key_of(self.id.evaluate_in(d, env)?.unwrap_or(Bson::Null))?;
            table.add(self, env, limit, key, self.inputs(d, env)?)?;
        }
        Ok(table.finish(self))
    }

    /// The values each accumulator takes from `d`.
    fn inputs(&self, d: &Document, env: &Env) -> Result<Vec<Option<Bson>>> {
        self.accumulators
            .iter()
            .map(|(_, _, e)| e.evaluate_in(d, env))
            .collect()
    }

    /// A finished group's output document.
    fn output(&self, key: Bson, states: Vec<AccState>) -> Document {
        let mut out = doc! {"_id": key};
        for ((name, _, _), st) in self.accumulators.iter().zip(states) {
            out.insert(name.clone(), finish(st));
        }
        out
    }
}

/// The groups of a `$group` in memory, in order of first appearance.
#[derive(Default)]
struct Table {
    index: BTreeMap<GroupKey, usize>,
    /// Each group's key, accumulator states, and whether a document reached it yet.
    groups: Vec<(Bson, Vec<AccState>, bool)>,
    /// What the groups hold: their keys, the values `$push` / `$addToSet` keep, and each other
    /// accumulator's one value as the group's first document gave it.
    held: usize,
}

impl Table {
    /// Adds one document's key and accumulator inputs; past `limit` bytes held, 292.
    fn add(
        &mut self,
        group: &Group,
        env: &Env,
        limit: Option<usize>,
        key: Bson,
        inputs: Vec<Option<Bson>>,
    ) -> Result<()> {
        let mut hold = |v: &Bson| -> Result<()> {
            self.held += crate::changestream::split::value_size(v);
            match limit {
                Some(limit) if self.held > limit => Err(over_memory_limit(
                    "Exceeded memory limit for $group, but didn't allow external sort. Pass \
                     allowDiskUse:true to opt in."
                        .into(),
                )),
                _ => Ok(()),
            }
        };
        let group_key = GroupKey::new(key.clone(), env.collation.as_ref());
        let gi = match self.index.get(&group_key) {
            Some(i) => *i,
            None => {
                hold(&key)?;
                // The values a new group's single-value accumulators keep ($first, $max, ...):
                // counted once, at the size the group's first document gives them.
                for ((_, kind, _), v) in group.accumulators.iter().zip(&inputs) {
                    if !matches!(kind, AccKind::Push | AccKind::AddToSet)
                        && let Some(v) = v
                    {
                        hold(v)?;
                    }
                }
                self.groups.push((key, group.init(), false));
                let i = self.groups.len() - 1;
                self.index.insert(group_key, i);
                i
            }
        };
        for ((_, kind, _), v) in group.accumulators.iter().zip(&inputs) {
            if matches!(kind, AccKind::Push | AccKind::AddToSet)
                && let Some(v) = v
            {
                hold(v)?;
            }
        }
        let Some((_, states, seen)) = self.groups.get_mut(gi) else {
            return Ok(());
        };
        let first_doc = !*seen;
        *seen = true;
        for (((_, kind, _), st), v) in group.accumulators.iter().zip(states.iter_mut()).zip(inputs)
        {
            accumulate(*kind, st, v, first_doc, env)?;
        }
        Ok(())
    }

    fn finish(self, group: &Group) -> Vec<Document> {
        self.groups
            .into_iter()
            .map(|(key, states, _)| group.output(key, states))
            .collect()
    }
}

fn accumulate(
    kind: AccKind,
    st: &mut AccState,
    v: Option<Bson>,
    first_doc: bool,
    env: &Env,
) -> Result<()> {
    match st {
        AccState::Sum(acc) => {
            if let Some(n) = v.as_ref().filter(|n| value::is_number(n)) {
                *acc = value::add_numbers(acc, n).unwrap_or(Bson::Null);
            }
        }
        AccState::Avg(acc, count) => {
            if let Some(n) = v.as_ref().filter(|n| value::is_number(n)) {
                *acc = value::add_numbers(acc, n).unwrap_or(Bson::Null);
                *count += 1;
            }
        }
        AccState::Best(best) => {
            if let Some(x) = v.filter(|x| !matches!(x, Bson::Null | Bson::Undefined))
                && beats(kind == AccKind::Min, &x, best.as_ref(), env)
            {
                *best = Some(x);
            }
        }
        AccState::First(first) => {
            if first_doc {
                *first = Some(v.unwrap_or(Bson::Null));
            }
        }
        AccState::Last(last) => *last = Some(v.unwrap_or(Bson::Null)),
        AccState::Push(items) => {
            if let Some(x) = v {
                items.push(x);
            }
        }
        AccState::Set(items, seen) => {
            if let Some(x) = v
                && seen
                    .insert(GroupKey::new(x.clone(), env.collation.as_ref()), ())
                    .is_none()
            {
                items.push(x);
            }
        }
        AccState::Merge(d) => match v {
            None | Some(Bson::Null) | Some(Bson::Undefined) => {}
            Some(Bson::Document(m)) => {
                for (k, x) in m {
                    d.insert(k, x);
                }
            }
            Some(other) => {
                return Err(stage_err(
                    40400,
                    format!(
                        "$mergeObjects requires object inputs, but input {other} is of type {}",
                        value::type_name(&other)
                    ),
                ));
            }
        },
    }
    Ok(())
}

fn finish(st: AccState) -> Bson {
    match st {
        AccState::Sum(acc) => acc,
        AccState::Avg(_, 0) => Bson::Null,
        AccState::Avg(acc, n) => {
            let avg = value::as_f64(&acc).unwrap_or(f64::NAN) / n as f64;
            if matches!(acc, Bson::Decimal128(_)) {
                Bson::Decimal128(value::f64_to_decimal(avg))
            } else {
                Bson::Double(avg)
            }
        }
        AccState::Best(b) => b.unwrap_or(Bson::Null),
        AccState::First(v) | AccState::Last(v) => v.unwrap_or(Bson::Null),
        AccState::Push(items) | AccState::Set(items, _) => Bson::Array(items),
        AccState::Merge(d) => Bson::Document(d),
    }
}

/// What an accumulator adds up: its operand, or 1 per document for `$count: {}` (which takes
/// no arguments). Shared by `$group` and window functions.
fn accumulator_input(count: bool, operand: &Bson, vars: &[String]) -> Result<Expr> {
    if !count {
        return Expr::parse_with_vars(operand, vars);
    }
    match operand {
        Bson::Document(c) if c.is_empty() => Ok(Expr::literal(Bson::Int32(1))),
        _ => Err(MongoError::type_mismatch(
            "$count takes no arguments, i.e. $count:{}",
        )),
    }
}

/// Whether `x` replaces the current `$min` (`min`) or `$max` value `best` (shared by `$group`
/// and window functions), under the environment's collation.
fn beats(min: bool, x: &Bson, best: Option<&Bson>, env: &Env) -> bool {
    best.is_none_or(|b| {
        let o = env.compare(x, b);
        if min { o.is_lt() } else { o.is_gt() }
    })
}

#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
