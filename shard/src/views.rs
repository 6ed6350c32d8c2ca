//! Reads of views on a shard. A view's definition lives in the catalog of its database's
//! primary shard, but its source may be sharded, so a shard does not read a view itself: as
//! mongod does, it answers `CommandOnShardedViewNotSupportedOnMongod` (169) with the view
//! resolved to its source collection and full pipeline (`resolvedView`), and the router runs
//! the read again as an aggregation over the source.
//!
//! Invariants: a view on a view resolves to the first non-view source, with the pipelines
//! concatenated innermost first; resolution stops with `ViewDepthLimitExceeded` (149) past
//! [`MAX_DEPTH`] views, so a cycle cannot loop.

use bson::{Bson, Document, doc};
use wire::{ErrorCode, MongoError};

use crate::catalog::Catalog;

/// MongoDB's limit on views over views.
pub const MAX_DEPTH: usize = 20;

/// `Err(169 with resolvedView)` when `db.coll` is a view; `Ok(())` otherwise.
pub fn refuse_view_read(catalog: &Catalog, db: &str, coll: &str) -> Result<(), MongoError> {
    let Some(entry) = catalog.lookup(db, coll) else {
        return Ok(());
    };
    if !entry.options.contains_key("viewOn") {
        return Ok(());
    }
    let mut source = coll.to_string();
    let mut stages: Vec<Bson> = Vec::new();
    for _ in 0..=MAX_DEPTH {
        let Some(view) = catalog
            .lookup(db, &source)
            .filter(|e| e.options.contains_key("viewOn"))
        else {
            return Err(MongoError::new(
                ErrorCode {
                    code: 169,
                    name: "CommandOnShardedViewNotSupportedOnMongod",
                },
                "Resolved views on sharded collections must be executed by mongos",
            )
            .with_extra(doc! {
                "resolvedView": {"ns": format!("{db}.{source}"), "pipeline": stages},
            }));
        };
        let mut inner: Vec<Bson> = view
            .options
            .get_array("pipeline")
            .cloned()
            .unwrap_or_default();
        inner.extend(stages);
        stages = inner;
        source = view
            .options
            .get_str("viewOn")
            .unwrap_or_default()
            .to_string();
    }
    Err(MongoError::new(
        ErrorCode {
            code: 149,
            name: "ViewDepthLimitExceeded",
        },
        format!("View depth too deep or view cycle detected; maximum depth is {MAX_DEPTH}"),
    ))
}

/// The source namespace and pipeline of a 169 reply (see [`refuse_view_read`]).
pub fn resolved(e: &MongoError) -> Option<(String, Vec<Document>)> {
    if e.code != 169 {
        return None;
    }
    let view = e.extra.as_ref()?.get_document("resolvedView").ok()?;
    let ns = view.get_str("ns").ok()?.to_string();
    let pipeline = view
        .get_array("pipeline")
        .ok()?
        .iter()
        .filter_map(|s| s.as_document().cloned())
        .collect();
    Some((ns, pipeline))
}
