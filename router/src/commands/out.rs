//! `$out` and `$merge`: the stages that write an aggregation's results into a collection.
//!
//! The router runs the pipeline before the stage as for any aggregate, then writes the results
//! through its own command paths, so routing, shard keys and unique indexes apply as to any
//! write: `$out` fills a temporary collection in the target database (with the target's
//! indexes) and renames it over the target; `$merge` sends one upsert (or insert) per result.
//!
//! Invariants:
//! * Either stage is the pipeline's last (40601 otherwise), and neither runs in a transaction
//!   or at a `linearizable` read concern.
//! * `$out` replaces the target whole or not at all: until the rename, the target is as it
//!   was, and a failure drops the temporary collection.
//! * `$merge` stops at the first failing document (earlier ones stay written), as MongoDB's,
//!   and gives a result without `_id` a new ObjectId first, as MongoDB's does.
//! * The results are written as they are read, a batch at a time, except a `$merge` into the
//!   collection the pipeline reads: its results are all read (spooled) before it writes.
//! * The target's validator applies to the written documents (`$out`'s temporary collection
//!   gets the target's options), unless the aggregate says `bypassDocumentValidation: true`.

use bson::{Bson, Document, doc};
use wire::{ErrorCode, MongoError, Result};

use super::Ctx;
use crate::command::Command;
use crate::cursors::RouterCursor;

/// Where and how the results are written.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Sink {
    Out {
        db: String,
        coll: String,
    },
    Merge {
        db: String,
        coll: String,
        on: Vec<String>,
        when_matched: WhenMatched,
        when_not_matched: WhenNotMatched,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum WhenMatched {
    Replace,
    KeepExisting,
    Merge,
    Fail,
    /// An update pipeline; `$$new` (or the `let` variables, evaluated on each result) names
    /// the result.
    Pipeline {
        stages: Vec<Bson>,
        vars: Document,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum WhenNotMatched {
    Insert,
    Discard,
    Fail,
}

fn is_sink(stage: &Document) -> bool {
    stage.contains_key("$out") || stage.contains_key("$merge")
}

/// The stages before a final `$out` or `$merge`, and that stage.
pub(super) fn split(stages: &[Document], db: &str) -> Result<(Vec<Document>, Option<Sink>)> {
    let Some(position) = stages.iter().position(is_sink) else {
        return Ok((stages.to_vec(), None));
    };
    let stage = &stages[position];
    let name = if stage.contains_key("$out") {
        "$out"
    } else {
        "$merge"
    };
    if position + 1 != stages.len() {
        return Err(MongoError::with_code(
            40601,
            format!("{name} can only be the final stage in the pipeline"),
        ));
    }
    let sink = match stage.get(name) {
        Some(spec) if name == "$out" => parse_out(spec, db)?,
        Some(spec) => parse_merge(spec, db)?,
        None => unreachable_stage()?,
    };
    Ok((stages[..position].to_vec(), Some(sink)))
}

impl Sink {
    /// Whether the stage writes into collection `coll` of `db` while the pipeline reads it: a
    /// `$merge` into its own source, whose writes a scan still under way could read again (an
    /// insert of a new `_id` would be read, merged and inserted again, without end). Such a
    /// pipeline's results are all read before the first write.
    pub(super) fn merges_into(&self, db: &str, coll: &str) -> bool {
        matches!(self, Sink::Merge { db: d, coll: c, .. } if d == db && c == coll)
    }
}

fn unreachable_stage() -> Result<Sink> {
    Err(MongoError::internal("a sink stage without its name"))
}

/// `{db, coll}` or a collection name in `db`.
fn target(spec: &Bson, db: &str, stage: &str, coll_field: &str) -> Result<(String, String)> {
    let bad = |what: &str| MongoError::failed_to_parse(format!("{stage}: {what}"));
    let (db, coll) = match spec {
        Bson::String(coll) => (db.to_string(), coll.clone()),
        Bson::Document(d) => {
            let db = match d.get("db") {
                Some(Bson::String(s)) => s.clone(),
                None => db.to_string(),
                Some(_) => return Err(bad("'db' must be a string")),
            };
            match d.get(coll_field) {
                Some(Bson::String(c)) => (db, c.clone()),
                _ => return Err(bad(&format!("'{coll_field}' must be a string"))),
            }
        }
        _ => return Err(bad("the target must be a collection name or a document")),
    };
    super::crud::validate_collection_name(&db, &coll)?;
    Ok((db, coll))
}

fn parse_out(spec: &Bson, db: &str) -> Result<Sink> {
    if let Bson::Document(d) = spec
        && d.contains_key("timeseries")
    {
        return Err(MongoError::new(
            ErrorCode::COMMAND_NOT_SUPPORTED,
            "$out to a time-series collection is not supported",
        ));
    }
    let (db, coll) = target(spec, db, "$out", "coll")?;
    Ok(Sink::Out { db, coll })
}

fn parse_merge(spec: &Bson, db: &str) -> Result<Sink> {
    let bad = |what: String| MongoError::failed_to_parse(format!("$merge: {what}"));
    let (into, options) = match spec {
        Bson::Document(d) => (
            d.get("into")
                .ok_or_else(|| bad("'into' is required".into()))?,
            d.clone(),
        ),
        other => (other, Document::new()),
    };
    for key in options.keys() {
        if !matches!(
            key.as_str(),
            "into" | "on" | "let" | "whenMatched" | "whenNotMatched"
        ) {
            return Err(bad(format!("unknown option '{key}'")));
        }
    }
    let (db, coll) = target(into, db, "$merge", "coll")?;
    let on = match options.get("on") {
        None => vec!["_id".to_string()],
        Some(Bson::String(f)) => vec![f.clone()],
        Some(Bson::Array(fields)) if !fields.is_empty() => fields
            .iter()
            .map(|f| match f {
                Bson::String(f) => Ok(f.clone()),
                _ => Err(bad("'on' fields must be strings".into())),
            })
            .collect::<Result<_>>()?,
        Some(_) => return Err(bad("'on' must be a field name or an array of them".into())),
    };
    let when_matched = match options.get("whenMatched") {
        Some(Bson::Array(stages)) => {
            // The pipeline is checked as an update pipeline when it runs; `let` defaults to
            // `{new: "$$ROOT"}`.
            let vars = match options.get("let") {
                None => doc! {"new": "$$ROOT"},
                Some(Bson::Document(v)) => v.clone(),
                Some(_) => return Err(bad("'let' must be an object".into())),
            };
            WhenMatched::Pipeline {
                stages: stages.clone(),
                vars,
            }
        }
        _ => {
            if options.contains_key("let") {
                return Err(MongoError::with_code(
                    51199,
                    "Cannot use 'let' variables with 'whenMatched' mode other than a pipeline",
                ));
            }
            mode(
                &options,
                "whenMatched",
                WhenMatched::Merge,
                &[
                    ("replace", WhenMatched::Replace),
                    ("keepExisting", WhenMatched::KeepExisting),
                    ("merge", WhenMatched::Merge),
                    ("fail", WhenMatched::Fail),
                ],
            )?
        }
    };
    let when_not_matched = mode(
        &options,
        "whenNotMatched",
        WhenNotMatched::Insert,
        &[
            ("insert", WhenNotMatched::Insert),
            ("discard", WhenNotMatched::Discard),
            ("fail", WhenNotMatched::Fail),
        ],
    )?;
    Ok(Sink::Merge {
        db,
        coll,
        on,
        when_matched,
        when_not_matched,
    })
}

/// One of `$merge`'s modes: `field` of `options` named as in `modes`, `default` when absent.
fn mode<T: Clone>(options: &Document, field: &str, default: T, modes: &[(&str, T)]) -> Result<T> {
    match options.get(field) {
        None => Ok(default),
        Some(Bson::String(s)) => modes
            .iter()
            .find(|(name, _)| name == s)
            .map(|(_, m)| m.clone())
            .ok_or_else(|| {
                MongoError::failed_to_parse(format!("$merge: unknown {field} mode '{s}'"))
            }),
        Some(_) => Err(MongoError::failed_to_parse(format!(
            "$merge: '{field}' must be a string"
        ))),
    }
}

/// Refuses a sink the aggregate cannot run where it is.
pub(super) fn check_allowed(ctx: &Ctx<'_>) -> Result<()> {
    if ctx.cmd.contains_key("txnNumber") && ctx.cmd.contains_key("autocommit") {
        return Err(MongoError::new(
            ErrorCode::OPERATION_NOT_SUPPORTED_IN_TRANSACTION,
            "$out and $merge cannot be used in a transaction",
        ));
    }
    let level = ctx
        .cmd
        .get_document("readConcern")
        .ok()
        .and_then(|rc| rc.get_str("level").ok());
    if level == Some("linearizable") {
        return Err(MongoError::new(
            ErrorCode::INVALID_OPTIONS,
            "$out and $merge cannot be used with a 'linearizable' read concern level",
        ));
    }
    Ok(())
}

/// Runs another command through the router's own dispatch, as the aggregate's client.
async fn command(ctx: &Ctx<'_>, db: &str, mut cmd: Document) -> Result<Document> {
    let name = cmd.keys().next().cloned().unwrap_or_default();
    if matches!(name.as_str(), "insert" | "update")
        && ctx
            .cmd
            .get_bool("bypassDocumentValidation")
            .unwrap_or(false)
    {
        cmd.insert("bypassDocumentValidation", true);
    }
    let command = Command::named(&name)
        .ok_or_else(|| MongoError::internal(format!("$out and $merge ran '{name}'")))?;
    let sub = Ctx {
        seams: ctx.seams,
        conn: ctx.conn,
        db,
        cmd: &cmd,
        name: &name,
        command: Some(command),
    };
    let reply = Box::pin(super::run_command(command, &sub))
        .await?
        .into_document()?;
    // A write's first error is the stage's error.
    if let Ok(errors) = reply.get_array("writeErrors")
        && let Some(Bson::Document(first)) = errors.first()
    {
        let code = first
            .get_i32("code")
            .unwrap_or(ErrorCode::INTERNAL_ERROR.code);
        let message = first.get_str("errmsg").unwrap_or("write failed");
        let mut e = MongoError::with_code(code, message);
        // What the write error tells beyond its code (a duplicate key's keyPattern and
        // keyValue, a validation failure's errInfo) stays on the stage's error.
        let extra: Document = ["errInfo", "keyPattern", "keyValue"]
            .into_iter()
            .filter_map(|f| first.get(f).map(|v| (f.to_string(), v.clone())))
            .collect();
        if !extra.is_empty() {
            e = e.with_extra(extra);
        }
        return Err(e);
    }
    if let Ok(wce) = reply.get_document("writeConcernError") {
        let code = wce
            .get_i32("code")
            .unwrap_or(ErrorCode::INTERNAL_ERROR.code);
        let message = wce.get_str("errmsg").unwrap_or("write concern failed");
        return Err(MongoError::with_code(code, message));
    }
    Ok(reply)
}

/// Writes the aggregation's results into the sink, reading them a batch at a time (the
/// router holds one batch of them, whatever their number).
pub(super) async fn write(ctx: &Ctx<'_>, sink: &Sink, mut results: RouterCursor) -> Result<()> {
    let written = match sink {
        Sink::Out { db, coll } => out(ctx, db, coll, &mut results).await,
        Sink::Merge {
            db,
            coll,
            on,
            when_matched,
            when_not_matched,
        } => {
            merge(
                ctx,
                db,
                coll,
                on,
                when_matched,
                *when_not_matched,
                &mut results,
            )
            .await
        }
    };
    if written.is_err() {
        results.kill(ctx.seams.shards()).await;
    }
    written
}

const WRITE_BATCH: usize = 1_000;

/// The next batch of results (at most [`WRITE_BATCH`]); `None` at the end.
async fn next_batch(ctx: &Ctx<'_>, results: &mut RouterCursor) -> Result<Option<Vec<Document>>> {
    let (batch, _) = results
        .next_batch(ctx.seams.shards(), WRITE_BATCH, None)
        .await?;
    Ok((!batch.is_empty()).then_some(batch))
}

async fn out(ctx: &Ctx<'_>, db: &str, coll: &str, results: &mut RouterCursor) -> Result<()> {
    let ns = format!("{db}.{coll}");
    if ctx.seams.catalog.sharded_collection(&ns).await?.is_some() {
        return Err(MongoError::with_code(
            28769,
            format!("{ns} cannot be sharded"),
        ));
    }
    let temp = format!("tmp.agg_out.{}", uuid::Uuid::new_v4().simple());
    // The temporary collection takes the target's options (its validator among them), so the
    // rename keeps them, as MongoDB's `$out` does.
    let listed = command(
        ctx,
        db,
        doc! {"listCollections": 1, "filter": {"name": coll}, "cursor": {}},
    )
    .await?;
    let mut create = doc! {"create": &temp};
    if let Some(Bson::Document(info)) = listed
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .ok()
        .and_then(|b| b.first())
        && let Ok(options) = info.get_document("options")
        && !info.get_str("type").is_ok_and(|t| t == "view")
    {
        create.extend(options.clone());
    }
    command(ctx, db, create).await?;
    let filled = fill(ctx, db, coll, &temp, results).await;
    let renamed = match filled {
        Ok(()) => {
            command(
                ctx,
                "admin",
                doc! {
                    "renameCollection": format!("{db}.{temp}"),
                    "to": &ns,
                    "dropTarget": true,
                },
            )
            .await
        }
        Err(e) => Err(e),
    };
    if let Err(e) = renamed {
        let _ = command(ctx, db, doc! {"drop": &temp}).await;
        return Err(e);
    }
    Ok(())
}

/// The temporary collection gets the target's indexes, then the documents.
async fn fill(
    ctx: &Ctx<'_>,
    db: &str,
    coll: &str,
    temp: &str,
    results: &mut RouterCursor,
) -> Result<()> {
    let indexes = match command(ctx, db, doc! {"listIndexes": coll, "cursor": {}}).await {
        Ok(reply) => reply
            .get_document("cursor")
            .and_then(|c| c.get_array("firstBatch"))
            .map(|b| b.to_vec())
            .unwrap_or_default(),
        Err(e) if e.code == ErrorCode::NAMESPACE_NOT_FOUND.code => Vec::new(),
        Err(e) => return Err(e),
    };
    let specs: Vec<Bson> = indexes
        .into_iter()
        .filter_map(|i| match i {
            Bson::Document(mut spec) if spec.get_str("name").ok() != Some("_id_") => {
                spec.remove("v");
                spec.remove("ns");
                Some(Bson::Document(spec))
            }
            _ => None,
        })
        .collect();
    if !specs.is_empty() {
        command(ctx, db, doc! {"createIndexes": temp, "indexes": specs}).await?;
    }
    while let Some(batch) = next_batch(ctx, results).await? {
        command(ctx, db, doc! {"insert": temp, "documents": batch}).await?;
    }
    Ok(())
}

async fn merge(
    ctx: &Ctx<'_>,
    db: &str,
    coll: &str,
    on: &[String],
    when_matched: &WhenMatched,
    when_not_matched: WhenNotMatched,
    results: &mut RouterCursor,
) -> Result<()> {
    check_unique_on(ctx, db, coll, on).await?;
    if *when_matched == WhenMatched::Fail && when_not_matched == WhenNotMatched::Insert {
        // Every result is new or an error: plain inserts (a match is a duplicate key).
        while let Some(batch) = next_batch(ctx, results).await? {
            command(ctx, db, doc! {"insert": coll, "documents": batch}).await?;
        }
        return Ok(());
    }
    // One command per result, as the results come.
    while let Some(batch) = next_batch(ctx, results).await? {
        for mut doc in batch {
            if !doc.contains_key("_id") {
                // A result without `_id` gets one, as MongoDB's `$merge` generates it.
                let mut with_id = doc! {"_id": bson::oid::ObjectId::new()};
                with_id.extend(doc);
                doc = with_id;
            }
            let mut filter = Document::new();
            for field in on {
                match pipeline::value::get_path(&doc, field) {
                    Some(v) if !matches!(v, Bson::Null | Bson::Undefined | Bson::Array(_)) => {
                        filter.insert(field.clone(), v.clone());
                    }
                    _ => {
                        return Err(MongoError::with_code(
                            51132,
                            "$merge write error: 'on' field cannot be missing, null, undefined or an array",
                        ));
                    }
                }
            }
            let u = match when_matched {
                WhenMatched::Replace => Bson::Document(doc.clone()),
                WhenMatched::Merge => Bson::Document(doc! {"$set": doc.clone()}),
                WhenMatched::KeepExisting => Bson::Document(doc! {"$setOnInsert": doc.clone()}),
                WhenMatched::Pipeline { stages, vars } => {
                    // The pipeline updates the match; with none, the result itself is inserted.
                    let mut values = Document::new();
                    for (name, e) in vars {
                        let expr = pipeline::expr::Expr::parse(e)?;
                        if let Some(v) = expr.evaluate(&doc)? {
                            values.insert(name.clone(), v);
                        }
                    }
                    let reply = command(
                        ctx,
                        db,
                        doc! {"update": coll, "updates": [{"q": filter, "u": stages.clone()}], "let": values},
                    )
                    .await?;
                    if reply.get_i32("n").unwrap_or(0) == 0 {
                        match when_not_matched {
                            WhenNotMatched::Insert => {
                                command(ctx, db, doc! {"insert": coll, "documents": [doc]}).await?;
                            }
                            WhenNotMatched::Discard => {}
                            WhenNotMatched::Fail => return Err(no_match()),
                        }
                    }
                    continue;
                }
                WhenMatched::Fail => {
                    // Only new documents may be written: any match fails the stage.
                    let found = command(
                        ctx,
                        db,
                        doc! {"find": coll, "filter": filter.clone(), "limit": 1, "singleBatch": true},
                    )
                    .await?;
                    let matched = found
                        .get_document("cursor")
                        .and_then(|c| c.get_array("firstBatch"))
                        .is_ok_and(|b| !b.is_empty());
                    if matched {
                        return Err(MongoError::with_code(
                            ErrorCode::DUPLICATE_KEY.code,
                            "$merge failed: a document matched and whenMatched is 'fail'",
                        ));
                    }
                    if when_not_matched == WhenNotMatched::Discard {
                        continue;
                    }
                    Bson::Document(doc.clone())
                }
            };
            let upsert = when_not_matched == WhenNotMatched::Insert;
            let reply = command(
                ctx,
                db,
                doc! {"update": coll, "updates": [{"q": filter, "u": u, "upsert": upsert}]},
            )
            .await?;
            if when_not_matched == WhenNotMatched::Fail && reply.get_i32("n").unwrap_or(0) == 0 {
                return Err(no_match());
            }
        }
    }
    Ok(())
}

fn no_match() -> MongoError {
    MongoError::with_code(
        13113,
        "$merge could not find a matching document in the target collection for at least one document in the source collection",
    )
}

/// `on` fields other than `_id` must be the fields of a unique index of the target (any
/// order), so that each result matches at most one document (51183 otherwise, also when the
/// target does not exist yet).
async fn check_unique_on(ctx: &Ctx<'_>, db: &str, coll: &str, on: &[String]) -> Result<()> {
    if on == ["_id"] {
        return Ok(());
    }
    let listed = command(ctx, db, doc! {"listIndexes": coll}).await;
    let indexes = match listed {
        Ok(reply) => crate::kernel::transport::first_batch(&reply)?,
        Err(e) if e.code == ErrorCode::NAMESPACE_NOT_FOUND.code => Vec::new(),
        Err(e) => return Err(e),
    };
    let wanted: std::collections::BTreeSet<&str> = on.iter().map(String::as_str).collect();
    let backed = indexes.iter().any(|ix| {
        ix.get_bool("unique").unwrap_or(false)
            && !ix.contains_key("partialFilterExpression")
            && !ix.contains_key("collation")
            && ix.get_document("key").is_ok_and(|k| {
                k.len() == wanted.len() && k.keys().all(|f| wanted.contains(f.as_str()))
            })
    }) || wanted == std::collections::BTreeSet::from(["_id"]);
    if backed {
        Ok(())
    } else {
        Err(MongoError::with_code(
            51183,
            "Cannot find index to verify that join fields will be unique",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinks_parse_and_must_come_last() {
        let stages = vec![doc! {"$match": {}}, doc! {"$out": "t"}];
        let (rest, sink) = split(&stages, "d").unwrap();
        assert_eq!(rest, vec![doc! {"$match": {}}]);
        assert_eq!(
            sink,
            Some(Sink::Out {
                db: "d".into(),
                coll: "t".into()
            })
        );
        let stages = vec![
            doc! {"$merge": {"into": {"db": "o", "coll": "t"}, "on": ["a", "b"], "whenMatched": "replace", "whenNotMatched": "discard"}},
        ];
        assert_eq!(
            split(&stages, "d").unwrap().1,
            Some(Sink::Merge {
                db: "o".into(),
                coll: "t".into(),
                on: vec!["a".into(), "b".into()],
                when_matched: WhenMatched::Replace,
                when_not_matched: WhenNotMatched::Discard,
            })
        );
        let stages = vec![doc! {"$out": "t"}, doc! {"$match": {}}];
        assert_eq!(split(&stages, "d").unwrap_err().code, 40601);
        let stages = vec![doc! {"$merge": {"into": "t", "whenMatched": "sometimes"}}];
        assert_eq!(
            split(&stages, "d").unwrap_err().code,
            ErrorCode::FAILED_TO_PARSE.code
        );
        let stages = vec![doc! {"$match": {}}];
        assert_eq!(split(&stages, "d").unwrap().1, None);
    }
}
