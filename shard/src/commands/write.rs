//! `insert`, `update` and `delete`: parse the statements, then run them as one job of the
//! writer (one atomic commit with their oplog entries and retryable-write records), or, when a
//! multi statement matches more than a batch, as one job per batch of it
//! ([`batches`](crate::write::batches)).
//!
//! Per-statement failures become `writeErrors` (`ordered` stops at the first); earlier
//! statements keep their effects, as in MongoDB. A retried statement (same `lsid`,
//! `txnNumber`, `stmtId`) is not applied again: its recorded result counts instead.

use bson::{Bson, Document, doc};
use resume::ClusterTime;
use wire::{ErrorCode, MongoError};

use super::{Ctx, Reply, as_bool, as_i64};
use crate::catalog::check_coll_name;
use crate::query::Filter;
use crate::retryable::{RetryInfo, RetryState};
use crate::storage::StorageResult;
use crate::update::UpdateSpec;
use crate::write::batches::{self, Batch};
use crate::write::ops::{
    UpdateOutcome, UpdateStmt, delete_one, ensure_collection, insert_one, lookup_writable,
    prepare_insert, targets, update_batch,
};
use crate::writer::{OpError, OpResult, WriteCtx, WriteFn, WriteOutput};

/// MongoDB's `maxWriteBatchSize`.
const MAX_WRITE_BATCH: usize = 100_000;

/// A write command carries between 1 and `maxWriteBatchSize` statements.
fn check_batch_size(n: usize) -> Result<(), MongoError> {
    if n == 0 || n > MAX_WRITE_BATCH {
        return Err(MongoError::new(
            ErrorCode::INVALID_LENGTH,
            format!(
                "Write batch sizes must be between 1 and {MAX_WRITE_BATCH}. Got {n} operations."
            ),
        ));
    }
    Ok(())
}

/// `{index, code, errmsg, ...extra}` for `writeErrors`.
pub fn write_error(index: usize, e: &MongoError) -> Bson {
    let mut d = doc! {"index": index as i32, "code": e.code, "errmsg": &e.errmsg};
    if let Some(extra) = &e.extra {
        for (k, v) in extra {
            d.insert(k.clone(), v.clone());
        }
    }
    Bson::Document(d)
}

/// Starts the retryable-write state of a job, or returns the command's error reply.
pub fn begin_retry(
    w: &WriteCtx<'_>,
    info: Option<RetryInfo>,
) -> StorageResult<Result<Option<RetryState>, WriteOutput>> {
    match info {
        None => Ok(Ok(None)),
        Some(info) => match RetryState::begin(w.txn(), info)? {
            Ok(s) => Ok(Ok(Some(s))),
            Err(e) => Ok(Err(WriteOutput {
                reply: e.to_document(),
                op_time: None,
            })),
        },
    }
}

fn finish(
    w: &mut WriteCtx<'_>,
    retry: &Option<RetryState>,
    mut reply: Document,
    write_errors: Vec<Bson>,
    retried: Vec<i32>,
    last_ts: Option<ClusterTime>,
) -> StorageResult<WriteOutput> {
    if let Some(r) = retry {
        let wall = w.wall_ms;
        r.save(w.txn_mut(), wall)?;
    }
    if !write_errors.is_empty() {
        reply.insert("writeErrors", write_errors);
    }
    if !retried.is_empty() {
        reply.insert("retriedStmtIds", retried);
    }
    reply.insert("ok", 1.0);
    // A retry that did nothing new reports the time of the session's last write.
    let op_time = last_ts.or_else(|| retry.as_ref().and_then(|r| r.record.last_op));
    Ok(WriteOutput { reply, op_time })
}

fn stmt_id(retry: &Option<RetryState>, i: usize) -> i32 {
    match retry {
        Some(r) => r.info.stmt_id(i),
        None => i32::try_from(i).unwrap_or(i32::MAX),
    }
}

/// A write command's statements, run in order as writer jobs: usually one, more when a
/// multi statement writes more than one batch ([`batches`](crate::write::batches)).
trait Batched: Send + 'static {
    fn series(&self) -> &Series;

    /// Runs statements on from where the last job stopped, until they are all done (the
    /// command's reply) or a multi statement has written a batch (a placeholder reply).
    fn step(&mut self, w: &mut WriteCtx<'_>) -> StorageResult<WriteOutput>;
}

/// Runs `run` as writer jobs until its statements are done; a batch that stopped at a held
/// key waits for a hold to end before the next.
async fn in_batches<R: Batched>(ctx: &Ctx<'_>, run: R) -> Result<WriteOutput, MongoError> {
    let reservations = &ctx.shard.state().reservations;
    let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(run)));
    loop {
        let seen = reservations.generation();
        let job_slot = slot.clone();
        let job = move |w: &mut WriteCtx<'_>| {
            let mut guard = job_slot.lock().unwrap_or_else(|e| e.into_inner());
            match guard.as_mut() {
                Some(run) => run.step(w),
                None => Ok(WriteOutput {
                    reply: MongoError::internal("a write's statements went missing").to_document(),
                    op_time: None,
                }),
            }
        };
        let out = ctx.submit_statements(Box::new(job)).await?;
        let (done, held) = {
            let guard = slot.lock().unwrap_or_else(|e| e.into_inner());
            match guard.as_ref() {
                Some(run) => (run.series().done, run.series().cursor.held),
                None => (true, false),
            }
        };
        if done {
            return Ok(out);
        }
        if held {
            reservations.wait(seen).await;
        }
    }
}

/// What every write command's statement series keeps between its jobs.
struct Series {
    /// The retryable-write identity, until the first job begins its state.
    retry_info: Option<RetryInfo>,
    retry: Option<RetryState>,
    begun: bool,
    /// The statement running now.
    next: usize,
    /// Where the running statement stands, when it is multi.
    cursor: batches::Cursor,
    stopped: bool,
    n: i64,
    errors: Vec<Bson>,
    retried: Vec<i32>,
    last_ts: Option<ClusterTime>,
    done: bool,
}

impl Series {
    fn new(retry_info: Option<RetryInfo>) -> Series {
        Series {
            retry_info,
            retry: None,
            begun: false,
            next: 0,
            cursor: batches::Cursor::default(),
            stopped: false,
            n: 0,
            errors: Vec::new(),
            retried: Vec::new(),
            last_ts: None,
            done: false,
        }
    }

    /// Begins the retryable-write state in the first job; `Some` is the command's reply
    /// when the session refuses it.
    fn begin(&mut self, w: &WriteCtx<'_>) -> StorageResult<Option<WriteOutput>> {
        if self.begun {
            return Ok(None);
        }
        self.begun = true;
        match begin_retry(w, self.retry_info.take())? {
            Ok(r) => {
                self.retry = r;
                Ok(None)
            }
            Err(out) => {
                self.done = true;
                Ok(Some(out))
            }
        }
    }

    /// The statement to run now, if any is left.
    fn next_statement(&self, total: usize) -> Option<usize> {
        (!self.stopped && self.next < total).then_some(self.next)
    }

    fn statement_done(&mut self) {
        self.next += 1;
        self.cursor = batches::Cursor::default();
    }

    /// Statement `i` failed: its write error, and an ordered command stops.
    fn statement_failed(&mut self, i: usize, e: &MongoError, ordered: bool) {
        self.errors.push(write_error(i, e));
        self.statement_done();
        self.stopped = ordered;
    }

    /// The reply of a job that ends with statements still to run.
    fn partial(&self) -> WriteOutput {
        WriteOutput {
            reply: doc! {"ok": 1.0},
            op_time: self.last_ts,
        }
    }

    /// The command's reply, with its write errors and retried statements.
    fn finish(&mut self, w: &mut WriteCtx<'_>, reply: Document) -> StorageResult<WriteOutput> {
        self.done = true;
        finish(
            w,
            &self.retry,
            reply,
            std::mem::take(&mut self.errors),
            std::mem::take(&mut self.retried),
            self.last_ts,
        )
    }
}

/// What differs between the kinds of statement a [`Run`] runs (updates, deletes).
trait Statements: Send + 'static {
    type Stmt: Send + 'static;
    /// What the running statement has done so far.
    type Progress: Default + Send + 'static;

    /// Counts statement `i`, which a retry of the command already executed (`prev`: its
    /// recorded outcome).
    fn replayed(&mut self, series: &mut Series, i: usize, prev: &Document);

    /// Runs the next batch of `stmt` (all of it unless multi), adding to `progress`.
    fn batch(
        &mut self,
        w: &mut WriteCtx<'_>,
        ns: (&str, &str),
        stmt: &Self::Stmt,
        sid: i32,
        series: &mut Series,
        progress: &mut Self::Progress,
    ) -> OpResult<()>;

    /// Statement `i` finished with `progress`: adds it to the totals; its retry record.
    fn finished(&mut self, series: &mut Series, i: usize, progress: Self::Progress) -> Document;

    /// The command's reply (before its write errors).
    fn reply(&mut self, series: &Series) -> Document;
}

/// A write command's statements of one kind, run as one or more writer jobs.
struct Run<K: Statements> {
    db: String,
    coll: String,
    stmts: Vec<Result<K::Stmt, MongoError>>,
    ordered: bool,
    series: Series,
    current: K::Progress,
    kind: K,
}

impl<K: Statements> Run<K> {
    fn new(
        ctx: &Ctx<'_>,
        coll: String,
        stmts: Vec<Result<K::Stmt, MongoError>>,
        ordered: bool,
        retry_info: Option<RetryInfo>,
        kind: K,
    ) -> Run<K> {
        Run {
            db: ctx.db.clone(),
            coll,
            stmts,
            ordered,
            series: Series::new(retry_info),
            current: K::Progress::default(),
            kind,
        }
    }
}

impl<K: Statements> Batched for Run<K> {
    fn series(&self) -> &Series {
        &self.series
    }

    fn step(&mut self, w: &mut WriteCtx<'_>) -> StorageResult<WriteOutput> {
        if let Some(out) = self.series.begin(w)? {
            return Ok(out);
        }
        while let Some(i) = self.series.next_statement(self.stmts.len()) {
            let sid = stmt_id(&self.series.retry, i);
            if let Some(prev) = self.series.retry.as_ref().and_then(|r| r.executed(sid)) {
                let prev = prev.clone();
                self.kind.replayed(&mut self.series, i, &prev);
                self.series.retried.push(sid);
                self.series.statement_done();
                continue;
            }
            let result = match &self.stmts[i] {
                Ok(s) => self.kind.batch(
                    w,
                    (&self.db, &self.coll),
                    s,
                    sid,
                    &mut self.series,
                    &mut self.current,
                ),
                Err(e) => Err(OpError::Mongo(e.clone())),
            };
            match result {
                Ok(()) if !self.series.cursor.finished => return Ok(self.series.partial()),
                Ok(()) => {
                    let progress = std::mem::take(&mut self.current);
                    let record = self.kind.finished(&mut self.series, i, progress);
                    if let Some(r) = self.series.retry.as_mut() {
                        r.record(sid, record);
                    }
                    self.series.statement_done();
                }
                Err(OpError::Storage(e)) => return Err(e),
                Err(OpError::Mongo(e)) => {
                    self.current = K::Progress::default();
                    self.series.statement_failed(i, &e, self.ordered);
                }
            }
        }
        let reply = self.kind.reply(&self.series);
        self.series.finish(w, reply)
    }
}

/// An `insert` command's arguments.
struct InsertArgs {
    coll: String,
    docs: Vec<Document>,
    ordered: bool,
    retry: Option<RetryInfo>,
    /// `bypassDocumentValidation`.
    bypass: bool,
}

impl InsertArgs {
    fn parse(ctx: &Ctx<'_>) -> Result<InsertArgs, MongoError> {
        let coll = ctx.collection()?;
        check_coll_name(&ctx.db, &coll)?;
        let raw = ctx
            .opt_array("documents")?
            .ok_or_else(|| ctx.missing("documents"))?;
        check_batch_size(raw.len())?;
        let mut docs = Vec::with_capacity(raw.len());
        for (i, d) in raw.into_iter().enumerate() {
            match d {
                Bson::Document(d) => docs.push(d),
                other => {
                    return Err(MongoError::type_mismatch(format!(
                        "BSON field 'insert.documents.{i}' is the wrong type '{}', expected type 'object'",
                        pipeline::value::type_name(&other)
                    )));
                }
            }
        }
        Ok(InsertArgs {
            coll,
            docs,
            ordered: ctx.bool_or("ordered", true)?,
            retry: RetryInfo::from_command(&ctx.cmd)?,
            bypass: ctx.bool_or("bypassDocumentValidation", false)?,
        })
    }
}

async fn insert(ctx: &Ctx<'_>) -> Result<WriteOutput, MongoError> {
    let args = InsertArgs::parse(ctx)?;
    ctx.submit_statements(insert_job(ctx.db.clone(), args, None))
        .await
}

/// The writer job of an insert; `reservation`: the ordered batch whose held keys it writes.
fn insert_job(db: String, args: InsertArgs, reservation: Option<u64>) -> WriteFn {
    let InsertArgs {
        coll,
        docs,
        ordered,
        retry: retry_info,
        bypass,
    } = args;
    Box::new(move |w: &mut WriteCtx<'_>| -> StorageResult<WriteOutput> {
        w.own_reservation = reservation;
        w.bypass_validation = bypass;
        let mut retry = match begin_retry(w, retry_info)? {
            Ok(r) => r,
            Err(out) => return Ok(out),
        };
        let (mut n, mut errors, mut retried, mut last_ts) = (0_i32, Vec::new(), Vec::new(), None);
        for (i, doc) in docs.into_iter().enumerate() {
            let stmt = stmt_id(&retry, i);
            if retry.as_ref().is_some_and(|r| r.executed(stmt).is_some()) {
                n += 1;
                retried.push(stmt);
                continue;
            }
            match insert_stmt(w, &db, &coll, doc, retry.as_mut(), stmt) {
                Ok(ts) => {
                    n += 1;
                    last_ts = Some(ts);
                    if let Some(r) = retry.as_mut() {
                        r.record(stmt, doc! {"n": 1});
                    }
                }
                Err(OpError::Storage(e)) => return Err(e),
                Err(OpError::Mongo(e)) => {
                    errors.push(write_error(i, &e));
                    if ordered {
                        break;
                    }
                }
            }
        }
        finish(w, &retry, doc! {"n": n}, errors, retried, last_ts)
    })
}

/// `_shardsvrReserveInsert`: the first phase of an ordered insert that spans shards (see
/// [`crate::reservations`]). Runs this shard's part as a dry run up to its first failing
/// document, holds the keys of the documents before it, and answers
/// `{n: <documents validated>, reservation, writeErrors: [the failure]}`, or `heldAt: n`
/// when document `n` meets a key another batch holds (a reservation never waits).
pub async fn reserve_insert(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let InsertArgs {
        coll,
        docs,
        retry,
        bypass,
        ..
    } = InsertArgs::parse(ctx)?;
    let db = ctx.db.clone();
    let job = move |w: &mut WriteCtx<'_>| -> StorageResult<WriteOutput> {
        w.bypass_validation = bypass;
        let session = match begin_retry(w, retry.clone())? {
            Ok(r) => r,
            Err(out) => return Ok(out),
        };
        let mut reply = Document::new();
        // A collection this shard does not have yet gets its identity at the commit: keys
        // held now would not be its keys, so nothing is validated.
        let exists = crate::write::ops::lookup(w, &db, &coll).is_some();
        let (stop, keys) = w.dry_run(|d| -> StorageResult<(usize, Option<MongoError>)> {
            if !exists {
                return Ok((0, Some(crate::writer::held_error())));
            }
            for (i, doc) in docs.iter().enumerate() {
                let stmt = stmt_id(&session, i);
                if session.as_ref().is_some_and(|r| r.executed(stmt).is_some()) {
                    continue;
                }
                match insert_stmt(d, &db, &coll, doc.clone(), None, stmt) {
                    Ok(_) => {}
                    Err(OpError::Storage(e)) => return Err(e),
                    Err(OpError::Mongo(e)) => return Ok((i, Some(e))),
                }
            }
            Ok((docs.len(), None))
        });
        let (validated, failure) = stop?;
        reply.insert("n", validated as i32);
        match failure {
            Some(e) if is_held(&e) => {
                reply.insert("heldAt", validated as i32);
            }
            Some(e) => {
                reply.insert("writeErrors", vec![write_error(validated, &e)]);
            }
            None => {}
        }
        let mut docs = docs;
        docs.truncate(validated);
        let batch = crate::reservations::Batch {
            db,
            coll,
            docs,
            retry,
        };
        let id = w.state().reservations.hold(batch, keys);
        reply.insert("reservation", id as i64);
        reply.insert("ok", 1.0);
        Ok(WriteOutput {
            reply,
            op_time: None,
        })
    };
    let out = ctx.submit(Box::new(job)).await?;
    Ok(Reply {
        body: out.reply.into(),
        op_time: None,
    })
}

/// `_shardsvrCommitReservation: <id>, upTo: <k>`: the second phase: inserts the first `k`
/// documents of reservation `id` as one ordered insert (none when `k` is 0), then ends it
/// (when the insert is acknowledged or failed, or this command is abandoned).
pub async fn commit_reservation(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let id = ctx
        .cmd
        .get("_shardsvrCommitReservation")
        .and_then(as_i64)
        .ok_or_else(|| {
            MongoError::failed_to_parse("_shardsvrCommitReservation must be a number")
        })?;
    let up_to = ctx.cmd.get("upTo").and_then(as_i64).unwrap_or(0).max(0) as usize;
    let reservations = &ctx.shard.state().reservations;
    let id = id as u64;
    let Some((mut batch, _taken)) = reservations.take(id) else {
        if !reservations.of_this_run(id) {
            // The shard restarted between the reservation and its commit: the batch's part
            // here is not written, while other shards' parts may be.
            return Err(MongoError::new(
                ErrorCode::INTERRUPTED_AT_SHUTDOWN,
                format!("the ordered batch's reservation {id} ended when this shard restarted"),
            ));
        }
        return Err(MongoError::new(
            ErrorCode::INTERRUPTED,
            format!("the ordered batch's reservation {id} expired or is unknown on this shard"),
        ));
    };
    if up_to == 0 {
        return Ok(Reply::read(doc! {"n": 0, "ok": 1.0}));
    }
    batch.docs.truncate(up_to);
    let args = InsertArgs {
        coll: batch.coll,
        docs: batch.docs,
        ordered: true,
        retry: batch.retry,
        // The router repeats the driver's flag on the commit.
        bypass: ctx.bool_or("bypassDocumentValidation", false)?,
    };
    let out = ctx.submit(insert_job(batch.db, args, Some(id))).await?;
    Ok(Reply {
        body: out.reply.into(),
        op_time: out.op_time,
    })
}

/// Whether `e` is a statement's meeting with a key an ordered batch holds.
pub fn is_held(e: &MongoError) -> bool {
    e.extra
        .as_ref()
        .is_some_and(|x| x.contains_key(crate::writer::HELD_MARKER))
}

/// The write commands, as [`write`] runs them.
#[derive(Clone, Copy)]
pub enum Kind {
    Insert,
    Update,
    Delete,
}

impl Kind {
    fn list(self) -> &'static str {
        match self {
            Kind::Insert => "documents",
            Kind::Update => "updates",
            Kind::Delete => "deletes",
        }
    }

    async fn run(self, ctx: &Ctx<'_>) -> Result<WriteOutput, MongoError> {
        match self {
            Kind::Insert => insert(ctx).await,
            Kind::Update => update(ctx).await,
            Kind::Delete => delete(ctx).await,
        }
    }
}

/// Runs `insert`, `update` or `delete`. Statements that met a key an ordered batch holds
/// wait for a batch to end and run again (with their own statement ids: a retryable write
/// stays exactly-once), until none meets a hold; an ordered command runs again from the
/// first such statement.
pub async fn write(ctx: &Ctx<'_>, kind: Kind) -> Result<Reply, MongoError> {
    let reservations = &ctx.shard.state().reservations;
    let mut seen = reservations.generation();
    let mut out = kind.run(ctx).await?;
    interrupted(&out.reply)?;
    let total = ctx.cmd.get_array(kind.list()).map_or(0, Vec::len);
    let ordered = ctx.bool_or("ordered", true)?;
    // `out`'s statements are the command's; a rerun's are `indexes` of them.
    loop {
        let held = held_statements(&out.reply);
        let Some(&first) = held.first() else { break };
        reservations.wait(seen).await;
        seen = reservations.generation();
        let indexes: Vec<usize> = if ordered {
            (first..total).collect()
        } else {
            held
        };
        let rerun = Ctx {
            shard: ctx.shard,
            db: ctx.db.clone(),
            cmd: rerun_command(&ctx.cmd, kind.list(), &indexes)?,
            txn: None,
            snapshot_at: None,
        };
        let again = kind.run(&rerun).await?;
        interrupted(&again.reply)?;
        let failed = match again.reply.get("ok") {
            Some(Bson::Double(ok)) => *ok != 1.0,
            Some(ok) => as_i64(ok) != Some(1),
            None => true,
        };
        if failed {
            out = again;
            break;
        }
        merge_rerun(&mut out, again, &indexes);
    }
    Ok(Reply {
        body: out.reply.into(),
        op_time: out.op_time,
    })
}

/// A statement stopped by the command's `maxTimeMS` or a kill ends the command with that error,
/// as MongoDB reports an interruption (the statements before it keep their effects).
fn interrupted(reply: &Document) -> Result<(), MongoError> {
    let Ok(errors) = reply.get_array("writeErrors") else {
        return Ok(());
    };
    for e in errors.iter().filter_map(Bson::as_document) {
        let code = e.get("code").and_then(as_i64).unwrap_or(0);
        if code == i64::from(ErrorCode::MAX_TIME_MS_EXPIRED.code)
            || code == i64::from(ErrorCode::INTERRUPTED.code)
        {
            let errmsg = e.get_str("errmsg").unwrap_or("operation was interrupted");
            return Err(MongoError::with_code(code as i32, errmsg));
        }
    }
    Ok(())
}

/// The indexes of the statements of a write reply that met a hold.
fn held_statements(reply: &Document) -> Vec<usize> {
    let Ok(errors) = reply.get_array("writeErrors") else {
        return Vec::new();
    };
    errors
        .iter()
        .filter_map(Bson::as_document)
        .filter(|e| e.contains_key(crate::writer::HELD_MARKER))
        .filter_map(|e| e.get("index").and_then(as_i64))
        .map(|i| i as usize)
        .collect()
}

/// The command again, for statements `indexes` of it only, each with its statement id.
fn rerun_command(cmd: &Document, list: &str, indexes: &[usize]) -> Result<Document, MongoError> {
    let statements = cmd
        .get_array(list)
        .map_err(|_| MongoError::internal("rerun of a write without statements"))?;
    let mut again = cmd.clone();
    again.insert(
        list,
        indexes
            .iter()
            .filter_map(|&i| statements.get(i).cloned())
            .collect::<Vec<_>>(),
    );
    if let Some(info) = RetryInfo::from_command(cmd)? {
        again.remove("stmtId");
        again.insert(
            "stmtIds",
            indexes.iter().map(|&i| info.stmt_id(i)).collect::<Vec<_>>(),
        );
    }
    Ok(again)
}

/// Folds the reply of a rerun of statements `indexes` into the command's reply `out`: its
/// counts add up, its statement indexes become the command's, and its write errors replace
/// the holds.
fn merge_rerun(out: &mut WriteOutput, again: WriteOutput, indexes: &[usize]) {
    let count = |d: &Document, k: &str| d.get(k).and_then(as_i64).unwrap_or(0);
    let remap = |list: Option<&Vec<Bson>>| -> Vec<Bson> {
        list.into_iter()
            .flatten()
            .filter_map(Bson::as_document)
            .map(|e| {
                let mut e = e.clone();
                let i = e.get("index").and_then(as_i64).unwrap_or(0) as usize;
                e.insert("index", indexes.get(i).copied().unwrap_or(i) as i32);
                Bson::Document(e)
            })
            .collect()
    };
    let reply = &mut out.reply;
    for k in ["n", "nModified"] {
        if reply.contains_key(k) {
            let total = count(reply, k) + count(&again.reply, k);
            reply.insert(k, total as i32);
        }
    }
    let mut upserted: Vec<Bson> = reply.get_array("upserted").cloned().unwrap_or_default();
    upserted.extend(remap(again.reply.get_array("upserted").ok()));
    if !upserted.is_empty() {
        upserted.sort_by_key(|u| {
            u.as_document()
                .and_then(|u| u.get("index"))
                .and_then(as_i64)
        });
        reply.insert("upserted", upserted);
    }
    let mut errors: Vec<Bson> = reply
        .get_array("writeErrors")
        .map(|e| {
            e.iter()
                .filter(|e| {
                    !e.as_document()
                        .is_some_and(|e| e.contains_key(crate::writer::HELD_MARKER))
                })
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    errors.extend(remap(again.reply.get_array("writeErrors").ok()));
    errors.sort_by_key(|e| {
        e.as_document()
            .and_then(|e| e.get("index"))
            .and_then(as_i64)
    });
    if errors.is_empty() {
        reply.remove("writeErrors");
    } else {
        reply.insert("writeErrors", errors);
    }
    if let Ok(ids) = again.reply.get_array("retriedStmtIds") {
        let mut all = reply
            .get_array("retriedStmtIds")
            .cloned()
            .unwrap_or_default();
        all.extend(ids.iter().cloned());
        reply.insert("retriedStmtIds", all);
    }
    out.op_time = out.op_time.max(again.op_time);
}

fn insert_stmt(
    w: &mut WriteCtx<'_>,
    db: &str,
    coll: &str,
    doc: Document,
    retry: Option<&mut RetryState>,
    stmt: i32,
) -> OpResult<ClusterTime> {
    let doc = prepare_insert(doc, w.wall_ms)?;
    let c = ensure_collection(w, db, coll)?;
    insert_one(w, &c, doc, retry, stmt)
}

/// Parses one `updates` element; statement-level problems are kept for its write error.
fn parse_update(
    ctx: &Ctx<'_>,
    v: &Bson,
    env: &pipeline::expr::Env,
    default_collation: Option<&pipeline::collation::Collation>,
) -> Result<Result<UpdateStmt, MongoError>, MongoError> {
    let Bson::Document(d) = v else {
        return Err(MongoError::type_mismatch(format!(
            "BSON field 'update.updates' element is the wrong type '{}', expected type 'object'",
            pipeline::value::type_name(v)
        )));
    };
    let env = &env.with_collation_of(d, default_collation)?;
    let q = match d.get("q") {
        Some(Bson::Document(q)) => q.clone(),
        Some(other) => {
            return Err(MongoError::type_mismatch(format!(
                "BSON field 'update.updates.q' is the wrong type '{}', expected type 'object'",
                pipeline::value::type_name(other)
            )));
        }
        None => {
            return Err(MongoError::with_code(
                40414,
                "BSON field 'update.updates.q' is missing but a required field",
            ));
        }
    };
    let Some(u) = d.get("u") else {
        return Err(MongoError::with_code(
            40414,
            "BSON field 'update.updates.u' is missing but a required field",
        ));
    };
    if d.contains_key("sort") {
        // `sort` on update statements arrived in 8.0; 7.0's parser refuses the field.
        return Err(MongoError::with_code(
            40415,
            "BSON field 'update.updates.sort' is an unknown field.",
        ));
    }
    let upsert = d.get("upsert").and_then(as_bool).unwrap_or(false);
    let multi = d.get("multi").and_then(as_bool).unwrap_or(false);
    let array_filters = match d.get("arrayFilters") {
        Some(Bson::Array(a)) => Some(a.clone()),
        _ => None,
    };
    let _ = ctx;
    let hint = d.get("hint");
    Ok(
        build_update_stmt(q, u, array_filters, upsert, multi, None, env).and_then(|mut s| {
            s.filter = s.filter.with_hint(hint)?;
            Ok(s)
        }),
    )
}

/// Builds an update statement (shared with findAndModify).
pub fn build_update_stmt(
    q: Document,
    u: &Bson,
    array_filters: Option<Vec<Bson>>,
    upsert: bool,
    multi: bool,
    sort: Option<crate::query::Sort>,
    env: &pipeline::expr::Env,
) -> Result<UpdateStmt, MongoError> {
    let filter = Filter::parse_in(&q, env)?;
    if multi
        && let Bson::Document(d) = u
        && d.keys().next().is_some_and(|k| !k.starts_with('$'))
    {
        return Err(MongoError::failed_to_parse(
            "multi update is not supported for replacement-style update",
        ));
    }
    let spec = UpdateSpec::parse_in(u, array_filters.as_deref(), env)?;
    Ok(UpdateStmt {
        filter,
        query: q,
        spec,
        upsert,
        multi,
        sort,
    })
}

async fn update(ctx: &Ctx<'_>) -> Result<WriteOutput, MongoError> {
    let coll = ctx.collection()?;
    check_coll_name(&ctx.db, &coll)?;
    let updates = ctx
        .opt_array("updates")?
        .ok_or_else(|| ctx.missing("updates"))?;
    check_batch_size(updates.len())?;
    let env = pipeline::expr::Env::from_command(&ctx.cmd)?;
    let default_collation = ctx.default_collation(&coll);
    let mut stmts = Vec::with_capacity(updates.len());
    for u in &updates {
        stmts.push(parse_update(ctx, u, &env, default_collation.as_ref())?);
    }
    let ordered = ctx.bool_or("ordered", true)?;
    let bypass = ctx.bool_or("bypassDocumentValidation", false)?;
    let retry_info = RetryInfo::from_command(&ctx.cmd)?;
    if retry_info.is_some() && stmts.iter().any(|s| matches!(s, Ok(s) if s.multi)) {
        return Err(MongoError::new(
            ErrorCode::INVALID_OPTIONS,
            "Cannot use (or request) retryable writes with multi=true",
        ));
    }
    let updates = Updates {
        bypass,
        n_modified: 0,
        upserted: Vec::new(),
    };
    in_batches(
        ctx,
        Run::new(ctx, coll, stmts, ordered, retry_info, updates),
    )
    .await
}

/// What an `update` command adds up across its statements.
struct Updates {
    bypass: bool,
    n_modified: i64,
    upserted: Vec<Bson>,
}

impl Statements for Updates {
    type Stmt = UpdateStmt;
    type Progress = UpdateOutcome;

    fn replayed(&mut self, series: &mut Series, i: usize, prev: &Document) {
        series.n += prev.get("n").and_then(as_i64).unwrap_or(0);
        self.n_modified += prev.get("nModified").and_then(as_i64).unwrap_or(0);
        if let Some(id) = prev.get("upserted") {
            self.upserted
                .push(Bson::Document(doc! {"index": i as i32, "_id": id.clone()}));
        }
    }

    fn batch(
        &mut self,
        w: &mut WriteCtx<'_>,
        (db, coll): (&str, &str),
        stmt: &UpdateStmt,
        sid: i32,
        series: &mut Series,
        progress: &mut UpdateOutcome,
    ) -> OpResult<()> {
        w.bypass_validation = self.bypass;
        let result = update_batch(
            w,
            db,
            coll,
            stmt,
            series.retry.as_mut(),
            sid,
            &mut series.cursor,
            progress,
            batches::BATCH,
        );
        if progress.last_ts.is_some() {
            series.last_ts = progress.last_ts;
        }
        result
    }

    fn finished(&mut self, series: &mut Series, i: usize, o: UpdateOutcome) -> Document {
        let mut rec = doc! {"n": o.n, "nModified": o.n_modified};
        series.n += o.n;
        self.n_modified += o.n_modified;
        if let Some(id) = o.upserted {
            series.n += 1;
            rec.insert("n", o.n + 1);
            rec.insert("upserted", id.clone());
            self.upserted
                .push(Bson::Document(doc! {"index": i as i32, "_id": id}));
        }
        rec
    }

    fn reply(&mut self, series: &Series) -> Document {
        let mut reply = doc! {"n": series.n as i32};
        if !self.upserted.is_empty() {
            reply.insert("upserted", std::mem::take(&mut self.upserted));
        }
        reply.insert("nModified", self.n_modified as i32);
        reply
    }
}

struct DeleteStmt {
    filter: Filter,
    multi: bool,
}

async fn delete(ctx: &Ctx<'_>) -> Result<WriteOutput, MongoError> {
    let coll = ctx.collection()?;
    check_coll_name(&ctx.db, &coll)?;
    let deletes = ctx
        .opt_array("deletes")?
        .ok_or_else(|| ctx.missing("deletes"))?;
    check_batch_size(deletes.len())?;
    let env = pipeline::expr::Env::from_command(&ctx.cmd)?;
    let default_collation = ctx.default_collation(&coll);
    let mut stmts = Vec::with_capacity(deletes.len());
    for d in &deletes {
        let Bson::Document(d) = d else {
            return Err(MongoError::type_mismatch(
                "BSON field 'delete.deletes' element is the wrong type, expected type 'object'",
            ));
        };
        let q = match d.get("q") {
            Some(Bson::Document(q)) => q.clone(),
            Some(_) => {
                return Err(MongoError::type_mismatch(
                    "BSON field 'delete.deletes.q' is the wrong type, expected type 'object'",
                ));
            }
            None => {
                return Err(MongoError::with_code(
                    40414,
                    "BSON field 'delete.deletes.q' is missing but a required field",
                ));
            }
        };
        let limit = match d.get("limit") {
            Some(v) => as_i64(v).ok_or_else(|| {
                MongoError::type_mismatch(
                    "BSON field 'delete.deletes.limit' is the wrong type, expected type 'int'",
                )
            })?,
            None => {
                return Err(MongoError::with_code(
                    40414,
                    "BSON field 'delete.deletes.limit' is missing but a required field",
                ));
            }
        };
        if limit != 0 && limit != 1 {
            return Err(MongoError::failed_to_parse(format!(
                "The limit field in delete objects must be 0 or 1. Got {limit}"
            )));
        }
        stmts.push(
            env.with_collation_of(d, default_collation.as_ref())
                .and_then(|env| Filter::parse_in(&q, &env))
                .and_then(|f| f.with_hint(d.get("hint")))
                .map(|filter| DeleteStmt {
                    filter,
                    multi: limit == 0,
                }),
        );
    }
    let ordered = ctx.bool_or("ordered", true)?;
    let retry_info = RetryInfo::from_command(&ctx.cmd)?;
    in_batches(
        ctx,
        Run::new(ctx, coll, stmts, ordered, retry_info, Deletes),
    )
    .await
}

/// A `delete` command's statements (their counts live in the [`Series`]).
struct Deletes;

impl Statements for Deletes {
    type Stmt = DeleteStmt;
    /// How many documents the current statement has deleted so far.
    type Progress = i64;

    fn replayed(&mut self, series: &mut Series, _: usize, prev: &Document) {
        series.n += prev.get("n").and_then(as_i64).unwrap_or(0);
    }

    /// The next batch of delete statement `stmt` (all of it unless multi).
    fn batch(
        &mut self,
        w: &mut WriteCtx<'_>,
        (db, coll): (&str, &str),
        stmt: &DeleteStmt,
        sid: i32,
        series: &mut Series,
        current: &mut i64,
    ) -> OpResult<()> {
        let Some(c) = lookup_writable(w, db, coll)? else {
            series.cursor.finished = true;
            return Ok(());
        };
        let batch = if stmt.multi {
            series
                .cursor
                .next_batch(w.txn(), &c, &stmt.filter, batches::BATCH)?
        } else {
            series.cursor.finished = true;
            Batch::whole(&c, targets(w, &c, &stmt.filter, false, None)?)
        };
        for (i, (_, d)) in batch.docs.iter().enumerate() {
            // A held document stops a statement that has done nothing yet, so it can run again;
            // one that has goes on from this document once the hold ends.
            if let Err(e) = w.check_not_held(&c, d) {
                if *current == 0 || !batch.resumable() {
                    return Err(e);
                }
                series.cursor.rewind(&batch, i);
                return Ok(());
            }
            series.last_ts = Some(delete_one(w, &c, d, series.retry.as_mut(), sid)?);
            *current += 1;
        }
        Ok(())
    }

    fn finished(&mut self, series: &mut Series, _: usize, deleted: i64) -> Document {
        series.n += deleted;
        doc! {"n": deleted}
    }

    fn reply(&mut self, series: &Series) -> Document {
        doc! {"n": series.n as i32}
    }
}
