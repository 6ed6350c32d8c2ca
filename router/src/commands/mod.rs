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
mod feeds;
mod fields;
mod find;
mod handshake;
mod layers;
mod out;
mod reads;
mod stats;
pub(crate) mod status;
mod subscriptions;
mod views;

use std::sync::Arc;

use bson::{Bson, Document};
use pipeline::agg::spill;
use wire::raw::Body;
use wire::server::{ConnectionInfo, Request};
use wire::{ErrorCode, MongoError, Result};

use crate::command::Command;
use crate::seams::Seams;

pub(crate) use args::Args;

/// What a command handler gets.
pub(crate) struct Ctx<'a> {
    pub seams: &'a Arc<Seams>,
    pub conn: &'a ConnectionInfo,
    pub db: &'a str,
    pub cmd: &'a Document,
    /// The command's name as sent (first key).
    pub name: &'a str,
    /// The command that name denotes, if any.
    pub command: Option<Command>,
}

impl Ctx<'_> {
    pub fn args(&self) -> Args<'_> {
        Args::new(self.cmd, self.name)
    }
}

/// Runs one request and returns the reply (with `$clusterTime` and `operationTime`), or `None`
/// when a test fail point closes the connection instead. The cross-cutting steps are
/// [`layers`], in this order, written only here: the clock, fail points, the write concern and
/// the snapshot pin before; authorisation, sessions, `currentOp` and `maxTimeMS` and the
/// stale-routing retry around [`dispatch`]; then what the reply gets.
pub async fn run(seams: &Arc<Seams>, conn: &ConnectionInfo, req: &Request) -> Option<Body> {
    let name = req.body.keys().next().map(String::as_str).unwrap_or("");
    let command = Command::named(name);
    let mut plan = layers::Plan::new(command.is_some_and(Command::is_handshake));
    layers::clock(seams, req, &mut plan).await;
    if layers::fail_points(seams, conn, req, name, &mut plan)
        .await
        .is_break()
    {
        return None;
    }
    layers::write_concern(seams, req, &mut plan);
    layers::snapshot(seams, name, req, &mut plan);
    let result = {
        let ctx = Ctx {
            seams,
            conn,
            db: &req.db,
            cmd: plan.command(&req.body),
            name,
            command,
        };
        layers::execute(&ctx, &plan, req).await
    };
    layers::after(seams, conn, req, name, plan, result).await
}

/// The caller's `user@db` when the router authenticates its clients.
fn router_auth_user(ctx: &Ctx<'_>) -> Option<String> {
    ctx.seams
        .options
        .auth
        .then(|| session_user(ctx.seams, ctx.conn))
}

/// The user a connection's sessions belong to: `user@db` of its first authenticated user, or
/// empty.
pub(crate) fn session_user(seams: &Seams, conn: &ConnectionInfo) -> String {
    seams
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
pub(crate) fn stamp_session_owner(seams: &Seams, conn: &ConnectionInfo, cmd: &mut Document) {
    if let Ok(lsid) = cmd.get_document_mut("lsid")
        && lsid.contains_key("id")
    {
        let owner = crate::local_sessions::uid(&session_user(seams, conn));
        lsid.insert("uid", Bson::Binary(owner));
    }
}

/// Runs the command `ctx` names, once its fields and its transaction rule allow it; a read that
/// met a view runs again over the view's source (see `views`).
async fn dispatch(ctx: &Ctx<'_>) -> Result<Body> {
    let command = ctx
        .command
        .filter(|c| !c.test_only() || ctx.seams.options.enable_test_commands)
        .ok_or_else(|| {
            MongoError::new(
                ErrorCode::COMMAND_NOT_FOUND,
                format!("no such command: '{}'", ctx.name),
            )
        })?;
    fields::check(command, ctx.name, ctx.cmd)?;
    refuse_reserved(command, ctx)?;
    if crate::txn::in_transaction(ctx.cmd) {
        command.check_transaction(ctx.name)?;
    }
    match run_command(command, ctx).await {
        Err(e)
            if matches!(
                command,
                Command::Find | Command::Count | Command::Distinct | Command::Aggregate
            ) =>
        {
            match shard::views::resolved(&e) {
                Some((source, pipeline)) => views::run(ctx, &source, pipeline).await,
                None => Err(e),
            }
        }
        other => other,
    }
}

/// The subscriptions' state collections are read-only to users (9105): their writes and DDL
/// are refused.
fn refuse_reserved(command: Command, ctx: &Ctx<'_>) -> Result<()> {
    use crate::subscriptions::spec::is_reserved;
    use Command::*;
    let target = match command {
        Insert | Update | Delete | FindAndModify | Create | Drop | CreateIndexes | DropIndexes
        | CollMod => ctx.cmd.get_str(ctx.name).ok().map(|c| (ctx.db, c)),
        RenameCollection => ["renameCollection", "to"]
            .iter()
            .filter_map(|f| ctx.cmd.get_str(f).ok()?.split_once('.'))
            .find(|(db, coll)| is_reserved(db, coll)),
        _ => None,
    };
    match target {
        Some((db, coll)) if is_reserved(db, coll) => Err(crate::subscriptions::errors::reserved(
            &format!("{db}.{coll}"),
        )),
        _ => Ok(()),
    }
}

/// How each command runs: every [`Command`] has its arm.
async fn run_command(command: Command, ctx: &Ctx<'_>) -> Result<Body> {
    use crate::auth::custom;
    use Command::*;
    let (seams, conn, db, cmd) = (ctx.seams, ctx.conn, ctx.db, ctx.cmd);
    let document = match command {
        GetMore => return find::get_more(ctx).await,
        ReadSubscription => return subscriptions::read(ctx).await,
        ListSubscriptions => return subscriptions::list(ctx).await,
        CreateSubscription => subscriptions::create(ctx).await,
        AckSubscription => subscriptions::ack(ctx).await,
        NackSubscription => subscriptions::nack(ctx).await,
        AlterSubscription => subscriptions::alter(ctx).await,
        ChangeStreamBounds => feeds::change_stream_bounds(ctx).await,
        CreateHttpToken => feeds::create_http_token(ctx).await,
        SnapshotCursor => feeds::snapshot_cursor(ctx).await,
        DropSubscription => subscriptions::drop(ctx).await,
        Find => return find::find(ctx).await,
        Aggregate => return aggregate::aggregate(ctx).await,
        Hello => {
            let mut reply = handshake::hello(ctx)?;
            crate::auth::augment_hello(&seams.auth_cx(), conn, cmd, &mut reply).await?;
            Ok(reply)
        }
        SaslStart => crate::auth::sasl_start(&seams.auth_cx(), conn, db, cmd).await,
        SaslContinue => crate::auth::sasl_continue(&seams.auth_cx(), conn, cmd),
        Logout => Ok(crate::auth::logout(&seams.auth_cx(), conn)),
        CreateUser => crate::auth::create_user(&seams.auth_cx(), db, cmd).await,
        UpdateUser => crate::auth::update_user(&seams.auth_cx(), db, cmd).await,
        DropUser => crate::auth::drop_user(&seams.auth_cx(), db, cmd).await,
        UsersInfo => crate::auth::users_info(&seams.auth_cx(), db, cmd).await,
        GrantRolesToUser => crate::auth::change_roles(&seams.auth_cx(), db, cmd, true).await,
        RevokeRolesFromUser => crate::auth::change_roles(&seams.auth_cx(), db, cmd, false).await,
        CreateRole => custom::create_role(&seams.auth_cx(), db, cmd).await,
        UpdateRole => custom::update_role(&seams.auth_cx(), db, cmd).await,
        DropRole => custom::drop_role(&seams.auth_cx(), db, cmd).await,
        RolesInfo => custom::roles_info(&seams.auth_cx(), db, cmd).await,
        GrantPrivilegesToRole => custom::change_privileges(&seams.auth_cx(), db, cmd, true).await,
        RevokePrivilegesFromRole => {
            custom::change_privileges(&seams.auth_cx(), db, cmd, false).await
        }
        GrantRolesToRole => custom::change_inherited(&seams.auth_cx(), db, cmd, true).await,
        RevokeRolesFromRole => custom::change_inherited(&seams.auth_cx(), db, cmd, false).await,
        Ping => Ok(ok()),
        BuildInfo => handshake::build_info(),
        GetParameter => crate::parameters::get(&seams.knobs(), cmd),
        SetParameter => {
            admin::admin_only(ctx)?;
            let on_shards = cmd.contains_key("ttlMonitorSleepSecs")
                || spill::LIMIT_PARAMETERS.iter().any(|p| cmd.contains_key(p));
            if on_shards {
                admin::set_shard_parameter(ctx).await
            } else {
                crate::parameters::set(&seams.knobs(), cmd)
            }
        }
        GetCmdLineOpts => admin::get_cmd_line_opts(ctx),
        CurrentOp => current_op::current_op(ctx),
        KillOp => current_op::kill_op(ctx),
        SetClusterParameter => admin::set_cluster_parameter(ctx).await,
        GetClusterParameter => admin::get_cluster_parameter(ctx).await,
        ServerStatus => admin::server_status(ctx).await,
        TributaryStatus => status::tributary_status(ctx).await,
        HostInfo => admin::host_info(),
        WhatsMyUri => Ok(bson::doc! {"you": conn.peer.to_string(), "ok": 1.0}),
        ListDatabases => admin::list_databases(ctx).await,
        DbStats => stats::db_stats(ctx).await,
        ConnectionStatus => admin::connection_status(ctx),
        CollStats => stats::coll_stats(ctx).await,
        Validate => stats::validate(ctx).await,
        EndSessions | KillAllSessions | KillSessions => {
            let own = router_auth_user(ctx).map(|user| seams.local_sessions.ids_of(&user));
            crate::txn::kill_sessions(
                seams.shards(),
                &seams.ops,
                &seams.services,
                ctx.name,
                cmd,
                own,
            )
            .await
        }
        RefreshSessions => admin::refresh_sessions(ctx).await,
        StartSession => admin::start_session(ctx),
        ListCommands => admin::list_commands(),
        GetLog => admin::get_log(ctx),
        Insert => crud::insert(ctx).await,
        Update => crud::update(ctx).await,
        Delete => crud::delete(ctx).await,
        FindAndModify => crud::find_and_modify(ctx).await,
        KillCursors => find::kill_cursors(ctx).await,
        Count => find::count(ctx).await,
        Explain => explain::explain(ctx).await,
        Distinct => find::distinct(ctx).await,
        Create => ddl::create(ctx).await,
        Drop => ddl::drop(ctx).await,
        DropDatabase => ddl::drop_database(ctx).await,
        RenameCollection => ddl::rename_collection(ctx).await,
        ListCollections => ddl::list_collections(ctx).await,
        CreateIndexes => ddl::create_indexes(ctx).await,
        DropIndexes => ddl::drop_indexes(ctx).await,
        ListIndexes => ddl::list_indexes(ctx).await,
        CollMod => ddl::coll_mod(ctx).await,
        EnableSharding => ddl::enable_sharding(ctx).await,
        ShardCollection => ddl::shard_collection(ctx).await,
        ListShards => admin::list_shards(ctx),
        CommitTransaction => crate::txn::commit(seams.shards(), cmd).await,
        AbortTransaction => crate::txn::abort(seams.shards(), cmd).await,
        ConfigureFailPoint => admin::configure_fail_point(ctx),
    };
    document.map(Body::Document)
}

/// `{ok: 1}`.
pub(crate) fn ok() -> Document {
    bson::doc! {"ok": 1.0}
}
