//! Statement-level write primitives, run by the writer inside a batch's transaction: implicit
//! collection creation, insert, update (with upsert), delete, each writing its document change
//! and its oplog entry together.
//!
//! Invariant: every primitive validates everything that can fail for client reasons (duplicate
//! keys, bad updates, size limits, immutable fields) BEFORE it writes anything, so a failing
//! statement leaves no trace; only storage failures can stop it midway, and those abort the
//! whole batch.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bson::oid::ObjectId;
use bson::{Bson, Document, Uuid, doc};
use pipeline::changestream::split::document_size;
use resume::ClusterTime;
use wire::{ErrorCode, MongoError};

use super::batches::{Batch, Cursor};
use crate::catalog::{CollectionEntry, check_coll_name, get_dotted};
use crate::oplog::EntrySpec;
use crate::query::{Filter, Sort, scan_matching};
use crate::retryable::RetryState;
use crate::shown::{render, render_doc};
use crate::storage::Scan;
use crate::update::{self, DiffOutcome, UpdateContext, UpdateSpec};
use crate::writer::{OpError, OpResult, WriteCtx};

/// Looks a collection up in the batch's catalog.
pub fn lookup(ctx: &WriteCtx<'_>, db: &str, coll: &str) -> Option<Arc<CollectionEntry>> {
    ctx.catalog().lookup(db, coll).cloned()
}

/// A collection for a CRUD write: views are refused (`CommandNotSupportedOnView`).
pub fn lookup_writable(
    ctx: &WriteCtx<'_>,
    db: &str,
    coll: &str,
) -> OpResult<Option<Arc<CollectionEntry>>> {
    match lookup(ctx, db, coll) {
        Some(c) if c.options.contains_key("viewOn") => Err(MongoError::new(
            ErrorCode::COMMAND_NOT_SUPPORTED_ON_VIEW,
            format!("Namespace {db}.{coll} is a view, not a collection"),
        )
        .into()),
        other => Ok(other),
    }
}

/// The collection, created (with its `create` oplog entry) if it does not exist.
pub fn ensure_collection(
    ctx: &mut WriteCtx<'_>,
    db: &str,
    coll: &str,
) -> OpResult<Arc<CollectionEntry>> {
    if let Some(c) = lookup(ctx, db, coll) {
        if c.options.contains_key("viewOn") {
            return Err(MongoError::new(
                ErrorCode::COMMAND_NOT_SUPPORTED_ON_VIEW,
                format!("Namespace {db}.{coll} is a view, not a collection"),
            )
            .into());
        }
        return Ok(c);
    }
    check_coll_name(db, coll)?;
    create_collection(ctx, db, coll, None, Document::new())
}

/// Creates a collection: catalog entry + `c` `create` entry, in the current transaction.
pub fn create_collection(
    ctx: &mut WriteCtx<'_>,
    db: &str,
    coll: &str,
    uuid: Option<Uuid>,
    options: Document,
) -> OpResult<Arc<CollectionEntry>> {
    let uuid = uuid.unwrap_or_default(); // a fresh random UUID
    let entry = CollectionEntry::new(db, coll, uuid, options.clone());
    let mut o = doc! {"create": coll};
    for (k, v) in &options {
        o.insert(k.clone(), v.clone());
    }
    if !options.contains_key("viewOn") {
        o.insert("idIndex", CollectionEntry::id_index());
    }
    let saved = ctx.save_collection(entry)?;
    ctx.log(EntrySpec::command(db, Some(uuid), o, None))?;
    Ok(saved)
}

static OID_COUNTER: AtomicU32 = AtomicU32::new(0);

fn process_id() -> [u8; 5] {
    static PID: std::sync::OnceLock<[u8; 5]> = std::sync::OnceLock::new();
    *PID.get_or_init(rand::random)
}

/// A new ObjectId whose time part comes from the injected clock.
pub fn new_object_id(wall_ms: u64) -> ObjectId {
    let secs = u32::try_from(wall_ms / 1000).unwrap_or(u32::MAX);
    let c = OID_COUNTER.fetch_add(1, Ordering::Relaxed).to_be_bytes();
    ObjectId::from_parts(secs, process_id(), [c[1], c[2], c[3]])
}

/// Prepares a document for insertion as MongoDB (5.0+) does: `_id` generated when missing and
/// moved first; bad `_id` values and oversized documents rejected. Field names with dots or a
/// leading `$` are stored as they are, except inside `_id`.
pub fn prepare_insert(doc: Document, wall_ms: u64) -> Result<Document, MongoError> {
    let out = ensure_id_first(doc, wall_ms)?;
    check_size(&out)?;
    if pipeline::value::nesting_exceeds(&out, MAX_STORED_DEPTH) {
        return Err(MongoError::new(
            ErrorCode::OVERFLOW,
            format!(
                "cannot insert document because it exceeds {MAX_STORED_DEPTH} levels of nesting"
            ),
        ));
    }
    Ok(out)
}

/// How deep a stored document may nest, as MongoDB's `BSONDepth::getMaxDepthForUserStorage()`
/// (the 200 levels a command may have, less 20 kept for the system's own wrapping).
pub const MAX_STORED_DEPTH: usize = 180;

/// `_id` first (generated when missing); rejects `_id` values MongoDB refuses.
pub fn ensure_id_first(mut doc: Document, wall_ms: u64) -> Result<Document, MongoError> {
    let id = doc
        .remove("_id")
        .unwrap_or_else(|| Bson::ObjectId(new_object_id(wall_ms)));
    check_id(&id)?;
    let mut out = Document::new();
    out.insert("_id", id);
    out.extend(doc);
    Ok(out)
}

pub fn check_id(id: &Bson) -> Result<(), MongoError> {
    if let Some(name) = dollar_prefixed_name(id) {
        return Err(MongoError::new(
            ErrorCode::INVALID_ID_FIELD,
            format!(
                "_id fields may not contain '$'-prefixed fields: {name} is not valid for storage."
            ),
        ));
    }
    let what = match id {
        Bson::Array(_) => "an array",
        Bson::RegularExpression(_) => "a regex",
        Bson::Undefined => "a undefined",
        _ => return Ok(()),
    };
    Err(MongoError::new(
        ErrorCode::INVALID_ID_FIELD,
        format!("can't use {what} for _id"),
    ))
}

/// The first `$`-prefixed field name anywhere inside `v` (documents and arrays).
fn dollar_prefixed_name(v: &Bson) -> Option<&str> {
    match v {
        Bson::Document(d) => d.iter().find_map(|(k, v)| {
            if k.starts_with('$') {
                Some(k.as_str())
            } else {
                dollar_prefixed_name(v)
            }
        }),
        Bson::Array(items) => items.iter().find_map(dollar_prefixed_name),
        _ => None,
    }
}

pub fn check_size(doc: &Document) -> Result<(), MongoError> {
    let size = document_size(doc);
    if size > wire::MAX_BSON_OBJECT_SIZE {
        return Err(MongoError::new(
            ErrorCode::BSON_OBJECT_TOO_LARGE,
            format!(
                "object to insert too large. size in bytes: {size}, max size: {}",
                wire::MAX_BSON_OBJECT_SIZE
            ),
        ));
    }
    Ok(())
}

/// The duplicate-key error MongoDB returns.
pub fn dup_key_error(
    coll: &CollectionEntry,
    index_name: &str,
    key_pattern: &Document,
    key_value: &Document,
) -> MongoError {
    // The message shows the key with field names only when the value doc has them.
    let shown: Document = key_value.clone();
    MongoError::new(
        ErrorCode::DUPLICATE_KEY,
        format!(
            "E11000 duplicate key error collection: {} index: {} dup key: {}",
            coll.ns(),
            index_name,
            render_doc(&shown)
        ),
    )
    .with_extra(doc! {"keyPattern": key_pattern.clone(), "keyValue": key_value.clone()})
}

/// Checks `_id` uniqueness and every unique secondary index for a document about to be
/// written. `replacing` is the `_id` of the document it replaces (an update).
pub fn check_unique(
    ctx: &WriteCtx<'_>,
    coll: &CollectionEntry,
    doc: &Document,
    replacing: Option<&Bson>,
) -> OpResult<()> {
    let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
    if replacing.is_none() && ctx.has_doc(coll, &id)? {
        return Err(OpError::Mongo(dup_key_error(
            coll,
            "_id_",
            &doc! {"_id": 1},
            &doc! {"_id": id},
        )));
    }
    if let Some((name, pattern, value)) = crate::indexes::find_conflict(ctx.txn(), coll, doc)? {
        return Err(OpError::Mongo(dup_key_error(coll, &name, &pattern, &value)));
    }
    Ok(())
}

/// Session fields for the entry of statement `stmt`, when the write is retryable.
fn with_session(mut spec: EntrySpec, retry: Option<&RetryState>, stmt: i32) -> EntrySpec {
    if let Some(r) = retry {
        spec.session = Some(r.session_fields(stmt));
    }
    spec
}

fn logged(
    ctx: &mut WriteCtx<'_>,
    spec: EntrySpec,
    retry: &mut Option<&mut RetryState>,
    stmt: i32,
) -> OpResult<ClusterTime> {
    let spec = with_session(spec, retry.as_deref(), stmt);
    let ts = ctx.log(spec)?;
    if let Some(r) = retry.as_deref_mut() {
        r.wrote_entry(ts);
    }
    Ok(ts)
}

/// Inserts a prepared document (see [`prepare_insert`]).
pub fn insert_one(
    ctx: &mut WriteCtx<'_>,
    coll: &CollectionEntry,
    doc: Document,
    mut retry: Option<&mut RetryState>,
    stmt: i32,
) -> OpResult<ClusterTime> {
    ctx.check_not_held(coll, &doc)?;
    crate::validation::check(coll, None, &doc, ctx.bypass_validation, ctx.wall_ms)?;
    crate::capped::check_fits(coll, &doc)?;
    check_unique(ctx, coll, &doc, None)?;
    ctx.put_doc(coll, &doc)?;
    crate::indexes::add(ctx.txn_mut(), coll, &doc)?;
    let key = coll.document_key(&doc);
    let capped = crate::capped::limits(coll).is_some().then(|| doc.clone());
    let ts = logged(
        ctx,
        EntrySpec::insert(coll.ns(), coll.uuid, doc, key),
        &mut retry,
        stmt,
    )?;
    if let Some(doc) = capped {
        crate::capped::inserted(ctx, coll, &doc)?;
        // Evictions are ordinary deletes, logged after the insert that caused them.
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        while let Some(old) = crate::capped::next_eviction(ctx, coll, &id)? {
            delete_one(ctx, coll, &old, None, 0)?;
        }
    }
    Ok(ts)
}

/// Deletes one document (given whole, as found).
pub fn delete_one(
    ctx: &mut WriteCtx<'_>,
    coll: &CollectionEntry,
    doc: &Document,
    mut retry: Option<&mut RetryState>,
    stmt: i32,
) -> OpResult<ClusterTime> {
    ctx.check_not_held(coll, doc)?;
    let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
    ctx.delete_doc(coll, &id)?;
    crate::indexes::remove(ctx.txn_mut(), coll, doc)?;
    crate::capped::deleted(ctx, coll, doc)?;
    let key = coll.document_key(doc);
    logged(
        ctx,
        EntrySpec::delete(coll.ns(), coll.uuid, key).with_pre_image(coll.records_pre_images(), doc),
        &mut retry,
        stmt,
    )
}

/// One parsed update statement.
pub struct UpdateStmt {
    pub filter: Filter,
    pub query: Document,
    pub spec: UpdateSpec,
    pub upsert: bool,
    pub multi: bool,
    pub sort: Option<Sort>,
}

/// What an update statement did.
#[derive(Debug, Default)]
pub struct UpdateOutcome {
    pub n: i64,
    pub n_modified: i64,
    pub upserted: Option<Bson>,
    pub last_ts: Option<ClusterTime>,
    /// First matched document before and after (findAndModify).
    pub before: Option<Document>,
    pub after: Option<Document>,
}

fn update_context(
    ctx: &WriteCtx<'_>,
    coll: Option<&CollectionEntry>,
    upsert_insert: bool,
    stmt: &UpdateStmt,
) -> UpdateContext {
    let now_ms = ctx.wall_ms;
    UpdateContext {
        now: bson::DateTime::from_millis(i64::try_from(now_ms).unwrap_or(i64::MAX)),
        now_ts: ctx.state().cluster_time().timestamp(),
        is_upsert_insert: upsert_insert,
        immutable_paths: coll.map(|c| c.immutable_paths()).unwrap_or_default(),
        collation: stmt.filter.collation().cloned(),
    }
}

/// The documents an update or delete statement targets. A sorted single-document statement
/// keeps only the first in the sort's order as it scans (ties: the first scanned).
pub fn targets(
    ctx: &WriteCtx<'_>,
    coll: &CollectionEntry,
    filter: &Filter,
    multi: bool,
    sort: Option<&Sort>,
) -> OpResult<Vec<Document>> {
    let mut found: Vec<Document> = Vec::new();
    scan_matching(ctx.txn(), coll, filter, &mut |d| match (sort, multi) {
        (Some(s), false) => {
            if found.first().is_none_or(|best| s.compare(&d, best).is_lt()) {
                found = vec![d];
            }
            Scan::Continue
        }
        _ => {
            found.push(d);
            if multi { Scan::Continue } else { Scan::Stop }
        }
    })?;
    if let (Some(s), true) = (sort, multi) {
        s.sort(&mut found);
    }
    Ok(found)
}

/// Checks that an update kept `_id` and the shard key.
fn check_immutable(
    coll: &CollectionEntry,
    old: &Document,
    new: &Document,
) -> Result<(), MongoError> {
    let mut paths = vec!["_id".to_string()];
    paths.extend(coll.immutable_paths());
    for p in paths {
        let a = get_dotted(old, &p);
        let b = get_dotted(new, &p);
        let same = match (a, b) {
            (Some(x), Some(y)) => crate::update::values::binary_eq(x, y),
            (None, None) => true,
            _ => false,
        };
        if !same {
            let shown = b.map(render).unwrap_or_else(|| "missing".into());
            return Err(MongoError::new(
                ErrorCode::IMMUTABLE_FIELD,
                format!(
                    "After applying the update, the (immutable) field '{p}' was found to have been altered to {p}: {shown}"
                ),
            ));
        }
    }
    Ok(())
}

/// Runs one update statement (with upsert) against `db.coll`, whole.
pub fn run_update(
    ctx: &mut WriteCtx<'_>,
    db: &str,
    coll_name: &str,
    stmt: &UpdateStmt,
    retry: Option<&mut RetryState>,
    stmt_id: i32,
) -> OpResult<UpdateOutcome> {
    let mut out = UpdateOutcome::default();
    let mut cursor = Cursor::default();
    update_batch(
        ctx,
        db,
        coll_name,
        stmt,
        retry,
        stmt_id,
        &mut cursor,
        &mut out,
        usize::MAX,
    )?;
    Ok(out)
}

/// Runs the next batch (at most `max` documents) of update statement `stmt`, adding to `out`;
/// `cursor` says where the statement stands. A statement that is not multi, or has a sort,
/// runs whole in one batch. The upsert happens in the batch that finishes the statement.
#[allow(clippy::too_many_arguments)]
pub fn update_batch(
    ctx: &mut WriteCtx<'_>,
    db: &str,
    coll_name: &str,
    stmt: &UpdateStmt,
    mut retry: Option<&mut RetryState>,
    stmt_id: i32,
    cursor: &mut Cursor,
    out: &mut UpdateOutcome,
    max: usize,
) -> OpResult<()> {
    let coll = lookup_writable(ctx, db, coll_name)?;
    if let Some(coll) = &coll {
        let batch = if stmt.multi && stmt.sort.is_none() {
            cursor.next_batch(ctx.txn(), coll, &stmt.filter, max)?
        } else {
            cursor.finished = true;
            Batch::whole(
                coll,
                targets(ctx, coll, &stmt.filter, stmt.multi, stmt.sort.as_ref())?,
            )
        };
        for (i, (_, old)) in batch.docs.iter().enumerate() {
            let uctx = update_context(ctx, Some(coll), false, stmt);
            let (new, outcome) = stmt.spec.apply_logged(old, &uctx, Some(&stmt.query))?;
            check_immutable(coll, old, &new)?;
            check_update_size(&new)?;
            let o = match outcome {
                DiffOutcome::Unchanged => None,
                DiffOutcome::Diff(d) => Some(doc! {"$v": 2, "diff": d}),
                DiffOutcome::Replacement => Some(new.clone()),
            };
            if let Some(o) = o {
                crate::validation::check(
                    coll,
                    Some(old),
                    &new,
                    ctx.bypass_validation,
                    ctx.wall_ms,
                )?;
                // A held document stops a statement that has done nothing yet, so it can run
                // again; one that has goes on from this document once the hold ends.
                let held = ctx
                    .check_not_held(coll, old)
                    .and_then(|()| ctx.check_not_held(coll, &new));
                if let Err(e) = held {
                    if out.n == 0 || !batch.resumable() {
                        return Err(e);
                    }
                    cursor.rewind(&batch, i);
                    return Ok(());
                }
                check_unique(ctx, coll, &new, new.get("_id"))?;
                ctx.put_doc(coll, &new)?;
                crate::indexes::update(ctx.txn_mut(), coll, old, &new)?;
                crate::capped::updated(ctx, coll, old, &new)?;
                let key = coll.document_key(old);
                let ts = logged(
                    ctx,
                    EntrySpec::update(coll.ns(), coll.uuid, o, key)
                        .with_pre_image(coll.records_pre_images(), old),
                    &mut retry,
                    stmt_id,
                )?;
                cursor.wrote(coll, old);
                out.n_modified += 1;
                out.last_ts = Some(ts);
            }
            out.n += 1;
            if out.before.is_none() {
                out.before = Some(old.clone());
                out.after = Some(new);
            }
        }
    } else {
        cursor.finished = true;
    }
    if !cursor.finished {
        return Ok(());
    }
    if out.n == 0 && stmt.upsert {
        let seed = update::upsert_seed(&stmt.query)?;
        let uctx = update_context(ctx, coll.as_deref(), true, stmt);
        let (new, _) = stmt.spec.apply_logged(&seed, &uctx, Some(&stmt.query))?;
        let new = ensure_id_first(new, ctx.wall_ms)?;
        check_update_size(&new)?;
        let coll = match coll {
            Some(c) => c,
            None => {
                check_coll_name(db, coll_name)?;
                // Validate before creating anything: a duplicate cannot exist in a new collection.
                ensure_collection(ctx, db, coll_name)?
            }
        };
        let id = new.get("_id").cloned().unwrap_or(Bson::Null);
        let ts = insert_one(ctx, &coll, new.clone(), retry, stmt_id)?;
        out.upserted = Some(id);
        out.last_ts = Some(ts);
        out.after = Some(new);
    }
    Ok(())
}

fn check_update_size(doc: &Document) -> Result<(), MongoError> {
    if pipeline::value::nesting_exceeds(doc, MAX_STORED_DEPTH) {
        return Err(MongoError::new(
            ErrorCode::OVERFLOW,
            format!("Document exceeds maximum nesting depth of {MAX_STORED_DEPTH}"),
        ));
    }
    let size = document_size(doc);
    if size > wire::MAX_BSON_OBJECT_SIZE {
        return Err(MongoError::with_code(
            17419,
            format!(
                "Resulting document after update is larger than {}",
                wire::MAX_BSON_OBJECT_SIZE
            ),
        ));
    }
    Ok(())
}
