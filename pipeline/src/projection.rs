//! `find` projections, and the shared machinery of `$project`, `$addFields`/`$set` and `$unset`.
//!
//! A projection is parsed into a tree keyed by path components (`{"a.b": 1}` and `{a: {b: 1}}`
//! give the same tree) and is one of three kinds:
//! * **inclusion**: only the included fields, `_id` (unless `_id: 0`), and computed fields are
//!   output. Included fields keep the input document's order; computed fields follow them in
//!   specification order (a computed `_id` stays first).
//! * **exclusion**: everything but the excluded fields.
//! * **add fields** (`$addFields`/`$set`): every input field is kept; a computed field replaces
//!   the existing value in place or is appended.
//!
//! Invariants: inclusion and exclusion never mix (except `_id`), reported as MongoDB 7 does
//! (31254 "Cannot do exclusion on field b in inclusion projection", 31253 for the reverse);
//! overlapping paths (`{a: 1, "a.b": 1}`) are 31250 "Path collision"; paths through arrays apply
//! to every document element (scalars are dropped by inclusion, kept by exclusion);
//! expressions always evaluate against the whole input document.

use bson::{Bson, Document, doc};

use crate::expr::{Env, Expr};
use crate::matcher::Matcher;
use crate::value;
use crate::{MongoError, Result};

/// Which language the specification is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    /// `find`'s `projection`: `$slice`, `$elemMatch` and `a.$` are projection operators.
    Find,
    /// The `$project` stage: all operators are aggregation expressions.
    Project,
    /// `$addFields`/`$set`: every value is an expression (numbers and booleans are literals).
    AddFields,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Inclusion,
    Exclusion,
    AddFields,
}

/// One level of a projection's tree, by field name in the order given (a map, so a projection
/// of many fields parses in linear time).
type Level = indexmap::IndexMap<String, PNode>;

#[derive(Debug, Clone)]
enum PNode {
    Include,
    Exclude,
    Compute(Expr),
    Slice { skip: Option<i64>, limit: i64 },
    ElemMatch(Box<Matcher>),
    Nested(Level),
}

/// A parsed projection.
#[derive(Debug, Clone)]
pub struct Projection {
    kind: Kind,
    root: Level,
    /// Whether `_id` is output by an inclusion projection (true unless `_id: 0`).
    include_id: bool,
    /// The array path of a positional projection (`{"a.$": 1}`) and the query's predicates on it.
    positional: Option<(String, Matcher)>,
    identity: bool,
}

impl Projection {
    /// Parses a `find` projection (no positional operator support without a query).
    pub fn parse(spec: &Document) -> Result<Projection> {
        Projection::parse_with(spec, Syntax::Find, None)
    }

    /// Parses a `find` projection; `filter` is the query, needed by a positional (`a.$`) path.
    pub fn parse_with_query(spec: &Document, filter: Option<&Document>) -> Result<Projection> {
        Projection::parse_with(spec, Syntax::Find, filter)
    }

    /// Parses a specification in the given syntax.
    pub fn parse_with(
        spec: &Document,
        syntax: Syntax,
        filter: Option<&Document>,
    ) -> Result<Projection> {
        Projection::parse_with_vars(spec, syntax, filter, &[])
    }

    /// [`Projection::parse_with`] where computed fields may use the given user variables.
    pub fn parse_with_vars(
        spec: &Document,
        syntax: Syntax,
        filter: Option<&Document>,
        vars: &[String],
    ) -> Result<Projection> {
        let mut p = Parser {
            syntax,
            vars: vars.to_vec(),
            kind: if syntax == Syntax::AddFields {
                Some(Kind::AddFields)
            } else {
                None
            },
            root: Level::new(),
            include_id: true,
            positional: None,
        };
        if spec.is_empty() {
            return match syntax {
                Syntax::Find => Ok(Projection::identity()),
                Syntax::Project => Err(MongoError::with_code(
                    51272,
                    "Invalid $project :: caused by :: projection specification must have at least one field",
                )),
                Syntax::AddFields => Ok(Projection::identity()),
            };
        }
        for (k, v) in spec {
            p.field(&[], k, v)?;
        }
        let positional = match p.positional {
            None => None,
            Some(path) => {
                let Some(filter) = filter else {
                    return Err(MongoError::bad_value(
                        "positional operator '.$' requires corresponding field in query specifier",
                    ));
                };
                let mut sub = Document::new();
                collect_filter_on(filter, &path, &mut sub);
                if sub.is_empty() {
                    return Err(MongoError::bad_value(
                        "positional operator '.$' requires corresponding field in query specifier",
                    ));
                }
                Some((path, Matcher::parse(&sub)?))
            }
        };
        // Only `_id` (or `$slice`s) decided nothing: `{_id: 1}` alone includes just `_id`,
        // `{_id: 0}` alone excludes it.
        let id_included = matches!(p.root.get("_id"), Some(PNode::Include));
        let kind = p.kind.unwrap_or(if positional.is_some() || id_included {
            Kind::Inclusion
        } else {
            Kind::Exclusion
        });
        Ok(Projection {
            kind,
            root: p.root,
            include_id: p.include_id,
            positional,
            identity: false,
        })
    }

    /// The projection that returns documents unchanged.
    pub fn identity() -> Projection {
        Projection {
            kind: Kind::Exclusion,
            root: Level::new(),
            include_id: true,
            positional: None,
            identity: true,
        }
    }

    /// Whether applying the projection returns the document unchanged.
    pub fn is_identity(&self) -> bool {
        self.identity
    }

    /// Projects one document. Fails only on expression errors or an unmatched positional path.
    pub fn apply(&self, doc: &Document) -> Result<Document> {
        self.apply_in(doc, &Env::default())
    }

    /// [`Projection::apply`] with `$$NOW` and user variables for computed fields.
    pub fn apply_in(&self, doc: &Document, env: &Env) -> Result<Document> {
        if self.identity {
            return Ok(doc.clone());
        }
        let mut out = match self.kind {
            Kind::Inclusion => include_doc(doc, &self.root, doc, true, self.include_id, env)?,
            Kind::Exclusion => exclude_doc(doc, &self.root, doc, env)?,
            Kind::AddFields => add_fields_doc(doc, &self.root, doc, env)?,
        };
        if let Some((path, m)) = &self.positional {
            apply_positional(doc, path, m, &mut out)?;
        }
        Ok(out)
    }
}

struct Parser {
    syntax: Syntax,
    vars: Vec<String>,
    kind: Option<Kind>,
    root: Level,
    include_id: bool,
    positional: Option<String>,
}

fn is_id(prefix: &[String], key: &str) -> bool {
    prefix.is_empty() && key == "_id"
}

impl Parser {
    fn set_kind(&mut self, want: Kind, path: &str) -> Result<()> {
        match (self.kind, want) {
            (None, k) => {
                self.kind = Some(k);
                Ok(())
            }
            (Some(a), b) if a == b => Ok(()),
            (Some(Kind::Inclusion), Kind::Exclusion) => Err(MongoError::with_code(
                31254,
                format!("Cannot do exclusion on field {path} in inclusion projection"),
            )),
            (Some(Kind::Exclusion), Kind::Inclusion) => Err(MongoError::with_code(
                31253,
                format!("Cannot do inclusion on field {path} in exclusion projection"),
            )),
            (Some(Kind::AddFields), _) => Ok(()),
            _ => Ok(()),
        }
    }

    fn field(&mut self, prefix: &[String], key: &str, v: &Bson) -> Result<()> {
        crate::value::check_path_length(key)?;
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(MongoError::bad_value(format!(
                "FieldPath field names may not be empty strings: '{key}'"
            )));
        }
        if let Some(base) = key.strip_suffix(".$") {
            if self.syntax != Syntax::Find {
                return Err(MongoError::with_code(
                    31324,
                    "Cannot use positional projection in aggregation projection",
                ));
            }
            if self.positional.is_some() {
                return Err(MongoError::with_code(
                    31276,
                    "Cannot specify more than one positional projection per query.",
                ));
            }
            let full = join(prefix, base);
            self.set_kind(Kind::Inclusion, &full)?;
            self.positional = Some(full);
            return Ok(());
        }
        if key.starts_with('$') || key.split('.').any(|p| p.starts_with('$')) {
            return Err(MongoError::with_code(
                16410,
                format!("FieldPath field names may not start with '$'. Given: {key}"),
            ));
        }
        let mut path: Vec<String> = prefix.to_vec();
        path.extend(key.split('.').map(str::to_string));
        let full = path.join(".");
        let node = match (v, self.syntax) {
            (Bson::Document(d), _) if d.keys().next().is_some_and(|k| !k.starts_with('$')) => {
                for (k2, v2) in d {
                    self.field(&path, k2, v2)?;
                }
                return Ok(());
            }
            (Bson::Document(d), Syntax::AddFields) if d.is_empty() => {
                PNode::Compute(Expr::literal(Bson::Document(Document::new())))
            }
            (Bson::Document(d), _) if d.is_empty() => {
                return Err(MongoError::with_code(
                    51270,
                    format!(
                        "An empty sub-projection is not a valid value. Found empty object at path {full}"
                    ),
                ));
            }
            (Bson::Document(d), Syntax::Find) if d.len() == 1 && d.contains_key("$slice") => {
                match slice_spec(d.get("$slice"))? {
                    Some((skip, limit)) => PNode::Slice { skip, limit },
                    None => self.compute(v, &full)?,
                }
            }
            (Bson::Document(d), Syntax::Find) if d.contains_key("$elemMatch") => {
                if path.len() > 1 {
                    return Err(MongoError::with_code(
                        31275,
                        "Cannot use $elemMatch projection on a nested field.",
                    ));
                }
                let inner = d.get("$elemMatch").cloned().unwrap_or(Bson::Null);
                if !matches!(inner, Bson::Document(_)) {
                    return Err(MongoError::bad_value(
                        "elemMatch: Invalid argument, object required.",
                    ));
                }
                let m = Matcher::parse(&doc! { "x": { "$elemMatch": inner } })?;
                self.set_kind(Kind::Inclusion, &full)?;
                PNode::ElemMatch(Box::new(m))
            }
            (Bson::Document(d), _) if d.contains_key("$meta") => {
                return Err(MongoError::bad_value("$meta projections are not supported"));
            }
            (
                Bson::Boolean(_)
                | Bson::Int32(_)
                | Bson::Int64(_)
                | Bson::Double(_)
                | Bson::Decimal128(_),
                Syntax::Find | Syntax::Project,
            ) => {
                if value::truthy(v) {
                    if !is_id(prefix, key) {
                        self.set_kind(Kind::Inclusion, &full)?;
                    }
                    PNode::Include
                } else {
                    if is_id(prefix, key) {
                        self.include_id = false;
                    } else {
                        self.set_kind(Kind::Exclusion, &full)?;
                    }
                    PNode::Exclude
                }
            }
            _ => self.compute(v, &full)?,
        };
        insert(&mut self.root, &path, node, &full)
    }

    fn compute(&mut self, v: &Bson, full: &str) -> Result<PNode> {
        if self.kind == Some(Kind::Exclusion) {
            return Err(MongoError::with_code(
                31252,
                format!(
                    "Cannot use expression other than $meta in exclusion projection (field {full})"
                ),
            ));
        }
        self.set_kind(Kind::Inclusion, full)?;
        Ok(PNode::Compute(Expr::parse_with_vars(v, &self.vars)?))
    }
}

/// A find `$slice` argument: `n` or `[skip, limit]`; `None` when it is an aggregation `$slice`.
fn slice_spec(v: Option<&Bson>) -> Result<Option<(Option<i64>, i64)>> {
    match v {
        Some(n) if value::is_number(n) => {
            let n = value::as_f64(n).unwrap_or(0.0);
            Ok(Some((None, n.clamp(-9.0e18, 9.0e18) as i64)))
        }
        Some(Bson::Array(a)) if a.len() == 2 && a.iter().all(value::is_number) => {
            let skip = value::as_f64(&a[0]).unwrap_or(0.0).clamp(-9.0e18, 9.0e18) as i64;
            let limit = value::as_f64(&a[1]).unwrap_or(0.0).clamp(-9.0e18, 9.0e18) as i64;
            if limit <= 0 {
                return Err(MongoError::with_code(
                    28724,
                    "Invalid $slice syntax. The limit must be positive",
                ));
            }
            Ok(Some((Some(skip), limit)))
        }
        Some(Bson::Array(_)) => Ok(None),
        _ => Err(MongoError::with_code(
            28667,
            "Invalid $slice syntax. The given syntax { $slice: <arg> } did not match the find() syntax because :: Location31273: $slice only supports numbers and [skip, limit] arrays",
        )),
    }
}

fn join(prefix: &[String], key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{}.{key}", prefix.join("."))
    }
}

fn insert(level: &mut Level, path: &[String], node: PNode, full: &str) -> Result<()> {
    let Some((head, rest)) = path.split_first() else {
        return Ok(());
    };
    if rest.is_empty() {
        if level.contains_key(head) {
            return Err(MongoError::with_code(
                31250,
                format!("Path collision at {full}"),
            ));
        }
        level.insert(head.clone(), node);
        return Ok(());
    }
    match level.get_mut(head) {
        None => {
            let mut children = Level::new();
            insert(&mut children, rest, node, full)?;
            level.insert(head.clone(), PNode::Nested(children));
            Ok(())
        }
        Some(existing) => match existing {
            PNode::Nested(children) => insert(children, rest, node, full),
            _ => Err(MongoError::with_code(
                31250,
                format!(
                    "Path collision at {full} remaining portion {}",
                    rest.join(".")
                ),
            )),
        },
    }
}

fn find_node<'a>(level: &'a Level, key: &str) -> Option<&'a PNode> {
    level.get(key)
}

fn has_computed(level: &Level) -> bool {
    level.iter().any(|(_, n)| match n {
        PNode::Compute(_) => true,
        PNode::Nested(c) => has_computed(c),
        _ => false,
    })
}

fn include_doc(
    src: &Document,
    nodes: &Level,
    root: &Document,
    top: bool,
    include_id: bool,
    env: &Env,
) -> Result<Document> {
    let mut out = Document::new();
    for (k, v) in src {
        match find_node(nodes, k) {
            Some(PNode::Include) => {
                out.insert(k.clone(), v.clone());
            }
            Some(PNode::Nested(children)) => {
                if let Some(x) = include_value(v, children, root, env)? {
                    out.insert(k.clone(), x);
                }
            }
            Some(PNode::Slice { skip, limit }) => {
                out.insert(k.clone(), slice_value(v, *skip, *limit));
            }
            Some(PNode::ElemMatch(m)) => {
                if let Bson::Array(a) = v
                    && let Some(e) = a.iter().find(|e| m.matches(&doc! { "x": [(*e).clone()] }))
                {
                    out.insert(k.clone(), vec![e.clone()]);
                }
            }
            // Computed fields come after the included ones (below), except a computed `_id`.
            Some(PNode::Compute(e)) if top && k == "_id" => {
                if let Some(x) = e.evaluate_in(root, env)? {
                    out.insert(k.clone(), x);
                }
            }
            Some(PNode::Compute(_)) | Some(PNode::Exclude) => {}
            None => {
                if top && include_id && k == "_id" {
                    out.insert(k.clone(), v.clone());
                }
            }
        }
    }
    // Computed fields in specification order (replacing nothing: an input field of the same
    // name was not copied above), then subtrees with computed fields the input lacks.
    for (k, n) in nodes {
        match n {
            PNode::Compute(_) if top && k == "_id" && src.contains_key(k) => {}
            PNode::Compute(e) => {
                if let Some(x) = e.evaluate_in(root, env)? {
                    out.insert(k.clone(), x);
                }
            }
            PNode::Nested(children) if has_computed(children) && !src.contains_key(k) => {
                out.insert(
                    k.clone(),
                    include_doc(&Document::new(), children, root, false, false, env)?,
                );
            }
            _ => {}
        }
    }
    Ok(out)
}

/// An included subtree applied to a value: documents recurse, arrays map over their elements.
fn include_value(v: &Bson, children: &Level, root: &Document, env: &Env) -> Result<Option<Bson>> {
    Ok(match v {
        Bson::Document(d) => Some(Bson::Document(include_doc(
            d, children, root, false, false, env,
        )?)),
        Bson::Array(a) => {
            let mut out = Vec::new();
            for e in a {
                if let Some(x) = include_value(e, children, root, env)? {
                    out.push(x);
                }
            }
            Some(Bson::Array(out))
        }
        _ if has_computed(children) => Some(Bson::Document(include_doc(
            &Document::new(),
            children,
            root,
            false,
            false,
            env,
        )?)),
        _ => None,
    })
}

fn exclude_doc(src: &Document, nodes: &Level, root: &Document, env: &Env) -> Result<Document> {
    let mut out = Document::new();
    for (k, v) in src {
        match find_node(nodes, k) {
            Some(PNode::Exclude) => {}
            Some(PNode::Nested(children)) => {
                out.insert(k.clone(), exclude_value(v, children, root, env)?);
            }
            Some(PNode::Slice { skip, limit }) => {
                out.insert(k.clone(), slice_value(v, *skip, *limit));
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(out)
}

fn exclude_value(v: &Bson, children: &Level, root: &Document, env: &Env) -> Result<Bson> {
    Ok(match v {
        Bson::Document(d) => Bson::Document(exclude_doc(d, children, root, env)?),
        Bson::Array(a) => Bson::Array(
            a.iter()
                .map(|e| exclude_value(e, children, root, env))
                .collect::<Result<Vec<_>>>()?,
        ),
        other => other.clone(),
    })
}

fn add_fields_doc(src: &Document, nodes: &Level, root: &Document, env: &Env) -> Result<Document> {
    let mut out = Document::new();
    for (k, v) in src {
        match find_node(nodes, k) {
            Some(PNode::Compute(e)) => {
                // A computed field replaces the value in place; missing removes it.
                if let Some(x) = e.evaluate_in(root, env)? {
                    out.insert(k.clone(), x);
                }
            }
            Some(PNode::Nested(children)) => {
                out.insert(k.clone(), add_fields_value(v, children, root, env)?);
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    for (k, n) in nodes {
        if src.contains_key(k) {
            continue;
        }
        match n {
            PNode::Compute(e) => {
                if let Some(x) = e.evaluate_in(root, env)? {
                    out.insert(k.clone(), x);
                }
            }
            PNode::Nested(children) => {
                out.insert(
                    k.clone(),
                    add_fields_doc(&Document::new(), children, root, env)?,
                );
            }
            _ => {}
        }
    }
    Ok(out)
}

fn add_fields_value(v: &Bson, children: &Level, root: &Document, env: &Env) -> Result<Bson> {
    Ok(match v {
        Bson::Document(d) => Bson::Document(add_fields_doc(d, children, root, env)?),
        Bson::Array(a) => Bson::Array(
            a.iter()
                .map(|e| add_fields_value(e, children, root, env))
                .collect::<Result<Vec<_>>>()?,
        ),
        _ => Bson::Document(add_fields_doc(&Document::new(), children, root, env)?),
    })
}

/// Find's `$slice`: `n` first elements (last `-n`), or `[skip, limit]`; non-arrays unchanged.
fn slice_value(v: &Bson, skip: Option<i64>, limit: i64) -> Bson {
    let Bson::Array(a) = v else {
        return v.clone();
    };
    let len = i64::try_from(a.len()).unwrap_or(i64::MAX);
    let (start, count) = match skip {
        None if limit >= 0 => (0, limit),
        None => ((len + limit).max(0), -limit),
        Some(s) if s >= 0 => (s.min(len), limit),
        Some(s) => ((len + s).max(0), limit),
    };
    let start = usize::try_from(start).unwrap_or(0);
    let count = usize::try_from(count).unwrap_or(0);
    Bson::Array(a.iter().skip(start).take(count).cloned().collect())
}

/// The filter's top-level predicates on `path` or below it (looking into `$and`).
fn collect_filter_on(filter: &Document, path: &str, out: &mut Document) {
    for (k, v) in filter {
        if k == "$and" {
            if let Bson::Array(items) = v {
                for i in items {
                    if let Bson::Document(d) = i {
                        collect_filter_on(d, path, out);
                    }
                }
            }
        } else if k == path || k.strip_prefix(path).is_some_and(|r| r.starts_with('.')) {
            out.insert(k.clone(), v.clone());
        }
    }
}

fn apply_positional(doc: &Document, path: &str, m: &Matcher, out: &mut Document) -> Result<()> {
    let Some(Bson::Array(arr)) = value::get_path(doc, path) else {
        return Err(MongoError::bad_value(
            "Executor error during find command :: caused by :: positional operator '.$' \
             couldn't find a matching element in the array",
        ));
    };
    for e in arr {
        let mut probe = doc.clone();
        value::set_path(&mut probe, path, Bson::Array(vec![e.clone()]));
        if m.matches(&probe) {
            value::set_path(out, path, Bson::Array(vec![e.clone()]));
            return Ok(());
        }
    }
    Err(MongoError::bad_value(
        "Executor error during find command :: caused by :: positional operator '.$' couldn't \
         find a matching element in the array",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(spec: Document) -> Projection {
        Projection::parse(&spec).unwrap_or_else(|e| panic!("{spec}: {e}"))
    }

    #[test]
    fn inclusion_keeps_listed_fields_and_id_in_document_order() {
        let cases = [
            (
                doc! {"b": 1, "a": 1},
                doc! {"_id": 1, "a": 1, "b": 2, "c": 3},
                doc! {"_id": 1, "a": 1, "b": 2},
            ),
            (
                doc! {"a": 1, "_id": 0},
                doc! {"_id": 1, "a": 1, "b": 2},
                doc! {"a": 1},
            ),
            (doc! {"a": true}, doc! {"_id": 1, "b": 2}, doc! {"_id": 1}),
            (doc! {"_id": 1}, doc! {"_id": 1, "b": 2}, doc! {"_id": 1}),
            (
                doc! {"_id": true, "a": {"$slice": 1}},
                doc! {"_id": 1, "a": [1, 2], "b": 2},
                doc! {"_id": 1, "a": [1]},
            ),
            (
                doc! {"a.b": 1},
                doc! {"a": {"b": 1, "c": 2}, "x": 1},
                doc! {"a": {"b": 1}},
            ),
            (
                doc! {"a": {"b": 1}},
                doc! {"a": {"b": 1, "c": 2}},
                doc! {"a": {"b": 1}},
            ),
            (
                doc! {"a.b": 1},
                doc! {"a": [{"b": 1, "c": 2}, 5, {"c": 3}]},
                doc! {"a": [{"b": 1}, {}]},
            ),
            (doc! {"a.b": 1}, doc! {"a": 5}, doc! {}),
        ];
        for (spec, input, want) in cases {
            assert_eq!(
                p(spec.clone()).apply(&input).unwrap(),
                want,
                "{spec} on {input}"
            );
        }
    }

    #[test]
    fn exclusion_drops_listed_fields_everywhere_on_the_path() {
        let cases = [
            (
                doc! {"b": 0},
                doc! {"_id": 1, "a": 1, "b": 2},
                doc! {"_id": 1, "a": 1},
            ),
            (doc! {"_id": 0}, doc! {"_id": 1, "a": 1}, doc! {"a": 1}),
            (
                doc! {"a.b": 0},
                doc! {"a": [{"b": 1, "c": 2}, 5]},
                doc! {"a": [{"c": 2}, 5]},
            ),
            (
                doc! {"a": false, "_id": 1},
                doc! {"_id": 1, "a": 1},
                doc! {"_id": 1},
            ),
        ];
        for (spec, input, want) in cases {
            assert_eq!(
                p(spec.clone()).apply(&input).unwrap(),
                want,
                "{spec} on {input}"
            );
        }
    }

    #[test]
    fn computed_fields_slice_and_elem_match() {
        let input = doc! {"_id": 1, "a": [1, 2, 3, 4], "x": 5, "d": [{"k": 1}, {"k": 2}]};
        let cases = [
            (doc! {"y": "$x"}, doc! {"_id": 1, "y": 5}),
            // Computed fields follow included ones, in specification order.
            (
                doc! {"x": "$x", "_id": 0, "d": 1},
                doc! {"d": [{"k": 1}, {"k": 2}], "x": 5},
            ),
            (
                doc! {"_id": "$x", "a": {"$slice": 1}},
                doc! {"_id": 5, "a": [1]},
            ),
            (doc! {"y": {"$add": ["$x", 1]}, "_id": 0}, doc! {"y": 6}),
            (doc! {"y": "lit", "_id": 0}, doc! {"y": "lit"}),
            (doc! {"n.m": "$x", "_id": 0}, doc! {"n": {"m": 5}}),
            (
                doc! {"a": {"$slice": 2}, "_id": 0, "x": 0, "d": 0},
                doc! {"a": [1, 2]},
            ),
            (
                doc! {"a": {"$slice": -1}, "x": 1},
                doc! {"_id": 1, "a": [4], "x": 5},
            ),
            (
                doc! {"a": {"$slice": [1, 2]}, "x": 0, "d": 0},
                doc! {"_id": 1, "a": [2, 3]},
            ),
            (
                doc! {"d": {"$elemMatch": {"k": 2}}},
                doc! {"_id": 1, "d": [{"k": 2}]},
            ),
            (doc! {"d": {"$elemMatch": {"k": 9}}}, doc! {"_id": 1}),
        ];
        for (spec, want) in cases {
            assert_eq!(p(spec.clone()).apply(&input).unwrap(), want, "{spec}");
        }
    }

    #[test]
    fn positional_projection_picks_first_matching_element() {
        let filter = doc! {"a": {"$gt": 2}};
        let proj = Projection::parse_with_query(&doc! {"a.$": 1}, Some(&filter)).unwrap();
        assert_eq!(
            proj.apply(&doc! {"_id": 1, "a": [1, 3, 5], "b": 1})
                .unwrap(),
            doc! {"_id": 1, "a": [3]}
        );
        assert!(Projection::parse_with_query(&doc! {"a.$": 1}, Some(&doc! {"b": 1})).is_err());
    }

    #[test]
    fn add_fields_replaces_in_place_and_merges_nested() {
        let proj = Projection::parse_with(
            &doc! {"a": 10, "n.z": 1, "new": "$a"},
            Syntax::AddFields,
            None,
        )
        .unwrap();
        assert_eq!(
            proj.apply(&doc! {"a": 1, "n": {"y": 2}, "b": 3}).unwrap(),
            doc! {"a": 10, "n": {"y": 2, "z": 1}, "b": 3, "new": 1}
        );
        let proj =
            Projection::parse_with(&doc! {"a.b": "$$REMOVE"}, Syntax::AddFields, None).unwrap();
        assert_eq!(
            proj.apply(&doc! {"a": [{"b": 1, "c": 1}]}).unwrap(),
            doc! {"a": [{"c": 1}]}
        );
    }

    /// Found by the fuzzer: a 16 MiB `find` with a million projected fields held a shard for
    /// minutes while each field was checked against every earlier one. Each level is a map
    /// now; a wide projection parses in one pass and still finds a collision at its end.
    #[test]
    fn a_projection_of_very_many_fields_parses_in_one_pass() {
        let mut spec = Document::new();
        for i in 0..100_000 {
            spec.insert(format!("f{i}"), 1);
            spec.insert(format!("n.f{i}"), 1);
        }
        let p = Projection::parse(&spec).expect("parses");
        let out = p
            .apply(&doc! {"f7": 1, "x": 2, "n": {"f9": 3, "y": 4}})
            .unwrap();
        assert_eq!(out, doc! {"f7": 1, "n": {"f9": 3}});
        spec.insert("n.f5.deeper", 1);
        let e = Projection::parse(&spec).expect_err("n.f5 is already projected");
        assert_eq!(e.code, 31250);
    }

    #[test]
    fn mixing_and_collisions_are_rejected_with_mongodb_codes() {
        let cases: &[(Document, i32)] = &[
            (doc! {"a": 1, "b": 0}, 31254),
            (doc! {"a": 0, "b": 1}, 31253),
            (doc! {"a": 1, "a.b": 1}, 31250),
            (doc! {"a.b": 1, "a": 1}, 31250),
            (doc! {"a": 0, "b": "$x"}, 31252),
            (doc! {"a.$": 1, "b.$": 1}, 31276),
            (doc! {"a.b": {"$elemMatch": {"x": 1}}}, 31275),
        ];
        for (spec, code) in cases {
            let e = Projection::parse_with_query(spec, Some(&doc! {"a": 1, "b": 1}))
                .expect_err(&format!("{spec}"));
            assert_eq!(e.code, *code, "{spec}: {e}");
        }
        let e = Projection::parse_with(&doc! {}, Syntax::Project, None).unwrap_err();
        assert_eq!(e.code, 51272);
    }
}
