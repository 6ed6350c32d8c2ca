//! Reads: `find` (including `local.oplog.rs`, tailable and awaitData), `getMore`,
//! `killCursors`, `count`, `distinct`, `aggregate`.
//!
//! Reads run on one storage snapshot and never go through the writer. Regular cursors hold
//! their remaining results; oplog tail cursors hold their position (the last entry examined)
//! and read on from the tail window (or storage when the window has moved past them), waiting
//! on the window's wake-up for `awaitData`.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bson::{Bson, Document, doc};
use resume::ClusterTime;
use wire::{ErrorCode, MongoError};

use super::{Ctx, Reply, as_i64, cursor_reply};
use crate::catalog::CollectionEntry;
use crate::cursor::{Cursor, CursorSource, Piped, ScanCursor};
use crate::indexes::plan::Access;
use crate::oplog::{WindowRead, read_from_storage};
use crate::query::{Filter, Output, Projection, Sort, scan_matching};
use crate::storage::{ReadTxn, Scan, StorageError};
use pipeline::agg::Docs;
use pipeline::agg::spill::{Purpose, Sorter, Spool};

/// Default first-batch size, as in MongoDB.
const DEFAULT_FIRST_BATCH: usize = 101;
/// Replies stay below the BSON limit.
const MAX_BATCH_BYTES: usize = wire::MAX_BSON_OBJECT_SIZE - 64 * 1024;
/// Default `maxTimeMS` of an awaitData getMore.
const DEFAULT_AWAIT_MS: u64 = 1000;

/// When an awaitData getMore with `maxTimeMS` (default one second) gives up waiting; a huge
/// maxTimeMS must not overflow the clock, so the wait is capped at a day.
fn await_deadline(max_time: Option<u64>) -> tokio::time::Instant {
    let wait = Duration::from_millis(max_time.filter(|m| *m > 0).unwrap_or(DEFAULT_AWAIT_MS));
    let now = tokio::time::Instant::now();
    now.checked_add(wait.min(Duration::from_secs(86_400)))
        .unwrap_or(now)
}

pub const OPLOG_NS: &str = "local.oplog.rs";

fn storage_err(e: StorageError) -> MongoError {
    e.into_mongo()
}

fn op_err(e: crate::writer::OpError) -> MongoError {
    match e {
        crate::writer::OpError::Mongo(e) => e,
        crate::writer::OpError::Storage(e) => storage_err(e),
    }
}

fn non_negative(ctx: &Ctx<'_>, field: &str) -> Result<Option<i64>, MongoError> {
    match ctx.opt_i64(field)? {
        Some(v) if v < 0 => Err(MongoError::with_code(
            51024,
            format!("BSON field '{field}' value must be >= 0, actual value '{v}'"),
        )),
        other => Ok(other),
    }
}

/// Splits `docs` into a batch of at most `n` documents (and the byte cap).
fn take_batch(docs: &mut VecDeque<Document>, n: Option<usize>) -> Vec<Document> {
    let mut out = Vec::new();
    let mut bytes = 0;
    while let Some(d) = docs.front() {
        if n.is_some_and(|n| out.len() >= n) {
            break;
        }
        let size = pipeline::changestream::split::document_size(d);
        if !out.is_empty() && bytes + size > MAX_BATCH_BYTES {
            break;
        }
        bytes += size;
        if let Some(d) = docs.pop_front() {
            out.push(d);
        }
    }
    out
}

pub async fn find(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let coll = ctx.collection()?;
    let ns = ctx.ns(&coll);
    let filter_doc = ctx.opt_doc("filter")?.unwrap_or_default();
    let env = ctx.env_for(&coll)?;
    let filter = Filter::parse_in(&filter_doc, &env)?.with_hint(ctx.cmd.get("hint"))?;
    let projection_doc = ctx.opt_doc("projection")?.filter(|p| !p.is_empty());
    let projection = projection_doc
        .as_ref()
        .map(|p| crate::query::find_projection(p, &filter_doc))
        .transpose()?;
    let sort_doc = ctx.opt_doc("sort")?.filter(|s| !s.is_empty());
    let skip = non_negative(ctx, "skip")?.unwrap_or(0) as usize;
    let limit = non_negative(ctx, "limit")?
        .filter(|l| *l > 0)
        .map(|l| l as usize);
    let batch_size = non_negative(ctx, "batchSize")?.map(|b| b as usize);
    let single_batch = ctx.bool_or("singleBatch", false)?;
    let tailable = ctx.bool_or("tailable", false)?;
    let await_data = ctx.bool_or("awaitData", false)?;
    if await_data && !tailable {
        return Err(MongoError::failed_to_parse(
            "Cannot set 'awaitData' without also setting 'tailable'",
        ));
    }
    let now = ctx.shard.state().now_millis();
    if ns == OPLOG_NS {
        return find_oplog(
            ctx,
            filter,
            &filter_doc,
            sort_doc.as_ref(),
            projection,
            limit,
            batch_size,
            tailable,
            await_data,
        );
    }
    crate::views::refuse_view_read(&ctx.shard.state().catalog(), &ctx.db, &coll)?;
    let capped = ctx
        .shard
        .state()
        .catalog()
        .lookup(&ctx.db, &coll)
        .is_some_and(|c| crate::capped::limits(c).is_some());
    if tailable && !capped {
        return Err(MongoError::bad_value(format!(
            "error processing query: ns={ns} tailable cursor requested on non capped collection"
        )));
    }
    let sort = sort_doc
        .map(|s| Sort::parse(&s))
        .transpose()?
        .map(|s| s.with_collation(env.collation.clone()));
    let stop_at = match (&sort, limit) {
        (None, Some(l)) => Some(skip.saturating_add(l)),
        _ => None,
    };
    let min = ctx.opt_doc("min")?.filter(|d| !d.is_empty());
    let max = ctx.opt_doc("max")?.filter(|d| !d.is_empty());
    let return_key = ctx.bool_or("returnKey", false)?;
    let record_id = ctx.bool_or("showRecordId", false)?;
    let disk = ctx.bool_or("allowDiskUse", false)?;
    let plan_for = |txn: &dyn ReadTxn, entry: &CollectionEntry| -> Result<_, MongoError> {
        let mut plan = crate::query::plan(txn, entry, &filter, sort.as_ref()).map_err(op_err)?;
        let prefix = crate::keys::collection_prefix(&entry.uuid);
        crate::indexes::plan::restrict_to_min_max(
            &mut plan,
            &prefix,
            filter.hinted(),
            min.as_ref(),
            max.as_ref(),
        )?;
        if !return_key && !record_id {
            crate::indexes::plan::cover(&mut plan, &filter_doc, projection_doc.as_ref());
        }
        let output = Output {
            projection: projection.clone(),
            return_key: return_key.then(|| crate::query::key_fields(&plan.access)),
            record_id,
        };
        Ok((plan, (!output.is_identity()).then_some(output)))
    };
    if ctx.txn.is_some() || ctx.snapshot_at.is_some() {
        // A transaction's or a snapshot read's whole result comes from its snapshot now: a
        // later getMore must not read a newer one.
        let found = ctx.read(|txn, catalog| {
            let Some(entry) = catalog.lookup(&ctx.db, &coll) else {
                return Ok(None);
            };
            let (plan, output) = plan_for(txn, entry)?;
            let mut docs = Held::new(sort.as_ref(), skip, limit, disk);
            run_collect(txn, entry, &plan, &filter, stop_at, &mut docs)?;
            Ok(Some((docs, output)))
        })?;
        let Some((docs, output)) = found else {
            return Ok(Reply::read(cursor_reply(0, &ns, Vec::new(), true)));
        };
        let shape = Shape {
            skip,
            limit,
            projection: output.as_ref(),
            batch_size,
            single_batch,
        };
        return buffered_reply(ctx, &ns, docs, &shape);
    }
    let Some((entry, txn)) = collection_snapshot(ctx, &coll)? else {
        return Ok(Reply::read(cursor_reply(0, &ns, Vec::new(), true)));
    };
    let (plan, projection) = plan_for(&*txn, &entry)?;
    if plan.provides_sort && !matches!(plan.access, Access::IdPoint(_)) {
        // The scan's order is the result's: stream pages instead of materializing it.
        let first_n = batch_size.unwrap_or(DEFAULT_FIRST_BATCH);
        let max_docs = limit.map_or(first_n, |l| l.min(first_n));
        let mut to_skip = skip;
        let mut seen = HashSet::new();
        let page = crate::query::scan_page(
            &*txn,
            &entry,
            &plan.access,
            &filter,
            None,
            &mut seen,
            &mut to_skip,
            max_docs,
            MAX_BATCH_BYTES,
        )
        .map_err(storage_err)?;
        let remaining = limit.map(|l| l - page.docs.len());
        let first = project_all(page.docs, projection.as_ref())?;
        // A tailable cursor outlives the end of its collection: it waits for more.
        let done = page.exhausted && !tailable || remaining == Some(0) || single_batch;
        let id = match (done, page.last_key) {
            (false, after) => ctx.shard.cursors().insert(Cursor {
                ns: ns.clone(),
                source: CursorSource::Scan(Box::new(ScanCursor {
                    coll: entry.clone(),
                    access: plan.access,
                    seen,
                    filter,
                    projection,
                    after,
                    remaining,
                    skip: to_skip,
                    tailable,
                    await_data,
                })),
                last_used_ms: now,
            }),
            _ => 0,
        };
        return Ok(Reply::read(cursor_reply(id, &ns, first, true)));
    }
    let mut docs = Held::new(sort.as_ref(), skip, limit, disk);
    run_collect(&*txn, &entry, &plan, &filter, stop_at, &mut docs)?;
    let shape = Shape {
        skip,
        limit,
        projection: projection.as_ref(),
        batch_size,
        single_batch,
    };
    buffered_reply(ctx, &ns, docs, &shape)
}

/// Collection `coll` of the command's database, with a fresh snapshot to read it from;
/// `None` when there is no such collection.
fn collection_snapshot(ctx: &Ctx<'_>, coll: &str) -> Result<Option<CollectionRead>, MongoError> {
    let Some(entry) = ctx.shard.state().catalog().lookup(&ctx.db, coll).cloned() else {
        return Ok(None);
    };
    Ok(Some((entry, snapshot(ctx)?)))
}

/// A collection and the snapshot it is read from.
type CollectionRead = (Arc<CollectionEntry>, Box<dyn ReadTxn>);

/// A fresh snapshot of the shard's storage.
fn snapshot(ctx: &Ctx<'_>) -> Result<Box<dyn ReadTxn>, MongoError> {
    ctx.shard.state().storage.begin_read().map_err(storage_err)
}

/// Where a `find`'s matching documents wait when they cannot stream from the scan: a sort's
/// (at most the sort limit in memory, spilling under `allowDiskUse` and 292 without; only the
/// first `skip + limit` kept before a limit), or, unsorted, a spool (on disk past the limit
/// whatever `allowDiskUse` says: holding a result is no blocking stage).
enum Held {
    Sorted(Sorter),
    Spooled(Spool),
}

impl Held {
    fn new(sort: Option<&Sort>, skip: usize, limit: Option<usize>, disk: bool) -> Held {
        let Some(sort) = sort else {
            return Held::Spooled(Spool::new("A find's result", true));
        };
        let spec = sort.clone();
        let sorter = Sorter::new(
            Arc::new(move |a: &Document, b: &Document| spec.compare(a, b)),
            Purpose::Sort,
            disk,
        );
        Held::Sorted(match limit {
            Some(l) => sorter.keep_top(skip.saturating_add(l)),
            None => sorter,
        })
    }

    fn push(&mut self, doc: Document) -> Result<(), MongoError> {
        match self {
            Held::Sorted(s) => s.push(doc),
            Held::Spooled(s) => s.push(doc),
        }
    }

    /// The documents, in the sort's order or as they came.
    fn finish(self) -> Result<Docs, MongoError> {
        Ok(match self {
            Held::Sorted(s) => Box::new(s.finish()?),
            Held::Spooled(s) => Box::new(s.finish()?),
        })
    }
}

/// Puts the documents `plan` yields that match `filter` into `held`, at most `stop_at`.
fn run_collect(
    txn: &dyn ReadTxn,
    entry: &CollectionEntry,
    plan: &crate::indexes::plan::Plan,
    filter: &Filter,
    stop_at: Option<usize>,
    held: &mut Held,
) -> Result<(), MongoError> {
    let mut n = 0;
    let mut failed = None;
    crate::query::run_plan(
        txn,
        entry,
        &plan.access,
        None,
        &mut HashSet::new(),
        &mut crate::query::Examined::default(),
        &mut |_, d| {
            if !filter.matches(&d) {
                return Scan::Continue;
            }
            if let Err(e) = held.push(d) {
                failed = Some(e);
                return Scan::Stop;
            }
            n += 1;
            if stop_at.is_some_and(|s| n >= s) {
                Scan::Stop
            } else {
                Scan::Continue
            }
        },
    )
    .map_err(storage_err)?;
    failed.map_or(Ok(()), Err)
}

/// What a materialized `find` does to its matching documents.
struct Shape<'a> {
    skip: usize,
    limit: Option<usize>,
    projection: Option<&'a Output>,
    batch_size: Option<usize>,
    single_batch: bool,
}

/// The reply to a `find` whose matching documents are all held (sorted as they were
/// taken): skipped, limited and projected as they are read, the first batch now and the rest
/// in a cursor.
fn buffered_reply(
    ctx: &Ctx<'_>,
    ns: &str,
    held: Held,
    shape: &Shape<'_>,
) -> Result<Reply, MongoError> {
    let docs = held.finish()?.skip(shape.skip);
    let docs: Docs = match shape.limit {
        Some(l) => Box::new(docs.take(l)),
        None => Box::new(docs),
    };
    let docs: Docs = match shape.projection.cloned() {
        Some(p) => Box::new(docs.map(move |d| d.and_then(|d| p.apply(&d)))),
        None => docs,
    };
    let mut rest = docs.peekable();
    let first = take_stream_batch(
        &mut rest,
        Some(shape.batch_size.unwrap_or(DEFAULT_FIRST_BATCH)),
    )?;
    let id = if shape.single_batch || rest.peek().is_none() {
        0
    } else {
        ctx.shard.cursors().insert(Cursor {
            ns: ns.to_string(),
            source: CursorSource::Stream(rest),
            last_used_ms: ctx.shard.state().now_millis(),
        })
    };
    Ok(Reply::read(cursor_reply(id, ns, first, true)))
}

fn project_all(
    docs: Vec<Document>,
    projection: Option<&Output>,
) -> Result<Vec<Document>, MongoError> {
    match projection {
        Some(p) => docs.iter().map(|d| p.apply(d)).collect(),
        None => Ok(docs),
    }
}

/// The next page of a streaming collection cursor; `None` for the cursor means it is done.
fn next_scan_page(
    ctx: &Ctx<'_>,
    cur: &mut ScanCursor,
    batch_size: Option<usize>,
) -> Result<(Vec<Document>, bool), MongoError> {
    let ScanCursor {
        coll,
        access,
        seen,
        tailable,
        await_data: _,
        filter,
        projection,
        after,
        remaining,
        skip,
    } = cur;
    let projection = projection.as_ref();
    let state = ctx.shard.state();
    // The collection must still be the one the cursor started on.
    let same = state
        .catalog()
        .lookup(&coll.db, &coll.name)
        .is_some_and(|c| c.uuid == coll.uuid);
    if !same {
        return Err(MongoError::new(
            QUERY_PLAN_KILLED,
            format!("collection dropped. UUID {}", coll.uuid),
        ));
    }
    let txn = state.storage.begin_read().map_err(storage_err)?;
    if *tailable
        && let Some(a) = after.as_deref()
        && let Some((oldest, _)) = crate::capped::oldest(&*txn, coll).map_err(storage_err)?
        && oldest.as_slice() > a
    {
        return Err(MongoError::new(
            ErrorCode::CAPPED_POSITION_LOST,
            "CollectionScan died due to position in capped collection being deleted.",
        ));
    }
    let max_docs = match (batch_size, *remaining) {
        (Some(b), Some(r)) => b.min(r),
        (Some(b), None) => b,
        (None, Some(r)) => r,
        (None, None) => usize::MAX,
    };
    let page = crate::query::scan_page(
        &*txn,
        coll,
        access,
        filter,
        after.as_deref(),
        seen,
        skip,
        max_docs,
        MAX_BATCH_BYTES,
    )
    .map_err(storage_err)?;
    if let Some(r) = remaining.as_mut() {
        *r -= page.docs.len().min(*r);
    }
    if page.last_key.is_some() {
        *after = page.last_key;
    }
    let alive = (!page.exhausted || *tailable) && *remaining != Some(0);
    Ok((project_all(page.docs, projection)?, alive))
}

/// `QueryPlanKilled`: the collection under a cursor was dropped or renamed.
const QUERY_PLAN_KILLED: ErrorCode = ErrorCode {
    code: 175,
    name: "QueryPlanKilled",
};

/// The lower bound a filter puts on `ts` (`{ts: {$gte|$gt|$eq: T}}` or `{ts: T}`), as the
/// position to scan after.
fn ts_lower_bound(filter: &Document) -> ClusterTime {
    let after = |v: &Bson, inclusive: bool| match v {
        Bson::Timestamp(t) => {
            let t = ClusterTime::from(*t);
            if inclusive { t.prev() } else { t }
        }
        _ => ClusterTime::ZERO,
    };
    match filter.get("ts") {
        Some(Bson::Document(d)) => {
            let mut best = ClusterTime::ZERO;
            for (op, v) in d {
                let b = match op.as_str() {
                    "$gte" | "$eq" => after(v, true),
                    "$gt" => after(v, false),
                    _ => ClusterTime::ZERO,
                };
                best = best.max(b);
            }
            best
        }
        Some(v @ Bson::Timestamp(_)) => after(v, true),
        _ => ClusterTime::ZERO,
    }
}

/// Reads up to `limit` oplog entries after `after`: from the tail window when it covers the
/// position, else from storage.
fn read_oplog(
    ctx: &Ctx<'_>,
    txn: Option<&dyn ReadTxn>,
    after: ClusterTime,
    limit: usize,
) -> Result<Vec<(ClusterTime, bytes::Bytes)>, MongoError> {
    let state = ctx.shard.state();
    if let WindowRead::Entries(v) = state.tail.read_after(after, limit) {
        return Ok(v);
    }
    match txn {
        Some(t) => read_from_storage(t, after, limit).map_err(storage_err),
        None => {
            let t = state.storage.begin_read().map_err(storage_err)?;
            read_from_storage(&*t, after, limit).map_err(storage_err)
        }
    }
}

/// Matching entries after `*last`, advancing `*last` past every entry examined.
fn next_oplog_batch(
    ctx: &Ctx<'_>,
    filter: &Filter,
    last: &mut ClusterTime,
    max_docs: Option<usize>,
) -> Result<Vec<Document>, MongoError> {
    let mut out = Vec::new();
    let mut bytes = 0;
    if max_docs == Some(0) {
        return Ok(out);
    }
    loop {
        let chunk = read_oplog(ctx, None, *last, 1000)?;
        if chunk.is_empty() {
            return Ok(out);
        }
        for (ts, raw) in chunk {
            let Ok(d) = Document::from_reader(&raw[..]) else {
                return Err(MongoError::internal("undecodable oplog entry"));
            };
            if filter.matches(&d) {
                if !out.is_empty() && bytes + raw.len() > MAX_BATCH_BYTES {
                    return Ok(out);
                }
                bytes += raw.len();
                out.push(d);
            }
            *last = ts;
            if max_docs.is_some_and(|m| out.len() >= m) {
                return Ok(out);
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn find_oplog(
    ctx: &Ctx<'_>,
    filter: Filter,
    filter_doc: &Document,
    sort: Option<&Document>,
    projection: Option<Projection>,
    limit: Option<usize>,
    batch_size: Option<usize>,
    tailable: bool,
    await_data: bool,
) -> Result<Reply, MongoError> {
    let now = ctx.shard.state().now_millis();
    let reverse = sort
        .and_then(|s| s.get("$natural"))
        .and_then(as_i64)
        .is_some_and(|v| v < 0);
    if tailable {
        // Start at the oldest entry still retained (or the filter's lower bound).
        let mut last = ts_lower_bound(filter_doc).max(ctx.shard.state().oplog_truncated_through());
        let first = next_oplog_batch(
            ctx,
            &filter,
            &mut last,
            Some(batch_size.unwrap_or(DEFAULT_FIRST_BATCH)),
        )?;
        let id = ctx.shard.cursors().insert(Cursor {
            ns: OPLOG_NS.into(),
            source: CursorSource::OplogTail {
                filter: Box::new(filter),
                last,
                await_data,
            },
            last_used_ms: now,
        });
        return Ok(Reply::read(cursor_reply(id, OPLOG_NS, first, true)));
    }
    let txn = snapshot(ctx)?;
    let mut docs = VecDeque::new();
    let range = if reverse {
        crate::storage::KeyRange::all()
    } else {
        crate::storage::KeyRange::from(std::ops::Bound::Excluded(
            crate::oplog::oplog_key(ts_lower_bound(filter_doc)).to_vec(),
        ))
    };
    let mut bad = false;
    txn.scan(
        crate::storage::Table::Oplog,
        &range,
        reverse,
        &mut |_, v| {
            match Document::from_reader(v) {
                Ok(d) => {
                    if filter.matches(&d) {
                        docs.push_back(d);
                    }
                }
                Err(_) => bad = true,
            }
            if limit.is_some_and(|l| docs.len() >= l) {
                Scan::Stop
            } else {
                Scan::Continue
            }
        },
    )
    .map_err(storage_err)?;
    if bad {
        return Err(MongoError::internal("undecodable oplog entry"));
    }
    if let Some(p) = &projection {
        docs = docs
            .into_iter()
            .map(|d| p.apply(&d))
            .collect::<Result<_, _>>()?;
    }
    let first = take_batch(&mut docs, Some(batch_size.unwrap_or(DEFAULT_FIRST_BATCH)));
    let id = if docs.is_empty() {
        0
    } else {
        ctx.shard.cursors().insert(Cursor {
            ns: OPLOG_NS.into(),
            source: CursorSource::Buffered(docs),
            last_used_ms: now,
        })
    };
    Ok(Reply::read(cursor_reply(id, OPLOG_NS, first, true)))
}

pub async fn get_more(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let id = match ctx.cmd.get("getMore") {
        Some(Bson::Int64(i)) => *i,
        Some(Bson::Int32(i)) => i64::from(*i),
        Some(v) => {
            return Err(MongoError::type_mismatch(format!(
                "BSON field 'getMore.getMore' is the wrong type '{}', expected type 'long'",
                pipeline::value::type_name(v)
            )));
        }
        None => return Err(ctx.missing("getMore")),
    };
    let coll = ctx
        .opt_str("collection")?
        .ok_or_else(|| ctx.missing("collection"))?;
    let ns = ctx.ns(&coll);
    let batch_size = non_negative(ctx, "batchSize")?
        .filter(|b| *b > 0)
        .map(|b| b as usize);
    let max_time = non_negative(ctx, "maxTimeMS")?.map(|m| m as u64);
    let Some(mut cursor) = ctx.shard.cursors().take(id) else {
        return Err(MongoError::new(
            ErrorCode::CURSOR_NOT_FOUND,
            format!("cursor id {id} not found"),
        ));
    };
    if cursor.ns != ns {
        let msg = format!(
            "Requested getMore on namespace '{ns}', but cursor belongs to a different namespace {}",
            cursor.ns
        );
        ctx.shard.cursors().put_back(id, cursor);
        return Err(MongoError::new(ErrorCode::UNAUTHORIZED, msg));
    }
    let (batch, alive) = match &mut cursor.source {
        CursorSource::Buffered(rest) => {
            let b = take_batch(rest, batch_size);
            let alive = !rest.is_empty();
            (b, alive)
        }
        CursorSource::Stream(docs) => {
            let b = super::long_running(|| take_stream_batch(docs, batch_size))?;
            let alive = docs.peek().is_some();
            (b, alive)
        }
        CursorSource::Piped(p) => super::long_running(|| piped_batch(ctx, p, batch_size))?,
        CursorSource::Scan(cur) => {
            let mut rx = ctx.shard.state().tail.subscribe();
            let deadline = await_deadline(max_time);
            loop {
                rx.borrow_and_update();
                let (batch, alive) = next_scan_page(ctx, cur, batch_size)?;
                if !batch.is_empty() || !alive || !cur.await_data {
                    break (batch, alive);
                }
                // awaitData: wait for a write (any collection's), look again, until maxTimeMS.
                match tokio::time::timeout_at(deadline, rx.changed()).await {
                    Ok(Ok(())) => continue,
                    _ => break (batch, alive),
                }
            }
        }
        CursorSource::OplogTail {
            filter,
            last,
            await_data,
        } => {
            let mut rx = ctx.shard.state().tail.subscribe();
            let deadline = await_deadline(max_time);
            let batch = loop {
                rx.borrow_and_update();
                // Entries this cursor has not read yet were truncated under it.
                if *last < ctx.shard.state().oplog_truncated_through() {
                    return Err(MongoError::new(
                        ErrorCode::CAPPED_POSITION_LOST,
                        "CollectionScan died due to position in capped collection being deleted.",
                    ));
                }
                let b = match next_oplog_batch(ctx, filter, last, batch_size) {
                    Ok(b) => b,
                    Err(e) => {
                        return Err(e);
                    }
                };
                if !b.is_empty() || !*await_data {
                    break b;
                }
                match tokio::time::timeout_at(deadline, rx.changed()).await {
                    Ok(Ok(())) => continue,
                    _ => break Vec::new(),
                }
            };
            (batch, true)
        }
    };
    if alive {
        cursor.last_used_ms = ctx.shard.state().now_millis();
        ctx.shard.cursors().put_back(id, cursor);
    }
    Ok(Reply::read(cursor_reply(
        if alive { id } else { 0 },
        &ns,
        batch,
        false,
    )))
}

/// The conjunction of a pipeline's leading `$match` stages (`{}` when there is none).
pub fn leading_match<'a>(stages: impl IntoIterator<Item = &'a Document>) -> Document {
    let matches: Vec<Bson> = stages
        .into_iter()
        .map_while(|s| match s.get("$match") {
            Some(Bson::Document(m)) if s.len() == 1 => Some(Bson::Document(m.clone())),
            _ => None,
        })
        .collect();
    match matches.len() {
        0 => Document::new(),
        1 => match matches.into_iter().next() {
            Some(Bson::Document(m)) => m,
            _ => Document::new(),
        },
        _ => doc! {"$and": matches},
    }
}

/// Calls `each` with every matching document of a collection (none when it does not exist)
/// until it says stop.
fn for_each_matching(
    ctx: &Ctx<'_>,
    coll: &str,
    filter: &Filter,
    each: &mut dyn FnMut(Document) -> Result<Scan, MongoError>,
) -> Result<(), MongoError> {
    ctx.read(|txn, catalog| {
        let Some(entry) = catalog.lookup(&ctx.db, coll) else {
            return Ok(());
        };
        let mut failed = None;
        scan_matching(txn, entry, filter, &mut |d| match each(d) {
            Ok(scan) => scan,
            Err(e) => {
                failed = Some(e);
                Scan::Stop
            }
        })
        .map_err(op_err)?;
        failed.map_or(Ok(()), Err)
    })
}

/// `count`: the matching documents are counted as the scan passes them (it stops at `skip +
/// limit`), never held.
pub fn count(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let coll = ctx.collection()?;
    crate::views::refuse_view_read(&ctx.shard.state().catalog(), &ctx.db, &coll)?;
    let env = ctx.env_for(&coll)?;
    let filter = Filter::parse_in(&ctx.opt_doc("query")?.unwrap_or_default(), &env)?
        .with_hint(ctx.cmd.get("hint"))?;
    let skip = non_negative(ctx, "skip")?.unwrap_or(0);
    let limit = ctx
        .opt_i64("limit")?
        .map(i64::saturating_abs)
        .filter(|l| *l > 0);
    let enough = limit.map(|l| l.saturating_add(skip));
    let mut total = 0_i64;
    for_each_matching(ctx, &coll, &filter, &mut |_| {
        pipeline::interrupt::check()?;
        total += 1;
        Ok(if enough.is_some_and(|e| total >= e) {
            Scan::Stop
        } else {
            Scan::Continue
        })
    })?;
    let mut n = (total - skip).max(0);
    if let Some(l) = limit {
        n = n.min(l);
    }
    Ok(Reply::read(
        doc! {"n": i32::try_from(n).unwrap_or(i32::MAX), "ok": 1.0},
    ))
}

/// A value ordered as `$sort` orders values (under the command's collation, folded first).
struct Ordered(Bson);

impl PartialEq for Ordered {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Ordered {}

impl PartialOrd for Ordered {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ordered {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        pipeline::value::compare(&self.0, &other.0)
    }
}

/// `distinct`: each value once (equal under the collation), in order; the values are what is
/// held, up to MongoDB's 16 MB cap (17217 past it).
pub fn distinct(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let coll = ctx.collection()?;
    crate::views::refuse_view_read(&ctx.shard.state().catalog(), &ctx.db, &coll)?;
    let key = ctx.opt_str("key")?.ok_or_else(|| ctx.missing("key"))?;
    let env = ctx.env_for(&coll)?;
    let filter = Filter::parse_in(&ctx.opt_doc("query")?.unwrap_or_default(), &env)?;
    let mut values: std::collections::BTreeMap<Ordered, Bson> = Default::default();
    let mut bytes = 0;
    for_each_matching(ctx, &coll, &filter, &mut |d| {
        pipeline::interrupt::check()?;
        for v in pipeline::value::path_values(&d, &key) {
            let items: Vec<&Bson> = match v {
                Bson::Array(a) => a.iter().collect(),
                other => vec![other],
            };
            for item in items {
                let folded = match &env.collation {
                    Some(c) => c.fold(item),
                    None => item.clone(),
                };
                if let std::collections::btree_map::Entry::Vacant(slot) =
                    values.entry(Ordered(folded))
                {
                    bytes += pipeline::changestream::split::value_size(item);
                    if bytes > wire::MAX_BSON_OBJECT_SIZE {
                        return Err(MongoError::with_code(17217, "distinct too big, 16mb cap"));
                    }
                    slot.insert(item.clone());
                }
            }
        }
        Ok(Scan::Continue)
    })?;
    let values: Vec<Bson> = values.into_values().collect();
    Ok(Reply::read(doc! {"values": values, "ok": 1.0}))
}

pub fn aggregate(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let ns_coll = match ctx.cmd.get("aggregate") {
        Some(Bson::String(s)) => s.clone(),
        Some(v) if as_i64(v) == Some(1) => String::new(),
        _ => {
            return Err(MongoError::new(
                ErrorCode::INVALID_NAMESPACE,
                "collection name has invalid type",
            ));
        }
    };
    let stages = ctx
        .opt_array("pipeline")?
        .ok_or_else(|| ctx.missing("pipeline"))?;
    let cursor_opts = ctx.opt_doc("cursor")?;
    if cursor_opts.is_none() && !ctx.bool_or("explain", false)? {
        return Err(MongoError::failed_to_parse(
            "The 'cursor' option is required, except for aggregate with the explain argument",
        ));
    }
    let batch_size = cursor_opts
        .as_ref()
        .and_then(|c| c.get("batchSize"))
        .and_then(as_i64)
        .map(|b| b.max(0) as usize);
    let mut parsed = Vec::with_capacity(stages.len());
    for s in stages {
        match s {
            Bson::Document(d) => parsed.push(d),
            _ => {
                return Err(MongoError::type_mismatch(
                    "Each element of the 'pipeline' array must be an object",
                ));
            }
        }
    }
    if !ns_coll.is_empty() {
        crate::views::refuse_view_read(&ctx.shard.state().catalog(), &ctx.db, &ns_coll)?;
    }
    let env = ctx.env_for(&ns_coll)?;
    let pipeline = pipeline::agg::Pipeline::parse_with_vars(&parsed, &env.names())?;
    let run = pipeline.push_run(&env);
    if ns_coll.is_empty() {
        return stream_reply(ctx, format!("{}.$cmd.aggregate", ctx.db), run, batch_size);
    }
    // The leading $match stages select what is read (through an index where one serves); the
    // pipeline still runs them.
    let filter = Filter::parse_in(&leading_match(&parsed), &env)?.with_hint(ctx.cmd.get("hint"))?;
    match piped(ctx, &ns_coll, filter, run)? {
        Ok(piped) => piped_reply(ctx, ctx.ns(&ns_coll), piped, batch_size),
        Err((filter, mut run)) => {
            // The scan pushes each document through the streaming stages into the first
            // blocking one, which holds what its memory limit allows (spilling under
            // allowDiskUse); what comes after is computed as the cursor is read.
            push_matching(ctx, &ns_coll, &filter, &mut run)?;
            stream_reply(ctx, ctx.ns(&ns_coll), run, batch_size)
        }
    }
}

/// The reply to a piped aggregate: its first batch, and a cursor on the rest.
fn piped_reply(
    ctx: &Ctx<'_>,
    ns: String,
    mut piped: Piped,
    batch_size: Option<usize>,
) -> Result<Reply, MongoError> {
    let n = batch_size.unwrap_or(DEFAULT_FIRST_BATCH);
    let (first, alive) = piped_batch(ctx, &mut piped, Some(n))?;
    let id = if alive {
        ctx.shard.cursors().insert(Cursor {
            ns: ns.clone(),
            source: CursorSource::Piped(Box::new(piped)),
            last_used_ms: ctx.shard.state().now_millis(),
        })
    } else {
        0
    };
    Ok(Reply::read(cursor_reply(id, &ns, first, true)))
}

/// The reply to an aggregate whose input has been pushed: the first batch of its output, the
/// rest (past its blocking stages, computed as it is read) in a cursor.
fn stream_reply(
    ctx: &Ctx<'_>,
    ns: String,
    run: pipeline::agg::PushRun,
    batch_size: Option<usize>,
) -> Result<Reply, MongoError> {
    let mut out = run.finish()?.peekable();
    let first = take_stream_batch(&mut out, Some(batch_size.unwrap_or(DEFAULT_FIRST_BATCH)))?;
    let id = if out.peek().is_none() {
        0
    } else {
        ctx.shard.cursors().insert(Cursor {
            ns: ns.clone(),
            source: CursorSource::Stream(out),
            last_used_ms: ctx.shard.state().now_millis(),
        })
    };
    Ok(Reply::read(cursor_reply(id, &ns, first, true)))
}

/// A pipeline with no blocking stage over `coll`, outside a transaction or snapshot read, as
/// a scan the client's reads drive (see [`Piped`]): it holds one page and what the stages made
/// of it, never the whole result. Anything else gets its `filter` and `run` back, to be fed
/// whole from one snapshot.
#[allow(clippy::type_complexity)]
fn piped(
    ctx: &Ctx<'_>,
    coll: &str,
    filter: Filter,
    run: pipeline::agg::PushRun,
) -> Result<Result<Piped, (Filter, pipeline::agg::PushRun)>, MongoError> {
    if !run.streams_through() || ctx.txn.is_some() || ctx.snapshot_at.is_some() {
        return Ok(Err((filter, run)));
    }
    let Some((entry, txn)) = collection_snapshot(ctx, coll)? else {
        return Ok(Err((filter, run)));
    };
    let plan = crate::query::plan(&*txn, &entry, &filter, None).map_err(op_err)?;
    if !plan.provides_sort || matches!(plan.access, Access::IdPoint(_)) {
        return Ok(Err((filter, run)));
    }
    Ok(Ok(Piped {
        scan: ScanCursor {
            coll: entry,
            access: plan.access,
            seen: HashSet::new(),
            filter,
            projection: None,
            after: None,
            remaining: None,
            skip: 0,
            tailable: false,
            await_data: false,
        },
        run,
        ready: VecDeque::new(),
        scanning: true,
    }))
}

/// The next batch of a piped aggregate: up to `n` documents within the reply's size, scanning
/// pages (each from a fresh snapshot) until the stages have made that many or the scan ends;
/// and whether more may come.
fn piped_batch(
    ctx: &Ctx<'_>,
    p: &mut Piped,
    n: Option<usize>,
) -> Result<(Vec<Document>, bool), MongoError> {
    /// The most documents one page reads.
    const PAGE: usize = 1_000;
    let n = n.unwrap_or(usize::MAX);
    let mut out = Vec::new();
    let mut bytes = 0;
    loop {
        while out.len() < n
            && let Some(d) = p.ready.front()
        {
            let size = pipeline::changestream::split::document_size(d);
            if !out.is_empty() && bytes + size > MAX_BATCH_BYTES {
                return Ok((out, true));
            }
            bytes += size;
            out.extend(p.ready.pop_front());
        }
        if out.len() >= n || !p.scanning {
            break;
        }
        let (page, more) = next_scan_page(ctx, &mut p.scan, Some((n - out.len()).min(PAGE)))?;
        p.scanning = more;
        for d in page {
            if !p.run.push(d)? {
                p.scanning = false;
                break;
            }
        }
        p.ready.extend(p.run.take_ready());
    }
    Ok((out, p.scanning || !p.ready.is_empty()))
}

/// Pushes the matching documents of `db.coll` into a pipeline run until it wants no more.
fn push_matching(
    ctx: &Ctx<'_>,
    coll: &str,
    filter: &Filter,
    run: &mut pipeline::agg::PushRun,
) -> Result<(), MongoError> {
    ctx.read(|txn, catalog| {
        let Some(entry) = catalog.lookup(&ctx.db, coll) else {
            return Ok(());
        };
        let mut failed = None;
        scan_matching(txn, entry, filter, &mut |d| match run.push(d) {
            Ok(true) => Scan::Continue,
            Ok(false) => Scan::Stop,
            Err(e) => {
                failed = Some(e);
                Scan::Stop
            }
        })
        .map_err(op_err)?;
        failed.map_or(Ok(()), Err)
    })
}

/// The next batch of a streamed result: up to `n` documents within the reply's size.
fn take_stream_batch(
    docs: &mut std::iter::Peekable<pipeline::agg::Docs>,
    n: Option<usize>,
) -> Result<Vec<Document>, MongoError> {
    let mut out = Vec::new();
    let mut bytes = 0;
    while n.is_none_or(|n| out.len() < n) {
        let size = match docs.peek() {
            None => break,
            Some(Err(_)) => 0,
            Some(Ok(d)) => pipeline::changestream::split::document_size(d),
        };
        if !out.is_empty() && bytes + size > MAX_BATCH_BYTES {
            break;
        }
        bytes += size;
        match docs.next() {
            Some(d) => out.push(d?),
            None => break,
        }
    }
    Ok(out)
}
