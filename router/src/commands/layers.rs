//! The cross-cutting steps around every command, as layers: what runs before a command (the
//! clock, test fail points, the write concern, the snapshot pin), around it (authorisation,
//! session admission, `currentOp` and `maxTimeMS`, the stale-routing retry) and after it (the
//! transaction's abort on a refusal, the snapshot's `atClusterTime`, injected errors, cursor
//! ownership, transaction labels and the reply's cluster time). `commands::run` calls them in
//! one order, written there once.
//!
//! Owns [`Plan`], the per-request record the layers pass on: the error a layer injected (the
//! first one wins, but a fail point's replaces a clock error, as before), whether a fail point
//! gave that error its own labels (then no transaction label is added), a fail point's
//! `writeConcernError` and its cut of a batch's statements, and the pinned snapshot.
//!
//! Invariants: a request a layer failed still passes through every later layer's bookkeeping
//! and gets one error reply (never a dropped connection, but where a test fail point closes
//! it); fail points exist only with `--enableTestCommands`; every reply leaves with the
//! router's `$clusterTime` and `operationTime`.

use std::ops::ControlFlow;
use std::sync::Arc;

use bson::raw::cstr;
use bson::{Bson, Document, RawDocumentBuf, Timestamp};
use wire::raw::Body;
use wire::server::{ConnectionInfo, Request};
use wire::{ErrorCode, MongoError, Result};

use super::Ctx;
use crate::failpoint::{self, Action, TransactionalWrite};
use crate::seams::Seams;

/// What the layers before a command decided about it.
#[derive(Default)]
pub(super) struct Plan {
    /// The command is the handshake (`hello`).
    handshake: bool,
    /// The error the command answers with instead of running.
    injected: Option<MongoError>,
    /// The injected error's fail point gave its labels: it gets no others.
    labelled: bool,
    /// A `writeConcernError` to add to the reply, with its labels.
    write_concern_error: Option<(Document, Vec<String>)>,
    /// `onPrimaryTransactionalWrite`: where it cuts the statements, and how.
    cut: Option<TransactionalWrite>,
    /// The command has a statement list (`findAndModify` has none).
    batch: bool,
    /// The statements the cut keeps.
    truncated: Option<Document>,
    /// The snapshot read's pinned command and time.
    pinned: Option<(Document, Timestamp)>,
}

impl Plan {
    pub(super) fn new(handshake: bool) -> Plan {
        Plan {
            handshake,
            ..Plan::default()
        }
    }

    /// The command as it runs: pinned to its snapshot, or cut by a fail point, or as sent.
    pub(super) fn command<'a>(&'a self, sent: &'a Document) -> &'a Document {
        self.pinned
            .as_ref()
            .map(|(cmd, _)| cmd)
            .or(self.truncated.as_ref())
            .unwrap_or(sent)
    }
}

/// The clock: a client's signed `$clusterTime` is verified (`--auth`) and observed, the
/// router learns the config shard's time (a handshake does not wait for it), and a read's
/// `afterClusterTime` / `atClusterTime` must not be in the future.
pub(super) async fn clock(seams: &Seams, req: &Request, plan: &mut Plan) {
    let mut failed = if seams.options.auth {
        match seams.cluster_key().await {
            Ok(key) => seams.clock.verify_client(&req.body, key).err(),
            Err(e) => Some(e),
        }
    } else {
        None
    };
    if failed.is_none() {
        failed = seams
            .clock
            .observe_client(&req.body, seams.options.max_clock_drift)
            .err();
    }
    // A handshake does not wait for an unreachable config shard (it answers with the time
    // it has); anything else waits as a command to it would.
    seams
        .learn_cluster_time(if plan.handshake {
            std::time::Duration::ZERO
        } else {
            seams.options.patience.connect
        })
        .await;
    if failed.is_none() {
        failed = crate::kernel::clock::check_read_times(&req.body, seams.cluster_time()).err();
    }
    plan.injected = failed;
}

/// Test fail points (`--enableTestCommands`): `failCommand` (block, fail with or without its
/// own labels, add a `writeConcernError`, close the connection), `maxTimeAlwaysTimeOut` and
/// `onPrimaryTransactionalWrite`. `Break` when the connection closes instead of a reply.
pub(super) async fn fail_points(
    seams: &Seams,
    conn: &ConnectionInfo,
    req: &Request,
    name: &str,
    plan: &mut Plan,
) -> ControlFlow<()> {
    if plan.handshake {
        seams.app_names.note_handshake(conn.id, &req.body);
    }
    if !seams.options.enable_test_commands {
        plan.batch = failpoint::has_statement_list(&req.body);
        return ControlFlow::Continue(());
    }
    if let Some(triggered) = seams
        .failpoints
        .check_command(name, seams.app_names.get(conn.id).as_deref())
    {
        if let Some(d) = triggered.block {
            tokio::time::sleep(d).await;
        }
        plan.write_concern_error = triggered.write_concern_error;
        match triggered.action {
            Some(Action::CloseConnection) => return ControlFlow::Break(()),
            Some(Action::Fail {
                error,
                explicit_labels,
            }) => {
                plan.labelled = explicit_labels;
                plan.injected = Some(if explicit_labels {
                    error
                } else {
                    failpoint::with_server_labels(error, name, &req.body)
                });
            }
            None => {}
        }
    }
    // `onPrimaryTransactionalWrite`: the statements before the one it entered at run, that one
    // commits or fails (a write error), the rest do not run; the connection may then close.
    if let Some(e) = seams.failpoints.check_max_time(&req.body) {
        plan.injected.get_or_insert(e);
    }
    if plan.injected.is_none() {
        plan.cut = seams.failpoints.check_transactional_write(&req.body);
    }
    // `findAndModify` has no statement list: a failure is the command's error.
    plan.batch = failpoint::has_statement_list(&req.body);
    if !plan.batch
        && let Some(tw) = &plan.cut
    {
        match &tw.fail_before_commit {
            Some(_) if tw.close_connection => return ControlFlow::Break(()),
            Some(e) => plan.injected = Some(e.clone()),
            None => {}
        }
    }
    plan.truncated = plan.cut.as_ref().filter(|_| plan.batch).map(|tw| {
        let keep = tw.statement + usize::from(tw.fail_before_commit.is_none());
        failpoint::first_statements(&req.body, keep)
    });
    ControlFlow::Continue(())
}

/// A write concern no deployment of this router can satisfy gets its `writeConcernError`
/// (unless a fail point gave one). A `w` the shards can meet goes to them with the write: a
/// replicated shard's primary waits for that many members.
pub(super) fn write_concern(seams: &Seams, req: &Request, plan: &mut Plan) {
    if plan.write_concern_error.is_none() {
        let members = seams
            .transport
            .shards()
            .iter()
            .map(|s| s.client.members())
            .min()
            .unwrap_or(1);
        plan.write_concern_error =
            unsatisfiable_write_concern(&req.body, members).map(|wce| (wce, Vec::new()));
    }
}

/// A snapshot read outside a transaction is pinned to a cluster time here.
pub(super) fn snapshot(seams: &Seams, name: &str, req: &Request, plan: &mut Plan) {
    match crate::snapshot::pin(name, &req.body, || seams.cluster_time().timestamp()) {
        Ok(pinned) => plan.pinned = pinned,
        Err(e) => {
            plan.injected.get_or_insert(e);
        }
    }
}

/// Runs the command unless a layer before failed it: authorisation, session admission, then
/// (but for the handshake) listed by `currentOp` and bounded by `maxTimeMS` and `killOp`,
/// with one retry when a shard found the routing stale.
pub(super) async fn execute(ctx: &Ctx<'_>, plan: &Plan, req: &Request) -> Result<Body> {
    let (seams, conn, name) = (ctx.seams, ctx.conn, ctx.name);
    if let Some(e) = &plan.injected {
        return Err(e.clone());
    }
    if plan
        .truncated
        .as_ref()
        .is_some_and(|t| failpoint::statement_count(t) == 0)
    {
        // The fail point entered at the first statement, which fails: nothing runs.
        return Ok(Body::Document(bson::doc! {"n": 0, "ok": 1.0}));
    }
    crate::auth::check(&seams.auth_cx(), conn, name, &req.db, &req.body).await?;
    if name.is_empty() {
        return Err(MongoError::new(
            ErrorCode::FAILED_TO_PARSE,
            "empty command document",
        ));
    }
    seams
        .sessions
        .admit(name, &req.body, seams.cluster_time())?;
    note_session(seams, conn, name, &req.body);
    let run = async {
        match super::dispatch(ctx).await {
            // Another router changed the collection's routing (sharded it, or dropped and
            // recreated it): the shard refused before running anything. Reload and retry
            // once.
            Err(e) if e.code == ErrorCode::STALE_CONFIG.code => {
                seams.catalog.forget_database(&req.db);
                super::dispatch(ctx).await
            }
            other => other,
        }
    };
    if plan.handshake {
        return run.await;
    }
    // Listed by currentOp while it runs; killOp ends it, here and on the shards; so does its
    // maxTimeMS.
    let op = seams.ops.start(conn, name, &req.db, &req.body);
    let run = crate::kernel::transport::OPERATION_KEY.scope(op.key.clone(), run);
    let run = async {
        match commit_metadata(seams, conn, name, &req.body) {
            Some(meta) => {
                crate::kernel::transport::COMMIT_METADATA
                    .scope(std::sync::Arc::new(meta), run)
                    .await
            }
            None => run.await,
        }
    };
    tokio::select! {
        result = within_max_time(name, &req.body, run) => result,
        () = op.cancel.cancelled() => {
            // A getMore stopped halfway may have taken events it never returned: its
            // cursor ends with it, as a failed getMore's does.
            if name == "getMore"
                && let Ok(id) = req.body.get_i64("getMore")
                && let Some(cursor) = seams.cursors.remove(id)
            {
                cursor.lock().await.kill(seams.shards()).await;
            }
            Err(MongoError::new(
                ErrorCode::INTERRUPTED,
                format!("operation {} was interrupted by killOp", op.id),
            ))
        }
    }
}

/// The layers after a command, on its result: a transaction a statement was refused in is
/// aborted; a snapshot read's reply gets its `atClusterTime`; injected write concern and write
/// errors are added (or the connection closes); cursor ownership is recorded (`--auth`); a
/// transaction's reply gets its recovery token, its error the transaction labels; the reply
/// gets the router's cluster time. `None` when the connection closes instead.
pub(super) async fn after(
    seams: &Arc<Seams>,
    conn: &ConnectionInfo,
    req: &Request,
    name: &str,
    plan: Plan,
    result: Result<Body>,
) -> Option<Body> {
    let in_txn = crate::txn::in_transaction(&req.body);
    if in_txn
        && let Err(e) = &result
        && e.code == crate::txn::OPERATION_NOT_SUPPORTED_IN_TRANSACTION.code
    {
        crate::txn::abort_after_refusal(seams.shards(), &req.body).await;
    }
    let result = match plan.pinned {
        Some((_, at)) => result.map(|r| crate::snapshot::stamp(r, at)),
        None => result,
    };
    let result = match plan.write_concern_error {
        Some((wce, labels)) => {
            result.map(|r| with_write_concern_error(r, wce, labels, name, &req.body))
        }
        // A shard's (a replicated shard's `w: N` not met) gets the server's labels.
        None => result.map(|r| match shard_write_concern_error(&r) {
            Some(wce) => with_write_concern_error(r, wce, Vec::new(), name, &req.body),
            None => r,
        }),
    };
    let result = match &plan.cut {
        Some(tw) if plan.batch => match &tw.fail_before_commit {
            Some(e) => result.map(|r| failpoint::with_write_error(r, tw.statement, e)),
            None => result,
        },
        _ => result,
    };
    if plan.cut.as_ref().is_some_and(|tw| tw.close_connection) {
        return None;
    }
    if seams.options.auth
        && let Ok(reply) = &result
    {
        note_cursor(seams, conn, name, &req.body, reply);
    }
    let reply = match result {
        Ok(reply) if in_txn => with_recovery_token(seams, &req.body, reply),
        Ok(reply) => reply,
        Err(e) if in_txn && !plan.labelled => {
            Body::Document(crate::txn::label(name, e).to_document())
        }
        Err(e) => Body::Document(e.to_document()),
    };
    Some(finish_reply(seams, reply))
}

/// What a write records of who made it, for change streams' `commitMetadata`: the
/// connection's user and its database, the application's name from its handshake, and the
/// command's `comment` (for a transaction, its `commitTransaction`'s), each only when known;
/// `None` for other commands, or when nothing is known.
fn commit_metadata(
    seams: &Seams,
    conn: &ConnectionInfo,
    name: &str,
    body: &bson::Document,
) -> Option<bson::Document> {
    if !matches!(
        name,
        "insert"
            | "update"
            | "delete"
            | "findAndModify"
            | "findandmodify"
            | "aggregate"
            | "commitTransaction"
    ) || !crate::kernel::transport::record_commit_metadata()
    {
        return None;
    }
    let mut meta = bson::Document::new();
    if let Some((user, db)) = seams.auth.users_of(conn.id).into_iter().next() {
        meta.insert("user", user);
        meta.insert("authenticatedDb", db);
    }
    if let Some(app) = seams.app_names.get(conn.id) {
        meta.insert("appName", &*app);
    }
    if let Some(comment) = body.get("comment") {
        meta.insert("comment", comment.clone());
    }
    (!meta.is_empty()).then_some(meta)
}

/// Runs a command within its `maxTimeMS` (50 when it runs out): the router's own work
/// checks the deadline as it goes (`pipeline::interrupt`), and waiting on shards stops at it
/// (the shards were sent the same `maxTimeMS` and stop their part by themselves). A getMore's
/// `maxTimeMS` is how long an awaitData cursor waits, not a limit.
async fn within_max_time(
    name: &str,
    cmd: &Document,
    run: impl std::future::Future<Output = Result<Body>>,
) -> Result<Body> {
    use pipeline::interrupt::{Interrupt, Interruptible, max_time_expired, max_time_ms};
    if name == "getMore" {
        return run.await;
    }
    let Some(ms) = max_time_ms(cmd)? else {
        return run.await;
    };
    let limit = std::time::Duration::from_millis(ms);
    let deadline = std::time::Instant::now() + limit;
    let run = Interruptible::new(Interrupt::deadline(Some(deadline)), run);
    match tokio::time::timeout(limit, run).await {
        Ok(result) => result,
        Err(_) => Err(max_time_expired()),
    }
}

/// Keeps the router's session cache: a command's `lsid` is a use of that session;
/// `endSessions` and `killAllSessions` forget sessions.
fn note_session(seams: &Seams, conn: &ConnectionInfo, name: &str, cmd: &Document) {
    use crate::local_sessions::session_id;
    let sessions = &seams.local_sessions;
    match name {
        "endSessions" => {
            let ids: Vec<_> = cmd
                .get_array("endSessions")
                .map(|a| a.iter().filter_map(session_id).collect())
                .unwrap_or_default();
            sessions.end(&ids, &super::session_user(seams, conn));
        }
        "killAllSessions" => sessions.clear(),
        _ => {
            if let Some(id) = cmd.get("lsid").and_then(session_id) {
                sessions.touch(id, super::session_user(seams, conn), bson::DateTime::now());
            }
        }
    }
}

/// The `writeConcernError` a shard put in a reply the router built, if any.
fn shard_write_concern_error(reply: &Body) -> Option<Document> {
    match reply {
        Body::Document(d) if !d.contains_key("errorLabels") => {
            d.get_document("writeConcernError").ok().cloned()
        }
        _ => None,
    }
}

/// A reply with an injected `writeConcernError` (the command ran): the fail point's labels,
/// else the server's own (a retryable write's retryable code is `RetryableWriteError`).
fn with_write_concern_error(
    reply: Body,
    wce: Document,
    labels: Vec<String>,
    name: &str,
    cmd: &Document,
) -> Body {
    let mut labels = labels;
    if labels.is_empty() {
        let code = wce.get("code").and_then(Bson::as_i32).unwrap_or(0);
        let probe = failpoint::with_server_labels(MongoError::with_code(code, ""), name, cmd);
        labels = probe.labels;
    }
    let mut fields = bson::doc! {"writeConcernError": wce};
    if !labels.is_empty() {
        fields.insert("errorLabels", labels);
    }
    match reply {
        Body::Document(mut d) => {
            d.extend(fields);
            Body::Document(d)
        }
        Body::Raw(mut raw) => {
            append_fields(&mut raw, &fields);
            Body::Raw(raw)
        }
        Body::Cursor(mut c) => {
            let mut raw = RawDocumentBuf::new();
            append_fields(&mut raw, &fields);
            for (key, value) in raw.iter().flatten() {
                c.doc.append(key, value);
            }
            Body::Cursor(c)
        }
    }
}

/// Appends `fields` to an encoded reply.
fn append_fields(raw: &mut RawDocumentBuf, fields: &Document) {
    match RawDocumentBuf::try_from(fields) {
        Ok(encoded) => {
            for (key, value) in encoded.iter().flatten() {
                raw.append(key, value);
            }
        }
        Err(e) => tracing::error!(error = %e, "reply fields that do not encode"),
    }
}

/// The `writeConcernError` a command's write concern earns on a deployment whose smallest
/// shard has `members` data-bearing members: the command runs, and a `w` above them is
/// `UnsatisfiableWriteConcern`, a tag other than `majority` `UnknownReplWriteConcern`.
fn unsatisfiable_write_concern(cmd: &Document, members: usize) -> Option<Document> {
    let w = cmd.get_document("writeConcern").ok()?.get("w")?;
    let error = match w {
        Bson::String(tag) if tag != "majority" => MongoError::new(
            ErrorCode::UNKNOWN_REPL_WRITE_CONCERN,
            format!("No write concern mode named '{tag}' found in replica set configuration"),
        ),
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_)
            if pipeline::value::as_f64(w).is_some_and(|n| n > members as f64) =>
        {
            MongoError::new(
                ErrorCode::UNSATISFIABLE_WRITE_CONCERN,
                "Not enough data-bearing nodes",
            )
        }
        _ => return None,
    };
    Some(bson::doc! {"code": error.code, "codeName": error.code_name, "errmsg": error.errmsg})
}

/// An `ok` reply inside a transaction names the shard that can finish it (`recoveryToken`).
fn with_recovery_token(seams: &Seams, cmd: &Document, reply: Body) -> Body {
    let Some(token) = crate::txn::recovery_token(seams.shards(), cmd) else {
        return reply;
    };
    match reply {
        Body::Document(mut d) => {
            if d.get("ok")
                .and_then(Bson::as_f64)
                .is_some_and(|ok| ok == 1.0)
                || d.get("ok").and_then(Bson::as_i32) == Some(1)
            {
                d.insert("recoveryToken", token);
            }
            Body::Document(d)
        }
        Body::Raw(mut raw) => {
            if let Ok(t) = RawDocumentBuf::try_from(&token) {
                raw.append(cstr!("recoveryToken"), t);
            }
            Body::Raw(raw)
        }
        Body::Cursor(mut c) => {
            if let Ok(t) = RawDocumentBuf::try_from(&token) {
                c.doc.append(cstr!("recoveryToken"), t);
            }
            Body::Cursor(c)
        }
    }
}

/// Replaces whatever time fields a shard put in the reply with the router's. An encoded reply
/// is the router's own (it has `ok` and no time fields): they are appended.
fn finish_reply(seams: &Seams, reply: Body) -> Body {
    let now = seams.clock.now();
    let gossip = match seams.cluster_key.get() {
        Some(key) if seams.options.auth => seams.clock.gossip_signed(key),
        _ => seams.clock.gossip(),
    };
    match reply {
        Body::Document(mut reply) => {
            reply.remove("$clusterTime");
            reply.remove("operationTime");
            if !reply.contains_key("ok") {
                reply.insert("ok", 1.0);
            }
            reply.insert("$clusterTime", gossip);
            reply.insert("operationTime", Bson::Timestamp(now.timestamp()));
            Body::Document(reply)
        }
        Body::Raw(mut reply) => {
            match RawDocumentBuf::try_from(&gossip) {
                Ok(gossip) => reply.append(cstr!("$clusterTime"), gossip),
                Err(e) => tracing::error!(error = %e, "the cluster time is not serialisable"),
            }
            reply.append(cstr!("operationTime"), now.timestamp());
            Body::Raw(reply)
        }
        Body::Cursor(mut reply) => {
            match RawDocumentBuf::try_from(&gossip) {
                Ok(gossip) => reply.doc.append(cstr!("$clusterTime"), gossip),
                Err(e) => tracing::error!(error = %e, "the cluster time is not serialisable"),
            }
            reply.doc.append(cstr!("operationTime"), now.timestamp());
            Body::Cursor(reply)
        }
    }
}

/// Records who opened the cursor a reply returns, and forgets the ones it ends (`--auth`).
fn note_cursor(seams: &Seams, conn: &ConnectionInfo, name: &str, cmd: &Document, reply: &Body) {
    let id = match reply {
        Body::Document(d) => d
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get_i64("id").ok()),
        Body::Raw(r) => r
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get_i64("id").ok()),
        Body::Cursor(c) => Some(c.id),
    };
    match (name, id) {
        ("getMore", Some(0)) => {
            if let Ok(id) = cmd.get_i64("getMore") {
                seams.auth.closed_cursor(id);
            }
        }
        ("killCursors", _) => {
            for id in cmd
                .get_array("cursors")
                .map(|c| c.iter().filter_map(Bson::as_i64).collect::<Vec<_>>())
                .unwrap_or_default()
            {
                seams.auth.closed_cursor(id);
            }
        }
        ("getMore", _) | (_, None) | (_, Some(0)) => {}
        (_, Some(id)) => seams.auth.opened_cursor(conn.id, id, &seams.cursors),
    }
}
