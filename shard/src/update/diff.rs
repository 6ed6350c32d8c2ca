//! `$v: 2` oplog update diffs: computing them (from two documents, or from the log of an
//! operator update) and applying them.
//!
//! Shape (MongoDB's `document_diff_serialization`): a document diff has the sections
//! `d: {f: false}`, `u: {f: v}`, `i: {f: v}` in that order (each only when non-empty), then
//! one `s<f>: <sub-diff>` per modified object/array field. An array diff starts with
//! `a: true`, then `l: <int32 new length>` when it was truncated, then `u<i>: v` / `s<i>: D`
//! in ascending index order.
//!
//! Application (MongoDB's `document_diff_applier`): fields of the old document are visited in
//! order; `d` fields are dropped, `u` fields replaced in place, `s` fields patched in place (a
//! sub-diff meeting a value of another type yields null), and `i` fields (plus `u` fields the
//! old document lacked) are appended at the end in diff order — so an `i` for an existing field
//! moves it to the end. An array diff truncates or pads (with nulls) to `l`, and `u<i>` past
//! the end pads with nulls.
//!
//! Invariants (property-tested):
//! * `diff(x, x) == None`; `apply_diff(old, diff(old, new)) == new` byte-for-byte, field order
//!   included (reordered fields are re-inserted through `i`, as MongoDB's calculator does).
//! * [`diff_or_replacement`] returns `Diff(diff(old, new))` unless that diff is at least as
//!   large as `new`, in which case a full replacement is cheaper (`Replacement`).
//! * A sub-diff that would be larger than the new value of its field is replaced by a `u` of the
//!   whole value (MongoDB's calculator does the same).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use bson::{Bson, Document};
use pipeline::value::array_index;
use wire::{MongoError, Result};

use super::tree::{LogEntry, LogKind};
use super::values::{binary_eq, bson_size, doc_binary_eq, doc_size};

/// How an update is to be logged.
#[derive(Debug, Clone, PartialEq)]
pub enum DiffOutcome {
    /// Nothing changed: no oplog entry, no change event.
    Unchanged,
    /// `o: {$v: 2, diff: D}` with this `D`.
    Diff(Document),
    /// `o: <the whole new document>`.
    Replacement,
}

/// A diff node under construction.
#[derive(Debug, Default)]
struct DocDiff {
    deletes: Vec<String>,
    updates: Vec<(String, Bson)>,
    inserts: Vec<(String, Bson)>,
    subs: Vec<(String, SubDiff)>,
}

#[derive(Debug)]
enum SubDiff {
    Doc(DocDiff),
    Array(ArrayDiff),
}

#[derive(Debug, Default)]
struct ArrayDiff {
    resize: Option<usize>,
    entries: BTreeMap<usize, ArrayEntry>,
}

#[derive(Debug)]
enum ArrayEntry {
    Update(Bson),
    Sub(SubDiff),
}

impl DocDiff {
    fn is_empty(&self) -> bool {
        self.deletes.is_empty()
            && self.updates.is_empty()
            && self.inserts.is_empty()
            && self.subs.is_empty()
    }

    fn to_document(&self) -> Document {
        let mut out = Document::new();
        if !self.deletes.is_empty() {
            let mut d = Document::new();
            for f in &self.deletes {
                d.insert(f.clone(), false);
            }
            out.insert("d", d);
        }
        for (key, section) in [("u", &self.updates), ("i", &self.inserts)] {
            if !section.is_empty() {
                let mut d = Document::new();
                for (f, v) in section {
                    d.insert(f.clone(), v.clone());
                }
                out.insert(key, d);
            }
        }
        for (f, sub) in &self.subs {
            out.insert(format!("s{f}"), sub.to_document());
        }
        out
    }

    fn has_field(&self, f: &str) -> bool {
        self.deletes.iter().any(|d| d == f)
            || self.updates.iter().any(|(k, _)| k == f)
            || self.inserts.iter().any(|(k, _)| k == f)
    }
}

impl SubDiff {
    fn to_document(&self) -> Document {
        match self {
            SubDiff::Doc(d) => d.to_document(),
            SubDiff::Array(a) => a.to_document(),
        }
    }
}

impl ArrayDiff {
    fn to_document(&self) -> Document {
        let mut out = Document::new();
        out.insert("a", true);
        if let Some(l) = self.resize {
            out.insert("l", size_bson(l));
        }
        for (i, e) in &self.entries {
            match e {
                ArrayEntry::Update(v) => out.insert(format!("u{i}"), v.clone()),
                ArrayEntry::Sub(s) => out.insert(format!("s{i}"), s.to_document()),
            };
        }
        out
    }
}

fn size_bson(n: usize) -> Bson {
    match i32::try_from(n) {
        Ok(v) => Bson::Int32(v),
        Err(_) => Bson::Int64(i64::try_from(n).unwrap_or(i64::MAX)),
    }
}

// ---------------------------------------------------------------------------------------------
// Computing a diff from two documents (MongoDB's `document_diff_calculator`)
// ---------------------------------------------------------------------------------------------

/// The `$v: 2` diff turning `old` into `new`; `None` when they are byte-for-byte identical.
pub fn diff(old: &Document, new: &Document) -> Option<Document> {
    if doc_binary_eq(old, new) {
        return None;
    }
    Some(doc_diff(old, new).to_document())
}

/// How to log the change from `old` to `new`: nothing, a diff, or a replacement when the diff
/// would not be smaller than `new` itself.
pub fn diff_or_replacement(old: &Document, new: &Document) -> DiffOutcome {
    match diff(old, new) {
        None => DiffOutcome::Unchanged,
        Some(d) if doc_size(&d) >= doc_size(new) => DiffOutcome::Replacement,
        Some(d) => DiffOutcome::Diff(d),
    }
}

fn doc_diff(pre: &Document, post: &Document) -> DocDiff {
    let mut node = DocDiff::default();
    let mut pre_it = pre.iter().peekable();
    let mut post_it = post.iter().peekable();
    let mut moved: BTreeSet<&str> = BTreeSet::new();
    while let (Some((pk, pv)), Some((qk, qv))) = (pre_it.peek(), post_it.peek()) {
        if pk == qk {
            if !binary_eq(pv, qv) {
                match sub_diff(pv, qv) {
                    Some(sub) => node.subs.push((pk.to_string(), sub)),
                    None => node.updates.push((pk.to_string(), (*qv).clone())),
                }
            }
            pre_it.next();
            post_it.next();
        } else {
            // Deleted, or present later in `post` (then re-inserted at its new place below).
            moved.insert(pk.as_str());
            pre_it.next();
        }
    }
    for (k, _) in pre_it {
        node.deletes.push(k.clone());
    }
    for (k, v) in post_it {
        moved.remove(k.as_str());
        node.inserts.push((k.clone(), v.clone()));
    }
    node.deletes.extend(moved.into_iter().map(str::to_string));
    node
}

fn array_diff(pre: &[Bson], post: &[Bson]) -> ArrayDiff {
    let mut node = ArrayDiff::default();
    for (i, (a, b)) in pre.iter().zip(post).enumerate() {
        if !binary_eq(a, b) {
            let entry = match sub_diff(a, b) {
                Some(sub) => ArrayEntry::Sub(sub),
                None => ArrayEntry::Update(b.clone()),
            };
            node.entries.insert(i, entry);
        }
    }
    for (i, b) in post.iter().enumerate().skip(pre.len()) {
        node.entries.insert(i, ArrayEntry::Update(b.clone()));
    }
    if pre.len() > post.len() {
        node.resize = Some(post.len());
    }
    node
}

/// A nested diff for two differing values of the same container type, unless it would be at
/// least as large as the new value (then the caller logs the whole value).
fn sub_diff(pre: &Bson, post: &Bson) -> Option<SubDiff> {
    let sub = match (pre, post) {
        (Bson::Document(a), Bson::Document(b)) => SubDiff::Doc(doc_diff(a, b)),
        (Bson::Array(a), Bson::Array(b)) => SubDiff::Array(array_diff(a, b)),
        _ => return None,
    };
    (doc_size(&sub.to_document()) < bson_size(post)).then_some(sub)
}

// ---------------------------------------------------------------------------------------------
// Building a diff from an operator update's log (MongoDB's `V2LogBuilder`)
// ---------------------------------------------------------------------------------------------

/// The diff MongoDB logs for an operator update: every changed path as recorded by the update
/// tree (`u` for a replaced value, `i` for a created field, `d` for a removed one, `u<i>` for
/// array elements set, created or appended), read from the final document `new`.
pub fn diff_from_log(new: &Document, log: &[LogEntry]) -> Option<Document> {
    let mut root = DocDiff::default();
    for e in log {
        add_log_entry(&mut root, new, e);
    }
    (!root.is_empty()).then(|| root.to_document())
}

/// One step into the new document while walking a logged path.
enum Cursor<'a> {
    Doc(&'a mut DocDiff, &'a Document),
    Array(&'a mut ArrayDiff, &'a [Bson]),
}

fn add_log_entry(root: &mut DocDiff, new: &Document, e: &LogEntry) {
    let (walk, last) = match &e.kind {
        LogKind::Appended { .. } => (&e.path[..], None),
        _ => match e.path.split_last() {
            Some((last, walk)) => (walk, Some(last)),
            None => return,
        },
    };
    let mut cur = Cursor::Doc(root, new);
    for name in walk {
        cur = match step(cur, name) {
            Some(c) => c,
            // Under a field already logged whole (or gone): covered by that entry.
            None => return,
        };
    }
    match (cur, last, &e.kind) {
        (Cursor::Array(node, values), None, LogKind::Appended { old_len }) => {
            for (i, v) in values.iter().enumerate().skip(*old_len) {
                node.entries.insert(i, ArrayEntry::Update(v.clone()));
            }
        }
        (Cursor::Doc(node, values), Some(f), kind) => {
            if node.has_field(f) {
                return;
            }
            match kind {
                LogKind::Deleted => node.deletes.push(f.clone()),
                LogKind::Updated | LogKind::Appended { .. } => {
                    if let Some(v) = values.get(f) {
                        node.subs.retain(|(k, _)| k != f);
                        node.updates.push((f.clone(), v.clone()));
                    }
                }
                LogKind::Created => {
                    if let Some(v) = values.get(f) {
                        node.inserts.push((f.clone(), v.clone()));
                    }
                }
            }
        }
        (Cursor::Array(node, values), Some(f), _) => {
            if let Some(i) = array_index(f)
                && let Some(v) = values.get(i)
            {
                node.entries.insert(i, ArrayEntry::Update(v.clone()));
            }
        }
        _ => {}
    }
}

fn step<'a>(cur: Cursor<'a>, name: &str) -> Option<Cursor<'a>> {
    match cur {
        Cursor::Doc(node, values) => {
            let value = values.get(name)?;
            if node.has_field(name) {
                return None;
            }
            let pos = match node.subs.iter().position(|(k, _)| k == name) {
                Some(p) => p,
                None => {
                    let sub = match value {
                        Bson::Document(_) => SubDiff::Doc(DocDiff::default()),
                        Bson::Array(_) => SubDiff::Array(ArrayDiff::default()),
                        _ => return None,
                    };
                    node.subs.push((name.to_string(), sub));
                    node.subs.len() - 1
                }
            };
            let (_, sub) = node.subs.get_mut(pos)?;
            descend_into(sub, value)
        }
        Cursor::Array(node, values) => {
            let i = array_index(name)?;
            let value = values.get(i)?;
            let entry = match node.entries.entry(i) {
                std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(ArrayEntry::Sub(match value {
                        Bson::Document(_) => SubDiff::Doc(DocDiff::default()),
                        Bson::Array(_) => SubDiff::Array(ArrayDiff::default()),
                        _ => return None,
                    }))
                }
            };
            match entry {
                ArrayEntry::Update(_) => None,
                ArrayEntry::Sub(sub) => descend_into(sub, value),
            }
        }
    }
}

fn descend_into<'a>(sub: &'a mut SubDiff, value: &'a Bson) -> Option<Cursor<'a>> {
    match (sub, value) {
        (SubDiff::Doc(d), Bson::Document(v)) => Some(Cursor::Doc(d, v)),
        (SubDiff::Array(a), Bson::Array(v)) => Some(Cursor::Array(a, v)),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Applying a diff (MongoDB's `document_diff_applier`)
// ---------------------------------------------------------------------------------------------

/// Arrays are never grown past this length by a diff (a 16 MiB document cannot hold more).
const MAX_ARRAY_LEN: usize = 16 * 1024 * 1024;

fn invalid(msg: impl Into<String>) -> MongoError {
    MongoError::failed_to_parse(msg)
}

enum DocMod<'a> {
    Delete,
    Update(&'a Bson),
    Insert,
    Sub(&'a Document),
}

/// Applies a `$v: 2` diff to `doc` with oplog-application semantics.
pub fn apply_diff(doc: &Document, diff: &Document) -> Result<Document> {
    apply_doc(doc, diff)
}

fn apply_doc(pre: &Document, diff: &Document) -> Result<Document> {
    let mut table: HashMap<&str, DocMod<'_>> = HashMap::new();
    // Updates and inserts are appended (when not applied in place) in this order.
    let mut updates: Vec<(&str, &Bson)> = Vec::new();
    let mut inserts: Vec<(&str, &Bson)> = Vec::new();
    for (key, value) in diff {
        match key.as_str() {
            "d" | "u" | "i" => {
                let Bson::Document(fields) = value else {
                    return Err(invalid(format!("diff section '{key}' must be an object")));
                };
                for (f, v) in fields {
                    let m = match key.as_str() {
                        "d" => DocMod::Delete,
                        "u" => {
                            updates.push((f, v));
                            DocMod::Update(v)
                        }
                        _ => {
                            inserts.push((f, v));
                            DocMod::Insert
                        }
                    };
                    if table.insert(f.as_str(), m).is_some() {
                        return Err(MongoError::with_code(
                            4728000,
                            format!("duplicate field name in diff: {f}"),
                        ));
                    }
                }
            }
            "b" => return Err(invalid("binary diffs ('b') are not supported")),
            k => {
                let Some(f) = k.strip_prefix('s') else {
                    return Err(invalid(format!("unexpected field in document diff: {k}")));
                };
                let Bson::Document(sub) = value else {
                    return Err(invalid(format!("sub-diff '{k}' must be an object")));
                };
                if table.insert(f, DocMod::Sub(sub)).is_some() {
                    return Err(MongoError::with_code(
                        4728000,
                        format!("duplicate field name in diff: {f}"),
                    ));
                }
            }
        }
    }
    let to_append = updates.into_iter().chain(inserts);

    let mut out = Document::new();
    let mut applied_in_place: HashSet<&str> = HashSet::new();
    for (k, v) in pre {
        match table.get(k.as_str()) {
            None => {
                out.insert(k.clone(), v.clone());
            }
            Some(DocMod::Delete) | Some(DocMod::Insert) => {}
            Some(DocMod::Update(nv)) => {
                out.insert(k.clone(), (*nv).clone());
                applied_in_place.insert(k.as_str());
            }
            Some(DocMod::Sub(sub)) => {
                out.insert(k.clone(), apply_sub(v, sub)?);
            }
        }
    }
    for (k, v) in to_append {
        if !applied_in_place.contains(k) {
            out.insert(k.to_string(), v.clone());
        }
    }
    Ok(out)
}

fn is_array_diff(sub: &Document) -> bool {
    matches!(sub.get("a"), Some(Bson::Boolean(true)))
}

/// Applies a sub-diff to a value; a type mismatch yields null (a later entry rewrites it).
fn apply_sub(v: &Bson, sub: &Document) -> Result<Bson> {
    Ok(match (v, is_array_diff(sub)) {
        (Bson::Document(d), false) => Bson::Document(apply_doc(d, sub)?),
        (Bson::Array(a), true) => Bson::Array(apply_array(a, sub)?),
        _ => Bson::Null,
    })
}

enum ArrMod<'a> {
    Update(&'a Bson),
    Sub(&'a Document),
}

fn apply_array(pre: &[Bson], diff: &Document) -> Result<Vec<Bson>> {
    let mut resize: Option<usize> = None;
    let mut mods: BTreeMap<usize, ArrMod<'_>> = BTreeMap::new();
    for (key, value) in diff {
        if key == "a" {
            continue;
        }
        if key == "l" {
            let n = pipeline::value::as_i64_exact(value)
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| invalid("array diff 'l' must be a non-negative integer"))?;
            resize = Some(n);
            continue;
        }
        let (kind, index) = key.split_at(key.len().min(1));
        let index = array_index(index)
            .ok_or_else(|| invalid(format!("unexpected field in array diff: {key}")))?;
        let m = match (kind, value) {
            ("u", v) => ArrMod::Update(v),
            ("s", Bson::Document(sub)) => ArrMod::Sub(sub),
            _ => return Err(invalid(format!("unexpected field in array diff: {key}"))),
        };
        if mods.insert(index, m).is_some() {
            return Err(invalid(format!("duplicate index in array diff: {index}")));
        }
    }
    let last_mod = mods.keys().next_back().map(|i| i + 1).unwrap_or(0);
    let target = match resize {
        Some(r) => {
            if last_mod > r {
                return Err(invalid("array diff modifies an index past its new length"));
            }
            r
        }
        None => pre.len().max(last_mod),
    };
    if target > MAX_ARRAY_LEN {
        return Err(invalid("array diff grows an array past the maximum size"));
    }
    let mut out = Vec::with_capacity(target);
    for i in 0..target {
        let old = pre.get(i);
        let v = match (mods.get(&i), old) {
            (Some(ArrMod::Update(v)), _) => (*v).clone(),
            (Some(ArrMod::Sub(sub)), Some(old)) => apply_sub(old, sub)?,
            (Some(ArrMod::Sub(_)), None) => Bson::Null,
            (None, Some(old)) => old.clone(),
            (None, None) => Bson::Null,
        };
        out.push(v);
    }
    Ok(out)
}
