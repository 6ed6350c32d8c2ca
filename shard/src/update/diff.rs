//! `$v: 2` oplog update diffs: computing them (from two documents, or from the log of an
//! operator update). Applying them is `pipeline::changestream::diff_apply` (re-exported here).
//!
//! Shape (MongoDB's `document_diff_serialization`): a document diff has the sections
//! `d: {f: false}`, `u: {f: v}`, `i: {f: v}` in that order (each only when non-empty), then
//! one `s<f>: <sub-diff>` per modified object/array field. An array diff starts with
//! `a: true`, then `l: <int32 new length>` when it was truncated, then `u<i>: v` / `s<i>: D`
//! in ascending index order.
//!
//! Application (MongoDB's `document_diff_applier`, in `pipeline`): fields of the old document are visited in
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

use std::collections::{BTreeMap, BTreeSet};

use bson::{Bson, Document};
use pipeline::changestream::split::{document_size, value_size};
use pipeline::value::array_index;

use super::tree::{LogEntry, LogKind};
use super::values::{binary_eq, doc_binary_eq};

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
        Some(d) if document_size(&d) >= document_size(new) => DiffOutcome::Replacement,
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
    (document_size(&sub.to_document()) < value_size(post)).then_some(sub)
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

/// Applying a diff lives in `pipeline` (change streams compute post-images with it); the
/// producer here is checked against it.
pub use pipeline::changestream::diff_apply::apply_diff;
