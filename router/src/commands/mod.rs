//! Command dispatch: one driver command in, one reply document out.
//!
//! Invariants: every reply carries the router's `$clusterTime` and an `operationTime`; a failure
//! anywhere becomes a MongoDB error document (never a dropped connection or a panic); the cluster
//! time of every incoming command is observed before it runs.

mod admin;
mod aggregate;
mod args;
mod crud;
mod current_op;
mod ddl;
mod explain;
mod fields;
mod find;
mod handshake;
mod out;
mod stats;
mod views;

use std::sync::Arc;

use bson::raw::cstr;
use bson::{Bson, Document, RawDocumentBuf};
use pipeline::agg::spill;
use wire::raw::Body;
use wire::server::{ConnectionInfo, Request};
use wire::{ErrorCode, MongoError, Result};

use crate::failpoint::{self, Action};
use crate::kernel::transport::Shards;
use crate::router::Router;

pub(crate) use args::Args;

/// What a command handler gets.
pub(crate) struct Ctx<'a> {
    pub router: &'a Arc<Router>,
    pub conn: &'a ConnectionInfo,
    pub db: &'a str,
    pub cmd: &'a Document,
    /// The command's name as sent (first key).
    pub name: &'a str,
}

impl Ctx<'_> {
    pub fn args(&self) -> Args<'_> {
        Args::new(self.cmd, self.name)
    }
}

/// Runs one request and returns the reply (with `$clusterTime` and `operationTime`), or `None`
/// when a test fail point closes the connection instead.
pub async fn run(router: &Arc<Router>, conn: &ConnectionInfo, req: &Request) -> Option<Body> {
    let name = req.body.keys().next().map(String::as_str).unwrap_or("");
    let mut injected = if router.options.auth {
        match router.cluster_key().await {
            Ok(key) => router.clock.verify_client(&req.body, key).err(),
            Err(e) => Some(e),
        }
    } else {
        None
    };
    if injected.is_none() {
        injected = router
            .clock
            .observe_client(&req.body, router.options.max_clock_drift)
            .err();
    }
    // A handshake does not wait for an unreachable config shard (it answers with the time
    // it has); anything else waits as a command to it would.
    let handshake = matches!(name, "hello" | "isMaster" | "ismaster");
    router
        .learn_cluster_time(if handshake {
            std::time::Duration::ZERO
        } else {
            router.options.patience.connect
        })
        .await;
    if injected.is_none() {
        injected = crate::kernel::clock::check_read_times(&req.body, router.cluster_time()).err();
    }
    let mut write_concern_error = None;
    // An injected error whose fail point gave its labels gets no others.
    let mut labelled = false;
    if router.options.enable_test_commands && matches!(name, "hello" | "isMaster" | "ismaster") {
        router.failpoints.note_handshake(conn.id, &req.body);
    }
    if router.options.enable_test_commands
        && let Some(triggered) = router
            .failpoints
            .check_command(name, router.failpoints.app_name(conn.id).as_deref())
    {
        if let Some(d) = triggered.block {
            tokio::time::sleep(d).await;
        }
        write_concern_error = triggered.write_concern_error;
        match triggered.action {
            Some(Action::CloseConnection) => return None,
            Some(Action::Fail {
                error,
                explicit_labels,
            }) => {
                labelled = explicit_labels;
                injected = Some(if explicit_labels {
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
    let mut cut = None;
    if router.options.enable_test_commands {
        if let Some(e) = router.failpoints.check_max_time(&req.body) {
            injected.get_or_insert(e);
        }
        if injected.is_none() {
            cut = router.failpoints.check_transactional_write(&req.body);
        }
    }
    // `findAndModify` has no statement list: a failure is the command's error.
    let batch = failpoint::has_statement_list(&req.body);
    if !batch && let Some(tw) = &cut {
        match &tw.fail_before_commit {
            Some(_) if tw.close_connection => return None,
            Some(e) => injected = Some(e.clone()),
            None => {}
        }
    }
    let truncated = cut.as_ref().filter(|_| batch).map(|tw| {
        let keep = tw.statement + usize::from(tw.fail_before_commit.is_none());
        failpoint::first_statements(&req.body, keep)
    });
    if write_concern_error.is_none() {
        write_concern_error = unsatisfiable_write_concern(&req.body).map(|wce| (wce, Vec::new()));
    }
    let pinned = match crate::snapshot::pin(router, name, &req.body) {
        Ok(p) => p,
        Err(e) => {
            injected.get_or_insert(e);
            None
        }
    };
    let ctx = Ctx {
        router,
        conn,
        db: &req.db,
        cmd: pinned
            .as_ref()
            .map(|(cmd, _)| cmd)
            .or(truncated.as_ref())
            .unwrap_or(&req.body),
        name,
    };
    let result = if let Some(e) = injected {
        Err(e)
    } else if truncated
        .as_ref()
        .is_some_and(|t| failpoint::statement_count(t) == 0)
    {
        // The fail point entered at the first statement, which fails: nothing runs.
        Ok(Body::Document(bson::doc! {"n": 0, "ok": 1.0}))
    } else if let Err(e) = crate::auth::check(router, conn, name, &req.db, &req.body).await {
        Err(e)
    } else if name.is_empty() {
        Err(MongoError::new(
            ErrorCode::FAILED_TO_PARSE,
            "empty command document",
        ))
    } else if let Err(e) = router
        .sessions
        .admit(name, &req.body, router.cluster_time())
    {
        Err(e)
    } else {
        note_session(router, conn, name, &req.body);
        let run = async {
            match dispatch(&ctx).await {
                // Another router changed the collection's routing (sharded it, or dropped and
                // recreated it): the shard refused before running anything. Reload and retry
                // once.
                Err(e) if e.code == ErrorCode::STALE_CONFIG.code => {
                    router.catalog.forget_database(&req.db);
                    dispatch(&ctx).await
                }
                other => other,
            }
        };
        if matches!(name, "hello" | "isMaster" | "ismaster") {
            run.await
        } else {
            // Listed by currentOp while it runs; killOp ends it, here and on the shards; so
            // does its maxTimeMS.
            let op = router.ops.start(conn, name, &req.db, &req.body);
            let run = crate::kernel::transport::OPERATION_KEY.scope(op.key.clone(), run);
            tokio::select! {
                result = within_max_time(name, &req.body, run) => result,
                () = op.cancel.cancelled() => {
                    // A getMore stopped halfway may have taken events it never returned: its
                    // cursor ends with it, as a failed getMore's does.
                    if name == "getMore"
                        && let Ok(id) = req.body.get_i64("getMore")
                        && let Some(cursor) = router.cursors.remove(id)
                    {
                        cursor.lock().await.kill(router).await;
                    }
                    Err(MongoError::new(
                        ErrorCode::INTERRUPTED,
                        format!("operation {} was interrupted by killOp", op.id),
                    ))
                }
            }
        }
    };
    let in_txn = crate::txn::in_transaction(&req.body);
    if in_txn
        && let Err(e) = &result
        && e.code == crate::txn::OPERATION_NOT_SUPPORTED_IN_TRANSACTION.code
    {
        crate::txn::abort_after_refusal(router, &req.body).await;
    }
    let result = match pinned {
        Some((_, at)) => result.map(|r| crate::snapshot::stamp(r, at)),
        None => result,
    };
    let result = match write_concern_error {
        Some((wce, labels)) => {
            result.map(|r| with_write_concern_error(r, wce, labels, name, &req.body))
        }
        None => result,
    };
    let result = match &cut {
        Some(tw) if batch => match &tw.fail_before_commit {
            Some(e) => result.map(|r| failpoint::with_write_error(r, tw.statement, e)),
            None => result,
        },
        _ => result,
    };
    if cut.as_ref().is_some_and(|tw| tw.close_connection) {
        return None;
    }
    if router.options.auth
        && let Ok(reply) = &result
    {
        note_cursor(router, conn, name, &req.body, reply);
    }
    let reply = match result {
        Ok(reply) if in_txn => with_recovery_token(router, &req.body, reply),
        Ok(reply) => reply,
        Err(e) if in_txn && !labelled => Body::Document(crate::txn::label(name, e).to_document()),
        Err(e) => Body::Document(e.to_document()),
    };
    Some(finish_reply(router, reply))
}

/// Tells every shard to stop what it runs for a killed operation (`_killOperations`), in the
/// background: the client's reply does not wait for it.
pub(crate) fn kill_on_shards(router: &Arc<Router>, key: bson::Binary) {
    let transport = router.transport.clone();
    router.services.spawn("kill_on_shards", async move {
        let all = transport.all();
        let cmd = bson::doc! {"_killOperations": 1, "operationKeys": [key]};
        for reply in transport.broadcast(&all, "admin", &cmd).await {
            if let Err(e) = reply {
                tracing::debug!(error = %e, "telling a shard of a killed operation");
            }
        }
    });
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

/// Whether `name` is a command this router runs (its canonical name or an alias): the
/// metrics label commands by name only then, so no client can grow the label set.
pub(crate) fn is_known(name: &str) -> bool {
    admin::COMMANDS.contains(&name)
        || matches!(
            name,
            "ismaster"
                | "buildinfo"
                | "findandmodify"
                | "collstats"
                | "dbstats"
                | "deleteIndexes"
                | "shardcollection"
                | "enablesharding"
                | "getnonce"
                | "configureFailPoint"
        )
}

/// The caller's `user@db` when the router authenticates its clients.
fn router_auth_user(ctx: &Ctx<'_>) -> Option<String> {
    ctx.router
        .options
        .auth
        .then(|| session_user(ctx.router, ctx.conn))
}

/// The user a connection's sessions belong to: `user@db` of its first authenticated user, or
/// empty.
pub(crate) fn session_user(router: &Router, conn: &ConnectionInfo) -> String {
    router
        .auth
        .users_of(conn.id)
        .into_iter()
        .next()
        .map(|(user, db)| format!("{user}@{db}"))
        .unwrap_or_default()
}

/// Stamps a command's session with its owner, as mongos does: `lsid.uid` becomes the SHA-256
/// of the connection's `user@db` (of the empty name without a user), whatever the client put
/// there. Every shard then keys the session by who owns it, and `killAllSessions` of a user
/// finds that user's transactions and operations, here and on the shards.
pub(crate) fn stamp_session_owner(router: &Router, conn: &ConnectionInfo, cmd: &mut Document) {
    if let Ok(lsid) = cmd.get_document_mut("lsid")
        && lsid.contains_key("id")
    {
        let owner = crate::local_sessions::uid(&session_user(router, conn));
        lsid.insert("uid", Bson::Binary(owner));
    }
}

/// Keeps the router's session cache: a command's `lsid` is a use of that session;
/// `endSessions` and `killAllSessions` forget sessions.
fn note_session(router: &Router, conn: &ConnectionInfo, name: &str, cmd: &Document) {
    use crate::local_sessions::session_id;
    let sessions = &router.local_sessions;
    match name {
        "endSessions" => {
            let ids: Vec<_> = cmd
                .get_array("endSessions")
                .map(|a| a.iter().filter_map(session_id).collect())
                .unwrap_or_default();
            sessions.end(&ids, &session_user(router, conn));
        }
        "killAllSessions" => sessions.clear(),
        _ => {
            if let Some(id) = cmd.get("lsid").and_then(session_id) {
                sessions.touch(id, session_user(router, conn), bson::DateTime::now());
            }
        }
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

/// The `writeConcernError` a command's write concern earns on a deployment whose shards are
/// one data-bearing node each, as a one-node replica set answers it: the command runs, and
/// `w` above one node is `UnsatisfiableWriteConcern`, a tag other than `majority`
/// `UnknownReplWriteConcern`.
fn unsatisfiable_write_concern(cmd: &Document) -> Option<Document> {
    let w = cmd.get_document("writeConcern").ok()?.get("w")?;
    let error = match w {
        Bson::String(tag) if tag != "majority" => MongoError::new(
            ErrorCode::UNKNOWN_REPL_WRITE_CONCERN,
            format!("No write concern mode named '{tag}' found in replica set configuration"),
        ),
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_)
            if pipeline::value::as_f64(w).is_some_and(|n| n > 1.0) =>
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
fn with_recovery_token(router: &Router, cmd: &Document, reply: Body) -> Body {
    let Some(token) = crate::txn::recovery_token(router, cmd) else {
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
fn finish_reply(router: &Router, reply: Body) -> Body {
    let now = router.clock.now();
    let gossip = match router.cluster_key.get() {
        Some(key) if router.options.auth => router.clock.gossip_signed(key),
        _ => router.clock.gossip(),
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
fn note_cursor(router: &Router, conn: &ConnectionInfo, name: &str, cmd: &Document, reply: &Body) {
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
                router.auth.closed_cursor(id);
            }
        }
        ("killCursors", _) => {
            for id in cmd
                .get_array("cursors")
                .map(|c| c.iter().filter_map(Bson::as_i64).collect::<Vec<_>>())
                .unwrap_or_default()
            {
                router.auth.closed_cursor(id);
            }
        }
        ("getMore", _) | (_, None) | (_, Some(0)) => {}
        (_, Some(id)) => router.auth.opened_cursor(conn.id, id, &router.cursors),
    }
}

async fn dispatch(ctx: &Ctx<'_>) -> Result<Body> {
    fields::check(ctx.name, ctx.cmd)?;
    let out = match ctx.name {
        "getMore" => find::get_more(ctx).await,
        "find" => find::find(ctx).await,
        "aggregate" => find::aggregate(ctx).await,
        _ => dispatch_document(ctx).await.map(Body::Document),
    };
    // A read that met a view runs again over the view's source (see `views`).
    match out {
        Err(e) if matches!(ctx.name, "find" | "count" | "distinct" | "aggregate") => {
            match shard::views::resolved(&e) {
                Some((source, pipeline)) => views::run(ctx, &source, pipeline).await,
                None => Err(e),
            }
        }
        other => other,
    }
}

async fn dispatch_document(ctx: &Ctx<'_>) -> Result<Document> {
    match ctx.name {
        "hello" | "isMaster" | "ismaster" => {
            let mut reply = handshake::hello(ctx)?;
            crate::auth::augment_hello(ctx.router, ctx.conn, ctx.cmd, &mut reply).await?;
            Ok(reply)
        }
        "saslStart" => crate::auth::sasl_start(ctx.router, ctx.conn, ctx.db, ctx.cmd).await,
        "saslContinue" => crate::auth::sasl_continue(ctx.router, ctx.conn, ctx.cmd),
        "logout" => Ok(crate::auth::logout(ctx.router, ctx.conn)),
        "createUser" => crate::auth::create_user(ctx.router, ctx.db, ctx.cmd).await,
        "updateUser" => crate::auth::update_user(ctx.router, ctx.db, ctx.cmd).await,
        "dropUser" => crate::auth::drop_user(ctx.router, ctx.db, ctx.cmd).await,
        "usersInfo" => crate::auth::users_info(ctx.router, ctx.db, ctx.cmd).await,
        "grantRolesToUser" => crate::auth::change_roles(ctx.router, ctx.db, ctx.cmd, true).await,
        "revokeRolesFromUser" => {
            crate::auth::change_roles(ctx.router, ctx.db, ctx.cmd, false).await
        }
        "createRole" => crate::auth::custom::create_role(ctx.router, ctx.db, ctx.cmd).await,
        "updateRole" => crate::auth::custom::update_role(ctx.router, ctx.db, ctx.cmd).await,
        "dropRole" => crate::auth::custom::drop_role(ctx.router, ctx.db, ctx.cmd).await,
        "rolesInfo" => crate::auth::custom::roles_info(ctx.router, ctx.db, ctx.cmd).await,
        "grantPrivilegesToRole" => {
            crate::auth::custom::change_privileges(ctx.router, ctx.db, ctx.cmd, true).await
        }
        "revokePrivilegesFromRole" => {
            crate::auth::custom::change_privileges(ctx.router, ctx.db, ctx.cmd, false).await
        }
        "grantRolesToRole" => {
            crate::auth::custom::change_inherited(ctx.router, ctx.db, ctx.cmd, true).await
        }
        "revokeRolesFromRole" => {
            crate::auth::custom::change_inherited(ctx.router, ctx.db, ctx.cmd, false).await
        }
        "ping" => Ok(ok()),
        "buildInfo" | "buildinfo" => handshake::build_info(),
        "getParameter" => crate::parameters::get(ctx.router, ctx.cmd),
        "setParameter"
            if ctx.cmd.contains_key("ttlMonitorSleepSecs")
                || spill::LIMIT_PARAMETERS
                    .iter()
                    .any(|p| ctx.cmd.contains_key(p)) =>
        {
            admin::admin_only(ctx)?;
            admin::set_shard_parameter(ctx).await
        }
        "setParameter" => {
            admin::admin_only(ctx)?;
            crate::parameters::set(ctx.router, ctx.cmd)
        }
        "getCmdLineOpts" => admin::get_cmd_line_opts(ctx),
        "currentOp" => current_op::current_op(ctx),
        "killOp" => current_op::kill_op(ctx),
        "setClusterParameter" => admin::set_cluster_parameter(ctx).await,
        "getClusterParameter" => admin::get_cluster_parameter(ctx).await,
        "serverStatus" => admin::server_status(ctx).await,
        "hostInfo" => admin::host_info(),
        "whatsmyuri" => Ok(bson::doc! {"you": ctx.conn.peer.to_string(), "ok": 1.0}),
        "listDatabases" => admin::list_databases(ctx).await,
        "dbStats" | "dbstats" => stats::db_stats(ctx).await,
        "connectionStatus" => admin::connection_status(ctx),
        "collStats" | "collstats" => stats::coll_stats(ctx).await,
        "validate" => stats::validate(ctx).await,
        "endSessions" | "killAllSessions" | "killSessions" => {
            let own = router_auth_user(ctx).map(|user| ctx.router.local_sessions.ids_of(&user));
            crate::txn::kill_sessions(ctx.router, ctx.name, ctx.cmd, own).await
        }
        "refreshSessions" => admin::refresh_sessions(ctx).await,
        "startSession" => admin::start_session(ctx),
        "listCommands" => admin::list_commands(),
        "getLog" => admin::get_log(ctx),
        "insert" => crud::insert(ctx).await,
        "update" => crud::update(ctx).await,
        "delete" => crud::delete(ctx).await,
        "findAndModify" | "findandmodify" => crud::find_and_modify(ctx).await,
        "killCursors" => find::kill_cursors(ctx).await,
        "count" => find::count(ctx).await,
        "explain" => explain::explain(ctx).await,
        "distinct" => find::distinct(ctx).await,
        "create" => ddl::create(ctx).await,
        "drop" => ddl::drop(ctx).await,
        "dropDatabase" => ddl::drop_database(ctx).await,
        "renameCollection" => ddl::rename_collection(ctx).await,
        "listCollections" => ddl::list_collections(ctx).await,
        "createIndexes" => ddl::create_indexes(ctx).await,
        "dropIndexes" | "deleteIndexes" => ddl::drop_indexes(ctx).await,
        "listIndexes" => ddl::list_indexes(ctx).await,
        "collMod" => ddl::coll_mod(ctx).await,
        "enableSharding" | "enablesharding" => ddl::enable_sharding(ctx).await,
        "shardCollection" | "shardcollection" => ddl::shard_collection(ctx).await,
        "listShards" => admin::list_shards(ctx),
        "commitTransaction" => crate::txn::commit(ctx.router, ctx.cmd).await,
        "abortTransaction" => crate::txn::abort(ctx.router, ctx.cmd).await,
        "configureFailPoint" if ctx.router.options.enable_test_commands => {
            admin::configure_fail_point(ctx)
        }
        other => Err(MongoError::new(
            ErrorCode::COMMAND_NOT_FOUND,
            format!("no such command: '{other}'"),
        )),
    }
}

/// `{ok: 1}`.
pub(crate) fn ok() -> Document {
    bson::doc! {"ok": 1.0}
}
