//! What the read commands share (`find`, `aggregate`, `explain`, the stats stages,
//! `$currentOp`): the shards a read reaches, its leading `$match` and whether its pipeline
//! must run on the router, and the first batch of a new router cursor.

use bson::{Bson, Document, RawDocumentBuf, doc};
use pipeline::agg::Pipeline;
use pipeline::agg::lookup;
use shard::sharding::ShardId;
use wire::raw::{Body, CursorReply};
use wire::{MongoError, Result};

use super::Ctx;
use super::crud::forwardable;
use crate::cursors::CursorTable;
use crate::cursors::RouterCursor;
use crate::kernel::catalog::{Catalog, Placement};

/// MongoDB's default first batch.
pub(super) const DEFAULT_BATCH: usize = 101;

/// The shards a read of `db.coll` with `filter` must reach; empty when the database does not
/// exist.
pub(super) async fn read_targets(ctx: &Ctx<'_>, coll: &str, filter: &Document) -> Result<Targets> {
    let placement = ctx.seams.catalog.placement(ctx.db, coll, false).await?;
    let shards = Catalog::targets(&placement, filter, ctx.cmd.get("collation"))?;
    Ok(Targets {
        shards,
        version: placement.version(),
        sharded: matches!(placement, Placement::Sharded(_)),
        read_preference: crate::kernel::replica_set::secondary_ok(ctx.cmd),
    })
}

/// The shards a read goes to, and the routing it was based on.
pub(super) struct Targets {
    pub(super) shards: Vec<ShardId>,
    pub(super) version: Document,
    pub(super) sharded: bool,
    /// The client's `$readPreference`, when it accepts secondaries
    /// ([`crate::kernel::replica_set::secondary_ok`]).
    pub(super) read_preference: Option<Bson>,
}

impl Targets {
    /// The driver's command for the shards, with the routing it was based on.
    pub(super) fn command(&self, cmd: &Document) -> Document {
        let mut cmd = forwardable(cmd);
        self.route(&mut cmd);
        cmd
    }

    /// Adds the routing to a command for the shards: the collection's version, and the
    /// client's read preference when it accepts secondaries.
    pub(super) fn route(&self, cmd: &mut Document) {
        cmd.insert("shardVersion", self.version.clone());
        if let Some(p) = &self.read_preference {
            cmd.insert("$readPreference", p.clone());
        }
    }
}

/// `{cursor: {id, ns, firstBatch}, ok: 1}`, registering the cursor when it is not exhausted.
pub(super) fn cursor_reply(
    cursors: &CursorTable,
    ns: String,
    batch: Vec<Document>,
    open: Option<RouterCursor>,
) -> Document {
    let id = match open {
        Some(cursor) => cursors.insert(cursor),
        None => 0,
    };
    let batch: Vec<Bson> = batch.into_iter().map(Bson::Document).collect();
    doc! {"cursor": {"firstBatch": batch, "id": id, "ns": ns}, "ok": 1.0}
}

/// Reads the first batch of a fresh router cursor and replies with it (each document encoded
/// as it is taken, see [`RouterCursor::next_encoded_batch`]); a `singleBatch` read closes the
/// cursor after it.
pub(super) async fn first_reply(
    ctx: &Ctx<'_>,
    ns: String,
    mut cursor: RouterCursor,
    batch_size: usize,
    single_batch: bool,
) -> Result<Body> {
    let (batch, exhausted) = match cursor
        .next_encoded_batch(ctx.seams.shards(), batch_size, None)
        .await
    {
        Ok(read) => read,
        Err(e) => {
            cursor.kill(ctx.seams.shards()).await;
            return Err(e);
        }
    };
    let id = if exhausted || single_batch {
        cursor.kill(ctx.seams.shards()).await;
        0
    } else {
        ctx.seams.cursors.insert(cursor)
    };
    Ok(Body::Raw(encoded_reply(&ns, id, true, &batch)))
}

/// The first reply of a cursor over `docs`, results the router computed (the command's
/// `cursor: {batchSize}`; `getMore` reads the rest).
pub(super) async fn buffered_reply(ctx: &Ctx<'_>, ns: String, docs: Vec<Document>) -> Result<Body> {
    let cursor = RouterCursor {
        ns: ns.clone(),
        state: crate::cursors::CursorState::Buffered(docs.into()),
        info: None,
    };
    let batch = batch_size(ctx, ctx.args().opt_doc("cursor")?)?;
    first_reply(ctx, ns, cursor, batch, false).await
}

pub(super) fn batch_size(ctx: &Ctx<'_>, from: Option<&Document>) -> Result<usize> {
    let v = match from {
        Some(d) => super::Args::new(d, ctx.name).opt_i64("batchSize")?,
        None => ctx.args().opt_i64("batchSize")?,
    };
    match v {
        None => Ok(DEFAULT_BATCH),
        Some(n) if n < 0 => Err(MongoError::bad_value(
            "BatchSize value must be non-negative",
        )),
        Some(n) => Ok(n as usize),
    }
}

/// `{cursor: {firstBatch | nextBatch, id, ns}, ok: 1}` around a batch of encoded documents.
pub(super) fn encoded_reply(ns: &str, id: i64, first: bool, batch: &[Vec<u8>]) -> RawDocumentBuf {
    CursorReply {
        ns,
        id,
        first,
        batch,
        post_batch_resume_token: None,
        invalidated: false,
    }
    .write()
}

/// An aggregate's leading `$match` stages as one filter (what the shards are asked for).
pub(super) fn leading_match(cmd: &Document) -> Document {
    let stages: Vec<Document> = cmd
        .get_array("pipeline")
        .map(|p| p.as_slice())
        .unwrap_or_default()
        .iter()
        .filter_map(Bson::as_document)
        .cloned()
        .collect();
    leading_match_of(&stages)
}

/// The conjunction of a pipeline's leading `$match` stages (`{}` without one).
pub(super) fn leading_match_of(stages: &[Document]) -> Document {
    let leading: Vec<Bson> = stages
        .iter()
        .take_while(|s| s.len() == 1 && s.contains_key("$match"))
        .filter_map(|s| s.get("$match").cloned())
        .collect();
    match leading.as_slice() {
        [] => Document::new(),
        [Bson::Document(m)] => m.clone(),
        _ => doc! {"$and": leading},
    }
}

/// Whether the pipeline must run on the router even over one shard's collection.
pub(super) fn needs_router(parsed: &Pipeline) -> bool {
    parsed.stages().iter().any(lookup::reads_other_collections)
}
