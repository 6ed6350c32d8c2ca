//! Writes through the router: `insert`, `update`, `delete`, `findAndModify`.
//!
//! An unsharded collection's write goes whole to its database's primary shard. A sharded
//! collection's write is split by shard key: inserts by each document's key, updates and deletes
//! by the key their query pins down (or broadcast). Retryable writes keep working across the
//! split because each sub-batch carries the session, the `txnNumber` and the original statement
//! ids (`stmtIds`), and the shards deduplicate by them.
//!
//! Invariants: write errors are reported with the driver's statement index; an ordered write
//! stops at its first error in statement order.

use std::collections::BTreeMap;

use bson::{Bson, Document, doc, oid::ObjectId};
use wire::{ErrorCode, MongoError, Result};

use super::Ctx;
use crate::kernel::catalog::{Catalog, Placement};
use crate::kernel::transport::Shards;
use shard::sharding::ShardId;

/// Fields of a driver's command that are the router's business, not the shard's.
const ROUTER_ONLY_FIELDS: &[&str] = &[
    "$db",
    "$clusterTime",
    "$readPreference",
    "apiVersion",
    "apiStrict",
    "apiDeprecationErrors",
];

/// The driver's command as it can be forwarded to a shard.
pub(super) fn forwardable(cmd: &Document) -> Document {
    forwardable_without(cmd, "")
}

/// [`forwardable`] without the field `left_out` (a write's statements, which the caller puts
/// back as the shard's part of them: never copied whole for nothing).
fn forwardable_without(cmd: &Document, left_out: &str) -> Document {
    cmd.iter()
        .filter(|(k, _)| !ROUTER_ONLY_FIELDS.contains(&k.as_str()) && k.as_str() != left_out)
        .map(|(k, v)| match (k.as_str(), v) {
            ("writeConcern", Bson::Document(wc)) => (
                k.clone(),
                Bson::Document(super::fields::forwarded_write_concern(wc)),
            ),
            _ => (k.clone(), v.clone()),
        })
        .collect()
}

/// Checks the namespace a command targets.
pub(super) fn validate_collection_name(db: &str, coll: &str) -> Result<()> {
    crate::kernel::catalog::validate_db_name(db)?;
    // MongoDB's limit on `db.coll`, checked before the name is used (or logged) anywhere.
    const MAX_NAMESPACE: usize = 255;
    if db.len() + 1 + coll.len() > MAX_NAMESPACE {
        let shown: String = coll.chars().take(64).collect();
        return Err(MongoError::new(
            ErrorCode::INVALID_NAMESPACE,
            format!(
                "Fully qualified namespace is too long. Namespace: {db}.{shown}... Max: \
                 {MAX_NAMESPACE}"
            ),
        ));
    }
    if coll.is_empty()
        || coll.contains('\0')
        || coll.starts_with('.')
        || coll.contains('$') && !coll.starts_with("$cmd")
    {
        return Err(MongoError::new(
            ErrorCode::INVALID_NAMESPACE,
            format!("Invalid collection name: {coll}"),
        ));
    }
    Ok(())
}

/// A write command's outcome, accumulated across shards.
#[derive(Default)]
struct WriteOutcome {
    n: i64,
    n_modified: i64,
    upserted: Vec<(usize, Bson)>,
    write_errors: BTreeMap<usize, Document>,
    /// The first shard's `writeConcernError` (a replicated shard whose `w: N` was not met).
    write_concern_error: Option<Document>,
    is_update: bool,
}

impl WriteOutcome {
    /// Adds a shard's reply for statements whose driver indexes are `indexes` (in sub-batch
    /// order).
    fn absorb(&mut self, reply: &Document, indexes: &[usize]) {
        self.n += int(reply.get("n"));
        self.n_modified += int(reply.get("nModified"));
        if self.write_concern_error.is_none()
            && let Ok(wce) = reply.get_document("writeConcernError")
        {
            self.write_concern_error = Some(wce.clone());
        }
        for u in reply
            .get_array("upserted")
            .map(Vec::as_slice)
            .unwrap_or(&[])
        {
            if let Some(u) = u.as_document() {
                let i = int(u.get("index")) as usize;
                let id = u.get("_id").cloned().unwrap_or(Bson::Null);
                self.upserted
                    .push((indexes.get(i).copied().unwrap_or(i), id));
            }
        }
        for e in reply
            .get_array("writeErrors")
            .map(Vec::as_slice)
            .unwrap_or(&[])
        {
            if let Some(e) = e.as_document() {
                let i = int(e.get("index")) as usize;
                let index = indexes.get(i).copied().unwrap_or(i);
                let mut e = e.clone();
                e.insert("index", index as i32);
                self.write_errors.insert(index, e);
            }
        }
    }

    /// A statement that failed as a whole on the router or at a shard.
    fn fail(&mut self, index: usize, e: &MongoError) {
        self.write_errors.insert(
            index,
            doc! {"index": index as i32, "code": e.code, "codeName": &e.code_name, "errmsg": &e.errmsg},
        );
    }

    fn has_errors(&self) -> bool {
        !self.write_errors.is_empty()
    }

    fn into_reply(mut self) -> Document {
        let mut reply = doc! {"n": count(self.n)};
        if self.is_update {
            reply.insert("nModified", count(self.n_modified));
            if !self.upserted.is_empty() {
                self.upserted.sort_by_key(|(i, _)| *i);
                let ups: Vec<Bson> = self
                    .upserted
                    .into_iter()
                    .map(|(i, id)| Bson::Document(doc! {"index": i as i32, "_id": id}))
                    .collect();
                reply.insert("upserted", ups);
            }
        }
        if !self.write_errors.is_empty() {
            let errs: Vec<Bson> = self
                .write_errors
                .into_values()
                .map(Bson::Document)
                .collect();
            reply.insert("writeErrors", errs);
        }
        if let Some(wce) = self.write_concern_error {
            reply.insert("writeConcernError", wce);
        }
        reply.insert("ok", 1.0);
        reply
    }
}

/// A count as MongoDB answers it: an int32 (int64 only past its range).
fn count(n: i64) -> Bson {
    i32::try_from(n).map_or(Bson::Int64(n), Bson::Int32)
}

fn int(v: Option<&Bson>) -> i64 {
    match v {
        Some(Bson::Int32(i)) => i64::from(*i),
        Some(Bson::Int64(i)) => *i,
        Some(Bson::Double(d)) => *d as i64,
        _ => 0,
    }
}

/// A sub-command for statements `indexes` of the driver's command: the same options, its own
/// statement list under `list_field`, and the original statement ids.
fn sub_command(
    ctx: &Ctx<'_>,
    version: &Document,
    list_field: &str,
    statements: Vec<Bson>,
    indexes: &[usize],
) -> Document {
    let mut cmd = forwardable_without(ctx.cmd, list_field);
    cmd.insert(list_field, statements);
    cmd.insert("shardVersion", version.clone());
    if crate::txn::is_retryable_write(ctx.cmd) {
        let ids: Vec<Bson> = match ctx.cmd.get_array("stmtIds") {
            Ok(given) => indexes
                .iter()
                .map(|&i| given.get(i).cloned().unwrap_or(Bson::Int32(i as i32)))
                .collect(),
            Err(_) => indexes.iter().map(|&i| Bson::Int32(i as i32)).collect(),
        };
        cmd.insert("stmtIds", ids);
    }
    cmd
}

/// Marks errors that a driver may retry (shard unreachable) as `RetryableWriteError`.
fn retryable(e: MongoError, ctx: &Ctx<'_>) -> MongoError {
    let retry_codes = [
        6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436,
    ];
    if crate::txn::is_retryable_write(ctx.cmd) && retry_codes.contains(&e.code) {
        e.with_label("RetryableWriteError")
    } else {
        e
    }
}

pub(super) async fn insert(ctx: &Ctx<'_>) -> Result<Document> {
    let args = ctx.args();
    let coll = args.collection()?;
    validate_collection_name(ctx.db, coll)?;
    let ordered = args.opt_bool("ordered")?.unwrap_or(true);
    let raw = args.array("documents")?;
    let mut outcome = WriteOutcome::default();
    let mut docs: Vec<Option<Document>> = Vec::with_capacity(raw.len());
    for (i, d) in raw.iter().enumerate() {
        match d {
            Bson::Document(d) => docs.push(Some(with_id(d))),
            other => {
                let e = MongoError::type_mismatch(format!(
                    "BSON field 'insert.documents.{i}' is the wrong type '{}', expected type 'object'",
                    super::args::type_name(other)
                ));
                return Err(e);
            }
        }
    }
    let placement = ctx
        .seams
        .catalog
        .placement(ctx.db, coll, true)
        .await
        .map_err(|e| retryable(e, ctx))?;
    let version = placement.version();
    let seams = ctx.seams;
    // Group statements by shard. Ordered writes run consecutive same-shard runs one after the
    // other and stop at the first error; unordered ones run one batch per shard, concurrently.
    let mut routed: Vec<Routed> = Vec::with_capacity(docs.len());
    for (i, d) in docs.iter_mut().enumerate() {
        let Some(d) = d.take() else { continue };
        let size = pipeline::changestream::split::document_size(&d);
        if size > wire::MAX_BSON_OBJECT_SIZE {
            outcome.fail(
                i,
                &MongoError::new(
                    ErrorCode::BSON_OBJECT_TOO_LARGE,
                    format!(
                        "object to insert too large. size in bytes: {size}, max size: {}",
                        wire::MAX_BSON_OBJECT_SIZE
                    ),
                ),
            );
            if ordered {
                break;
            }
            continue;
        }
        let shard = match &placement {
            Placement::Unsharded { primary } => written_primary(*primary)?,
            Placement::Sharded(sc) => match sc.key.key_of_document(&d) {
                Ok(key) => sc.chunks.shard_for(&key),
                Err(e) => {
                    outcome.fail(i, &e);
                    if ordered {
                        break;
                    }
                    continue;
                }
            },
        };
        routed.push((i, shard, d));
    }
    let stop_at = if ordered {
        outcome.write_errors.keys().next().copied()
    } else {
        None
    };
    let batches = group(routed, ordered, stop_at);
    if ordered {
        let runs = batches;
        let shards: std::collections::BTreeSet<ShardId> = runs.iter().map(|r| r.0).collect();
        // Inside a transaction nothing is visible before the commit anyway: runs it is.
        if shards.len() > 1 && !crate::txn::in_transaction(ctx.cmd) {
            insert_across_shards(ctx, &version, runs, &mut outcome).await?;
        } else {
            insert_runs(ctx, &version, runs, &mut outcome).await?;
        }
        // An ordered write reports only its first error: later statements never ran.
        if let Some(first) = outcome.write_errors.keys().next().copied() {
            outcome.write_errors.retain(|&i, _| i == first);
        }
    } else {
        let sends = batches.iter().map(|(shard, indexes, docs)| {
            seams.shards().write(
                *shard,
                ctx.db,
                sub_command(ctx, &version, "documents", docs.clone(), indexes),
            )
        });
        let replies = futures::future::join_all(sends).await;
        for ((_, indexes, _), reply) in batches.iter().zip(replies) {
            match reply {
                Ok(reply) => outcome.absorb(&reply, indexes),
                Err(e) => return Err(retryable(e, ctx)),
            }
        }
    }
    Ok(outcome.into_reply())
}

/// Runs an ordered insert's runs (consecutive statements on one shard) one after the other,
/// stopping at the first that fails.
async fn insert_runs(
    ctx: &Ctx<'_>,
    version: &Document,
    runs: Vec<Batch>,
    outcome: &mut WriteOutcome,
) -> Result<()> {
    for (shard, indexes, docs) in runs {
        let cmd = sub_command(ctx, version, "documents", docs, &indexes);
        let reply = ctx
            .seams
            .shards()
            .write(shard, ctx.db, cmd)
            .await
            .map_err(|e| retryable(e, ctx))?;
        outcome.absorb(&reply, &indexes);
        if reply.contains_key("writeErrors") {
            break;
        }
    }
    Ok(())
}

/// An ordered insert whose documents go to several shards, in two phases instead of one
/// sub-batch per run (see `shard::reservations`): every shard validates its whole part and
/// holds its keys (`_shardsvrReserveInsert`); then every shard inserts its documents that
/// come before the first failure of all shards (`_shardsvrCommitReservation`), in one commit
/// each, all at once. Nothing after the first failure is applied on any shard. A part that
/// meets another batch's hold stops there; the rest from that document runs as runs.
async fn insert_across_shards(
    ctx: &Ctx<'_>,
    version: &Document,
    runs: Vec<Batch>,
    outcome: &mut WriteOutcome,
) -> Result<()> {
    let seams = ctx.seams;
    let mut parts: Vec<Batch> = Vec::new();
    for (shard, indexes, docs) in runs {
        match parts.iter_mut().find(|p| p.0 == shard) {
            Some(p) => {
                p.1.extend(indexes);
                p.2.extend(docs);
            }
            None => parts.push((shard, indexes, docs)),
        }
    }
    let reserves = parts.iter().map(|(shard, indexes, docs)| {
        let mut cmd = doc! {"_shardsvrReserveInsert": ctx.args().collection().unwrap_or_default()};
        for (k, v) in sub_command(ctx, version, "documents", docs.clone(), indexes)
            .into_iter()
            .skip(1)
        {
            cmd.insert(k, v);
        }
        seams.shards().command(*shard, ctx.db, cmd)
    });
    let replies = futures::future::join_all(reserves).await;
    let reservation = |r: &Document| r.get("reservation").map(|id| int(Some(id)));
    if let Some(e) = replies.iter().find_map(|r| r.as_ref().err()) {
        let e = e.clone();
        let releases = parts.iter().zip(&replies).filter_map(|((shard, ..), r)| {
            let id = reservation(r.as_ref().ok()?)?;
            Some(seams.shards().command(
                *shard,
                ctx.db,
                doc! {"_shardsvrCommitReservation": id, "upTo": 0},
            ))
        });
        futures::future::join_all(releases).await;
        return Err(retryable(e, ctx));
    }
    let replies: Vec<Document> = replies.into_iter().flatten().collect();
    // Where each part stops (the driver index of its first failure or hold), and the first
    // of them all.
    let mut first: Option<(usize, Option<Document>)> = None;
    for ((_, indexes, _), reply) in parts.iter().zip(&replies) {
        let validated = int(reply.get("n")) as usize;
        let Some(&at) = indexes.get(validated) else {
            continue;
        };
        let error = reply
            .get_array("writeErrors")
            .ok()
            .and_then(|e| e.first())
            .and_then(Bson::as_document)
            .cloned();
        if error.is_none() && !reply.contains_key("heldAt") {
            continue;
        }
        if first.as_ref().is_none_or(|(i, _)| at < *i) {
            first = Some((at, error));
        }
    }
    let stop = first.as_ref().map_or(usize::MAX, |(i, _)| *i);
    let commits = parts
        .iter()
        .zip(&replies)
        .map(|((shard, indexes, _), reply)| {
            let up_to = indexes.iter().take_while(|&&i| i < stop).count();
            let mut cmd = doc! {
                "_shardsvrCommitReservation": reservation(reply).unwrap_or(0),
                "upTo": up_to as i64,
            };
            // The commit writes the documents: it carries the driver's validation bypass.
            if let Some(b) = ctx.cmd.get("bypassDocumentValidation") {
                cmd.insert("bypassDocumentValidation", b.clone());
            }
            async move {
                let reply = seams.shards().command(*shard, ctx.db, cmd).await;
                (reply, &indexes[..up_to])
            }
        });
    for (reply, indexes) in futures::future::join_all(commits).await {
        let reply = reply.map_err(|e| retryable(e, ctx))?;
        outcome.absorb(&reply, indexes);
    }
    match first {
        None => Ok(()),
        Some((at, Some(mut error))) => {
            error.insert("index", at as i32);
            outcome.write_errors.entry(at).or_insert(error);
            Ok(())
        }
        Some((at, None)) => {
            // A hold: the rest runs as runs, whose writes wait for the holding batch.
            let mut rest: Vec<Routed> = parts
                .into_iter()
                .flat_map(|(shard, indexes, docs)| {
                    indexes
                        .into_iter()
                        .zip(docs)
                        .map(move |(i, d)| (i, shard, d))
                })
                .filter(|(i, _, _)| *i >= at)
                .filter_map(|(i, shard, d)| Some((i, shard, d.as_document()?.clone())))
                .collect();
            rest.sort_by_key(|(i, _, _)| *i);
            insert_runs(ctx, version, group(rest, true, None), outcome).await
        }
    }
}

/// A statement routed: its index in the driver's batch, its shard, the document.
type Routed = (usize, ShardId, Document);

/// A shard's batch: the shard, its statements' indexes in the driver's batch, the documents.
type Batch = (ShardId, Vec<usize>, Vec<Bson>);

/// Groups `(index, shard, doc)` into per-shard batches: runs of consecutive statements for an
/// ordered write (up to `stop_at`), one batch per shard otherwise.
fn group(routed: Vec<Routed>, ordered: bool, stop_at: Option<usize>) -> Vec<Batch> {
    let mut batches: Vec<Batch> = Vec::new();
    for (i, shard, d) in routed {
        if stop_at.is_some_and(|s| i > s) {
            break;
        }
        let slot = if ordered {
            batches.last_mut().filter(|b| b.0 == shard)
        } else {
            batches.iter_mut().find(|b| b.0 == shard)
        };
        match slot {
            Some(b) => {
                b.1.push(i);
                b.2.push(Bson::Document(d));
            }
            None => batches.push((shard, vec![i], vec![Bson::Document(d)])),
        }
    }
    batches
}

/// The document with an `_id` (a new ObjectId first when it has none), as mongos does so that a
/// hashed `_id` key can be routed.
fn with_id(d: &Document) -> Document {
    if d.contains_key("_id") {
        return d.clone();
    }
    let mut out = Document::new();
    out.insert("_id", ObjectId::new());
    for (k, v) in d {
        out.insert(k.clone(), v.clone());
    }
    out
}

/// The primary of an unsharded namespace that a write placed (creating its database).
fn written_primary(primary: Option<ShardId>) -> Result<ShardId> {
    primary.ok_or_else(|| MongoError::internal("a write's database has no primary shard"))
}

pub(super) async fn update(ctx: &Ctx<'_>) -> Result<Document> {
    write_statements(ctx, "updates", true).await
}

pub(super) async fn delete(ctx: &Ctx<'_>) -> Result<Document> {
    write_statements(ctx, "deletes", false).await
}

/// `update` and `delete`: statement by statement on sharded collections, whole on unsharded.
async fn write_statements(ctx: &Ctx<'_>, list_field: &str, is_update: bool) -> Result<Document> {
    let args = ctx.args();
    let coll = args.collection()?;
    validate_collection_name(ctx.db, coll)?;
    let ordered = args.opt_bool("ordered")?.unwrap_or(true);
    let statements = args.documents(list_field)?;
    let seams = ctx.seams;
    let placement = seams
        .catalog
        .placement(ctx.db, coll, is_update)
        .await
        .map_err(|e| retryable(e, ctx))?;
    let version = placement.version();
    let sc = match placement {
        Placement::Unsharded { primary: None } => {
            // The database does not exist: nothing to update or delete.
            let mut outcome = WriteOutcome {
                is_update,
                ..Default::default()
            };
            outcome.n = 0;
            return Ok(outcome.into_reply());
        }
        Placement::Unsharded {
            primary: Some(primary),
        } => {
            let shard = primary;
            let mut cmd = forwardable(ctx.cmd);
            cmd.insert("shardVersion", version);
            let reply = seams
                .shards()
                .write(shard, ctx.db, cmd)
                .await
                .map_err(|e| retryable(e, ctx))?;
            return Ok(reply);
        }
        Placement::Sharded(sc) => sc,
    };
    let mut outcome = WriteOutcome {
        is_update,
        ..Default::default()
    };
    for (i, stmt) in statements.iter().enumerate() {
        let filter = match stmt.get("q") {
            Some(Bson::Document(q)) => q.clone(),
            _ => {
                return Err(MongoError::type_mismatch(format!(
                    "BSON field '{}.{list_field}.q' is missing or not an object",
                    ctx.name
                )));
            }
        };
        let multi = if is_update {
            matches!(stmt.get("multi"), Some(Bson::Boolean(true)))
        } else {
            !matches!(
                stmt.get("limit"),
                Some(Bson::Int32(1)) | Some(Bson::Int64(1)) | Some(Bson::Double(1.0))
            )
        };
        let upsert = matches!(stmt.get("upsert"), Some(Bson::Boolean(true)));
        let shards = Catalog::sharded_targets(&sc, &filter, stmt.get("collation"))?;
        let cmd = sub_command(
            ctx,
            &version,
            list_field,
            vec![Bson::Document((*stmt).clone())],
            &[i],
        );
        if shards.len() == 1 || multi {
            let sends = shards
                .iter()
                .map(|&s| seams.shards().write(s, ctx.db, cmd.clone()));
            let replies = futures::future::join_all(sends).await;
            for reply in replies {
                match reply {
                    Ok(r) => outcome.absorb(&r, &[i]),
                    Err(e) => return Err(retryable(e, ctx)),
                }
            }
        } else if upsert {
            outcome.fail(
                i,
                &MongoError::new(
                    ErrorCode::SHARD_KEY_NOT_FOUND,
                    format!("Failed to target upsert by query :: could not extract exact shard key from {filter}"),
                ),
            );
        } else {
            // A single-document write without the shard key: the first shard that matches wins.
            for shard in shards {
                let reply = seams
                    .shards()
                    .write(shard, ctx.db, cmd.clone())
                    .await
                    .map_err(|e| retryable(e, ctx))?;
                let matched = int(reply.get("n")) > 0 || reply.contains_key("writeErrors");
                outcome.absorb(&reply, &[i]);
                if matched {
                    break;
                }
            }
        }
        if ordered && outcome.has_errors() {
            break;
        }
    }
    Ok(outcome.into_reply())
}

pub(super) async fn find_and_modify(ctx: &Ctx<'_>) -> Result<Document> {
    let args = ctx.args();
    let coll = args.collection()?;
    validate_collection_name(ctx.db, coll)?;
    let query = args.opt_doc("query")?.cloned().unwrap_or_default();
    let upsert = args.opt_bool("upsert")?.unwrap_or(false);
    let seams = ctx.seams;
    let placement = seams
        .catalog
        .placement(ctx.db, coll, true)
        .await
        .map_err(|e| retryable(e, ctx))?;
    let mut cmd = forwardable(ctx.cmd);
    cmd.insert("shardVersion", placement.version());
    let shards = match placement {
        Placement::Unsharded { primary } => vec![written_primary(primary)?],
        Placement::Sharded(sc) => Catalog::sharded_targets(&sc, &query, ctx.cmd.get("collation"))?,
    };
    if shards.len() > 1 && upsert {
        return Err(MongoError::new(
            ErrorCode::SHARD_KEY_NOT_FOUND,
            format!(
                "Query for sharded findAndModify with upsert: true must contain the shard key: {query}"
            ),
        ));
    }
    let mut last = None;
    for shard in shards {
        let reply = seams
            .shards()
            .write(shard, ctx.db, cmd.clone())
            .await
            .map_err(|e| retryable(e, ctx))?;
        let n = reply
            .get_document("lastErrorObject")
            .map(|l| int(l.get("n")))
            .unwrap_or(0);
        if n > 0 {
            return Ok(reply);
        }
        last = Some(reply);
    }
    last.ok_or_else(|| MongoError::internal("findAndModify reached no shard"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed(shards: &[usize]) -> Vec<Routed> {
        shards
            .iter()
            .enumerate()
            .map(|(i, &s)| (i, ShardId::new(s).unwrap(), doc! {"_id": i as i32}))
            .collect()
    }

    /// Each batch's shard (as its index) and statement indexes.
    fn shape(batches: Vec<Batch>) -> Vec<(usize, Vec<usize>)> {
        batches
            .into_iter()
            .map(|(s, i, _)| (s.index(), i))
            .collect()
    }

    #[test]
    fn ordered_batches_keep_statement_order() {
        let b = group(routed(&[0, 0, 1, 0]), true, None);
        assert_eq!(shape(b), vec![(0, vec![0, 1]), (1, vec![2]), (0, vec![3])]);
    }

    #[test]
    fn unordered_batches_are_one_per_shard() {
        let b = group(routed(&[0, 1, 0, 1]), false, None);
        assert_eq!(shape(b), vec![(0, vec![0, 2]), (1, vec![1, 3])]);
    }

    #[test]
    fn write_errors_are_reported_at_the_driver_index() {
        let mut o = WriteOutcome::default();
        o.absorb(
            &doc! {"n": 1, "writeErrors": [{"index": 1, "code": 11000, "errmsg": "dup"}]},
            &[4, 7],
        );
        let reply = o.into_reply();
        let e = reply.get_array("writeErrors").unwrap()[0]
            .as_document()
            .unwrap()
            .clone();
        assert_eq!(e.get_i32("index").unwrap(), 7);
        assert_eq!(
            reply.get("n"),
            Some(&Bson::Int32(1)),
            "an int32, as MongoDB"
        );
    }

    #[test]
    fn generated_ids_come_first() {
        let d = with_id(&doc! {"a": 1});
        assert_eq!(d.keys().next().unwrap(), "_id");
        let kept = with_id(&doc! {"a": 1, "_id": 5});
        assert_eq!(kept.get_i32("_id").unwrap(), 5);
    }
}
