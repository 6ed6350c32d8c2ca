//! The router's view of a collection, checked before a routed CRUD command runs.
//!
//! A router caches which collections are sharded. It sends `shardVersion: {sharded: false}` with
//! a command it routed as unsharded, and `{sharded: true, uuid}` with one it routed by shard key.
//! When the shard's catalog disagrees (the collection was sharded, or dropped and recreated,
//! through another router), the command fails with `StaleConfig` (13388) before it touches
//! anything, and the router reloads its metadata and retries. Commands without `shardVersion`
//! (direct connections) are not checked.

use bson::{Bson, Document};
use wire::MongoError;

use super::Ctx;

pub const STALE_CONFIG: i32 = 13388;

pub fn check_shard_version(ctx: &Ctx<'_>) -> Result<(), MongoError> {
    let Some(Bson::Document(version)) = ctx.cmd.get("shardVersion") else {
        return Ok(());
    };
    let Some((_, Bson::String(coll))) = ctx.cmd.iter().next() else {
        return Ok(());
    };
    let catalog = ctx.shard.state().catalog();
    let entry = catalog.lookup(&ctx.db, coll);
    let sharded_here = entry.is_some_and(|e| e.shard_key.is_some());
    let stale = match version.get_bool("sharded").unwrap_or(false) {
        false => sharded_here,
        true => !sharded_here || !same_uuid(version, entry.map(|e| e.uuid.bytes())),
    };
    if stale {
        return Err(MongoError::with_code(
            STALE_CONFIG,
            format!(
                "the router's routing information for {}.{coll} is stale ({})",
                ctx.db,
                describe(version)
            ),
        ));
    }
    Ok(())
}

fn same_uuid(version: &Document, here: Option<[u8; 16]>) -> bool {
    match (version.get("uuid"), here) {
        (Some(Bson::Binary(b)), Some(here)) => b.bytes == here,
        _ => false,
    }
}

fn describe(version: &Document) -> &'static str {
    if version.get_bool("sharded").unwrap_or(false) {
        "it routed the collection as sharded"
    } else {
        "it routed the collection as unsharded"
    }
}
