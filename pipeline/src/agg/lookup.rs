//! The stages that read documents from elsewhere: `$lookup`, `$unionWith`, `$graphLookup`
//! (other collections of the same database) and `$documents` (literal documents).
//!
//! Collections are not read here: the caller reads every collection the pipeline names
//! ([`foreign_collections`], nested pipelines included) and hands their documents in as a
//! [`Foreign`] (a [`ForeignSource`]) in the run environment ([`crate::expr::Env::foreign`]).
//! A stage that names a collection the environment does not carry fails (CommandNotSupported,
//! 115) rather than reading it as empty: only a caller that saw the whole cluster may run these
//! stages.
//!
//! Invariants:
//! * `localField`/`foreignField` match as MongoDB's equality `$match` does: every value the
//!   local path reaches (arrays expanded one level at the leaf) is looked for; none at all looks
//!   for `null`, which matches a foreign `null` or missing field; a foreign array matches when
//!   any element (or the array itself) is equal. The filter runs through [`Matcher`], so the
//!   semantics are those of `$match`.
//! * `$graphLookup` returns each foreign document at most once (by `_id`), at the depth it was
//!   first reached; the search stops after `maxDepth` or when no new value is left to look for,
//!   so it ends on cyclic graphs.
//! * `$documents` is a pipeline's first stage (40602 elsewhere) and ignores its input.

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};

use bson::{Bson, Document, doc};

use super::{Pipeline, Stage, stage_err};
use crate::collation::Collation;
use crate::expr::{Env, Expr};
use crate::foreign::ForeignSource;
use crate::matcher::Matcher;
use crate::value::{self, compare};
use crate::{MongoError, Result};

/// How many input documents a join takes at once, at most (the foreign documents it reads
/// are those one chunk can join).
pub const CHUNK_DOCS: usize = 1_000;

/// The most input bytes a join takes at once (one document more when a single one is larger).
pub const CHUNK_BYTES: usize = 16 * 1024 * 1024;

/// The documents of the other collections a pipeline reads, by collection name (same database).
#[derive(Debug, Default, Clone)]
pub struct Foreign {
    collections: HashMap<String, Vec<Document>>,
}

impl Foreign {
    /// Records a collection's documents (a collection that does not exist is empty).
    pub fn insert(&mut self, collection: impl Into<String>, docs: Vec<Document>) {
        self.collections.insert(collection.into(), docs);
    }

    /// A collection's documents, if they were read.
    pub fn get(&self, collection: &str) -> Option<&[Document]> {
        self.collections.get(collection).map(Vec::as_slice)
    }
}

impl ForeignSource for Foreign {
    fn documents(&self, collection: &str) -> Option<&[Document]> {
        self.get(collection)
    }
}

/// `$lookup`.
#[derive(Debug, Clone)]
pub struct Lookup {
    from: Option<String>,
    as_field: String,
    /// `(localField, foreignField)`.
    join: Option<(String, String)>,
    let_vars: Vec<(String, Expr)>,
    pipeline: Option<Pipeline>,
    /// The sub-pipeline's stage documents (empty without one).
    stages: Vec<Document>,
    /// The sub-pipeline's first stage, when it is a `$match` (its filter).
    first_match: Option<Document>,
}

/// `$unionWith`.
#[derive(Debug, Clone)]
pub struct UnionWith {
    coll: Option<String>,
    pipeline: Option<Pipeline>,
    /// The sub-pipeline's stage documents (empty without one).
    stages: Vec<Document>,
}

/// `$graphLookup`.
#[derive(Debug, Clone)]
pub struct GraphLookup {
    from: String,
    start_with: Expr,
    connect_from: String,
    connect_to: String,
    as_field: String,
    max_depth: Option<u64>,
    depth_field: Option<String>,
    restrict: Option<Matcher>,
}

/// The names of the collections a pipeline reads besides its input, nested pipelines
/// (`$lookup`, `$unionWith`, `$facet`) included.
pub fn foreign_collections(p: &Pipeline) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    collect(p, &mut out);
    out
}

/// The collections one stage reads (nested pipelines included).
pub fn stage_foreign_collections(stage: &Stage) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    collect_stage(stage, &mut out);
    out
}

fn collect(p: &Pipeline, out: &mut BTreeSet<String>) {
    for stage in p.stages() {
        collect_stage(stage, out);
    }
}

fn collect_stage(stage: &Stage, out: &mut BTreeSet<String>) {
    match stage {
        Stage::Lookup(l) => {
            out.extend(l.from.clone());
            if let Some(sub) = &l.pipeline {
                collect(sub, out);
            }
        }
        Stage::UnionWith(u) => {
            out.extend(u.coll.clone());
            if let Some(sub) = &u.pipeline {
                collect(sub, out);
            }
        }
        Stage::GraphLookup(g) => {
            out.insert(g.from.clone());
        }
        Stage::Facet(facets) => {
            for (_, sub) in facets {
                collect(sub, out);
            }
        }
        _ => {}
    }
}

/// Where a `$unionWith`'s documents come from, for the router to read them as an aggregate of
/// their own (see [`union_source`]).
#[derive(Debug)]
pub enum UnionSource<'a> {
    /// The sub-pipeline's stages (none for `{$unionWith: "<coll>"}`) over a collection: an
    /// aggregate of that collection, split between the shards that hold it and the router, as
    /// mongos runs it.
    Collection(&'a str, &'a [Document]),
    /// A sub-pipeline that makes its own documents (`$documents` first; a collection named
    /// beside it is not read).
    Documents(&'a Pipeline),
}

/// Where `stage`'s documents come from, when it is a `$unionWith`.
pub fn union_source(stage: &Stage) -> Option<UnionSource<'_>> {
    let Stage::UnionWith(u) = stage else {
        return None;
    };
    match (&u.pipeline, &u.coll) {
        (Some(p), _) if starts_with_documents(Some(p)) => Some(UnionSource::Documents(p)),
        (_, Some(coll)) => Some(UnionSource::Collection(coll, &u.stages)),
        // The parse refuses a `$unionWith` with neither.
        (_, None) => None,
    }
}

/// Filters that together select the documents whose `field` equals one of `values` (as the
/// join's `$eq` does: `null` also finds a missing field), each for at most `chunk` values:
/// `$in`, or the `$or` of `$eq`s when a value is a regex (which `$in` would match as a
/// pattern).
fn in_filters(field: &str, values: &[Bson], chunk: usize) -> Vec<Document> {
    values
        .chunks(chunk.max(1))
        .map(|part| {
            if part.iter().any(|v| matches!(v, Bson::RegularExpression(_))) {
                join_filter(field, part.to_vec())
            } else {
                doc! {field: {"$in": part.to_vec()}}
            }
        })
        .collect()
}

/// The documents a `$graphLookup` can reach from its input, found level by level as the
/// stage itself searches, for the caller to read instead of the whole `from` collection:
/// [`GraphPrefetch::next_filters`] names what the next level reads, [`GraphPrefetch::found`]
/// takes what it read. Every document any input document's search reaches (to `maxDepth`,
/// through documents `restrictSearchWithMatch` lets by) is kept, so the stage's result is the
/// same; documents the restriction excludes are read but neither kept nor followed.
pub struct GraphPrefetch {
    from: String,
    connect_to: String,
    connect_from: String,
    max_depth: Option<u64>,
    restrict: Option<(Matcher, Env)>,
    depth: u64,
    frontier: Vec<Bson>,
    queried: BTreeSet<Key>,
    visited: BTreeSet<Key>,
    docs: Vec<Document>,
    /// What `docs` holds, up to the sort limit (40099 past it, with or without disk use, as
    /// MongoDB 7.0's `$graphLookup`).
    bytes: usize,
}

impl GraphPrefetch {
    /// The search for `stage` (a `$graphLookup`) over `input`; `None` for other stages.
    pub fn start(stage: &Stage, input: &[Document], env: &Env) -> Result<Option<GraphPrefetch>> {
        let Stage::GraphLookup(g) = stage else {
            return Ok(None);
        };
        let mut queried = BTreeSet::new();
        let mut frontier = Vec::new();
        for doc in input {
            let start = match g.start_with.evaluate_in(doc, env)? {
                Some(Bson::Array(a)) => a,
                Some(v) => vec![v],
                None => Vec::new(),
            };
            for v in start {
                if queried.insert(Key(v.clone())) {
                    frontier.push(v);
                }
            }
        }
        Ok(Some(GraphPrefetch {
            from: g.from.clone(),
            connect_to: g.connect_to.clone(),
            connect_from: g.connect_from.clone(),
            max_depth: g.max_depth,
            restrict: g.restrict.clone().map(|m| (m, env.clone())),
            depth: 0,
            frontier,
            queried,
            visited: BTreeSet::new(),
            docs: Vec::new(),
            bytes: 0,
        }))
    }

    /// The collection searched.
    pub fn from(&self) -> &str {
        &self.from
    }

    /// The filters (at most `chunk` values each) of the next level's read, or `None` when the
    /// search is over (nothing new to look for, or `maxDepth` passed).
    pub fn next_filters(&mut self, chunk: usize) -> Option<Vec<Document>> {
        if self.frontier.is_empty() || self.max_depth.is_some_and(|max| self.depth > max) {
            return None;
        }
        self.depth += 1;
        let values = std::mem::take(&mut self.frontier);
        Some(in_filters(&self.connect_to, &values, chunk))
    }

    /// Takes a level's documents: new ones the restriction lets by are kept, and their
    /// `connectFromField` values not yet looked for make the next level.
    pub fn found(&mut self, docs: Vec<Document>) -> Result<()> {
        for d in docs {
            if let Some((m, env)) = &self.restrict
                && !m.try_matches_in(&d, env)?
            {
                continue;
            }
            let id = d.get("_id").cloned().unwrap_or(Bson::Null);
            if !self.visited.insert(Key(id)) {
                continue;
            }
            for v in leaf_values(&d, &self.connect_from) {
                if self.queried.insert(Key(v.clone())) {
                    self.frontier.push(v);
                }
            }
            self.bytes += crate::changestream::split::document_size(&d);
            if self.bytes > super::spill::sort_limit() {
                return Err(MongoError::with_code(
                    40099,
                    "$graphLookup reached maximum memory consumption",
                ));
            }
            self.docs.push(d);
        }
        Ok(())
    }

    /// Every document kept, each once.
    pub fn into_docs(self) -> Vec<Document> {
        self.docs
    }
}

/// What a `$lookup` needs of its `from` collection to run over `input`: the collection and
/// filters (each for at most `chunk` values) that together select every foreign document
/// that can join some input document, so reading them instead of the whole collection changes
/// no result. The join is `localField`/`foreignField` (the union of the per-document join
/// filters), or else a correlated sub-pipeline whose first `$match` requires
/// `{$expr: {$eq: ["$<field>", "$$<let variable>"]}}` (`$in` on the variable's values, which
/// selects a superset of the documents `$eq` keeps; see [`correlated_eq`]). `None` when the
/// stage is no such join (or its sub-pipeline starts with `$documents` or reads other
/// collections, or a variable is missing for some document): it needs its collection whole.
pub fn join_prefetch(
    stage: &Stage,
    input: &[Document],
    chunk: usize,
    env: &Env,
) -> Result<Option<(String, Vec<Document>)>> {
    let Some((l, from)) = lookup_of_collection(stage) else {
        return Ok(None);
    };
    let mut values = Vec::new();
    let field = match (&l.join, correlated_eq(l)) {
        (Some((local, foreign_field)), _) => {
            for doc in input {
                let reached = leaf_values(doc, local);
                if reached.is_empty() {
                    values.push(Bson::Null);
                }
                values.extend(reached);
            }
            foreign_field.clone()
        }
        (None, Some((field, var))) => {
            for doc in input {
                match l.let_vars[var].1.evaluate_in(doc, env)? {
                    Some(v) => values.push(v),
                    None => return Ok(None),
                }
            }
            field
        }
        (None, None) => return Ok(None),
    };
    values.sort_by(compare);
    values.dedup_by(|a, b| compare(a, b) == Ordering::Equal);
    Ok(Some((from.clone(), in_filters(&field, &values, chunk))))
}

/// `stage` as a `$lookup` whose documents come from its `from` collection alone (its
/// sub-pipeline neither starts with `$documents` nor reads other collections), with that
/// collection's name; `None` for anything else.
fn lookup_of_collection(stage: &Stage) -> Option<(&Lookup, &String)> {
    let Stage::Lookup(l) = stage else {
        return None;
    };
    let from = l.from.as_ref()?;
    let elsewhere = l
        .pipeline
        .as_ref()
        .is_some_and(|p| p.stages().iter().any(reads_other_collections));
    (!starts_with_documents(l.pipeline.as_ref()) && !elsewhere).then_some((l, from))
}

/// In a `$lookup`'s correlated sub-pipeline, the first `$match`'s requirement that a top-level
/// foreign field equal one of the stage's `let` variables: a `$expr` (at the top, in a
/// top-level `$and`, or a conjunct of the `$expr`'s own `$and`) `{$eq: ["$<field>",
/// "$$<var>"]}` in either order, as the field name and the variable's index. Only one-name
/// fields: `$expr`'s `"$a.b"` collects an array's values into one array, which a query's `a.b`
/// does not, so `$in` there would not select a superset.
fn correlated_eq(l: &Lookup) -> Option<(String, usize)> {
    let filter = l.first_match.as_ref()?;
    let mut exprs: Vec<&Bson> = Vec::new();
    for (k, v) in filter {
        match (k.as_str(), v) {
            ("$expr", e) => exprs.push(e),
            ("$and", Bson::Array(items)) => exprs.extend(
                items
                    .iter()
                    .filter_map(Bson::as_document)
                    .filter_map(|d| d.get("$expr")),
            ),
            _ => {}
        }
    }
    let conjuncts = exprs.into_iter().flat_map(|e| {
        match e.as_document().and_then(|d| d.get_array("$and").ok()) {
            Some(items) => items.iter().collect::<Vec<_>>(),
            None => vec![e],
        }
    });
    for c in conjuncts {
        let Some(Bson::Array(args)) = c
            .as_document()
            .filter(|d| d.len() == 1)
            .and_then(|d| d.get("$eq"))
        else {
            continue;
        };
        let [a, b] = args.as_slice() else {
            continue;
        };
        for (f, v) in [(a, b), (b, a)] {
            let field = f
                .as_str()
                .and_then(|f| f.strip_prefix('$'))
                .filter(|f| !f.is_empty() && !f.starts_with('$') && !f.contains('.'));
            let var = v.as_str().and_then(|v| v.strip_prefix("$$"));
            if let (Some(field), Some(var)) = (field, var)
                && let Some(i) = l.let_vars.iter().position(|(n, _)| n == var)
            {
                return Some((field.to_string(), i));
            }
        }
    }
    None
}

/// One document's `$lookup` as MongoDB runs every document's: a query of its own on the
/// foreign collection (what the router falls back to when the collection is too large to hold
/// for the whole input). Running `stages` over collection `from` under `env` gives the
/// documents that join `doc`; [`PerDocument::attach`] puts them in place.
pub struct PerDocument {
    pub from: String,
    /// The join's `$match` (for `localField`/`foreignField`), then the sub-pipeline.
    pub stages: Vec<Document>,
    /// The caller's environment with the stage's `let` variables bound for `doc`.
    pub env: Env,
    as_field: String,
}

impl PerDocument {
    /// `doc` with what joined it in the stage's `as` field.
    pub fn attach(&self, mut doc: Document, joined: Vec<Document>) -> Document {
        let joined = Bson::Array(joined.into_iter().map(Bson::Document).collect());
        set_output(&mut doc, &self.as_field, joined);
        doc
    }
}

/// `doc`'s run of `stage` as a query of its own (see [`PerDocument`]); `None` when the stage
/// is no `$lookup` of a collection, or its sub-pipeline starts with `$documents` (it reads
/// nothing) or reads other collections.
pub fn lookup_per_document(
    stage: &Stage,
    doc: &Document,
    env: &Env,
) -> Result<Option<PerDocument>> {
    let Some((l, from)) = lookup_of_collection(stage) else {
        return Ok(None);
    };
    let mut inner = env.clone();
    inner.foreign = None;
    for (name, e) in &l.let_vars {
        if let Some(v) = e.evaluate_in(doc, env)? {
            inner.vars.push((name.clone(), v));
        }
    }
    let mut stages = Vec::with_capacity(l.stages.len() + 1);
    if let Some((local, foreign_field)) = &l.join {
        let filter = join_filter(foreign_field, leaf_values(doc, local));
        stages.push(doc! {"$match": filter});
    }
    stages.extend(l.stages.iter().cloned());
    Ok(Some(PerDocument {
        from: from.clone(),
        stages,
        env: inner,
        as_field: l.as_field.clone(),
    }))
}

/// Whether the stage (or a pipeline nested in it) reads other collections, so it must run
/// where every collection can be read.
pub fn reads_other_collections(stage: &Stage) -> bool {
    match stage {
        Stage::Lookup(_) | Stage::UnionWith(_) | Stage::GraphLookup(_) => true,
        Stage::Facet(facets) => facets
            .iter()
            .any(|(_, p)| p.stages().iter().any(reads_other_collections)),
        _ => false,
    }
}

fn foreign_docs<'e>(env: &'e Env, coll: &str, stage: &str) -> Result<&'e [Document]> {
    env.foreign
        .as_ref()
        .and_then(|f| f.documents(coll))
        .ok_or_else(|| {
            MongoError::new(
                wire::ErrorCode::COMMAND_NOT_SUPPORTED,
                format!("{stage} from '{coll}' must run on the router, which reads the collection"),
            )
        })
}

/// How deep `$lookup` and `$unionWith` sub-pipelines may nest (MongoDB's limit).
pub const MAX_SUB_PIPELINE_DEPTH: usize = 20;

/// The deepest nesting of `$lookup` / `$unionWith` sub-pipelines (through `$facet` too).
fn sub_pipeline_depth(p: &Pipeline) -> usize {
    p.stages()
        .iter()
        .map(|s| match s {
            Stage::Lookup(l) => 1 + l.pipeline.as_ref().map_or(0, sub_pipeline_depth),
            Stage::UnionWith(u) => 1 + u.pipeline.as_ref().map_or(0, sub_pipeline_depth),
            Stage::Facet(f) => f
                .iter()
                .map(|(_, p)| sub_pipeline_depth(p))
                .max()
                .unwrap_or(0),
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

/// A nested `pipeline` argument: an array of stage documents.
fn sub_pipeline(v: &Bson, vars: &[String], within: &str, code: i32) -> Result<Pipeline> {
    let Bson::Array(items) = v else {
        return Err(MongoError::type_mismatch(
            "'pipeline' option must be specified as an array",
        ));
    };
    let mut stages = Vec::with_capacity(items.len());
    for item in items {
        let Bson::Document(d) = item else {
            return Err(MongoError::type_mismatch(
                "Each element of the 'pipeline' array must be an object",
            ));
        };
        if let Some(name) = ["$out", "$merge"].into_iter().find(|n| d.contains_key(*n)) {
            return Err(stage_err(
                code,
                format!("{name} is not allowed within a {within}'s sub-pipeline"),
            ));
        }
        stages.push(d.clone());
    }
    let p = Pipeline::parse_with_vars(&stages, vars)?;
    if sub_pipeline_depth(&p) + 1 > MAX_SUB_PIPELINE_DEPTH {
        return Err(MongoError::new(
            wire::ErrorCode::MAX_SUB_PIPELINE_DEPTH_EXCEEDED,
            format!(
                "Maximum number of nested sub-pipelines exceeded. Limit is {MAX_SUB_PIPELINE_DEPTH}"
            ),
        ));
    }
    Ok(p)
}

fn starts_with_documents(p: Option<&Pipeline>) -> bool {
    p.and_then(|p| p.stages().first())
        .is_some_and(|s| matches!(s, Stage::Documents(_)))
}

/// A collection name argument (`from`, `coll`): a valid name in this database.
fn collection_name(v: &str, stage: &str) -> Result<String> {
    if v.is_empty() || v.contains('\0') || v.starts_with('.') || v.starts_with("system.") {
        return Err(MongoError::new(
            wire::ErrorCode::INVALID_NAMESPACE,
            format!("invalid {stage} namespace: '{v}'"),
        ));
    }
    Ok(v.to_string())
}

/// A field path argument (`as`, `localField`, ...): no `$` prefix (16410), not empty.
fn field_path(v: &str) -> Result<String> {
    if v.is_empty() {
        return Err(stage_err(
            40352,
            "FieldPath cannot be constructed with empty string",
        ));
    }
    if v.split('.').any(|p| p.starts_with('$')) {
        return Err(stage_err(
            16410,
            format!(
                "FieldPath field names may not start with '$'. Consider using $getField or $setField. ({v})"
            ),
        ));
    }
    if v.split('.').any(str::is_empty) {
        return Err(stage_err(
            15998,
            format!("FieldPath field names may not be empty strings. ({v})"),
        ));
    }
    Ok(v.to_string())
}

/// Sets `path` to `v`, replacing whatever non-document stands in the way.
fn set_output(doc: &mut Document, path: &str, v: Bson) {
    if !value::set_path(doc, path, v.clone()) {
        let top = path.split('.').next().unwrap_or(path);
        doc.insert(top, Document::new());
        value::set_path(doc, path, v);
    }
}

/// Every value a path reaches, arrays at the leaf expanded one level (what `$lookup` joins on).
fn leaf_values(doc: &Document, path: &str) -> Vec<Bson> {
    let mut out = Vec::new();
    for v in value::path_values(doc, path) {
        match v {
            Bson::Array(a) => out.extend(a.iter().cloned()),
            other => out.push(other.clone()),
        }
    }
    out
}

/// The equality filter on `foreign_field` for the values `values` (MongoDB's `$lookup` join).
fn join_filter(foreign_field: &str, values: Vec<Bson>) -> Document {
    let mut values = values;
    if values.is_empty() {
        values.push(Bson::Null);
    }
    if values.len() == 1 {
        let v = values.pop().unwrap_or(Bson::Null);
        return doc! {foreign_field: {"$eq": v}};
    }
    let any: Vec<Bson> = values
        .into_iter()
        .map(|v| Bson::Document(doc! {foreign_field: {"$eq": v}}))
        .collect();
    doc! {"$or": any}
}

impl Lookup {
    pub(super) fn parse(arg: &Bson, vars: &[String]) -> Result<Lookup> {
        let bad = |msg: String| MongoError::failed_to_parse(msg);
        let Bson::Document(d) = arg else {
            return Err(bad("the $lookup specification must be an Object".into()));
        };
        let (mut from, mut as_field, mut local, mut foreign) = (None, None, None, None);
        let mut let_spec = None;
        let mut pipeline = None;
        for (k, v) in d {
            match (k.as_str(), v) {
                ("pipeline", _) => pipeline = Some(v),
                ("let", Bson::Document(l)) => let_spec = Some(l),
                ("let", other) => {
                    return Err(bad(format!(
                        "$lookup argument 'let: {other}' must be an object, is type {}",
                        value::type_name(other)
                    )));
                }
                ("from", Bson::String(s)) => from = Some(collection_name(s, "$lookup")?),
                ("from", other) => {
                    return Err(bad(format!(
                        "$lookup 'from' field must be a string, but found {}",
                        value::type_name(other)
                    )));
                }
                ("as" | "localField" | "foreignField", Bson::String(s)) => {
                    let slot = match k.as_str() {
                        "as" => &mut as_field,
                        "localField" => &mut local,
                        _ => &mut foreign,
                    };
                    *slot = Some(s.clone()).filter(|s| !s.is_empty());
                }
                ("as" | "localField" | "foreignField", other) => {
                    return Err(bad(format!(
                        "$lookup argument '{k}: {other}' must be a string, found {}",
                        value::type_name(other)
                    )));
                }
                _ => return Err(bad(format!("unknown argument to $lookup: {k}"))),
            }
        }
        let mut let_vars = Vec::new();
        let mut inner_vars = vars.to_vec();
        for (name, e) in let_spec.into_iter().flatten() {
            crate::expr::check_var_name(name)?;
            let_vars.push((name.clone(), Expr::parse_with_vars(e, vars)?));
            inner_vars.push(name.clone());
        }
        let first_match = pipeline
            .and_then(Bson::as_array)
            .and_then(|stages| stages.first())
            .and_then(Bson::as_document)
            .and_then(|stage| stage.get_document("$match").ok())
            .cloned();
        let stages = pipeline
            .and_then(Bson::as_array)
            .into_iter()
            .flatten()
            .filter_map(Bson::as_document)
            .cloned()
            .collect();
        let pipeline = pipeline
            .map(|p| sub_pipeline(p, &inner_vars, "$lookup", 51047))
            .transpose()?;
        if from.is_none() && !starts_with_documents(pipeline.as_ref()) {
            return Err(bad(if pipeline.is_some() {
                "$lookup stage without explicit collection must have a pipeline with $documents as first stage".into()
            } else {
                "must specify 'pipeline' when 'from' is empty".into()
            }));
        }
        let as_field = field_path(
            &as_field.ok_or_else(|| bad("must specify 'as' field for a $lookup".into()))?,
        )?;
        let join = match (local, foreign) {
            (Some(l), Some(f)) => Some((field_path(&l)?, field_path(&f)?)),
            (None, None) if pipeline.is_some() => None,
            _ if pipeline.is_some() => {
                return Err(bad(
                    "$lookup requires both or neither of 'localField' and 'foreignField' to be specified"
                        .into(),
                ));
            }
            _ => {
                return Err(bad(
                    "$lookup requires either 'pipeline' or both 'localField' and 'foreignField' to be specified"
                        .into(),
                ));
            }
        };
        if pipeline.is_none() && !let_vars.is_empty() {
            return Err(bad(
                "$lookup with a 'let' argument must also specify 'pipeline'".into(),
            ));
        }
        Ok(Lookup {
            from,
            as_field,
            join,
            let_vars,
            pipeline,
            stages,
            first_match,
        })
    }

    pub(super) fn run(&self, docs: Vec<Document>, env: &Env) -> Result<Vec<Document>> {
        let run = self.prepare(env)?;
        docs.into_iter()
            .map(|d| self.join_one(d, &run, env))
            .collect()
    }

    /// What every document's join shares: the foreign documents and their index.
    fn prepare<'e>(&self, env: &'e Env) -> Result<(&'e [Document], Option<JoinIndex>)> {
        let from_documents = starts_with_documents(self.pipeline.as_ref());
        let foreign = match (&self.from, from_documents) {
            (Some(c), false) => foreign_docs(env, c, "$lookup")?,
            _ => &[],
        };
        let index = match &self.join {
            Some((_, foreign_field)) if !from_documents => {
                JoinIndex::build(foreign, foreign_field, env)
            }
            _ => None,
        };
        Ok((foreign, index))
    }

    /// `doc` with what joins it in its `as` field.
    fn join_one(
        &self,
        mut doc: Document,
        (foreign, index): &(&[Document], Option<JoinIndex>),
        env: &Env,
    ) -> Result<Document> {
        crate::interrupt::check()?;
        let mut inner = env.clone();
        for (name, e) in &self.let_vars {
            if let Some(v) = e.evaluate_in(&doc, env)? {
                inner.vars.push((name.clone(), v));
            }
        }
        let (join, candidates) = match &self.join {
            Some((local, foreign_field)) => {
                let values = leaf_values(&doc, local);
                let candidates = index.as_ref().and_then(|i| i.candidates(&values));
                let m = Matcher::parse(&join_filter(foreign_field, values))?;
                (Some(m), candidates)
            }
            None => (None, None),
        };
        let keep = |d: &Document| join.as_ref().is_none_or(|m| m.matches(d));
        let stages = self.pipeline.as_ref().map(Pipeline::stages).unwrap_or(&[]);
        let (mut found, rest) = match stages.split_first() {
            Some((first @ Stage::Documents(_), rest)) => {
                let mut produced = first.run_in(Vec::new(), &inner)?;
                produced.retain(keep);
                (produced, rest)
            }
            _ => match candidates {
                // The index narrows the scan; the matcher still decides.
                Some(found) => (
                    found
                        .into_iter()
                        .filter_map(|i| foreign.get(i))
                        .filter(|d| keep(d))
                        .cloned()
                        .collect(),
                    stages,
                ),
                None => (
                    foreign.iter().filter(|d| keep(d)).cloned().collect(),
                    stages,
                ),
            },
        };
        for stage in rest {
            found = stage.run_in(found, &inner)?;
        }
        set_output(
            &mut doc,
            &self.as_field,
            Bson::Array(found.into_iter().map(Bson::Document).collect()),
        );
        Ok(doc)
    }
}

impl UnionWith {
    pub(super) fn parse(arg: &Bson, vars: &[String]) -> Result<UnionWith> {
        let mut stages = Vec::new();
        let (coll, pipeline) = match arg {
            Bson::String(s) => (Some(collection_name(s, "$unionWith")?), None),
            Bson::Document(d) => {
                let (mut coll, mut pipeline) = (None, None);
                for (k, v) in d {
                    match (k.as_str(), v) {
                        ("coll", Bson::String(s)) => coll = Some(collection_name(s, "$unionWith")?),
                        ("coll", other) => {
                            return Err(MongoError::type_mismatch(format!(
                                "BSON field '$unionWith.coll' is the wrong type '{}', expected type 'string'",
                                value::type_name(other)
                            )));
                        }
                        ("pipeline", v) => {
                            pipeline = Some(sub_pipeline(v, vars, "$unionWith", 31441)?);
                            stages = v
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter_map(Bson::as_document)
                                .cloned()
                                .collect();
                        }
                        _ => {
                            return Err(stage_err(
                                40415,
                                format!("BSON field '$unionWith.{k}' is an unknown field."),
                            ));
                        }
                    }
                }
                (coll, pipeline)
            }
            other => {
                return Err(MongoError::failed_to_parse(format!(
                    "the $unionWith stage specification must be an object or string, but found {}",
                    value::type_name(other)
                )));
            }
        };
        if coll.is_none() && !starts_with_documents(pipeline.as_ref()) {
            return Err(MongoError::failed_to_parse(
                "$unionWith stage without explicit collection must have a pipeline with $documents as first stage",
            ));
        }
        Ok(UnionWith {
            coll,
            pipeline,
            stages,
        })
    }

    pub(super) fn run(&self, mut docs: Vec<Document>, env: &Env) -> Result<Vec<Document>> {
        let stages = self.pipeline.as_ref().map(Pipeline::stages).unwrap_or(&[]);
        let (mut other, rest) = match stages.split_first() {
            Some((first @ Stage::Documents(_), rest)) => (first.run_in(Vec::new(), env)?, rest),
            _ => match &self.coll {
                Some(c) => (foreign_docs(env, c, "$unionWith")?.to_vec(), stages),
                None => (Vec::new(), stages),
            },
        };
        for stage in rest {
            other = stage.run_in(other, env)?;
        }
        docs.extend(other);
        Ok(docs)
    }
}

/// The foreign documents by every value their `foreignField` reaches (each array also by its
/// elements), to narrow a `$lookup`'s equality join. It may name documents that do not match
/// (the join filter still runs on each) but never leaves out one that does, for the values it
/// answers for: not `null` or missing (which match a missing field), not regular expressions,
/// and only on paths without numeric components (which may index arrays or name fields).
/// Under a collation the values are folded ([`Collation::fold`]), so case variants meet.
struct JoinIndex {
    by_value: std::collections::BTreeMap<Key, Vec<usize>>,
    collation: Option<Collation>,
}

impl JoinIndex {
    fn key(&self, v: &Bson) -> Key {
        Key(match &self.collation {
            Some(c) => c.fold(v),
            None => v.clone(),
        })
    }

    fn build(foreign: &[Document], field: &str, env: &Env) -> Option<JoinIndex> {
        if field.split('.').any(|p| value::array_index(p).is_some()) {
            return None;
        }
        let mut index = JoinIndex {
            by_value: Default::default(),
            collation: env.collation.clone(),
        };
        for (i, d) in foreign.iter().enumerate() {
            for v in value::path_values(d, field) {
                if let Bson::Array(items) = v {
                    for e in items {
                        let k = index.key(e);
                        index.by_value.entry(k).or_default().push(i);
                    }
                }
                let k = index.key(v);
                index.by_value.entry(k).or_default().push(i);
            }
        }
        Some(index)
    }

    /// The positions of the documents that may equal one of `values`, in collection order;
    /// `None` when the index cannot answer (scan instead).
    fn candidates(&self, values: &[Bson]) -> Option<Vec<usize>> {
        if values.is_empty()
            || values.iter().any(|v| {
                matches!(
                    v,
                    Bson::Null
                        | Bson::Undefined
                        | Bson::RegularExpression(_)
                        | Bson::MinKey
                        | Bson::MaxKey
                )
            })
        {
            return None;
        }
        let mut out: Vec<usize> = values
            .iter()
            .filter_map(|v| self.by_value.get(&self.key(v)))
            .flatten()
            .copied()
            .collect();
        out.sort_unstable();
        out.dedup();
        Some(out)
    }
}

/// A BSON value ordered by MongoDB's comparison (graph search sets).
struct Key(Bson);

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        compare(&self.0, &other.0) == Ordering::Equal
    }
}
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        compare(&self.0, &other.0)
    }
}

impl GraphLookup {
    pub(super) fn parse(arg: &Bson, vars: &[String]) -> Result<GraphLookup> {
        let Bson::Document(d) = arg else {
            return Err(MongoError::failed_to_parse(
                "the $graphLookup stage specification must be an object",
            ));
        };
        let mut from = None;
        let mut start_with = None;
        let (mut connect_from, mut connect_to, mut as_field) = (None, None, None);
        let (mut max_depth, mut depth_field, mut restrict) = (None, None, None);
        for (k, v) in d {
            match k.as_str() {
                "from" => match v {
                    Bson::String(s) => from = Some(collection_name(s, "$graphLookup")?),
                    other => {
                        return Err(MongoError::failed_to_parse(format!(
                            "$graphLookup 'from' field must be a string, but found {}",
                            value::type_name(other)
                        )));
                    }
                },
                "startWith" => start_with = Some(Expr::parse_with_vars(v, vars)?),
                "connectFromField" | "connectToField" | "as" | "depthField" => {
                    let Bson::String(s) = v else {
                        return Err(stage_err(
                            40103,
                            format!(
                                "expected string as argument for {k}, found: {}",
                                value::type_name(v)
                            ),
                        ));
                    };
                    let path = Some(field_path(s)?);
                    match k.as_str() {
                        "connectFromField" => connect_from = path,
                        "connectToField" => connect_to = path,
                        "as" => as_field = path,
                        _ => depth_field = path,
                    }
                }
                "maxDepth" => {
                    if !value::is_number(v) {
                        return Err(stage_err(
                            40100,
                            format!(
                                "maxDepth must be numeric, found type: {}",
                                value::type_name(v)
                            ),
                        ));
                    }
                    let n = value::as_i64_exact(v).ok_or_else(|| {
                        stage_err(
                            40102,
                            format!("maxDepth could not be represented as a long long: {v}"),
                        )
                    })?;
                    if n < 0 {
                        return Err(stage_err(
                            40101,
                            format!("maxDepth requires a nonnegative argument, found: {n}"),
                        ));
                    }
                    max_depth = Some(n.unsigned_abs());
                }
                "restrictSearchWithMatch" => {
                    let Bson::Document(m) = v else {
                        return Err(stage_err(
                            40185,
                            format!(
                                "expected an object as specification for 'restrictSearchWithMatch', found: {}",
                                value::type_name(v)
                            ),
                        ));
                    };
                    restrict = Some(Matcher::parse_with_vars(m, vars)?);
                }
                other => {
                    return Err(stage_err(
                        40104,
                        format!("Unknown argument to $graphLookup: {other}"),
                    ));
                }
            }
        }
        let (Some(start_with), Some(connect_from), Some(connect_to), Some(as_field)) =
            (start_with, connect_from, connect_to, as_field)
        else {
            return Err(stage_err(
                40105,
                "$graphLookup requires 'startWith', 'connectFromField', 'connectToField', and 'as' to be specified",
            ));
        };
        let from = from.ok_or_else(|| {
            MongoError::failed_to_parse("must specify 'from' field for a $graphLookup")
        })?;
        Ok(GraphLookup {
            from,
            start_with,
            connect_from,
            connect_to,
            as_field,
            max_depth,
            depth_field,
            restrict,
        })
    }

    pub(super) fn run(&self, docs: Vec<Document>, env: &Env) -> Result<Vec<Document>> {
        let run = self.prepare(env)?;
        docs.into_iter()
            .map(|d| self.search_one(d, &run, env))
            .collect()
    }

    /// What every document's search shares: the foreign documents and their index.
    fn prepare<'e>(&self, env: &'e Env) -> Result<(&'e [Document], Option<JoinIndex>)> {
        let foreign = foreign_docs(env, &self.from, "$graphLookup")?;
        Ok((foreign, JoinIndex::build(foreign, &self.connect_to, env)))
    }

    /// `doc` with what its search reaches in its `as` field.
    fn search_one(
        &self,
        mut doc: Document,
        (foreign, index): &(&[Document], Option<JoinIndex>),
        env: &Env,
    ) -> Result<Document> {
        crate::interrupt::check()?;
        let mut frontier: Vec<Bson> = match self.start_with.evaluate_in(&doc, env)? {
            Some(Bson::Array(a)) => a,
            Some(v) => vec![v],
            None => Vec::new(),
        };
        let mut queried: BTreeSet<Key> = frontier.iter().cloned().map(Key).collect();
        let mut visited: BTreeSet<Key> = BTreeSet::new();
        let mut found = Vec::new();
        let mut depth: u64 = 0;
        while !frontier.is_empty() && self.max_depth.is_none_or(|max| depth <= max) {
            let values = std::mem::take(&mut frontier);
            // The index narrows the scan (in collection order); the matcher decides.
            let candidates = index.as_ref().and_then(|i| i.candidates(&values));
            let matcher = Matcher::parse(&join_filter(&self.connect_to, values))?;
            let scan: Box<dyn Iterator<Item = &Document>> = match candidates {
                Some(c) => Box::new(c.into_iter().filter_map(|i| foreign.get(i))),
                None => Box::new(foreign.iter()),
            };
            for d in scan {
                if !matcher.matches(d) {
                    continue;
                }
                if let Some(r) = &self.restrict
                    && !r.try_matches_in(d, env)?
                {
                    continue;
                }
                let id = d.get("_id").cloned().unwrap_or(Bson::Null);
                if !visited.insert(Key(id)) {
                    continue;
                }
                for v in leaf_values(d, &self.connect_from) {
                    if queried.insert(Key(v.clone())) {
                        frontier.push(v);
                    }
                }
                let mut r = d.clone();
                if let Some(f) = &self.depth_field {
                    set_output(
                        &mut r,
                        f,
                        Bson::Int64(i64::try_from(depth).unwrap_or(i64::MAX)),
                    );
                }
                found.push(Bson::Document(r));
            }
            depth += 1;
        }
        set_output(&mut doc, &self.as_field, Bson::Array(found));
        Ok(doc)
    }
}

/// `stage` (a `$lookup` or `$graphLookup`) over `docs`, one output document at a time as the
/// caller reads: the foreign documents are indexed once, and what each document joins is made
/// only when it is read, so the caller can pass each on before the next is made. `None` for
/// other stages.
pub fn join_each<'a>(
    stage: &'a Stage,
    docs: Vec<Document>,
    env: &'a Env,
) -> Result<Option<Box<dyn Iterator<Item = Result<Document>> + 'a>>> {
    Ok(match stage {
        Stage::Lookup(l) => {
            let run = l.prepare(env)?;
            Some(Box::new(
                docs.into_iter().map(move |d| l.join_one(d, &run, env)),
            ))
        }
        Stage::GraphLookup(g) => {
            let run = g.prepare(env)?;
            Some(Box::new(
                docs.into_iter().map(move |d| g.search_one(d, &run, env)),
            ))
        }
        _ => None,
    })
}

/// `$documents`: the expression (evaluated once, against no document) as the stream.
pub(super) fn documents(e: &Expr, env: &Env) -> Result<Vec<Document>> {
    match e.evaluate_in(&Document::new(), env)? {
        Some(Bson::Array(items)) => items
            .into_iter()
            .map(|item| match item {
                Bson::Document(d) => Ok(d),
                other => Err(stage_err(
                    40228,
                    format!(
                        "'replacement document' must evaluate to an object, but resulting value was: {other}. Type of resulting value: '{}'.",
                        value::type_name(&other)
                    ),
                )),
            })
            .collect(),
        other => Err(stage_err(
            5858203,
            format!(
                "an array is expected for $documents, found {}",
                other.as_ref().map(value::type_name).unwrap_or("missing")
            ),
        )),
    }
}

#[cfg(test)]
mod tests;
