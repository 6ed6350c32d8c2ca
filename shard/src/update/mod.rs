//! Updates: parsing and applying MongoDB 7.0 update specifications (operator documents,
//! replacement documents, pipelines) to one document, the upsert seed document, and the
//! `$v: 2` oplog diffs that describe what an update changed.
//!
//! Pure code: no I/O and no clock (the time for `$currentDate`/`$$NOW` is in
//! [`UpdateContext`]). Errors are [`wire::MongoError`] with MongoDB's codes.
//!
//! Layout: [`path`] (update paths, sibling order), [`operators`] (the leaf modifiers),
//! `tree` (the update tree: conflicts, resolution of `$`/`$[]`/`$[id]`, application),
//! [`positional`] (the element the query matched), [`diff`] (oplog diffs), [`upsert`].
//!
//! Invariants:
//! * [`UpdateSpec::apply`] never mutates its input and returns the new document; on error
//!   nothing was changed.
//! * Field order: a modified field keeps its position; a new field is appended, siblings
//!   created by one update in MongoDB's order (names bytewise, numeric names numerically);
//!   `$rename` writes the destination in place when it exists, else appends it. A replacement
//!   keeps the original `_id` and puts it first.
//! * `_id` (and every path in [`UpdateContext::immutable_paths`]) may not change once it has a
//!   value: ImmutableField (66).
//! * [`UpdateSpec::apply_logged`] also says how to log the update: `Unchanged` (no oplog entry,
//!   no event) exactly when the new document is byte-for-byte the old one; for operator updates
//!   the diff is built from the paths the update touched, as MongoDB's `V2LogBuilder` does;
//!   pipeline updates use [`diff_or_replacement`]; replacements log the whole document.
//!
//! # The diff shape, for the change-stream parser (`updateDescription`)
//!
//! An update's oplog entry is `o: {$v: 2, diff: D}` where `D` is a *document diff*:
//!
//! ```text
//! D := { d?: {<field>: false, ...},      // removed fields           -> removedFields
//!        u?: {<field>: <value>, ...},    // replaced values          -> updatedFields
//!        i?: {<field>: <value>, ...},    // new fields (appended)    -> updatedFields
//!        s<field>?: D | A, ... }          // nested diff of an object or array field
//! A := { a: true,                          // marks an array diff
//!        l?: <int32>,                      // new length after truncation -> truncatedArrays
//!        u<index>?: <value>, ...           // element set / appended  -> updatedFields "path.index"
//!        s<index>?: D | A, ... }           // nested diff of an element
//! ```
//!
//! Keys appear in exactly that order (`d`, `u`, `i`, then `s…` sub-diffs; in an array diff `a`,
//! `l`, then `u<i>`/`s<i>` by ascending index); sections are omitted when empty; `b` (binary
//! deltas) is never emitted. Field names inside `d`/`u`/`i` are single components (never
//! dotted paths): the parser builds dotted paths by joining the `s<field>`/`s<index>` keys it
//! descended through. Operator updates (MongoDB's behaviour): `$set`/`$inc`/... of an existing
//! field is `u` with the whole new value even if it is an object; `$push`/`$addToSet` that only
//! append give `u<i>` entries for the new elements; `$pull`/`$pop`/sorted or sliced `$push` give
//! `u` of the whole array; `$unset` of an array element gives `u<i>: null`; `$rename` gives a `d`
//! of the source and an `i` (or `u`) of the destination. Pipeline updates use the generic
//! calculator ([`diff()`]): changed sub-documents become `s` sub-diffs, shrunk arrays carry `l`,
//! fields whose position changed are deleted and re-inserted through `i`.

// `wire::MongoError` is the project's one client-visible error type; like `wire` and `pipeline`
// we return it by value rather than boxing it on every path.
#![allow(clippy::result_large_err)]

pub mod diff;
pub mod operators;
pub mod path;
pub mod positional;
mod tree;
pub mod upsert;
pub mod values;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};

use bson::{Bson, Document};
use pipeline::Matcher;
use wire::{ErrorCode, MongoError, Result};

pub use diff::{DiffOutcome, apply_diff, diff, diff_or_replacement};
pub use upsert::upsert_seed;

use crate::shown::{render, render_doc};
use operators::{Env, Modifier, OPERATORS};
use path::{Part, UpdatePath};
use tree::{Leaf, LogKind, ObjectNode, Resolver};
use values::{binary_eq, doc_binary_eq, render_id};

/// What an update needs besides the document: the time, whether this is the insert of an
/// upsert, and the immutable paths. (The query, needed by the positional `$`, is an argument
/// of [`UpdateSpec::apply_logged`].)
#[derive(Debug, Clone)]
pub struct UpdateContext {
    /// `$currentDate` (date) and `$$NOW`.
    pub now: bson::DateTime,
    /// `$currentDate: {$type: "timestamp"}`.
    pub now_ts: bson::Timestamp,
    /// The update builds a new document of an upsert: `$setOnInsert` applies, `$`-prefixed
    /// top-level fields are allowed.
    pub is_upsert_insert: bool,
    /// Dotted paths that may not change (the shard key fields); `_id` always is.
    pub immutable_paths: Vec<String>,
    /// The statement's collation, for `$addToSet`, `$pull`, `$pullAll`, `$min` and `$max`.
    pub collation: Option<pipeline::collation::Collation>,
}

impl UpdateContext {
    /// A context for an ordinary update at `now`.
    pub fn new(now: bson::DateTime, now_ts: bson::Timestamp) -> UpdateContext {
        UpdateContext {
            now,
            now_ts,
            is_upsert_insert: false,
            immutable_paths: Vec::new(),
            collation: None,
        }
    }
}

/// A parsed operator-style update.
#[derive(Debug, Clone)]
pub struct OperatorUpdate {
    root: ObjectNode,
    filters: HashMap<String, Matcher>,
}

/// A parsed pipeline-style update: single-document stages, run in order.
#[derive(Debug, Clone)]
pub struct PipelineUpdate {
    pipeline: pipeline::agg::Pipeline,
    /// The command's `let` variables.
    env: pipeline::expr::Env,
}

/// A parsed update specification (the `u` of an update statement).
#[derive(Debug, Clone)]
pub enum UpdateSpec {
    Operators(OperatorUpdate),
    Replacement(Document),
    Pipeline(PipelineUpdate),
}

/// Stages allowed in a pipeline-style update.
const PIPELINE_UPDATE_STAGES: &[&str] = &[
    "$addFields",
    "$set",
    "$project",
    "$unset",
    "$replaceRoot",
    "$replaceWith",
];

impl UpdateSpec {
    /// Parses `u`: a document of `$`-operators, a replacement document, or an array of stages.
    /// `array_filters` is the statement's `arrayFilters` as sent (each must be a document).
    pub fn parse(u: &Bson, array_filters: Option<&[Bson]>) -> Result<UpdateSpec> {
        UpdateSpec::parse_in(u, array_filters, &pipeline::expr::Env::default())
    }

    /// [`UpdateSpec::parse`] for a command with `let` variables (which a pipeline-style
    /// update can read).
    pub fn parse_in(
        u: &Bson,
        array_filters: Option<&[Bson]>,
        env: &pipeline::expr::Env,
    ) -> Result<UpdateSpec> {
        let filters = array_filters
            .unwrap_or_default()
            .iter()
            .map(|f| match f {
                Bson::Document(d) => Ok(d.clone()),
                other => Err(MongoError::type_mismatch(format!(
                    "BSON field 'arrayFilters' is the wrong type '{}', expected type 'object'",
                    pipeline::value::type_name(other)
                ))),
            })
            .collect::<Result<Vec<Document>>>()?;
        match u {
            Bson::Array(stages) => {
                if !filters.is_empty() {
                    return Err(MongoError::failed_to_parse(
                        "arrayFilters may not be specified for pipeline-style updates",
                    ));
                }
                parse_pipeline(stages, env).map(UpdateSpec::Pipeline)
            }
            Bson::Document(d) => {
                if d.keys().next().is_some_and(|k| k.starts_with('$')) {
                    parse_operators(d, &filters).map(UpdateSpec::Operators)
                } else {
                    if !filters.is_empty() {
                        return Err(MongoError::failed_to_parse(
                            "arrayFilters may not be specified for replacement-style updates",
                        ));
                    }
                    parse_replacement(d).map(UpdateSpec::Replacement)
                }
            }
            other => Err(MongoError::type_mismatch(format!(
                "Update argument must be either an object or an array, not {}",
                pipeline::value::type_name(other)
            ))),
        }
    }

    pub fn is_replacement(&self) -> bool {
        matches!(self, UpdateSpec::Replacement(_))
    }

    /// Applies the update to `doc` and returns the new document. Without the query, a path
    /// with the positional `$` fails as in MongoDB when the query matched no array element.
    pub fn apply(&self, doc: &Document, ctx: &UpdateContext) -> Result<Document> {
        self.apply_logged(doc, ctx, None).map(|(d, _)| d)
    }

    /// Applies the update to `doc`, which matched `query` (used by the positional `$`), and
    /// says how to log it: see the module docs for the diff shape. Operator updates get
    /// MongoDB's path-based diff; pipeline updates a calculated diff or a replacement.
    pub fn apply_logged(
        &self,
        doc: &Document,
        ctx: &UpdateContext,
        query: Option<&Document>,
    ) -> Result<(Document, DiffOutcome)> {
        match self {
            UpdateSpec::Operators(ops) => {
                let (new, log) = apply_operators(ops, doc, ctx, query)?;
                let outcome = match diff::diff_from_log(&new, &log) {
                    Some(d) => DiffOutcome::Diff(d),
                    None => DiffOutcome::Unchanged,
                };
                Ok((new, outcome))
            }
            UpdateSpec::Replacement(r) => {
                let new = apply_replacement(r, doc, ctx)?;
                let outcome = if doc_binary_eq(doc, &new) {
                    DiffOutcome::Unchanged
                } else {
                    DiffOutcome::Replacement
                };
                Ok((new, outcome))
            }
            UpdateSpec::Pipeline(p) => {
                let new = apply_pipeline(p, doc, ctx)?;
                let outcome = diff_or_replacement(doc, &new);
                Ok((new, outcome))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Operator updates
// ---------------------------------------------------------------------------------------------

fn unknown_modifier(name: &str) -> MongoError {
    MongoError::failed_to_parse(format!(
        "Unknown modifier: {name}. Expected a valid update modifier or pipeline-style update specified as an array"
    ))
}

fn parse_operators(u: &Document, array_filters: &[Document]) -> Result<OperatorUpdate> {
    let filters = parse_array_filters(array_filters)?;
    let mut used: HashSet<String> = HashSet::new();
    let mut root = ObjectNode::default();
    for (op, arg) in u {
        if !OPERATORS.contains(&op.as_str()) {
            return Err(unknown_modifier(op));
        }
        let Bson::Document(fields) = arg else {
            return Err(MongoError::failed_to_parse(format!(
                "Modifiers operate on fields but we found type {} instead. For example: {{$mod: {{<field>: ...}}}} not {{{op}: {}}}",
                pipeline::value::type_name(arg),
                render(arg)
            )));
        };
        for (field, value) in fields {
            let path = UpdatePath::parse(field)?;
            for part in &path.parts {
                if let Part::Filtered(id) = part {
                    if !filters.contains_key(id) {
                        return Err(MongoError::bad_value(format!(
                            "No array filter found for identifier '{id}' in path '{field}'"
                        )));
                    }
                    used.insert(id.clone());
                }
            }
            if op == "$rename" {
                parse_rename(&mut root, path, field, value)?;
            } else {
                let modifier = Modifier::parse(op, field, value)?;
                root.insert(Leaf { modifier, path })?;
            }
        }
    }
    for id in filters.keys() {
        if !used.contains(id) {
            return Err(MongoError::failed_to_parse(format!(
                "The array filter for identifier '{id}' was not used in the update {}",
                render_doc(u)
            )));
        }
    }
    Ok(OperatorUpdate { root, filters })
}

fn parse_rename(root: &mut ObjectNode, from: UpdatePath, field: &str, value: &Bson) -> Result<()> {
    let Bson::String(to) = value else {
        return Err(MongoError::bad_value(format!(
            "The 'to' field for $rename must be a string: {field}: {}",
            render(value)
        )));
    };
    let to = UpdatePath::parse(to)?;
    let spec = format!("{field}: {}", render(value));
    if from == to {
        return Err(MongoError::bad_value(format!(
            "The source and target field for $rename must differ: {spec}"
        )));
    }
    if from.is_prefix_of(&to) || to.is_prefix_of(&from) {
        return Err(MongoError::bad_value(format!(
            "The source and target field for $rename must not be on the same path: {spec}"
        )));
    }
    if from.is_dynamic() {
        return Err(MongoError::bad_value(format!(
            "The source field for $rename may not be dynamic: {}",
            from.dotted
        )));
    }
    if to.is_dynamic() {
        return Err(MongoError::bad_value(format!(
            "The destination field for $rename may not be dynamic: {}",
            to.dotted
        )));
    }
    root.insert(Leaf {
        modifier: Modifier::Rename { from: from.clone() },
        path: to,
    })?;
    root.insert(Leaf {
        modifier: Modifier::RenameSource,
        path: from,
    })
}

/// Parses `arrayFilters`: each filter names one identifier (the first component of its
/// top-level paths, looking inside `$and`/`$or`/`$nor`).
fn parse_array_filters(filters: &[Document]) -> Result<HashMap<String, Matcher>> {
    let mut out = HashMap::new();
    for f in filters {
        let mut ids = Vec::new();
        filter_ids(f, &mut ids);
        let Some(id) = ids.first().cloned() else {
            return Err(MongoError::failed_to_parse(
                "Cannot use an expression without a top-level field name in arrayFilters",
            ));
        };
        if let Some(other) = ids.iter().find(|i| **i != id) {
            return Err(MongoError::failed_to_parse(format!(
                "Error parsing array filter :: caused by :: Expected a single top-level field name, found '{id}' and '{other}'"
            )));
        }
        let valid = id.chars().next().is_some_and(|c| c.is_ascii_lowercase())
            && id.chars().all(|c| c.is_ascii_alphanumeric());
        if !valid {
            return Err(MongoError::bad_value(format!(
                "Error parsing array filter :: caused by :: The top-level field name must be an alphanumeric string beginning with a lowercase letter, found '{id}'"
            )));
        }
        if out.contains_key(&id) {
            return Err(MongoError::failed_to_parse(format!(
                "Found multiple array filters with the same top-level field name {id}"
            )));
        }
        out.insert(id, Matcher::parse(f)?);
    }
    Ok(out)
}

fn filter_ids(f: &Document, out: &mut Vec<String>) {
    for (k, v) in f {
        if matches!(k.as_str(), "$and" | "$or" | "$nor") {
            if let Bson::Array(clauses) = v {
                for c in clauses {
                    if let Bson::Document(d) = c {
                        filter_ids(d, out);
                    }
                }
            }
        } else if !k.starts_with('$') {
            out.push(k.split('.').next().unwrap_or_default().to_string());
        }
    }
}

fn apply_operators(
    ops: &OperatorUpdate,
    doc: &Document,
    ctx: &UpdateContext,
    query: Option<&Document>,
) -> Result<(Document, Vec<tree::LogEntry>)> {
    let mut resolver = Resolver {
        doc,
        filters: &ops.filters,
        query,
        out: Vec::new(),
    };
    resolver.resolve_root(&ops.root)?;
    let resolved = resolver.out;
    tree::check_disjoint(&resolved)?;

    let env = Env {
        ctx,
        id: render_id(doc),
    };
    let mut new = doc.clone();
    let mut log = Vec::new();
    for op in &resolved {
        tree::apply_op(&mut new, op, &env, &mut log)?;
    }
    if log.is_empty() {
        return Ok((new, log));
    }
    check_immutable(doc, &new, ctx, |imm| {
        resolved
            .iter()
            .map(|op| op.path.join("."))
            .find(|p| overlaps(p, imm))
    })?;
    if !ctx.is_upsert_insert {
        for e in &log {
            if e.kind != LogKind::Deleted
                && let Some(first) = e.path.first()
                && first.starts_with('$')
            {
                return Err(MongoError::new(
                    ErrorCode::DOLLAR_PREFIXED_FIELD_NAME,
                    format!(
                        "The dollar ($) prefixed field '{first}' in '{}' is not valid for storage.",
                        e.path.join(".")
                    ),
                ));
            }
        }
    }
    check_id_value(&new)?;
    Ok((new, log))
}

/// Whether two dotted paths are equal or one is a prefix of the other.
fn overlaps(a: &str, b: &str) -> bool {
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    long == short || long.strip_prefix(short).is_some_and(|r| r.starts_with('.'))
}

/// `_id` and the immutable paths keep their values (when they had one). `culprit` names the
/// update path that touched an immutable path, for the message.
fn check_immutable(
    old: &Document,
    new: &Document,
    ctx: &UpdateContext,
    culprit: impl Fn(&str) -> Option<String>,
) -> Result<()> {
    let immutable = std::iter::once("_id").chain(ctx.immutable_paths.iter().map(String::as_str));
    for imm in immutable {
        let Some(before) = pipeline::value::get_path(old, imm) else {
            continue;
        };
        let unchanged =
            pipeline::value::get_path(new, imm).is_some_and(|after| binary_eq(before, after));
        if !unchanged {
            let root_field = imm.split('.').next().unwrap_or(imm);
            let path = culprit(imm).unwrap_or_else(|| imm.to_string());
            let field = if imm == "_id" { root_field } else { imm };
            return Err(MongoError::new(
                ErrorCode::IMMUTABLE_FIELD,
                format!(
                    "Performing an update on the path '{path}' would modify the immutable field '{field}'"
                ),
            ));
        }
    }
    Ok(())
}

/// `_id` may not be an array, a regex or undefined (InvalidIdField, 53).
fn check_id_value(doc: &Document) -> Result<()> {
    let bad = match doc.get("_id") {
        Some(Bson::Array(_)) => "array",
        Some(Bson::RegularExpression(_)) => "regex",
        Some(Bson::Undefined) => "undefined",
        _ => return Ok(()),
    };
    Err(MongoError::new(
        ErrorCode::INVALID_ID_FIELD,
        format!("The '_id' value cannot be of type {bad}"),
    ))
}

// ---------------------------------------------------------------------------------------------
// Replacements
// ---------------------------------------------------------------------------------------------

fn parse_replacement(d: &Document) -> Result<Document> {
    if let Some(k) = d.keys().find(|k| k.starts_with('$')) {
        return Err(MongoError::new(
            ErrorCode::DOLLAR_PREFIXED_FIELD_NAME,
            format!(
                "The dollar ($) prefixed field '{k}' in '{k}' is not allowed in the context of an update's replacement document. Consider using an aggregation pipeline with $replaceWith."
            ),
        ));
    }
    Ok(d.clone())
}

/// The replacement with the original `_id` first; a different `_id` or a changed immutable path
/// is ImmutableField (66).
fn apply_replacement(r: &Document, doc: &Document, ctx: &UpdateContext) -> Result<Document> {
    finish_whole_document(r, doc, ctx)
}

/// Shared by replacements and pipeline updates: keeps `_id` first and unchanged.
fn finish_whole_document(r: &Document, doc: &Document, ctx: &UpdateContext) -> Result<Document> {
    let mut new = Document::new();
    match (doc.get("_id"), r.get("_id")) {
        (Some(old), Some(repl)) if !binary_eq(old, repl) => {
            return Err(altered("_id", repl));
        }
        (Some(id), _) | (None, Some(id)) => {
            new.insert("_id", id.clone());
        }
        (None, None) => {}
    }
    for (k, v) in r {
        if k != "_id" {
            new.insert(k.clone(), v.clone());
        }
    }
    for imm in &ctx.immutable_paths {
        if let Some(before) = pipeline::value::get_path(doc, imm) {
            match pipeline::value::get_path(&new, imm) {
                Some(after) if binary_eq(before, after) => {}
                Some(after) => return Err(altered(imm, after)),
                None => {
                    return Err(MongoError::new(
                        ErrorCode::IMMUTABLE_FIELD,
                        format!(
                            "After applying the update, the (immutable) field '{imm}' was found to have been removed"
                        ),
                    ));
                }
            }
        }
    }
    check_id_value(&new)?;
    Ok(new)
}

fn altered(field: &str, value: &Bson) -> MongoError {
    MongoError::new(
        ErrorCode::IMMUTABLE_FIELD,
        format!(
            "After applying the update, the (immutable) field '{field}' was found to have been altered to {field}: {}",
            render(value)
        ),
    )
}

// ---------------------------------------------------------------------------------------------
// Pipeline updates
// ---------------------------------------------------------------------------------------------

fn parse_pipeline(stages: &[Bson], env: &pipeline::expr::Env) -> Result<PipelineUpdate> {
    let mut docs = Vec::with_capacity(stages.len());
    for s in stages {
        let Bson::Document(stage) = s else {
            return Err(MongoError::type_mismatch(
                "Each element of the 'pipeline' array must be an object",
            ));
        };
        if let Some(name) = stage.keys().next()
            && stage.len() == 1
            && !PIPELINE_UPDATE_STAGES.contains(&name.as_str())
        {
            return Err(MongoError::new(
                ErrorCode::INVALID_OPTIONS,
                format!("{name} is not allowed to be used within an update"),
            ));
        }
        docs.push(stage.clone());
    }
    let pipeline = pipeline::agg::Pipeline::parse_with_vars(&docs, &env.names())?;
    if !pipeline.is_single_document_transform() {
        return Err(MongoError::new(
            ErrorCode::INVALID_OPTIONS,
            "only single-document stages are allowed within an update",
        ));
    }
    Ok(PipelineUpdate {
        pipeline,
        env: env.clone(),
    })
}

/// Runs the stages over the document; the result replaces it (keeping `_id`, like a
/// replacement). User variables come from the command's `let`; `$$NOW` is not bound.
fn apply_pipeline(p: &PipelineUpdate, doc: &Document, ctx: &UpdateContext) -> Result<Document> {
    let mut cur = doc.clone();
    for stage in p.pipeline.stages() {
        cur = stage.apply_one_in(cur, &p.env)?.ok_or_else(|| {
            MongoError::internal(format!(
                "{} dropped the document in an update",
                stage.name()
            ))
        })?;
    }
    finish_whole_document(&cur, doc, ctx)
}
