//! The update tree of an operator-style update, and its application to one document.
//!
//! Parsing puts every modifier at its path in a tree, as MongoDB's `UpdateObjectNode` /
//! `UpdateArrayNode` do, which is where conflicts are found: two modifiers on one path, or one
//! path a prefix of another, is ConflictingUpdateOperators (40) at parse time. Application runs
//! in two phases:
//! 1. *Resolve*: walk the tree against the original document and list the concrete leaf
//!    operations in MongoDB's order: siblings in [`cmp_field_names`] order, `$` replaced by the
//!    index the query matched, `$[]`/`$[id]` expanded over the array's elements (filters
//!    evaluated on the original elements). Nodes that land on the same concrete path are merged,
//!    and two leaves meeting is "Update created a conflict at 'a.0'" (40).
//! 2. *Apply*: carry out each operation on a copy of the document by walking its concrete path
//!    from the root, creating what is missing, and record a [`LogEntry`] for every real change.
//!
//! Invariants:
//! * Resolved paths are pairwise disjoint (no one a prefix of another), so the order of the
//!   operations only decides the order in which new fields are appended.
//! * The log holds exactly the changes made: an empty log means the document is unchanged;
//!   `Created` names the topmost field that did not exist before; values are read from the
//!   final document when the log is turned into a diff.
//!
//! [`cmp_field_names`]: super::path::cmp_field_names

use std::collections::{BTreeMap, HashMap};

use bson::{Bson, Document};
use pipeline::Matcher;
use pipeline::value::array_index;
use wire::{ErrorCode, MongoError, Result};

use super::operators::{Change, Env, Modifier};
use super::path::{FieldKey, Part, UpdatePath, join};
use super::positional;
use crate::shown::render;

/// Arrays are never padded beyond this many elements (MongoDB refuses to backfill past it).
const MAX_PADDING: usize = 1_500_000;

/// A modifier at its path.
#[derive(Debug, Clone)]
pub struct Leaf {
    pub modifier: Modifier,
    pub path: UpdatePath,
}

#[derive(Debug, Clone)]
pub enum Node {
    Leaf(Leaf),
    Object(ObjectNode),
    Array(ArrayNode),
}

/// Children by field name (or array index), plus the positional `$` child.
#[derive(Debug, Clone, Default)]
pub struct ObjectNode {
    children: BTreeMap<FieldKey, Node>,
    positional: Option<Box<Node>>,
}

/// Children of `$[]` (key `""`) and `$[id]` (key `id`).
#[derive(Debug, Clone, Default)]
pub struct ArrayNode {
    children: BTreeMap<String, Node>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Leaf,
    Object,
    Array,
}

fn conflict(path: &UpdatePath, depth: usize) -> MongoError {
    let at: Vec<String> = path.parts[..=depth].iter().map(Part::as_written).collect();
    MongoError::new(
        ErrorCode::CONFLICTING_UPDATE_OPERATORS,
        format!(
            "Updating the path '{}' would create a conflict at '{}'",
            path.dotted,
            at.join(".")
        ),
    )
}

impl ObjectNode {
    /// Adds a modifier at `leaf.path`; a path equal to or a prefix of an existing one is a
    /// conflict.
    pub fn insert(&mut self, leaf: Leaf) -> Result<()> {
        let path = leaf.path.clone();
        insert_in_object(self, &path, 0, leaf)
    }
}

/// The kind of node `path.parts[..=depth]` needs: a leaf at the end, an array node when the
/// next part is `$[]`/`$[id]`, else an object node.
fn want_kind(path: &UpdatePath, depth: usize) -> Kind {
    if depth + 1 == path.parts.len() {
        Kind::Leaf
    } else if matches!(
        path.parts.get(depth + 1),
        Some(Part::All | Part::Filtered(_))
    ) {
        Kind::Array
    } else {
        Kind::Object
    }
}

/// A new node for `path.parts[..=depth]` holding the rest of the path.
fn fresh(path: &UpdatePath, depth: usize, leaf: Leaf) -> Result<Node> {
    Ok(match want_kind(path, depth) {
        Kind::Leaf => Node::Leaf(leaf),
        Kind::Object => {
            let mut o = ObjectNode::default();
            insert_in_object(&mut o, path, depth + 1, leaf)?;
            Node::Object(o)
        }
        Kind::Array => {
            let mut a = ArrayNode::default();
            insert_in_array(&mut a, path, depth + 1, leaf)?;
            Node::Array(a)
        }
    })
}

/// Continues the path below an existing node; any mismatch of kinds is a conflict.
fn into_existing(node: &mut Node, path: &UpdatePath, depth: usize, leaf: Leaf) -> Result<()> {
    match (node, want_kind(path, depth)) {
        (Node::Object(o), Kind::Object) => insert_in_object(o, path, depth + 1, leaf),
        (Node::Array(a), Kind::Array) => insert_in_array(a, path, depth + 1, leaf),
        _ => Err(conflict(path, depth)),
    }
}

fn insert_in_object(
    obj: &mut ObjectNode,
    path: &UpdatePath,
    depth: usize,
    leaf: Leaf,
) -> Result<()> {
    match path.parts.get(depth) {
        Some(Part::Field(f)) => {
            let key = FieldKey(f.clone());
            if let Some(n) = obj.children.get_mut(&key) {
                return into_existing(n, path, depth, leaf);
            }
            let n = fresh(path, depth, leaf)?;
            obj.children.insert(key, n);
            Ok(())
        }
        Some(Part::Positional) => {
            if let Some(n) = obj.positional.as_deref_mut() {
                return into_existing(n, path, depth, leaf);
            }
            obj.positional = Some(Box::new(fresh(path, depth, leaf)?));
            Ok(())
        }
        _ => Err(MongoError::internal("malformed update path")),
    }
}

fn insert_in_array(arr: &mut ArrayNode, path: &UpdatePath, depth: usize, leaf: Leaf) -> Result<()> {
    let key = match path.parts.get(depth) {
        Some(Part::All) => String::new(),
        Some(Part::Filtered(id)) => id.clone(),
        _ => return Err(MongoError::internal("malformed update path")),
    };
    if let Some(n) = arr.children.get_mut(&key) {
        return into_existing(n, path, depth, leaf);
    }
    let n = fresh(path, depth, leaf)?;
    arr.children.insert(key, n);
    Ok(())
}

/// One concrete leaf operation.
#[derive(Debug)]
pub struct ResolvedOp<'a> {
    pub path: Vec<String>,
    pub leaf: &'a Leaf,
}

/// Where the resolver stands in the original document.
#[derive(Clone, Copy)]
enum At<'a> {
    Doc(&'a Document),
    Value(&'a Bson),
    Missing,
}

impl<'a> At<'a> {
    fn child(self, name: &str) -> At<'a> {
        match self {
            At::Doc(d) => d.get(name).map_or(At::Missing, At::Value),
            At::Value(Bson::Document(d)) => d.get(name).map_or(At::Missing, At::Value),
            At::Value(Bson::Array(a)) => array_index(name)
                .and_then(|i| a.get(i))
                .map_or(At::Missing, At::Value),
            _ => At::Missing,
        }
    }
}

/// Phase 1: the concrete operations of `root` against `doc`, in application order.
pub struct Resolver<'a> {
    pub doc: &'a Document,
    pub filters: &'a HashMap<String, Matcher>,
    pub query: Option<&'a Document>,
    pub out: Vec<ResolvedOp<'a>>,
}

impl<'a> Resolver<'a> {
    pub fn resolve_root(&mut self, root: &'a ObjectNode) -> Result<()> {
        let mut path = Vec::new();
        self.resolve_objects(&[root], At::Doc(self.doc), &mut path)
    }

    fn resolve(&mut self, nodes: &[&'a Node], at: At<'a>, path: &mut Vec<String>) -> Result<()> {
        match nodes {
            [] => Ok(()),
            [Node::Leaf(leaf)] => {
                if !matches!(leaf.modifier, Modifier::RenameSource) {
                    self.out.push(ResolvedOp {
                        path: path.clone(),
                        leaf,
                    });
                }
                Ok(())
            }
            _ => {
                let mut objects = Vec::new();
                let mut arrays = Vec::new();
                for n in nodes {
                    match n {
                        Node::Object(o) => objects.push(o),
                        Node::Array(a) => arrays.push(a),
                        Node::Leaf(_) => return Err(created_conflict(path)),
                    }
                }
                match (objects.is_empty(), arrays.is_empty()) {
                    (false, true) => self.resolve_objects(&objects, at, path),
                    (true, false) => self.resolve_arrays(&arrays, at, path),
                    _ => Err(created_conflict(path)),
                }
            }
        }
    }

    fn resolve_objects(
        &mut self,
        objects: &[&'a ObjectNode],
        at: At<'a>,
        path: &mut Vec<String>,
    ) -> Result<()> {
        let mut merged: BTreeMap<FieldKey, Vec<&'a Node>> = BTreeMap::new();
        for o in objects {
            for (k, n) in &o.children {
                merged.entry(k.clone()).or_default().push(n);
            }
            if let Some(p) = &o.positional {
                let index = positional::matched_index(self.query, self.doc, path)?;
                merged
                    .entry(FieldKey(index.to_string()))
                    .or_default()
                    .push(p);
            }
        }
        for (k, nodes) in merged {
            path.push(k.0);
            let child_at = at.child(path.last().map(String::as_str).unwrap_or_default());
            self.resolve(&nodes, child_at, path)?;
            path.pop();
        }
        Ok(())
    }

    fn resolve_arrays(
        &mut self,
        arrays: &[&'a ArrayNode],
        at: At<'a>,
        path: &mut Vec<String>,
    ) -> Result<()> {
        let elements = match at {
            At::Value(Bson::Array(a)) => a,
            At::Missing => {
                return Err(MongoError::bad_value(format!(
                    "The path '{}' must exist in the document in order to apply array updates.",
                    join(path)
                )));
            }
            At::Value(v) => {
                return Err(MongoError::bad_value(format!(
                    "Cannot apply array updates to non-array element {}: {}",
                    path.last().map(String::as_str).unwrap_or_default(),
                    render(v)
                )));
            }
            At::Doc(_) => {
                return Err(MongoError::bad_value(
                    "Cannot apply array updates to a document",
                ));
            }
        };
        for (i, e) in elements.iter().enumerate() {
            let mut matching: Vec<&'a Node> = Vec::new();
            for a in arrays {
                for (id, n) in &a.children {
                    if id.is_empty() || self.filter_matches(id, e)? {
                        matching.push(n);
                    }
                }
            }
            if matching.is_empty() {
                continue;
            }
            path.push(i.to_string());
            self.resolve(&matching, At::Value(e), path)?;
            path.pop();
        }
        Ok(())
    }

    fn filter_matches(&self, id: &str, e: &Bson) -> Result<bool> {
        let m = self.filters.get(id).ok_or_else(|| {
            MongoError::bad_value(format!("No array filter found for identifier '{id}'"))
        })?;
        Ok(m.matches(&super::operators::wrap(id, e)))
    }
}

fn created_conflict(path: &[String]) -> MongoError {
    MongoError::new(
        ErrorCode::CONFLICTING_UPDATE_OPERATORS,
        format!("Update created a conflict at '{}'", join(path)),
    )
}

/// Resolved paths must be disjoint (merges through `$`, `$[]` and `$[id]` can make them meet).
pub fn check_disjoint(ops: &[ResolvedOp<'_>]) -> Result<()> {
    let mut paths: Vec<&[String]> = ops.iter().map(|o| o.path.as_slice()).collect();
    paths.sort();
    for w in paths.windows(2) {
        if let [a, b] = w
            && b.starts_with(a)
        {
            return Err(created_conflict(a));
        }
    }
    Ok(())
}

/// What one applied operation changed, for the oplog diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogKind {
    Updated,
    Created,
    Deleted,
    Appended { old_len: usize },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub path: Vec<String>,
    pub kind: LogKind,
}

/// Phase 2: applies one resolved operation to `doc`.
pub fn apply_op(
    doc: &mut Document,
    op: &ResolvedOp<'_>,
    env: &Env<'_>,
    log: &mut Vec<LogEntry>,
) -> Result<()> {
    match &op.leaf.modifier {
        Modifier::Rename { from } => apply_rename(doc, &op.path, from, env, log),
        m => apply_in_doc(doc, &op.path, 0, m, env, log),
    }
}

fn apply_in_doc(
    doc: &mut Document,
    path: &[String],
    depth: usize,
    m: &Modifier,
    env: &Env<'_>,
    log: &mut Vec<LogEntry>,
) -> Result<()> {
    let name = path
        .get(depth)
        .ok_or_else(|| MongoError::internal("update path ended early"))?;
    let last = depth + 1 == path.len();
    match doc.get_mut(name) {
        Some(v) if last => match m.apply_existing(v, false, &join(path), env)? {
            Change::NoOp => {}
            Change::Deleted => {
                doc.remove(name);
                log.push(entry(path, LogKind::Deleted));
            }
            change => log.push(entry(path, change_kind(change))),
        },
        Some(v) => descend(v, path, depth + 1, m, env, log)?,
        None => {
            if let Some(value) = m.create_value(env)? {
                doc.insert(name.clone(), nest(value, &path[depth + 1..]));
                log.push(entry(&path[..=depth], LogKind::Created));
            }
        }
    }
    Ok(())
}

fn descend(
    v: &mut Bson,
    path: &[String],
    depth: usize,
    m: &Modifier,
    env: &Env<'_>,
    log: &mut Vec<LogEntry>,
) -> Result<()> {
    match v {
        Bson::Document(d) => apply_in_doc(d, path, depth, m, env, log),
        Bson::Array(a) => apply_in_array(a, path, depth, m, env, log),
        other => not_viable(other, path, depth, m, env),
    }
}

fn apply_in_array(
    arr: &mut Vec<Bson>,
    path: &[String],
    depth: usize,
    m: &Modifier,
    env: &Env<'_>,
    log: &mut Vec<LogEntry>,
) -> Result<()> {
    let name = path
        .get(depth)
        .ok_or_else(|| MongoError::internal("update path ended early"))?;
    let last = depth + 1 == path.len();
    let Some(index) = array_index(name) else {
        let whole = Bson::Array(std::mem::take(arr));
        let result = not_viable(&whole, path, depth, m, env);
        if let Bson::Array(a) = whole {
            *arr = a;
        }
        return result;
    };
    match arr.get_mut(index) {
        Some(v) if last => match m.apply_existing(v, true, &join(path), env)? {
            Change::NoOp => {}
            change => log.push(entry(path, change_kind(change))),
        },
        Some(v) => descend(v, path, depth + 1, m, env, log)?,
        None => {
            if let Some(value) = m.create_value(env)? {
                if index > MAX_PADDING {
                    return Err(MongoError::new(
                        ErrorCode::PATH_NOT_VIABLE,
                        format!("can't backfill array to larger than {MAX_PADDING} elements"),
                    ));
                }
                arr.resize(index, Bson::Null);
                arr.push(nest(value, &path[depth + 1..]));
                log.push(entry(&path[..=depth], LogKind::Created));
            }
        }
    }
    Ok(())
}

/// `path[depth]` cannot be created inside `container` (a scalar, or an array with a
/// non-numeric field): PathNotViable if the modifier would create something, else a no-op.
fn not_viable(
    container: &Bson,
    path: &[String],
    depth: usize,
    m: &Modifier,
    env: &Env<'_>,
) -> Result<()> {
    if m.create_value(env)?.is_none() {
        return Ok(());
    }
    let field = path.get(depth).map(String::as_str).unwrap_or_default();
    let parent = depth
        .checked_sub(1)
        .and_then(|d| path.get(d))
        .map(String::as_str)
        .unwrap_or_default();
    Err(MongoError::new(
        ErrorCode::PATH_NOT_VIABLE,
        format!(
            "Cannot create field '{field}' in element {{{parent}: {}}}",
            render(container)
        ),
    ))
}

fn nest(mut value: Bson, rest: &[String]) -> Bson {
    for name in rest.iter().rev() {
        let mut d = Document::new();
        d.insert(name.clone(), value);
        value = Bson::Document(d);
    }
    value
}

fn entry(path: &[String], kind: LogKind) -> LogEntry {
    LogEntry {
        path: path.to_vec(),
        kind,
    }
}

fn change_kind(c: Change) -> LogKind {
    match c {
        Change::Appended { old_len } => LogKind::Appended { old_len },
        Change::Deleted => LogKind::Deleted,
        Change::NoOp | Change::Updated => LogKind::Updated,
    }
}

/// `$rename`: read the source (which may not go through an array), set it at the destination
/// like `$set` (in place if the destination exists, else appended), then remove the source.
fn apply_rename(
    doc: &mut Document,
    to: &[String],
    from: &UpdatePath,
    env: &Env<'_>,
    log: &mut Vec<LogEntry>,
) -> Result<()> {
    let from_parts = from.fields();
    for imm in immutable_paths(env) {
        let common = imm
            .iter()
            .zip(&from_parts)
            .take_while(|(a, b)| a == b)
            .count();
        if common >= imm.len().min(from_parts.len()) {
            return Err(MongoError::new(
                ErrorCode::IMMUTABLE_FIELD,
                format!(
                    "Unsetting the path '{}' using $rename would modify the immutable field '{}'",
                    from.dotted,
                    imm.join(".")
                ),
            ));
        }
    }
    let Some(value) = find_rename_source(doc, &from_parts, &from.dotted, env)? else {
        return Ok(());
    };
    // The destination may not go through an array either.
    let mut cur: Option<&Bson> = None;
    for (i, name) in to.iter().enumerate() {
        let next = match cur {
            None => doc.get(name),
            Some(Bson::Document(d)) => d.get(name),
            Some(Bson::Array(_)) => {
                return Err(MongoError::bad_value(format!(
                    "The destination field cannot be an array element, '{}' in doc with {} has an array field called '{}'",
                    join(to),
                    env.id,
                    to.get(i.wrapping_sub(1))
                        .map(String::as_str)
                        .unwrap_or_default()
                )));
            }
            Some(_) => None,
        };
        match next {
            Some(v) => cur = Some(v),
            None => break,
        }
    }
    apply_in_doc(doc, to, 0, &Modifier::Set(value), env, log)?;
    remove_path(doc, &from_parts);
    log.push(entry(&from_parts, LogKind::Deleted));
    Ok(())
}

fn immutable_paths(env: &Env<'_>) -> Vec<Vec<String>> {
    let mut out = vec![vec!["_id".to_string()]];
    for p in &env.ctx.immutable_paths {
        out.push(p.split('.').map(str::to_string).collect());
    }
    out
}

fn find_rename_source(
    doc: &Document,
    parts: &[String],
    dotted: &str,
    env: &Env<'_>,
) -> Result<Option<Bson>> {
    let Some((first, rest)) = parts.split_first() else {
        return Ok(None);
    };
    let Some(mut cur) = doc.get(first) else {
        return Ok(None);
    };
    let mut parent_name = first;
    for name in rest {
        cur = match cur {
            Bson::Document(d) => match d.get(name) {
                Some(v) => v,
                None => return Ok(None),
            },
            Bson::Array(_) => {
                return Err(MongoError::bad_value(format!(
                    "The source field cannot be an array element, '{dotted}' in doc with {} has an array field called '{parent_name}'",
                    env.id
                )));
            }
            other => {
                return Err(MongoError::new(
                    ErrorCode::PATH_NOT_VIABLE,
                    format!(
                        "cannot use the part ({name} of {dotted}) to traverse the element ({{{parent_name}: {}}})",
                        render(other)
                    ),
                ));
            }
        };
        parent_name = name;
    }
    Ok(Some(cur.clone()))
}

fn remove_path(doc: &mut Document, parts: &[String]) {
    match parts {
        [] => {}
        [last] => {
            doc.remove(last);
        }
        [first, rest @ ..] => {
            if let Some(Bson::Document(d)) = doc.get_mut(first) {
                remove_path(d, rest);
            }
        }
    }
}
