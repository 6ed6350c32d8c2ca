//! Handshake and server-information commands: `hello`/`isMaster`, `buildInfo`, `getParameter`.
//!
//! A shard presents itself as a standalone-like server (no `setName`, no `msg: isdbgrid`) with
//! `logicalSessionTimeoutMinutes`, so clients connecting directly (e.g. to tail the oplog) get
//! sessions.

use bson::{Bson, doc};
use pipeline::agg::spill;
use wire::MongoError;

use super::{Ctx, Reply};

pub fn hello(ctx: &Ctx<'_>, name: &str) -> Result<Reply, MongoError> {
    let hello_ok = ctx.cmd.get("helloOk").and_then(super::as_bool) == Some(true);
    let now = ctx.shard.state().now_millis();
    Ok(Reply::read(crate::handshake::hello(
        name, hello_ok, true, now,
    )))
}

pub fn build_info() -> Result<Reply, MongoError> {
    Ok(Reply::read(doc! {
        "version": "7.0.0",
        "gitVersion": "tributary",
        "versionArray": [7, 0, 0, 0],
        "bits": 64,
        "debug": false,
        "maxBsonObjectSize": wire::MAX_BSON_OBJECT_SIZE as i32,
        "storageEngines": ["redb"],
        "ok": 1.0,
    }))
}

pub fn get_parameter(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let mut d = bson::Document::new();
    let all = matches!(ctx.cmd.get("getParameter"), Some(Bson::String(s)) if s == "*");
    if all || ctx.cmd.contains_key("enableTestCommands") {
        d.insert("enableTestCommands", true);
    }
    if all || ctx.cmd.contains_key("featureCompatibilityVersion") {
        d.insert("featureCompatibilityVersion", doc! {"version": "7.0"});
    }
    if all || ctx.cmd.contains_key(TTL_SLEEP) {
        d.insert(TTL_SLEEP, ctx.shard.ttl_sleep().get() as i64);
    }
    for name in spill::LIMIT_PARAMETERS {
        if all || ctx.cmd.contains_key(name) {
            let bytes = spill::limit_parameter(name).unwrap_or_default();
            d.insert(name, i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }
    d.insert("ok", 1.0);
    Ok(Reply::read(d))
}

const TTL_SLEEP: &str = "ttlMonitorSleepSecs";
const ASK_AFTER: &str = "askCoordinatorAfterSecs";

/// `setParameter` on a shard: the shard's own runtime parameters (`ttlMonitorSleepSecs`,
/// `askCoordinatorAfterSecs`, and the blocking stages' memory limits, which are the
/// process's).
pub fn set_parameter(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    if let Some(v) = ctx.cmd.get(TTL_SLEEP) {
        let was = crate::ttl::set_sleep(ctx.shard, v)?;
        return Ok(Reply::read(doc! {"was": was as i64, "ok": 1.0}));
    }
    if let Some(v) = ctx.cmd.get(ASK_AFTER) {
        let was = ctx.shard.transactions().set_ask_after(v)?;
        return Ok(Reply::read(doc! {"was": was as i64, "ok": 1.0}));
    }
    for (name, v) in ctx.cmd.iter() {
        if let Some(was) = spill::set_limit_parameter(name, v) {
            let was = i64::try_from(was?).unwrap_or(i64::MAX);
            return Ok(Reply::read(doc! {"was": was, "ok": 1.0}));
        }
    }
    Err(MongoError::bad_value(
        "attempted to set unrecognized parameter, use help:true to see options",
    ))
}
