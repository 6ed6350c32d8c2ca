//! `transactionNetEffect` (Tributary's): a transaction's CRUD events folded per document into
//! the one change that takes the document from where it was before the transaction to where it
//! is after: an `insert` (with the final document), an `update` (with the combined
//! `updateDescription`), a `replace` (with the final document), a `delete`, or nothing.
//!
//! | the document's ops in the transaction | net event |
//! |---|---|
//! | insert, then anything but a last delete | `insert` of the final document |
//! | insert … delete | none |
//! | updates only | `update`, the descriptions combined (a path set twice is set once, to its last value; a path set then removed is removed) |
//! | a replace, or a delete then an insert, and it exists at the end | `replace` with the final document |
//! | … ending in a delete | `delete` |
//! | anything that leaves it as it was (the shard marks its ops `noNetChange` at commit) | none |
//!
//! Invariants:
//! * pure: the fold reads only the transaction's own pseudo-entries (and the `noNetChange`
//!   marks the shard wrote into them when it committed, comparing each document before and
//!   after), so a stream folds a transaction the same however often it reads it;
//! * a folded event is made from its document's last op (so it carries that op's `clusterTime`,
//!   `txnOpIndex` and token, with the folded `operationType`), and folded events come in the
//!   order of their last ops: tokens increase, and resuming after a folded event refolds the
//!   whole transaction and skips exactly the events at or before it;
//! * the pre-image a folded event is given is that of its document's first op (the document
//!   before the transaction); events that are not CRUD pass through unfolded, in place.

use bson::{Bson, Document, doc};
use wire::{MongoError, Result};

use super::ChangeEvent;
use super::diff_apply::apply_diff;
use super::transform::Transformer;

/// The field of a transaction's op that says its document ends the transaction as it began.
pub const NO_NET_CHANGE: &str = "noNetChange";

/// One event of the folded transaction, with the op whose pre-image it shows.
#[derive(Debug, Clone)]
pub struct Folded {
    pub event: ChangeEvent,
    /// The op the event's images are read for: its document's first op in the transaction.
    pub image_op: Document,
}

/// What a group's ops leave the document as.
enum End {
    Inserted(Document),
    Replaced(Document),
    Updated(Composed),
    Deleted,
    Nothing,
}

/// Folds one transaction's ops (its pseudo-entries, in `txnOpIndex` order) into net events.
pub fn fold(transformer: &mut Transformer, ops: &[Document]) -> Result<Vec<Folded>> {
    // Each op's event, and the group (document) it belongs to.
    let mut events: Vec<Option<ChangeEvent>> = Vec::with_capacity(ops.len());
    let mut groups: Vec<(Document, Vec<usize>)> = Vec::new();
    let mut loose: Vec<usize> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let event = transformer.transform(op)?;
        match &event {
            Some(e) if is_crud(e.operation_type()) => {
                let key = doc! {
                    "ns": e.doc.get("ns").cloned().unwrap_or(Bson::Null),
                    "key": e.doc.get("documentKey").cloned().unwrap_or(Bson::Null),
                };
                match groups.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, members)) => members.push(i),
                    None => groups.push((key, vec![i])),
                }
            }
            Some(_) => loose.push(i),
            None => {}
        }
        events.push(event);
    }
    // (position, event): a folded event sits at its last op.
    let mut out: Vec<(usize, Folded)> = Vec::with_capacity(groups.len() + loose.len());
    for i in loose {
        if let Some(event) = events[i].take() {
            out.push((
                i,
                Folded {
                    event,
                    image_op: ops[i].clone(),
                },
            ));
        }
    }
    for (_, members) in groups {
        let (Some(&first), Some(&last)) = (members.first(), members.last()) else {
            continue;
        };
        let end = if members
            .iter()
            .any(|&i| ops[i].get_bool(NO_NET_CHANGE).unwrap_or(false))
        {
            End::Nothing
        } else {
            end_of(&members, ops, &events)?
        };
        let event = match end {
            End::Nothing => None,
            End::Deleted => events[last].take(),
            End::Inserted(doc) => transformer.transform(&rewritten(&ops[last], "i", doc))?,
            End::Replaced(doc) => transformer.transform(&rewritten(&ops[last], "u", doc))?,
            End::Updated(composed) => match events[last].take() {
                Some(mut e) => {
                    e.doc.insert("updateDescription", composed.to_document());
                    Some(e)
                }
                None => None,
            },
        };
        if let Some(event) = event {
            out.push((
                last,
                Folded {
                    event,
                    image_op: ops[first].clone(),
                },
            ));
        }
    }
    out.sort_by_key(|(position, _)| *position);
    Ok(out.into_iter().map(|(_, f)| f).collect())
}

fn is_crud(kind: &str) -> bool {
    matches!(kind, "insert" | "update" | "replace" | "delete")
}

/// The last op of a document, made to say the net change: an insert of `doc` (`i`) or a
/// replacement by it (`u` without a diff).
fn rewritten(last: &Document, op: &str, doc: Document) -> Document {
    let mut entry = last.clone();
    let key = match last.get_str("op") {
        Ok("d") => last.get_document("o").ok().cloned(),
        _ => last.get_document("o2").ok().cloned(),
    }
    .unwrap_or_else(|| doc! {"_id": doc.get("_id").cloned().unwrap_or(Bson::Null)});
    entry.insert("op", op);
    entry.insert("o", doc);
    entry.insert("o2", key);
    entry
}

/// Where a document's ops (`members`, in order) leave it.
fn end_of(members: &[usize], ops: &[Document], events: &[Option<ChangeEvent>]) -> Result<End> {
    let kind = |i: usize| events[i].as_ref().map_or("", ChangeEvent::operation_type);
    let existed = kind(members[0]) != "insert";
    // The whole document, once an insert or a replace gave it; else what updates composed.
    let mut whole: Option<Document> = None;
    let mut present = existed;
    let mut composed = Composed::default();
    for &i in members {
        match kind(i) {
            "insert" | "replace" => {
                let doc = ops[i].get_document("o").map_err(|_| {
                    MongoError::internal("an insert or replace op without its document")
                })?;
                whole = Some(doc.clone());
                present = true;
            }
            "update" => {
                present = true;
                match whole.take() {
                    Some(doc) => {
                        let diff = ops[i]
                            .get_document("o")
                            .and_then(|o| o.get_document("diff"))
                            .map_err(|_| MongoError::internal("an update op without its diff"))?;
                        whole = Some(apply_diff(&doc, diff)?);
                    }
                    None => {
                        let description = events[i]
                            .as_ref()
                            .and_then(|e| e.doc.get_document("updateDescription").ok())
                            .ok_or_else(|| {
                                MongoError::internal("an update event without its description")
                            })?;
                        composed.then(description);
                    }
                }
            }
            "delete" => {
                present = false;
                whole = None;
                composed = Composed::default();
            }
            _ => {}
        }
    }
    Ok(match (existed, present, whole) {
        (false, false, _) => End::Nothing,
        (false, true, Some(doc)) => End::Inserted(doc),
        (true, false, _) => End::Deleted,
        // A replace, or a delete and an insert: the whole document is known.
        (true, true, Some(doc)) => End::Replaced(doc),
        (true, true, None) => End::Updated(composed),
        (false, true, None) => {
            return Err(MongoError::internal(
                "a document inserted in a transaction lost its contents in the fold",
            ));
        }
    })
}

/// Update descriptions composed in order: each path set or removed once, as the last op left
/// it.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Composed {
    updated: Document,
    removed: Vec<String>,
    truncated: Vec<(String, Bson)>,
}

/// Whether `path` is `ancestor` or lies under it.
fn under(path: &str, ancestor: &str) -> bool {
    path == ancestor
        || path
            .strip_prefix(ancestor)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// The proper ancestor of `path` among `paths`, with the rest of `path` below it.
fn ancestor_in<'a>(
    paths: impl Iterator<Item = &'a String>,
    path: &str,
) -> Option<(String, String)> {
    paths
        .filter(|a| a.as_str() != path && under(path, a))
        .map(|a| (a.clone(), path[a.len() + 1..].to_string()))
        .next()
}

/// Sets (`Some`) or removes (`None`) `rest` (dotted) inside `value`; false when the value
/// there is not a document (or an array with that index) to change.
fn set_in(value: &mut Bson, rest: &str, new: Option<&Bson>) -> bool {
    let (head, tail) = match rest.split_once('.') {
        Some((h, t)) => (h, Some(t)),
        None => (rest, None),
    };
    match (value, tail) {
        (Bson::Document(d), None) => {
            match new {
                Some(v) => {
                    d.insert(head, v.clone());
                }
                None => {
                    d.remove(head);
                }
            }
            true
        }
        (Bson::Document(d), Some(t)) => d.get_mut(head).is_some_and(|v| set_in(v, t, new)),
        (Bson::Array(a), tail) => {
            let Ok(i) = head.parse::<usize>() else {
                return false;
            };
            let Some(slot) = a.get_mut(i) else {
                return false;
            };
            match (tail, new) {
                (None, Some(v)) => {
                    *slot = v.clone();
                    true
                }
                // Removing an array element leaves null in its place, as `$unset` does.
                (None, None) => {
                    *slot = Bson::Null;
                    true
                }
                (Some(t), _) => set_in(slot, t, new),
            }
        }
        _ => false,
    }
}

impl Composed {
    /// Composes the next op's description (`updatedFields`, `removedFields`,
    /// `truncatedArrays`) after what is composed so far.
    pub fn then(&mut self, next: &Document) {
        if let Ok(removed) = next.get_array("removedFields") {
            for path in removed.iter().filter_map(Bson::as_str) {
                self.remove(path);
            }
        }
        if let Ok(arrays) = next.get_array("truncatedArrays") {
            for t in arrays.iter().filter_map(Bson::as_document) {
                let (Ok(field), Some(size)) = (t.get_str("field"), t.get("newSize")) else {
                    continue;
                };
                self.truncated.retain(|(f, _)| f != field);
                self.truncated.push((field.to_string(), size.clone()));
            }
        }
        if let Ok(updated) = next.get_document("updatedFields") {
            for (path, value) in updated {
                self.set(path, value);
            }
        }
    }

    /// Drops the updated paths at or under `path` (the next op's word on it is the last).
    fn forget_updates_under(&mut self, path: &str) {
        let stale: Vec<String> = self
            .updated
            .keys()
            .filter(|k| under(k, path))
            .cloned()
            .collect();
        for k in stale {
            self.updated.remove(&k);
        }
    }

    /// Sets (`Some`) or removes `path` inside the value of an updated path above it; false
    /// when there is none to change.
    fn change_in_updated(&mut self, path: &str, value: Option<&Bson>) -> bool {
        let Some((ancestor, rest)) = ancestor_in(self.updated.keys(), path) else {
            return false;
        };
        self.updated
            .get_mut(&ancestor)
            .is_some_and(|v| set_in(v, &rest, value))
    }

    fn set(&mut self, path: &str, value: &Bson) {
        self.removed.retain(|r| !under(r, path));
        self.forget_updates_under(path);
        if !self.change_in_updated(path, Some(value)) {
            self.updated.insert(path, value.clone());
        }
    }

    fn remove(&mut self, path: &str) {
        self.forget_updates_under(path);
        if !self.change_in_updated(path, None) {
            self.removed.retain(|r| !under(r, path));
            self.removed.push(path.to_string());
        }
    }

    pub fn to_document(&self) -> Document {
        doc! {
            "updatedFields": self.updated.clone(),
            "removedFields": self.removed.iter().cloned().map(Bson::String).collect::<Vec<_>>(),
            "truncatedArrays": self
                .truncated
                .iter()
                .map(|(f, n)| Bson::Document(doc! {"field": f, "newSize": n.clone()}))
                .collect::<Vec<_>>(),
        }
    }
}

#[cfg(test)]
mod tests;
