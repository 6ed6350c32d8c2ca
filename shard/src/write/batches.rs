//! Multi-document updates and deletes in bounded batches.
//!
//! An `updateMany` or `deleteMany` over a large collection must not hold the single writer for
//! its whole pass: every other write of the shard would wait behind it, and the matches would
//! all sit in memory at once. So a multi statement runs as a series of writer jobs, each
//! writing at most [`BATCH`] documents; a [`Cursor`] carries the statement's place in its
//! scan from one job to the next. Other writes interleave between the batches, as they do
//! between MongoDB's yields: the statement is not isolated, each document's write is.
//!
//! Invariants:
//! * The plan is chosen once, by the first batch, and every later batch scans the same key
//!   space after the place the previous one reached; a later batch whose collection or index
//!   has gone ends the statement with `QueryPlanKilled`, as a yield that finds it dropped.
//! * No document is updated twice by one statement: an update can move a document ahead of an
//!   index scan (it changes the scanned key), so an index-scan update remembers the documents
//!   it wrote and skips them; a scan in `_id` or insertion order cannot meet a document again.
//! * A batch that meets a held key after its statement has written something rewinds to that
//!   document, and the statement waits and goes on from there: it never runs again whole.

use std::collections::HashSet;

use bson::{Bson, Document, Uuid};
use wire::MongoError;

use crate::catalog::CollectionEntry;
use crate::indexes::plan::Access;
use crate::query::{Examined, Filter, plan, run_plan};
use crate::storage::{ReadTxn, Scan};
use crate::writer::OpResult;

/// The most documents one batch of a multi statement writes.
pub const BATCH: usize = 500;

/// `QueryPlanKilled`: the collection or index a running statement scans went away.
const QUERY_PLAN_KILLED: i32 = 175;

/// A multi statement's place between its batches.
#[derive(Debug, Default)]
pub struct Cursor {
    /// The collection and plan of the first batch.
    plan: Option<(Uuid, Access)>,
    /// The last scan key the statement is done with.
    after: Option<Vec<u8>>,
    /// The documents a multikey index scan has produced (by document key).
    seen: HashSet<Vec<u8>>,
    /// The documents an index-scan update has written (by document key).
    written: HashSet<Vec<u8>>,
    /// The scan has no more documents.
    pub finished: bool,
    /// The last batch stopped at a held key: wait for the hold to end, then go on.
    pub held: bool,
}

/// One batch: the matching documents with the scan key each was found at.
pub struct Batch {
    pub docs: Vec<(Vec<u8>, Document)>,
    uuid: Uuid,
    /// Where the batch's scan started.
    start: Option<Vec<u8>>,
    /// It came from a cursor, which can go on from any of its documents.
    resumable: bool,
}

impl Batch {
    /// The documents of a statement found otherwise (single, or sorted), as its only batch.
    pub fn whole(coll: &CollectionEntry, docs: Vec<Document>) -> Batch {
        Batch {
            docs: docs.into_iter().map(|d| (Vec::new(), d)).collect(),
            uuid: coll.uuid,
            start: None,
            resumable: false,
        }
    }

    pub fn resumable(&self) -> bool {
        self.resumable
    }
}

impl Cursor {
    /// The next (at most `max`) documents of `coll` that match `filter`; the cursor is
    /// finished when the scan ran out before `max`.
    pub fn next_batch(
        &mut self,
        txn: &dyn ReadTxn,
        coll: &CollectionEntry,
        filter: &Filter,
        max: usize,
    ) -> OpResult<Batch> {
        self.held = false;
        let access = match &self.plan {
            Some((uuid, access)) => {
                check_still_there(coll, uuid, access)?;
                access.clone()
            }
            None => {
                let access = plan(txn, coll, filter, None)?.access;
                self.plan = Some((coll.uuid, access.clone()));
                access
            }
        };
        let start = self.after.clone();
        let mut docs = Vec::new();
        let written = &self.written;
        let mut more = false;
        run_plan(
            txn,
            coll,
            &access,
            self.after.as_deref(),
            &mut self.seen,
            &mut Examined::default(),
            &mut |k, d| {
                if !filter.matches(&d) || written.contains(&document_key(coll, &d)) {
                    return Scan::Continue;
                }
                docs.push((k.to_vec(), d));
                if docs.len() >= max {
                    more = true;
                    Scan::Stop
                } else {
                    Scan::Continue
                }
            },
        )?;
        match docs.last() {
            Some((k, _)) if more => self.after = Some(k.clone()),
            _ => self.finished = true,
        }
        Ok(Batch {
            docs,
            uuid: coll.uuid,
            start,
            resumable: true,
        })
    }

    /// Notes that the statement wrote `doc`, which `batch` produced: an index-scan update
    /// must not meet it again.
    pub fn wrote(&mut self, coll: &CollectionEntry, doc: &Document) {
        if matches!(self.plan, Some((_, Access::Index(_)))) {
            self.written.insert(document_key(coll, doc));
        }
    }

    /// Makes the next batch start at document `i` of `batch` (it met a held key there).
    pub fn rewind(&mut self, batch: &Batch, i: usize) {
        self.held = true;
        self.finished = false;
        for (_, d) in &batch.docs[i..] {
            let id = d.get("_id").cloned().unwrap_or(Bson::Null);
            self.seen.remove(&crate::keys::doc_key(&batch.uuid, &id));
        }
        self.after = match i.checked_sub(1) {
            Some(prev) => Some(batch.docs[prev].0.clone()),
            None => batch.start.clone(),
        };
    }
}

fn document_key(coll: &CollectionEntry, doc: &Document) -> Vec<u8> {
    let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
    crate::keys::doc_key(&coll.uuid, &id)
}

/// Refuses a later batch whose collection was dropped (or re-created) or whose index was
/// dropped since the first batch planned.
fn check_still_there(coll: &CollectionEntry, uuid: &Uuid, access: &Access) -> OpResult<()> {
    if coll.uuid != *uuid {
        return Err(MongoError::with_code(
            QUERY_PLAN_KILLED,
            format!(
                "collection {} dropped during a multi-document write",
                coll.ns()
            ),
        )
        .into());
    }
    if let Access::Index(scan) = access
        && !coll
            .indexes
            .iter()
            .any(|spec| spec.get_str("name").is_ok_and(|n| n == scan.name))
    {
        return Err(MongoError::with_code(
            QUERY_PLAN_KILLED,
            format!(
                "index '{}' dropped during a multi-document write on {}",
                scan.name,
                coll.ns()
            ),
        )
        .into());
    }
    Ok(())
}
