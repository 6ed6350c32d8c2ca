//! Administrative and harness commands: `getCmdLineOpts`, `serverStatus`,
//! `listDatabases`, session bookkeeping, `listShards`, `listCommands`, and the cluster
//! parameters (`setClusterParameter` / `getClusterParameter`: `changeStreamOptions`, which every
//! shard stores, since each purges its own pre-images).

use bson::{Bson, DateTime, Document, doc};
use shard::preimages::CHANGE_STREAM_OPTIONS;
use shard::sharding::ShardId;
use wire::{ErrorCode, MongoError, Result};

use super::{Ctx, ok};
use crate::kernel::transport::Shards;

/// Refuses a command sent to a database other than `admin` (13, as MongoDB).
pub(super) fn admin_only(ctx: &Ctx<'_>) -> Result<()> {
    if ctx.db != "admin" {
        return Err(MongoError::new(
            ErrorCode::UNAUTHORIZED,
            format!("{} may only be run against the admin database.", ctx.name),
        ));
    }
    Ok(())
}

fn unknown_parameter(name: &str) -> MongoError {
    MongoError::new(
        ErrorCode::NO_SUCH_KEY,
        format!("Unknown Cluster Parameter {name}"),
    )
}

/// `setClusterParameter: {changeStreamOptions: {preAndPostImages: {expireAfterSeconds}}}`:
/// validated here, then stored by every shard.
pub(super) async fn set_cluster_parameter(ctx: &Ctx<'_>) -> Result<Document> {
    admin_only(ctx)?;
    let Some(Bson::Document(param)) = ctx.cmd.get("setClusterParameter") else {
        return Err(MongoError::type_mismatch(
            "setClusterParameter takes an object naming one parameter",
        ));
    };
    let mut fields = param.iter();
    let (Some((name, value)), None) = (fields.next(), fields.next()) else {
        return Err(MongoError::bad_value(
            "setClusterParameter takes exactly one parameter",
        ));
    };
    if name != CHANGE_STREAM_OPTIONS {
        return Err(unknown_parameter(name));
    }
    let Bson::Document(options) = value else {
        return Err(MongoError::type_mismatch(
            "changeStreamOptions must be an object",
        ));
    };
    shard::preimages::validate(options)?;
    let cmd = doc! {"_shardsvrSetClusterParameter": 1, CHANGE_STREAM_OPTIONS: options.clone()};
    let seams = ctx.seams;
    for r in seams
        .shards()
        .broadcast(&seams.transport.all(), "admin", &cmd)
        .await
    {
        r?;
    }
    Ok(ok())
}

/// `getClusterParameter: "changeStreamOptions" | ["changeStreamOptions"] | "*"`, as the config
/// shard stores it.
pub(super) async fn get_cluster_parameter(ctx: &Ctx<'_>) -> Result<Document> {
    admin_only(ctx)?;
    let names: Vec<&str> = match ctx.cmd.get("getClusterParameter") {
        Some(Bson::String(s)) => vec![s.as_str()],
        Some(Bson::Array(a)) => a.iter().filter_map(Bson::as_str).collect(),
        _ => {
            return Err(MongoError::type_mismatch(
                "getClusterParameter takes a name, a list of names or \"*\"",
            ));
        }
    };
    if let Some(other) = names
        .iter()
        .find(|n| **n != "*" && **n != CHANGE_STREAM_OPTIONS)
    {
        return Err(unknown_parameter(other));
    }
    let reply = ctx
        .seams
        .shards()
        .command(
            ShardId::CONFIG,
            "admin",
            doc! {"getClusterParameter": CHANGE_STREAM_OPTIONS},
        )
        .await?;
    let params = reply
        .get_array("clusterParameters")
        .cloned()
        .unwrap_or_default();
    Ok(doc! {"clusterParameters": params, "ok": 1.0})
}

pub(super) fn get_cmd_line_opts(ctx: &Ctx<'_>) -> Result<Document> {
    let argv: Vec<Bson> = ctx
        .seams
        .options
        .argv
        .iter()
        .cloned()
        .map(Bson::String)
        .collect();
    Ok(doc! {"argv": argv, "parsed": {}, "ok": 1.0})
}

/// `serverStatus`: the router's own figures, and each shard's (`shards.<name>`: oplog size,
/// entries, oldest and newest `ts`, high-water mark, pre-images, change-stream counters, which
/// `metrics.changeStreams` also sums). A shard that does not answer within a second shows its
/// error instead.
pub(super) async fn server_status(ctx: &Ctx<'_>) -> Result<Document> {
    let seams = ctx.seams;
    let names = seams.transport.names();
    let asks = seams.transport.all().into_iter().map(|s| async move {
        let ask = seams.shards().command(s, "admin", doc! {"serverStatus": 1});
        match tokio::time::timeout(std::time::Duration::from_secs(1), ask).await {
            Ok(Ok(mut d)) => {
                for k in ["ok", "$clusterTime", "operationTime", "shard"] {
                    d.remove(k);
                }
                d
            }
            Ok(Err(e)) => doc! {"error": e.errmsg},
            Err(_) => doc! {"error": "no answer within 1 s"},
        }
    });
    let statuses = futures::future::join_all(asks).await;
    let mut shards = Document::new();
    let mut split = 0i64;
    let mut failed = 0i64;
    let mut expanded = 0i64;
    for (name, status) in names.iter().zip(statuses) {
        if let Ok(cs) = status
            .get_document("metrics")
            .and_then(|m| m.get_document("changeStreams"))
        {
            split += cs.get_i64("largeEventsSplit").unwrap_or(0);
            failed += cs.get_i64("largeEventsFailed").unwrap_or(0);
            expanded += cs.get_i64("showExpandedEvents").unwrap_or(0);
        }
        shards.insert(name.clone(), status);
    }
    let uptime = seams.started.elapsed();
    let connections = seams.connections.counts();
    let (merges, buffered) = seams.streams.hubs.stats();
    Ok(doc! {
        "host": &seams.options.advertised_host,
        "version": super::handshake::VERSION,
        "process": "mongos",
        "pid": i64::from(std::process::id()),
        "uptime": uptime.as_secs_f64(),
        "uptimeMillis": uptime.as_millis() as i64,
        "localTime": DateTime::now(),
        // As mongod 7.0's, from the listener's own counters (`wire::limits`): `available` is
        // the limit in force (`--maxConns`, capped by the open-files limit) minus `current`;
        // `active` counts connections with a request in flight, awaiting getMores included.
        "connections": {
            "current": count(connections.current),
            "available": count(connections.available),
            "totalCreated": count(connections.total_created),
            "rejected": count(connections.rejected),
            "active": count(connections.active),
        },
        "storageEngine": {"name": "redb", "supportsCommittedReads": true, "persistent": true},
        "metrics": {
            "cursor": {"open": {"total": seams.cursors.len() as i64}},
            // Merges shared by change streams with the same shard-side spec, the bytes their
            // logs count, and every shard reply any stream's events still hold (merges, logs,
            // replies being written); the shards' counters, summed.
            "changeStreams": {
                "sharedMerges": merges as i64,
                "sharedBufferBytes": buffered as i64,
                "heldReplyBytes": i64::try_from(crate::streams::held_bytes()).unwrap_or(i64::MAX),
                // Streams that stopped holding anything until read again, past
                // `changeStreamHeldReplyBytesLimit` (`server::StreamMemory`).
                "parked": i64::try_from(crate::streams::parked_streams()).unwrap_or(i64::MAX),
                "largeEventsSplit": split,
                "largeEventsFailed": failed,
                "showExpandedEvents": expanded,
            },
            "subscriptions": seams.subscriptions.status(),
            // The router process's spills (in the embedded default, the shards' too; a shard
            // process shows its own under `shards`).
            "query": pipeline::agg::spill::counters().to_document(),
        },
        "shards": shards,
        "ok": 1.0,
    })
}

/// A count as mongod's `serverStatus` gives it: an int, or a long past `i32::MAX`.
fn count(n: u64) -> Bson {
    i32::try_from(n).map_or_else(|_| Bson::Int64(n.min(i64::MAX as u64) as i64), Bson::Int32)
}

/// `connectionStatus`: the users this connection authenticated as and the roles they were
/// given (directly, as mongod lists them: not what those roles inherit), read when each
/// logged in.
pub(super) fn connection_status(ctx: &Ctx<'_>) -> Result<Document> {
    let pairs = |v: Vec<(String, String)>, name: &str| -> Vec<Bson> {
        v.into_iter()
            .map(|(who, db)| {
                let mut d = Document::new();
                d.insert(name, who);
                d.insert("db", db);
                Bson::Document(d)
            })
            .collect()
    };
    let show_privileges = match ctx.cmd.get("showPrivileges") {
        None => false,
        Some(Bson::Boolean(b)) => *b,
        Some(v) if pipeline::value::is_number(v) => pipeline::value::as_f64(v) != Some(0.0),
        Some(v) => {
            return Err(MongoError::type_mismatch(format!(
                "BSON field 'connectionStatus.showPrivileges' is the wrong type '{}', expected \
                 types '[bool, long, int, decimal, double]'",
                pipeline::value::type_name(v)
            )));
        }
    };
    let (users, roles) = ctx.seams.auth.status_of(ctx.conn.id);
    let mut auth_info = doc! {
        "authenticatedUsers": pairs(users, "user"),
        "authenticatedUserRoles": pairs(roles, "role"),
    };
    if show_privileges {
        let privileges: Vec<Bson> = ctx
            .seams
            .auth
            .privileges_of(ctx.conn.id)
            .iter()
            .map(|p| Bson::Document(crate::auth::roles::privilege_document(p)))
            .collect();
        auth_info.insert("authenticatedUserPrivileges", privileges);
    }
    Ok(doc! {"authInfo": auth_info, "ok": 1.0})
}

/// `getLog`: `"*"` names the logs; `"global"` has the process's last lines (mongod's
/// structured lines, from `crate::log_buffer`); `"startupWarnings"` has none.
pub(super) fn get_log(ctx: &Ctx<'_>) -> Result<Document> {
    admin_only(ctx)?;
    match ctx.cmd.get("getLog") {
        Some(Bson::String(s)) if s == "*" => {
            Ok(doc! {"names": ["global", "startupWarnings"], "ok": 1.0})
        }
        Some(Bson::String(s)) if s == "global" => {
            let (lines, written) = crate::log_buffer::lines();
            Ok(doc! {"totalLinesWritten": written as i64, "log": lines, "ok": 1.0})
        }
        Some(Bson::String(s)) if s == "startupWarnings" => {
            Ok(doc! {"totalLinesWritten": 0_i64, "log": [], "ok": 1.0})
        }
        Some(Bson::String(s)) => Err(MongoError::with_code(
            ErrorCode::BAD_VALUE.code,
            format!("No log named '{s}'"),
        )),
        _ => Err(MongoError::type_mismatch(
            "Argument to getLog must be of type String",
        )),
    }
}

pub(super) fn host_info() -> Result<Document> {
    Ok(doc! {
        "system": {"currentTime": DateTime::now(), "numCores": std::thread::available_parallelism().map(|n| n.get() as i32).unwrap_or(1)},
        "os": {"type": std::env::consts::OS},
        "ok": 1.0,
    })
}

/// `startSession`: a new session id, noted as used by the caller. Sessions are implicit (any
/// `lsid` is accepted), so nothing else starts.
pub(super) fn start_session(ctx: &Ctx<'_>) -> Result<Document> {
    let id = bson::Binary {
        subtype: bson::spec::BinarySubtype::Uuid,
        bytes: uuid::Uuid::new_v4().as_bytes().to_vec(),
    };
    ctx.seams.local_sessions.touch(
        id.clone(),
        super::session_user(ctx.seams, ctx.conn),
        DateTime::now(),
    );
    Ok(doc! {"id": {"id": id}, "timeoutMinutes": 30, "ok": 1.0})
}

/// `refreshSessions`: the caller's named sessions count as used now, on this router and on
/// every shard, where their retryable-write records then live another 30 minutes.
pub(super) async fn refresh_sessions(ctx: &Ctx<'_>) -> Result<Document> {
    shard::retryable::refreshed_sessions(ctx.cmd)?;
    let user = super::session_user(ctx.seams, ctx.conn);
    let uid = crate::local_sessions::uid(&user);
    let now = DateTime::now();
    let ids: Vec<bson::Binary> = ctx
        .cmd
        .get_array("refreshSessions")
        .map(|a| {
            a.iter()
                .filter_map(crate::local_sessions::session_id)
                .collect()
        })
        .unwrap_or_default();
    for id in &ids {
        ctx.seams
            .local_sessions
            .touch(id.clone(), user.clone(), now);
    }
    let keys: Vec<Vec<u8>> = ids
        .iter()
        .map(|id| [id.bytes.as_slice(), uid.bytes.as_slice()].concat())
        .collect();
    ctx.seams.sessions.refresh(&keys);
    let lsids: Vec<Bson> = ids
        .into_iter()
        .map(|id| Bson::Document(doc! {"id": id, "uid": uid.clone()}))
        .collect();
    let all = ctx.seams.transport.all();
    let forward = doc! {"refreshSessions": lsids};
    for reply in ctx.seams.shards().broadcast(&all, "admin", &forward).await {
        reply?;
    }
    Ok(ok())
}

pub(super) fn list_shards(ctx: &Ctx<'_>) -> Result<Document> {
    let shards: Vec<Bson> = ctx
        .seams
        .transport
        .shards()
        .iter()
        .map(|s| Bson::Document(doc! {"_id": &s.name, "host": s.client.describe(), "state": 1}))
        .collect();
    Ok(doc! {"shards": shards, "ok": 1.0})
}

/// `listCommands`: the registry's listed names (`crate::command`).
pub(super) fn list_commands() -> Result<Document> {
    let mut commands = Document::new();
    for name in crate::command::Command::listed() {
        commands.insert(name, doc! {});
    }
    Ok(doc! {"commands": commands, "ok": 1.0})
}

/// `listDatabases` over every shard: sizes summed, `local` hidden, `filter` and `nameOnly`
/// honoured.
pub(super) async fn list_databases(ctx: &Ctx<'_>) -> Result<Document> {
    let args = ctx.args();
    let name_only = args.opt_bool("nameOnly")?.unwrap_or(false);
    // As mongod: a user without the `listDatabases` action sees the databases it has a role
    // or privilege on (`authorizedDatabases` defaults to that), and may not ask for all (13).
    let shown = if ctx.seams.options.auth {
        ctx.seams.auth.databases_listed(ctx.conn.id)
    } else {
        None
    };
    if shown.is_some() && args.opt_bool("authorizedDatabases")? == Some(false) {
        return Err(MongoError::new(
            ErrorCode::UNAUTHORIZED,
            "Insufficient permissions to list all databases",
        ));
    }
    let filter = match args.opt_doc("filter")? {
        Some(f) => Some(pipeline::Matcher::parse(f)?),
        None => None,
    };
    let seams = ctx.seams;
    let replies = seams
        .shards()
        .broadcast_read(&seams.transport.all(), "admin", &doc! {"listDatabases": 1})
        .await;
    let mut sizes: std::collections::BTreeMap<String, i64> = Default::default();
    for reply in replies {
        let reply = reply?;
        for d in reply
            .get_array("databases")
            .map(|a| a.as_slice())
            .unwrap_or(&[])
        {
            let Some(d) = d.as_document() else { continue };
            let Ok(name) = d.get_str("name") else {
                continue;
            };
            if name == "local" {
                continue;
            }
            let size = match d.get("sizeOnDisk") {
                Some(Bson::Int64(n)) => *n,
                Some(Bson::Int32(n)) => i64::from(*n),
                Some(Bson::Double(n)) => *n as i64,
                _ => 0,
            };
            *sizes.entry(name.to_string()).or_default() += size;
        }
    }
    let mut total = 0i64;
    let mut databases = Vec::new();
    for (name, size) in sizes {
        if shown.as_ref().is_some_and(|may| !may(&name)) {
            continue;
        }
        let entry = if name_only {
            doc! {"name": &name}
        } else {
            doc! {"name": &name, "sizeOnDisk": size, "empty": size == 0}
        };
        if let Some(m) = &filter
            && !m.matches(&doc! {"name": &name, "sizeOnDisk": size, "empty": size == 0})
        {
            continue;
        }
        total += size;
        databases.push(Bson::Document(entry));
    }
    let mut reply = doc! {"databases": databases};
    if !name_only {
        reply.insert("totalSize", total);
        reply.insert("totalSizeMb", total / (1024 * 1024));
    }
    reply.insert("ok", 1.0);
    Ok(reply)
}

/// `configureFailPoint` (only with `--enableTestCommands`; only on `admin`, as in MongoDB).
pub(super) fn configure_fail_point(ctx: &Ctx<'_>) -> Result<Document> {
    if ctx.db != "admin" {
        return Err(wire::MongoError::new(
            wire::ErrorCode::UNAUTHORIZED,
            "configureFailPoint may only be run against the admin database.",
        ));
    }
    ctx.seams.failpoints.configure(ctx.cmd)
}

/// `setParameter` of a parameter the shards own (`ttlMonitorSleepSecs`, the blocking stages'
/// memory limits): set on every shard; `was` is the first shard's previous value. The memory
/// limits are set on the router too, for the stages it runs itself.
pub(super) async fn set_shard_parameter(ctx: &Ctx<'_>) -> Result<Document> {
    let cmd: Document = ctx
        .cmd
        .iter()
        .filter(|(k, _)| *k == "setParameter" || !k.starts_with('$') && *k != "lsid")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let shards = ctx.seams.transport.all();
    let mut was = Bson::Null;
    for (i, reply) in ctx
        .seams
        .shards()
        .broadcast(&shards, "admin", &cmd)
        .await
        .into_iter()
        .enumerate()
    {
        let reply = reply?;
        if i == 0 {
            was = reply.get("was").cloned().unwrap_or(Bson::Null);
        }
    }
    for (name, value) in &cmd {
        if let Some(local) = pipeline::agg::spill::set_limit_parameter(name, value) {
            let local = i64::try_from(local?).unwrap_or(i64::MAX);
            if was == Bson::Null {
                was = Bson::Int64(local);
            }
        }
    }
    Ok(doc! {"was": was, "ok": 1.0})
}
