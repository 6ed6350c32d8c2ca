//! The subscription commands, parsed here and run by `crate::subscriptions`.
//!
//! A consumer's read, ack, nack or alteration that reaches a router other than the one
//! holding its lease is forwarded there, once (`forwardedBy` marks it; a forwarded command that meets another
//! owner answers ConsumerLeaseMoved), so any router answers for any consumer.

use std::time::Duration;

use bson::{Bson, Document};
use wire::raw::Body;
use wire::{MongoError, Result};

use super::Ctx;
use crate::subscriptions::spec::{self, check_name};

pub(super) async fn create(ctx: &Ctx<'_>) -> Result<Document> {
    ctx.seams.subscriptions.create(ctx.db, ctx.cmd).await
}

/// The subscription a command names (its first field) and the consumer it gives.
fn target(ctx: &Ctx<'_>) -> Result<(String, String)> {
    let name = check_name(ctx.cmd.get(ctx.name), ctx.name)?;
    let consumer = check_name(ctx.cmd.get("consumer"), "consumer")?;
    Ok((name, consumer))
}

pub(super) async fn read(ctx: &Ctx<'_>) -> Result<Body> {
    let (name, consumer) = target(ctx)?;
    let max = spec::positive(ctx.cmd, "max", spec::MAX_READ_MAX)?.unwrap_or(spec::DEFAULT_READ_MAX);
    let wait = match ctx.cmd.get("waitMS") {
        None | Some(Bson::Null) => 0,
        _ => match spec::positive(ctx.cmd, "waitMS", spec::MAX_WAIT_MS) {
            Ok(v) => v.unwrap_or(0),
            // 0 is allowed: no wait.
            Err(_) if ctx.args().opt_i64("waitMS")? == Some(0) => 0,
            Err(e) => return Err(e),
        },
    };
    let ack_through = match ctx.cmd.get("ackThrough") {
        None | Some(Bson::Null) => None,
        Some(Bson::String(id)) => Some(id.as_str()),
        Some(_) => {
            return Err(MongoError::type_mismatch(
                "'ackThrough' must be a deliveryId",
            ));
        }
    };
    let read = ctx
        .seams
        .subscriptions
        .read(
            ctx.db,
            &name,
            &consumer,
            max as usize,
            Duration::from_millis(wait as u64),
            ack_through,
        )
        .await;
    match read {
        Ok(read) => Ok(Body::Raw(read.reply())),
        Err(e) => at_owner(ctx, e, Duration::from_millis(wait as u64))
            .await
            .map(Body::Document),
    }
}

/// The reply of the router holding the consumer's lease when `e` names it (the command sent
/// there once), else `e`. `wait`: how long the command may wait there.
async fn at_owner(ctx: &Ctx<'_>, e: MongoError, wait: Duration) -> Result<Document> {
    let subs = &ctx.seams.subscriptions;
    let Some(owner) = crate::subscriptions::errors::owner_of(&e) else {
        return Err(e);
    };
    if owner == subs.router_id() || ctx.cmd.contains_key("forwardedBy") {
        return Err(e);
    }
    // Its own fields (no session, no cluster time).
    let own = ctx.command.map_or(&[][..], super::fields::own);
    let mut cmd: Document = ctx
        .cmd
        .iter()
        .enumerate()
        .filter(|(i, (k, _))| *i == 0 || own.contains(&k.as_str()))
        .map(|(_, (k, v))| (k.clone(), v.clone()))
        .collect();
    cmd.insert("forwardedBy", subs.router_id());
    let options = &ctx.seams.options;
    let peer = subs.peer(owner, options.shard_tls.clone(), options.shard_key.clone());
    let patience = wait + Duration::from_secs(10);
    let reply = match tokio::time::timeout(patience, peer.command(ctx.db, &cmd)).await {
        Ok(Ok(reply)) => reply,
        // The owner cannot be reached: the client learns who holds the lease, and for how long.
        Ok(Err(_)) | Err(_) => return Err(e),
    };
    if let Some(err) = MongoError::from_reply(&reply) {
        return Err(err);
    }
    Ok(reply
        .into_iter()
        .filter(|(k, _)| !matches!(k.as_str(), "$clusterTime" | "operationTime"))
        .collect())
}

/// A command's `deliveryIds`: strings, at most `spec::MAX_IDS` of them (none when `optional`
/// and absent).
fn ids(ctx: &Ctx<'_>, optional: bool) -> Result<Vec<String>> {
    if optional && !ctx.cmd.contains_key("deliveryIds") {
        return Ok(Vec::new());
    }
    let ids = ctx.args().array("deliveryIds")?;
    if ids.len() > spec::MAX_IDS {
        return Err(MongoError::bad_value(format!(
            "at most {} deliveryIds per call",
            spec::MAX_IDS
        )));
    }
    ids.iter()
        .map(|v| match v {
            Bson::String(s) => Ok(s.clone()),
            _ => Err(MongoError::type_mismatch("deliveryIds must be strings")),
        })
        .collect()
}

pub(super) async fn ack(ctx: &Ctx<'_>) -> Result<Document> {
    let (name, consumer) = target(ctx)?;
    let args = ctx.args();
    let through = match ctx.cmd.get("through") {
        None => None,
        Some(Bson::String(id)) => Some(id.as_str()),
        Some(_) => return Err(MongoError::type_mismatch("'through' must be a deliveryId")),
    };
    let in_progress = args.opt_bool("inProgress")?.unwrap_or(false);
    if in_progress && through.is_some() {
        return Err(MongoError::bad_value(
            "'through' acknowledges: it does not go with 'inProgress'",
        ));
    }
    let ids = ids(ctx, through.is_some())?;
    let ack = crate::subscriptions::Ack {
        ids: &ids,
        through,
        in_progress,
        wait_durable: args.opt_bool("waitDurable")?.unwrap_or(false),
    };
    let acked = ctx
        .seams
        .subscriptions
        .ack(ctx.db, &name, &consumer, ack)
        .await;
    match acked {
        Err(e) => at_owner(ctx, e, Duration::from_secs(30)).await,
        ok => ok,
    }
}

pub(super) async fn nack(ctx: &Ctx<'_>) -> Result<Document> {
    let (name, consumer) = target(ctx)?;
    let args = ctx.args();
    let retry = match args.opt_i64("retryInMS")? {
        None => None,
        Some(ms) if (0..=spec::MAX_BACKOFF_MS).contains(&ms) => {
            Some(Duration::from_millis(ms as u64))
        }
        Some(ms) => {
            return Err(MongoError::bad_value(format!(
                "'retryInMS' must be from 0 to {}, not {ms}",
                spec::MAX_BACKOFF_MS
            )));
        }
    };
    let dead_letter = args.opt_bool("deadLetter")?.unwrap_or(false);
    let nacked = ctx
        .seams
        .subscriptions
        .nack(
            ctx.db,
            &name,
            &consumer,
            &ids(ctx, false)?,
            retry,
            dead_letter,
        )
        .await;
    match nacked {
        Err(e) => at_owner(ctx, e, Duration::ZERO).await,
        ok => ok,
    }
}

pub(super) async fn alter(ctx: &Ctx<'_>) -> Result<Document> {
    let name = check_name(ctx.cmd.get(ctx.name), ctx.name)?;
    match ctx.seams.subscriptions.alter(ctx.db, &name, ctx.cmd).await {
        // What it does to the subscription is done here; what it does to a consumer served
        // by another router is done there (the subscription's part again: a no-op).
        Err(e) => at_owner(ctx, e, Duration::ZERO).await,
        ok => ok,
    }
}

pub(super) async fn drop(ctx: &Ctx<'_>) -> Result<Document> {
    let name = check_name(ctx.cmd.get(ctx.name), ctx.name)?;
    ctx.seams
        .subscriptions
        .drop_subscription(ctx.db, &name)
        .await
}

/// `listSubscriptions`: one row per consumer of one database's subscriptions (of all on
/// `admin`), as a cursor (`cursor: {batchSize}`; `getMore` reads the rest).
pub(super) async fn list(ctx: &Ctx<'_>) -> Result<Body> {
    let filter = ctx.args().opt_doc("filter")?;
    let rows = ctx.seams.subscriptions.list(ctx.db, filter).await?;
    let ns = format!("{}.$cmd.listSubscriptions", ctx.db);
    super::reads::buffered_reply(ctx, ns, rows).await
}
