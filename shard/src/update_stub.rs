//! Temporary stand-in for `update/` (being written in parallel) with its announced API, so the
//! rest of the crate compiles. Removed once `update/mod.rs` lands.
#![allow(dead_code, clippy::todo)]

use bson::{Bson, Document};
use wire::{MongoError, Result};

pub mod values {
    use bson::Bson;
    pub fn binary_eq(a: &Bson, b: &Bson) -> bool {
        a == b
    }
}

pub enum DiffOutcome {
    Unchanged,
    Diff(Document),
    Replacement,
}

pub struct UpdateContext {
    pub now: bson::DateTime,
    pub now_ts: bson::Timestamp,
    pub is_upsert_insert: bool,
    pub immutable_paths: Vec<String>,
}

pub struct UpdateSpec {
    u: Bson,
}

impl UpdateSpec {
    pub fn parse(u: &Bson, _array_filters: Option<&[Bson]>) -> Result<UpdateSpec> {
        Ok(UpdateSpec { u: u.clone() })
    }

    pub fn apply(&self, doc: &Document, _ctx: &UpdateContext) -> Result<Document> {
        let Bson::Document(u) = &self.u else {
            return Err(MongoError::bad_value("stub"));
        };
        let mut out = doc.clone();
        if let Ok(set) = u.get_document("$set") {
            for (k, v) in set {
                out.insert(k.clone(), v.clone());
            }
        } else if !u.keys().any(|k| k.starts_with('$')) {
            let mut n = Document::new();
            if let Some(id) = doc.get("_id") {
                n.insert("_id", id.clone());
            }
            n.extend(u.clone());
            out = n;
        }
        Ok(out)
    }
}

pub fn upsert_seed(filter: &Document) -> Result<Document> {
    Ok(filter
        .iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect())
}

pub fn diff_or_replacement(old: &Document, new: &Document) -> DiffOutcome {
    if old == new {
        DiffOutcome::Unchanged
    } else {
        let mut u = Document::new();
        for (k, v) in new {
            if old.get(k) != Some(v) {
                u.insert(k.clone(), v.clone());
            }
        }
        DiffOutcome::Diff(bson::doc! {"u": u})
    }
}
