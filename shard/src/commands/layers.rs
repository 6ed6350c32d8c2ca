//! The steps every command passes through on a shard, in their order, written once in [`run`]:
//!
//! 1. **clock**: the caller's `$clusterTime` moves this shard's clock;
//! 2. **interrupt**: the rest runs within `maxTimeMS` and until a kill of its operation key;
//! 3. **parse**: the command's name and `$db`, its transaction arguments and its snapshot;
//! 4. **read time**: a read as of a cluster time waits until everything before it is
//!    committed here, and so does, on a secondary, a read after one; a read of the latest
//!    state waits out the prepared transactions that hold what it reads;
//! 5. **routing**: a command that carries the router's `shardVersion` is checked against this
//!    shard's placement (`StaleConfig` otherwise);
//! 6. **execute**: the registry's dispatch ([`super::execute`]);
//! 7. **stamp**: the reply gets `$clusterTime` and `operationTime` (on a secondary, the time
//!    it applied everything up to).
//!
//! Invariants: an error at any step is the command's reply (stamped like any reply); no step
//! waits without a deadline.

use bson::raw::cstr;
use bson::{Bson, Document, RawDocumentBuf};
use resume::ClusterTime;
use wire::raw::Body;
use wire::{ErrorCode, MongoError};

use super::{Ctx, Reply};
use crate::Shard;
use crate::command::Command;

/// Runs `cmd` through every step (see the module header).
pub(super) async fn run(shard: &Shard, cmd: Document) -> Body {
    if let Some(t) = incoming_cluster_time(&cmd) {
        shard.state().observe(t);
    }
    let (body, op_time) = match interruptible(shard, cmd).await {
        Ok(r) => (r.body, r.op_time),
        Err(e) => (Body::Document(e.to_document()), None),
    };
    stamp(shard, body, op_time)
}

fn incoming_cluster_time(cmd: &Document) -> Option<ClusterTime> {
    match cmd.get("$clusterTime") {
        Some(Bson::Document(d)) => match d.get("clusterTime") {
            Some(Bson::Timestamp(t)) => Some(ClusterTime::from(*t)),
            _ => None,
        },
        _ => None,
    }
}

/// Interrupt: the rest runs within the command's `maxTimeMS` (50 when it runs out; a getMore's
/// is how long an awaitData cursor waits) and until a `killOp` of its operation key: long
/// loops check both as they go (`pipeline::interrupt`), and a wait stops at them.
async fn interruptible(shard: &Shard, mut cmd: Document) -> Result<Reply, MongoError> {
    use pipeline::interrupt::{Interrupt, Interruptible, max_time_expired, max_time_ms};
    let name = cmd.keys().next().map(String::as_str).unwrap_or("");
    let limit = match name {
        "getMore" => None,
        _ => max_time_ms(&cmd)?,
    };
    let name = name.to_string();
    let operation =
        crate::operations::take_key(&mut cmd).map(|k| shard.operations().start(k, &name));
    if limit.is_none() && operation.is_none() {
        return parsed(shard, cmd).await;
    }
    let limit = limit.map(std::time::Duration::from_millis);
    let interrupt = Interrupt {
        deadline: limit.map(|l| std::time::Instant::now() + l),
        killed: operation.as_ref().map(|o| o.flag()),
    };
    let run = Interruptible::new(interrupt, parsed(shard, cmd));
    let timed = async {
        match limit {
            Some(limit) => tokio::time::timeout(limit, run)
                .await
                .unwrap_or_else(|_| Err(max_time_expired())),
            None => run.await,
        }
    };
    match &operation {
        Some(op) => tokio::select! {
            result = timed => result,
            () = op.killed() => Err(MongoError::new(
                ErrorCode::INTERRUPTED,
                "operation was interrupted by killOp",
            )),
        },
        None => timed.await,
    }
}

/// Parse, read time and routing, then execute.
async fn parsed(shard: &Shard, cmd: Document) -> Result<Reply, MongoError> {
    let Some(name) = cmd.keys().next().cloned() else {
        return Err(MongoError::new(
            ErrorCode::FAILED_TO_PARSE,
            "Empty command document",
        ));
    };
    let db = match cmd.get("$db") {
        Some(Bson::String(s)) => s.clone(),
        Some(_) => {
            return Err(MongoError::type_mismatch(
                "BSON field '$db' is the wrong type, expected type 'string'",
            ));
        }
        None => {
            return Err(MongoError::with_code(
                40571,
                "OP_MSG requests require a $db argument",
            ));
        }
    };
    let command = Command::named(&name);
    let txn = crate::txn::TxnArgs::from_command(command, &name, &cmd)?;
    let snapshot_at = read_concern_snapshot(&cmd)?;
    let ctx = Ctx {
        shard,
        db,
        cmd,
        txn,
        snapshot_at,
    };
    read_time(&ctx, command).await?;
    if command.is_some_and(Command::checks_shard_version) {
        super::routing::check_shard_version(&ctx)?;
    }
    let Some(command) = command else {
        return Err(MongoError::new(
            ErrorCode::COMMAND_NOT_FOUND,
            format!("no such command: '{name}'"),
        ));
    };
    super::execute(&ctx, command, &name).await
}

/// The `readConcern: snapshot` of a command outside a transaction.
fn read_concern_snapshot(cmd: &Document) -> Result<Option<Option<ClusterTime>>, MongoError> {
    if cmd.contains_key("autocommit") {
        return Ok(None);
    }
    let Ok(rc) = cmd.get_document("readConcern") else {
        return Ok(None);
    };
    if !rc.get_str("level").is_ok_and(|l| l == "snapshot") {
        if rc.contains_key("atClusterTime") {
            return Err(MongoError::new(
                ErrorCode::INVALID_OPTIONS,
                "atClusterTime is only allowed with readConcern level snapshot",
            ));
        }
        return Ok(None);
    }
    match rc.get("atClusterTime") {
        None => Ok(Some(None)),
        Some(Bson::Timestamp(t)) => Ok(Some(Some(ClusterTime::from(*t)))),
        Some(_) => Err(MongoError::type_mismatch(
            "BSON field 'readConcern.atClusterTime' is the wrong type, expected type 'timestamp'",
        )),
    }
}

/// Read time: a transaction's or a snapshot's read waits for its cluster time; a read of the
/// latest state outside both waits out the prepared transactions holding what it reads.
async fn read_time(ctx: &Ctx<'_>, command: Option<Command>) -> Result<(), MongoError> {
    let shard = ctx.shard;
    if let Some(t) = ctx
        .txn
        .as_ref()
        .and_then(|t| t.at_cluster_time)
        .or(ctx.snapshot_at.flatten())
    {
        wait_for_time(shard, t).await?;
    }
    if shard.state().follows()
        && let Some(t) = after_cluster_time(&ctx.cmd)
    {
        wait_for_follower(shard, t).await?;
    }
    let latest_read = matches!(
        command,
        Some(Command::Find | Command::Count | Command::Distinct)
    ) || command == Some(Command::Aggregate)
        && !super::changestream::is_change_stream(&ctx.cmd);
    if latest_read && ctx.txn.is_none() && ctx.snapshot_at.is_none() {
        wait_while_prepared(shard, &ctx.db, &ctx.cmd).await?;
    }
    Ok(())
}

/// A read of the latest state waits while a prepared transaction that holds a key of what it
/// reads is undecided here: it could commit at a time the read should see, and the read must
/// not see it half applied. One that holds only other collections' keys does not hold it up.
async fn wait_while_prepared(shard: &Shard, db: &str, cmd: &Document) -> Result<(), MongoError> {
    let timed_out = MongoError::new(
        ErrorCode::MAX_TIME_MS_EXPIRED,
        "timed out waiting for a prepared transaction to be decided",
    );
    wait_until(|| !prepared_holds_read(shard, db, cmd), 30, timed_out).await
}

/// Polls `done` every millisecond for at most `secs` seconds; `timed_out` when it never holds.
async fn wait_until(
    mut done: impl FnMut() -> bool,
    secs: u64,
    timed_out: MongoError,
) -> Result<(), MongoError> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !done() {
        if tokio::time::Instant::now() >= deadline {
            return Err(timed_out);
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    Ok(())
}

/// Whether an undecided prepared transaction may hold what the read `cmd` reads: one holding a
/// key of its collection, one whose keys are not listed yet (a prepare in flight), or any
/// when the read is of a view (which reads another collection).
fn prepared_holds_read(shard: &Shard, db: &str, cmd: &Document) -> bool {
    if !shard.transactions().any_prepared(shard) {
        return false;
    }
    let state = shard.state();
    if state.hlc().hold_count() > state.prepared.transactions() {
        return true;
    }
    let Some(Bson::String(coll)) = cmd.values().next() else {
        return true;
    };
    match state.catalog().lookup(db, coll) {
        Some(c) if !c.options.contains_key("viewOn") => state
            .prepared
            .holds_prefix(&crate::keys::collection_prefix(&c.uuid)),
        Some(_) => true,
        None => false,
    }
}

/// Waits until everything at or before `t` is committed here (a read as of `t` must see all
/// of it); the shard's clock moves to `t` first, so nothing new is written at or below it.
/// A `t` ahead of the cluster time the command brought is refused: moving the clock there
/// would put every later write in the future (the router refuses such times first).
async fn wait_for_time(shard: &Shard, t: ClusterTime) -> Result<(), MongoError> {
    let state = shard.state();
    let now = state.cluster_time();
    if t > now {
        return Err(MongoError::new(
            ErrorCode::INVALID_OPTIONS,
            format!(
                "readConcern atClusterTime value must not be greater than the current \
                 clusterTime. Requested clusterTime: Timestamp({}, {}); current clusterTime: \
                 Timestamp({}, {})",
                t.secs, t.inc, now.secs, now.inc
            ),
        ));
    }
    state.observe(t);
    let timed_out = MongoError::new(
        ErrorCode::EXCEEDED_TIME_LIMIT,
        "timed out waiting for the writes before the read's cluster time",
    );
    wait_until(|| state.high_water_mark() >= t, 10, timed_out).await
}

/// A read's `readConcern.afterClusterTime`.
fn after_cluster_time(cmd: &Document) -> Option<ClusterTime> {
    match cmd
        .get_document("readConcern")
        .ok()?
        .get("afterClusterTime")?
    {
        Bson::Timestamp(t) => Some(ClusterTime::from(*t)),
        _ => None,
    }
}

/// On a secondary (`follower`), a read after a cluster time waits until the member applied
/// everything up to it: a client that wrote at `t` reads its write (causal consistency). Within
/// the command's `maxTimeMS` (the interrupt layer), and never longer than 10 s.
async fn wait_for_follower(shard: &Shard, t: ClusterTime) -> Result<(), MongoError> {
    let state = shard.state();
    let timed_out = MongoError::new(
        ErrorCode::EXCEEDED_TIME_LIMIT,
        format!(
            "this secondary had not applied the writes up to the read's afterClusterTime \
             Timestamp({}, {}) within 10 s",
            t.secs, t.inc
        ),
    );
    wait_until(|| state.high_water_mark() >= t, 10, timed_out).await
}

/// Stamp: the reply carries the shard's cluster time and the command's `operationTime` (its
/// last write's, else the cluster time).
fn stamp(shard: &Shard, body: Body, op_time: Option<ClusterTime>) -> Body {
    let state = shard.state();
    let ct = state.cluster_time();
    // A secondary's read is as of what it applied, not of its clock.
    let op_time = op_time.unwrap_or_else(|| {
        if state.follows() {
            state.high_water_mark()
        } else {
            ct
        }
    });
    match body {
        Body::Document(mut reply) => {
            reply.insert("$clusterTime", crate::cluster_time_doc(ct));
            reply.insert("operationTime", op_time.timestamp());
            Body::Document(reply)
        }
        Body::Raw(mut reply) => {
            if let Ok(t) = RawDocumentBuf::try_from(&crate::cluster_time_doc(ct)) {
                reply.append(cstr!("$clusterTime"), t);
            }
            reply.append(cstr!("operationTime"), op_time.timestamp());
            Body::Raw(reply)
        }
        Body::Cursor(mut reply) => {
            if let Ok(t) = RawDocumentBuf::try_from(&crate::cluster_time_doc(ct)) {
                reply.doc.append(cstr!("$clusterTime"), t);
            }
            reply
                .doc
                .append(cstr!("operationTime"), op_time.timestamp());
            Body::Cursor(reply)
        }
    }
}
