//! Command dispatch and the argument helpers every command family uses.
//!
//! Every command runs through the steps of `layers`, in one order (clock, interrupt, parse, read
//! time, routing), then `execute`, the registry's exhaustive dispatch, then the reply's
//! stamp.
//!
//! Each family lives in its own file: `parse` the command document into typed arguments
//! (rejecting bad input with MongoDB's codes), then execute (reads on a snapshot, writes as a
//! job for the writer), then build the reply. Errors are [`MongoError`]s; nothing here panics
//! on input.

mod changestream;
mod ddl;
pub mod explain;
mod find_and_modify;
mod hello;
mod layers;
mod query;
pub mod routing;
mod stats;
mod validate;
mod write;

pub use crate::args::{as_bool, as_i64};
pub use ddl::check_index_key;

use bson::{Bson, Document};
use resume::ClusterTime;
use wire::{ErrorCode, MongoError};

use crate::Shard;
use crate::catalog::Catalog;
use crate::command::Command;
use crate::history::AsOf;
use crate::storage::ReadTxn;
use crate::txn::TxnArgs;
use crate::writer::{COMMIT_METADATA_FIELD, WriteFn, WriteOutput};
use wire::raw::Body;

/// A command's reply body and the optime of its last write (if it wrote).
pub struct Reply {
    pub body: Body,
    pub op_time: Option<ClusterTime>,
}

impl Reply {
    pub fn read(body: impl Into<Body>) -> Self {
        Reply {
            body: body.into(),
            op_time: None,
        }
    }
}

/// Runs one command through the layers (`layers::run`, which call [`execute`] last).
pub async fn run(shard: &Shard, cmd: Document) -> Body {
    layers::run(shard, cmd).await
}

/// Executes a parsed command: the registry's dispatch, one arm per [`Command`].
async fn execute(ctx: &Ctx<'_>, command: Command, name: &str) -> Result<Reply, MongoError> {
    let shard = ctx.shard;
    use Command::*;
    match command {
        Hello => hello::hello(ctx, name),
        Ping => Ok(Reply::read(bson::doc! {"ok": 1.0})),
        BuildInfo => hello::build_info(),
        EndSessions | KillAllSessions | KillSessions => {
            let killed = crate::txn::SessionFilter::of(name, &ctx.cmd)?;
            shard.transactions().kill_sessions(&killed);
            Ok(Reply::read(bson::doc! {"ok": 1.0}))
        }
        RefreshSessions => {
            let keys = crate::retryable::refreshed_sessions(&ctx.cmd)?;
            crate::retryable::refresh(shard.writer(), keys).await?;
            Ok(Reply::read(bson::doc! {"ok": 1.0}))
        }
        GetParameter => hello::get_parameter(ctx),
        SetParameter => hello::set_parameter(ctx),
        ServerStatus => {
            let mut status = shard.status()?;
            status.insert("ok", 1.0);
            Ok(Reply::read(status))
        }
        Lineage => {
            let lineage = shard.state().lineage().map(|l| l.to_document());
            let newest = shard.state().tail.visible();
            Ok(Reply::read(bson::doc! {
                "lineage": lineage,
                "newest": Bson::Timestamp(newest.timestamp()),
                "ok": 1.0,
            }))
        }
        MarkLineageLost => {
            let Some(Bson::Timestamp(to)) = ctx.cmd.get("to") else {
                return Err(MongoError::type_mismatch("'to' must be a timestamp"));
            };
            let reached = match ctx.cmd.get("reached") {
                Some(Bson::Timestamp(t)) => Some(ClusterTime::from(*t)),
                _ => None,
            };
            let changed = shard
                .mark_lineage_lost(ClusterTime::from(*to), reached)
                .await?;
            Ok(Reply::read(bson::doc! {"changed": changed, "ok": 1.0}))
        }
        RetentionPins => retention_pins(ctx).await,
        OplogBytesSince => oplog_bytes_since(ctx),
        GetClusterParameter => {
            let p = crate::preimages::parameter(shard)?;
            Ok(Reply::read(
                bson::doc! {"clusterParameters": [p], "ok": 1.0},
            ))
        }
        SetClusterParameter => {
            let options = ctx
                .cmd
                .get_document(crate::preimages::CHANGE_STREAM_OPTIONS)
                .map_err(|_| MongoError::failed_to_parse("changeStreamOptions must be an object"))?
                .clone();
            crate::preimages::set_parameter(shard, options).await?;
            Ok(Reply::read(bson::doc! {"ok": 1.0}))
        }
        CommitTransaction => commit_transaction(ctx).await,
        AbortTransaction => abort_transaction(ctx).await,
        PrepareTransaction => prepare_transaction(ctx).await,
        ConfigureFailPoint => {
            shard.configure_fail_point(&ctx.cmd)?;
            Ok(Reply::read(bson::doc! {"ok": 1.0}))
        }
        CoordinateCommitTransaction => coordinate_commit(ctx).await,
        Insert => write::write(ctx, write::Kind::Insert).await,
        Update => write::write(ctx, write::Kind::Update).await,
        Delete => write::write(ctx, write::Kind::Delete).await,
        ReserveInsert => write::reserve_insert(ctx).await,
        CommitReservation => write::commit_reservation(ctx).await,
        FindAndModify => loop {
            // A statement that met a key an ordered batch holds waits for it, then runs again.
            let reservations = &shard.state().reservations;
            let seen = reservations.generation();
            match find_and_modify::find_and_modify(ctx).await {
                Err(e) if write::is_held(&e) => reservations.wait(seen).await,
                done => break done,
            }
        },
        Find => query::find(ctx).await,
        GetMore if changestream::owns_get_more(ctx) => changestream::get_more(ctx).await,
        GetMore => query::get_more(ctx).await,
        KillCursors => changestream::kill_cursors(ctx),
        KillOperations => kill_operations(ctx),
        NudgeChangeStream => changestream::nudge(ctx),
        Explain => long_running(|| explain::explain(ctx)),
        Count => long_running(|| query::count(ctx)),
        Distinct => long_running(|| query::distinct(ctx)),
        Aggregate if changestream::is_change_stream(&ctx.cmd) => changestream::aggregate(ctx),
        Aggregate => long_running(|| query::aggregate(ctx)),
        Create => ddl::create(ctx).await,
        Drop => ddl::drop(ctx).await,
        DropDatabase => ddl::drop_database(ctx).await,
        RenameCollection => ddl::rename_collection(ctx).await,
        ListCollections => ddl::list_collections(ctx),
        ListDatabases => ddl::list_databases(ctx),
        CollStats => stats::coll_stats(ctx),
        Validate => long_running(|| validate::validate(ctx)),
        DbStats => stats::db_stats(ctx),
        CreateIndexes => ddl::create_indexes(ctx).await,
        DropIndexes => ddl::drop_indexes(ctx).await,
        ListIndexes => ddl::list_indexes(ctx),
        CollMod => ddl::coll_mod(ctx).await,
        ShardCollection => ddl::shard_collection(ctx).await,
    }
}

/// One command being executed.
pub struct Ctx<'a> {
    pub shard: &'a Shard,
    pub db: String,
    pub cmd: Document,
    /// The multi-document transaction the command is part of.
    pub txn: Option<TxnArgs>,
    /// A read with `readConcern: {level: "snapshot"}` outside a transaction: `Some(None)`
    /// reads as of now, `Some(Some(t))` as of `atClusterTime` `t`.
    pub snapshot_at: Option<Option<ClusterTime>>,
}

fn transaction<'c>(ctx: &'c Ctx<'_>) -> Result<&'c TxnArgs, MongoError> {
    ctx.txn.as_ref().ok_or_else(|| {
        MongoError::new(
            ErrorCode::INVALID_OPTIONS,
            format!("{} must be run within a transaction", ctx.name()),
        )
    })
}

async fn commit_transaction(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let out = ctx
        .shard
        .transactions()
        .commit(ctx.shard, transaction(ctx)?)
        .await?;
    Ok(Reply {
        body: out.reply.into(),
        op_time: out.op_time,
    })
}

async fn prepare_transaction(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let ts = ctx
        .shard
        .transactions()
        .prepare(ctx.shard, transaction(ctx)?)
        .await?;
    Ok(Reply {
        body: bson::doc! {"prepareTimestamp": ts.timestamp(), "ok": 1.0}.into(),
        op_time: Some(ts),
    })
}

async fn coordinate_commit(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let reply = crate::txn::coordinator::coordinate(ctx.shard, transaction(ctx)?, &ctx.cmd).await?;
    Ok(Reply::read(reply))
}

async fn abort_transaction(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    ctx.shard
        .transactions()
        .abort(ctx.shard, transaction(ctx)?)
        .await?;
    Ok(Reply::read(bson::doc! {"ok": 1.0}))
}

impl Ctx<'_> {
    /// Runs a write job: in the command's transaction when it has one, else as a job of the
    /// writer (committed, durably, before this returns).
    pub async fn submit(&self, job: WriteFn) -> Result<WriteOutput, MongoError> {
        match &self.txn {
            Some(t) => self.shard.transactions().write(self.shard, t, job),
            None => {
                self.shard
                    .writer()
                    .submit(self.with_commit_metadata(job))
                    .await
            }
        }
    }

    /// `job` recording the command's `tributaryCommit` (who wrote, from which application,
    /// with which comment: see [`crate::writer::WriteCtx::commit_metadata`]) in its entries.
    /// A transaction's statements record nothing: its commit does.
    fn with_commit_metadata(&self, job: WriteFn) -> WriteFn {
        let Ok(meta) = self.cmd.get_document(COMMIT_METADATA_FIELD) else {
            return job;
        };
        let meta = crate::writer::CommitMetadata::new(meta);
        Box::new(move |w: &mut crate::writer::WriteCtx<'_>| {
            w.commit_metadata = Some(meta);
            job(w)
        })
    }

    /// [`Ctx::submit`] for a job of statements (insert, update, delete, findAndModify), which
    /// the writer thread runs under the command's deadline and kill flag too: a statement past
    /// its `maxTimeMS`, or killed, stops where it checks (its scans and expressions, before it
    /// writes) and fails; the statements before it keep their effects, as MongoDB's do. Other
    /// jobs (DDL, an ordered batch's phases) run to their end: stopped halfway, they would
    /// commit half.
    pub async fn submit_statements(&self, job: WriteFn) -> Result<WriteOutput, MongoError> {
        if self.txn.is_some() {
            return self.submit(job).await;
        }
        let interrupt = pipeline::interrupt::current();
        let job: WriteFn = Box::new(move |w: &mut crate::writer::WriteCtx<'_>| {
            pipeline::interrupt::with(&interrupt, || job(w))
        });
        self.shard
            .writer()
            .submit(self.with_commit_metadata(job))
            .await
    }

    /// Runs `f` on what the command reads: its transaction's snapshot with the transaction's
    /// own writes, or a fresh snapshot of the shard.
    pub fn read<R>(
        &self,
        f: impl FnOnce(&dyn ReadTxn, &Catalog) -> Result<R, MongoError>,
    ) -> Result<R, MongoError> {
        long_running(|| self.read_now(f))
    }

    fn read_now<R>(
        &self,
        f: impl FnOnce(&dyn ReadTxn, &Catalog) -> Result<R, MongoError>,
    ) -> Result<R, MongoError> {
        match &self.txn {
            Some(t) => self.shard.transactions().read(self.shard, t, f),
            None => {
                let state = self.shard.state();
                let catalog = state.catalog();
                let snapshot = state
                    .storage
                    .begin_read()
                    .map_err(|e| MongoError::internal(format!("storage: {e}")))?;
                match self.snapshot_at {
                    Some(at) => {
                        let at = at.unwrap_or_else(|| state.high_water_mark());
                        let as_of = AsOf::new(snapshot, state.history.clone(), at)?;
                        f(&as_of, &catalog)
                    }
                    None => f(&*snapshot, &catalog),
                }
            }
        }
    }

    pub fn name(&self) -> &str {
        self.cmd.keys().next().map(String::as_str).unwrap_or("")
    }

    /// The collection named by the command's first field.
    /// The command's `let` and `collation` environment on collection `coll`: the collection's
    /// default collation applies when the command names none.
    pub fn env_for(&self, coll: &str) -> Result<pipeline::expr::Env, MongoError> {
        pipeline::expr::Env::from_command(&self.cmd)?
            .with_collation_of(&self.cmd, self.default_collation(coll).as_ref())
    }

    /// Collection `coll`'s default collation (`None`: simple, or no such collection).
    pub fn default_collation(&self, coll: &str) -> Option<pipeline::collation::Collation> {
        self.shard
            .state()
            .catalog()
            .lookup(&self.db, coll)
            .and_then(|c| c.collation())
    }

    pub fn collection(&self) -> Result<String, MongoError> {
        match self.cmd.iter().next() {
            Some((_, Bson::String(s))) => Ok(s.clone()),
            Some((_, v)) => Err(MongoError::new(
                ErrorCode::INVALID_NAMESPACE,
                format!(
                    "collection name has invalid type {}",
                    pipeline::value::type_name(v)
                ),
            )),
            None => Err(MongoError::failed_to_parse("Empty command document")),
        }
    }

    pub fn ns(&self, coll: &str) -> String {
        format!("{}.{}", self.db, coll)
    }

    fn wrong_type(&self, field: &str, v: &Bson, expected: &str) -> MongoError {
        MongoError::type_mismatch(format!(
            "BSON field '{}.{}' is the wrong type '{}', expected type '{}'",
            self.name(),
            field,
            pipeline::value::type_name(v),
            expected
        ))
    }

    pub fn opt_doc(&self, field: &str) -> Result<Option<Document>, MongoError> {
        match self.cmd.get(field) {
            None | Some(Bson::Null) => Ok(None),
            Some(Bson::Document(d)) => Ok(Some(d.clone())),
            Some(v) => Err(self.wrong_type(field, v, "object")),
        }
    }

    pub fn opt_bool(&self, field: &str) -> Result<Option<bool>, MongoError> {
        match self.cmd.get(field) {
            None | Some(Bson::Null) => Ok(None),
            Some(v) => match as_bool(v) {
                Some(b) => Ok(Some(b)),
                None => Err(self.wrong_type(field, v, "bool")),
            },
        }
    }

    pub fn bool_or(&self, field: &str, default: bool) -> Result<bool, MongoError> {
        Ok(self.opt_bool(field)?.unwrap_or(default))
    }

    pub fn opt_i64(&self, field: &str) -> Result<Option<i64>, MongoError> {
        match self.cmd.get(field) {
            None | Some(Bson::Null) => Ok(None),
            Some(v) => match as_i64(v) {
                Some(n) => Ok(Some(n)),
                None => Err(self.wrong_type(field, v, "long")),
            },
        }
    }

    pub fn opt_array(&self, field: &str) -> Result<Option<Vec<Bson>>, MongoError> {
        match self.cmd.get(field) {
            None | Some(Bson::Null) => Ok(None),
            Some(Bson::Array(a)) => Ok(Some(a.clone())),
            Some(v) => Err(self.wrong_type(field, v, "array")),
        }
    }

    pub fn opt_str(&self, field: &str) -> Result<Option<String>, MongoError> {
        match self.cmd.get(field) {
            None | Some(Bson::Null) => Ok(None),
            Some(Bson::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.wrong_type(field, v, "string")),
        }
    }

    pub fn missing(&self, field: &str) -> MongoError {
        MongoError::with_code(
            40414,
            format!(
                "BSON field '{}.{}' is missing but a required field",
                self.name(),
                field
            ),
        )
    }
}

/// A cursor reply `{cursor: {firstBatch|nextBatch, id, ns}, ok: 1}`.
pub fn cursor_reply(id: i64, ns: &str, batch: Vec<Document>, first: bool) -> Document {
    let docs: Vec<Bson> = batch.into_iter().map(Bson::Document).collect();
    let key = if first { "firstBatch" } else { "nextBatch" };
    let mut c = Document::new();
    c.insert(key, docs);
    c.insert("id", id);
    c.insert("ns", ns);
    bson::doc! {"cursor": c, "ok": 1.0}
}

/// `_killOperations {operationKeys: [...]}`: a router's `killOp` of a client operation stops
/// the commands it runs here.
fn kill_operations(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let keys: Vec<Vec<u8>> = ctx
        .opt_array("operationKeys")?
        .ok_or_else(|| ctx.missing("operationKeys"))?
        .iter()
        .filter_map(crate::operations::key_bytes)
        .collect();
    let killed = ctx.shard.operations().kill(&keys);
    Ok(Reply::read(bson::doc! {"killed": killed as i64, "ok": 1.0}))
}

pub(crate) use wire::server::long_running;

/// `_shardsvrOplogBytesSince: [Timestamp]` → `{bytes: [long]}`: for each time, the bytes of
/// this shard's oplog from it on (a subscription consumer's lag; at most
/// `crate::pins::MAX_PINS` times per call).
fn oplog_bytes_since(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let Some(Bson::Array(times)) = ctx.cmd.get("_shardsvrOplogBytesSince") else {
        return Err(MongoError::type_mismatch(
            "_shardsvrOplogBytesSince takes an array of Timestamps",
        ));
    };
    if times.len() > crate::pins::MAX_PINS {
        return Err(MongoError::bad_value(format!(
            "at most {} times per call",
            crate::pins::MAX_PINS
        )));
    }
    let froms = times
        .iter()
        .map(|t| match t {
            Bson::Timestamp(t) => Ok(ClusterTime::from(*t)),
            _ => Err(MongoError::type_mismatch("each time must be a Timestamp")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bytes = ctx.read_now(|txn, _| {
        crate::retention::bytes_since(txn, &froms)
            .map_err(|e| MongoError::internal(format!("storage: {e}")))
    })?;
    let bytes: Vec<Bson> = bytes.into_iter().map(|b| Bson::Int64(b as i64)).collect();
    Ok(Reply::read(bson::doc! {"bytes": bytes, "ok": 1.0}))
}

/// `_shardsvrRetentionPins: 1, set: [{id, from: Timestamp, maxLagBytes?, maxLagSecs?}],
/// drop: [id]`: the router's subscriptions hold this shard's oplog (`crate::pins`). Replies
/// with the set pins as they are now: `{pins: [{id, expired}]}`.
async fn retention_pins(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let strings = |field: &str| -> Result<Vec<String>, MongoError> {
        Ok(ctx
            .cmd
            .get_array(field)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    };
    let drop = strings("drop")?;
    let mut set = Vec::new();
    for p in ctx.cmd.get_array("set").map(Vec::as_slice).unwrap_or(&[]) {
        let Some(p) = p.as_document() else {
            return Err(MongoError::type_mismatch("each pin must be a document"));
        };
        let (Ok(id), Ok(from)) = (p.get_str("id"), p.get_timestamp("from")) else {
            return Err(MongoError::failed_to_parse(
                "a pin needs 'id' and 'from' (a Timestamp)",
            ));
        };
        let num = |f: &str| match p.get(f) {
            Some(Bson::Int64(v)) if *v > 0 => Some(*v as u64),
            Some(Bson::Int32(v)) if *v > 0 => Some(*v as u64),
            _ => None,
        };
        set.push((
            id.to_string(),
            crate::pins::Pin {
                from: ClusterTime::from(from),
                max_lag_bytes: num("maxLagBytes"),
                max_lag_secs: num("maxLagSecs").map(|s| s.min(u64::from(u32::MAX)) as u32),
                expired: false,
            },
        ));
    }
    if set.len() + drop.len() > crate::pins::MAX_PINS {
        return Err(MongoError::bad_value(format!(
            "at most {} pins per call",
            crate::pins::MAX_PINS
        )));
    }
    let ids: Vec<String> = set
        .iter()
        .map(|(id, _)| id.clone())
        .chain(strings("get")?)
        .collect();
    let now = ctx.shard.change_pins(set, drop, ids).await?;
    let pins: Vec<Bson> = now
        .into_iter()
        .map(|(id, p)| Bson::Document(bson::doc! {"id": id, "expired": p.expired}))
        .collect();
    Ok(Reply::read(bson::doc! {"pins": pins, "ok": 1.0}))
}
