//! `explain` on a shard: the plan this shard runs for `find`, `count`, `distinct`,
//! `aggregate`, `update`, `delete` and `findAndModify`, in MongoDB's explain layout
//! (`queryPlanner.winningPlan`, and with `executionStats` verbosity what running it examined).
//!
//! Invariants: the plan shown is the one the command's own code takes: the planner's choice
//! (`indexes::plan`) for the same filter, sort and hint (`IDHACK`, `COLLSCAN`, or `FETCH` over
//! an `IXSCAN` with its bounds, under a `SORT` unless the scan gives the order; an aggregate
//! reads what its leading `$match` selects before its stages); running it for statistics
//! reads only: an explained write changes nothing and reports what it would have matched,
//! modified, upserted or deleted.

use std::time::Instant;

use bson::{Bson, Document, doc};
use wire::{ErrorCode, MongoError};

use super::{Ctx, Reply};
use crate::indexes::plan::{Access, Plan};
use crate::query::Filter;
use crate::storage::Scan;

const VERBOSITIES: [&str; 3] = ["queryPlanner", "executionStats", "allPlansExecution"];

/// The verbosity of an `explain` command (MongoDB's default: `allPlansExecution`).
pub fn verbosity(cmd: &Document) -> Result<String, MongoError> {
    match cmd.get("verbosity") {
        None => Ok("allPlansExecution".to_string()),
        Some(Bson::String(v)) if VERBOSITIES.contains(&v.as_str()) => Ok(v.clone()),
        Some(_) => Err(MongoError::bad_value(
            "verbosity string must be one of {'queryPlanner', 'executionStats', 'allPlansExecution'}",
        )),
    }
}

/// What one explained command reads, and what it does with what matches.
struct Shape {
    coll: String,
    filter_doc: Document,
    /// The stages above the collection access, innermost first: `(stage, its fields)`.
    stages: Vec<(&'static str, Document)>,
    write: Option<Write>,
    /// How many matching documents the command returns at most (`None`: all).
    limit: Option<usize>,
    skip: usize,
    /// An aggregate's stages after reading the collection.
    pipeline: Option<Vec<Bson>>,
    sort: Option<Document>,
    hint: Option<Bson>,
}

enum Write {
    Update {
        spec: crate::update::UpdateSpec,
        multi: bool,
        upsert: bool,
    },
    Delete {
        multi: bool,
    },
}

fn int(d: &Document, field: &str) -> Option<i64> {
    d.get(field).and_then(|v| match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(f) => Some(*f as i64),
        _ => None,
    })
}

fn sub_doc(d: &Document, field: &str) -> Result<Document, MongoError> {
    match d.get(field) {
        None | Some(Bson::Null) => Ok(Document::new()),
        Some(Bson::Document(f)) => Ok(f.clone()),
        Some(_) => Err(MongoError::type_mismatch(format!(
            "'{field}' must be an object"
        ))),
    }
}

/// The one statement an explained write batch may hold.
fn only_statement(inner: &Document, field: &str) -> Result<Document, MongoError> {
    match inner.get_array(field).map(|a| a.as_slice()) {
        Ok([Bson::Document(s)]) => Ok(s.clone()),
        _ => Err(MongoError::new(
            ErrorCode::INVALID_LENGTH,
            format!("explained {field} must hold exactly one statement"),
        )),
    }
}

fn shape(name: &str, inner: &Document) -> Result<Shape, MongoError> {
    let coll = match inner.get(name) {
        Some(Bson::String(c)) => c.clone(),
        _ => String::new(),
    };
    let mut shape = Shape {
        coll,
        filter_doc: Document::new(),
        stages: Vec::new(),
        write: None,
        limit: None,
        skip: 0,
        pipeline: None,
        sort: None,
        hint: inner.get("hint").cloned(),
    };
    match name {
        "find" => {
            shape.filter_doc = sub_doc(inner, "filter")?;
            let sort = sub_doc(inner, "sort")?;
            shape.skip = int(inner, "skip").unwrap_or(0).max(0) as usize;
            shape.limit = int(inner, "limit")
                .map(i64::saturating_abs)
                .filter(|l| *l > 0)
                .map(|l| l as usize);
            if !sort.is_empty() {
                shape.sort = Some(sort.clone());
                let mut fields =
                    doc! {"sortPattern": sort, "memLimit": 104_857_600, "type": "simple"};
                if let Some(l) = shape.limit {
                    fields.insert("limitAmount", (l + shape.skip) as i64);
                }
                shape.stages.push(("SORT", fields));
            }
            if shape.skip > 0 {
                shape
                    .stages
                    .push(("SKIP", doc! {"skipAmount": shape.skip as i64}));
            }
            if let Some(l) = shape.limit {
                shape.stages.push(("LIMIT", doc! {"limitAmount": l as i64}));
            }
            let projection = sub_doc(inner, "projection")?;
            if !projection.is_empty() {
                shape
                    .stages
                    .push(("PROJECTION_DEFAULT", doc! {"transformBy": projection}));
            }
        }
        "count" => {
            shape.filter_doc = sub_doc(inner, "query")?;
            shape.skip = int(inner, "skip").unwrap_or(0).max(0) as usize;
            shape.limit = int(inner, "limit")
                .map(i64::saturating_abs)
                .filter(|l| *l > 0)
                .map(|l| l as usize);
            shape.stages.push(("COUNT", Document::new()));
        }
        "distinct" => {
            shape.filter_doc = sub_doc(inner, "query")?;
            let key = inner.get_str("key").unwrap_or_default();
            shape.stages.push((
                "PROJECTION_DEFAULT",
                doc! {"transformBy": {key: 1, "_id": 0}},
            ));
        }
        "aggregate" => {
            let stages = inner
                .get_array("pipeline")
                .map_err(|_| MongoError::failed_to_parse("aggregate needs a pipeline array"))?;
            shape.filter_doc =
                super::query::leading_match(stages.iter().map_while(|s| s.as_document()));
            shape.pipeline = Some(stages.clone());
        }
        "update" => {
            let statement = only_statement(inner, "updates")?;
            shape.filter_doc = sub_doc(&statement, "q")?;
            shape.hint = statement.get("hint").cloned();
            let u = statement
                .get("u")
                .ok_or_else(|| MongoError::failed_to_parse("an update needs 'u'"))?;
            let filters = statement.get_array("arrayFilters").ok();
            shape.write = Some(Write::Update {
                spec: crate::update::UpdateSpec::parse(u, filters.map(|f| f.as_slice()))?,
                multi: statement.get_bool("multi").unwrap_or(false),
                upsert: statement.get_bool("upsert").unwrap_or(false),
            });
            shape.stages.push(("UPDATE", Document::new()));
        }
        "delete" => {
            let statement = only_statement(inner, "deletes")?;
            shape.filter_doc = sub_doc(&statement, "q")?;
            shape.hint = statement.get("hint").cloned();
            shape.write = Some(Write::Delete {
                multi: int(&statement, "limit") == Some(0),
            });
            shape.stages.push(("DELETE", Document::new()));
        }
        "findAndModify" | "findandmodify" => {
            shape.filter_doc = sub_doc(inner, "query")?;
            let sort = sub_doc(inner, "sort")?;
            if !sort.is_empty() {
                shape.sort = Some(sort.clone());
                shape.stages.push((
                    "SORT",
                    doc! {"sortPattern": sort, "memLimit": 104_857_600, "limitAmount": 1, "type": "simple"},
                ));
            }
            if inner.get_bool("remove").unwrap_or(false) {
                shape.write = Some(Write::Delete { multi: false });
                shape.stages.push(("DELETE", Document::new()));
            } else {
                let u = inner.get("update").ok_or_else(|| {
                    MongoError::failed_to_parse("findAndModify needs 'update' or 'remove'")
                })?;
                let filters = inner.get_array("arrayFilters").ok();
                shape.write = Some(Write::Update {
                    spec: crate::update::UpdateSpec::parse(u, filters.map(|f| f.as_slice()))?,
                    multi: false,
                    upsert: inner.get_bool("upsert").unwrap_or(false),
                });
                shape.stages.push(("UPDATE", Document::new()));
            }
        }
        other => {
            return Err(MongoError::new(
                ErrorCode::COMMAND_NOT_FOUND,
                format!("Explain failed due to unknown command: {other}"),
            ));
        }
    }
    Ok(shape)
}

/// What running the plan examined and produced.
#[derive(Default)]
struct Counts {
    keys_examined: i64,
    docs_examined: i64,
    matched: i64,
    returned: i64,
    would_modify: i64,
    millis: i64,
}

/// The collection access of a plan: `(the node that reads, the FETCH above an IXSCAN)`.
fn access_node(shape: &Shape, plan: Option<&Plan>) -> (Document, Option<Document>) {
    let ixscan =
        |pattern: Document, name: &str, flags: [bool; 3], reverse: bool, bounds: &Document| {
            let [multikey, unique, sparse] = flags;
            let partial = false;
            doc! {
                "stage": "IXSCAN",
                "keyPattern": pattern,
                "indexName": name,
                "isMultiKey": multikey,
                "isUnique": unique,
                "isSparse": sparse,
                "isPartial": partial,
                "indexVersion": 2,
                "direction": if reverse { "backward" } else { "forward" },
                "indexBounds": bounds.clone(),
            }
        };
    let fetch = || {
        let mut f = doc! {"stage": "FETCH"};
        if !shape.filter_doc.is_empty() {
            f.insert("filter", shape.filter_doc.clone());
        }
        f
    };
    match plan.map(|p| &p.access) {
        Some(Access::IdPoint(_)) => (doc! {"stage": "IDHACK"}, None),
        Some(Access::Documents {
            bounded: true,
            reverse,
            bounds,
            ..
        }) => (
            ixscan(
                doc! {"_id": 1},
                "_id_",
                [false, true, false],
                *reverse,
                bounds,
            ),
            Some(fetch()),
        ),
        Some(Access::Index(scan)) => {
            let covered = scan.covered;
            let mut node = ixscan(
                scan.pattern.clone(),
                &scan.name,
                [scan.multikey, scan.unique, scan.sparse],
                scan.reverse,
                &scan.bounds,
            );
            node.insert("isPartial", scan.partial);
            (node, (!covered).then(fetch))
        }
        Some(Access::Documents { reverse, .. }) => (
            doc! {"stage": "COLLSCAN", "filter": shape.filter_doc.clone(), "direction": if *reverse { "backward" } else { "forward" }},
            None,
        ),
        Some(Access::Natural { reverse, .. }) => (
            doc! {"stage": "COLLSCAN", "filter": shape.filter_doc.clone(), "direction": if *reverse { "backward" } else { "forward" }},
            None,
        ),
        None => (doc! {"stage": "EOF"}, None),
    }
}

/// The plan tree; with `counts`, each stage carries its statistics.
fn plan(shape: &Shape, chosen: Option<&Plan>, counts: Option<&Counts>) -> Document {
    let (mut node, fetch) = access_node(shape, chosen);
    if let Some(c) = counts {
        node.insert(
            "nReturned",
            if fetch.is_some() {
                c.keys_examined
            } else {
                c.matched
            },
        );
        node.insert("executionTimeMillisEstimate", c.millis);
        node.insert("keysExamined", c.keys_examined);
        node.insert(
            "docsExamined",
            if fetch.is_some() { 0 } else { c.docs_examined },
        );
    }
    if let Some(mut f) = fetch {
        if let Some(c) = counts {
            f.insert("nReturned", c.matched);
            f.insert("executionTimeMillisEstimate", c.millis);
            f.insert("docsExamined", c.docs_examined);
        }
        f.insert("inputStage", node);
        node = f;
    }
    let sorted_by_scan = chosen.is_some_and(|p| p.provides_sort);
    for (stage, fields) in &shape.stages {
        if *stage == "SORT" && sorted_by_scan {
            continue;
        }
        let covered = matches!(chosen.map(|p| &p.access), Some(Access::Index(s)) if s.covered);
        let name = match *stage {
            "PROJECTION_DEFAULT" if covered => "PROJECTION_COVERED",
            other => other,
        };
        let mut outer = doc! {"stage": name};
        outer.extend(fields.clone());
        if let Some(c) = counts {
            match (*stage, &shape.write) {
                ("UPDATE", Some(Write::Update { upsert, .. })) => {
                    outer.insert("nMatched", c.returned);
                    outer.insert("nWouldModify", c.would_modify);
                    outer.insert("nWouldUpsert", i64::from(*upsert && c.returned == 0));
                }
                ("DELETE", _) => {
                    outer.insert("nWouldDelete", c.returned);
                }
                ("COUNT", _) => {
                    outer.insert("nCounted", c.returned);
                }
                _ => {}
            }
            outer.insert("executionTimeMillisEstimate", c.millis);
        }
        outer.insert("inputStage", node);
        node = outer;
    }
    node
}

/// `explain` of the command in `explain`.
pub fn explain(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let inner = match ctx.cmd.get("explain") {
        Some(Bson::Document(d)) => d.clone(),
        _ => {
            return Err(MongoError::type_mismatch(
                "explain takes a command document",
            ));
        }
    };
    let verbosity = verbosity(&ctx.cmd)?;
    let name = inner.keys().next().cloned().unwrap_or_default();
    let shape = shape(&name, &inner)?;
    // The collation is the command's, or an update's or delete's first statement's.
    let collation_source = match name.as_str() {
        "update" | "delete" => inner
            .get_array(if name == "update" {
                "updates"
            } else {
                "deletes"
            })
            .ok()
            .and_then(|s| s.first())
            .and_then(Bson::as_document)
            .cloned()
            .unwrap_or_default(),
        _ => inner.clone(),
    };
    let env = pipeline::expr::Env::from_command(&inner)?.with_collation_of(
        &collation_source,
        ctx.default_collation(&shape.coll).as_ref(),
    )?;
    let filter = Filter::parse_in(&shape.filter_doc, &env)?.with_hint(shape.hint.as_ref())?;
    let sort = shape
        .sort
        .as_ref()
        .map(crate::query::Sort::parse)
        .transpose()?
        .map(|s| s.with_collation(env.collation.clone()));
    let mut chosen = ctx.read(|txn, catalog| match catalog.lookup(&ctx.db, &shape.coll) {
        Some(entry) => crate::query::plan(txn, entry, &filter, sort.as_ref())
            .map(Some)
            .map_err(op_err),
        None => Ok(None),
    })?;
    if name == "find"
        && let Some(p) = chosen.as_mut()
    {
        let projection = sub_doc(&inner, "projection")?;
        crate::indexes::plan::cover(p, &shape.filter_doc, Some(&projection));
    }
    let ns = ctx.ns(&shape.coll);
    let server_info =
        doc! {"host": ctx.shard.name(), "version": "7.0.0", "gitVersion": "tributary"};
    let counts = if verbosity == "queryPlanner" {
        None
    } else {
        Some(run(ctx, &shape, &filter, chosen.as_ref())?)
    };
    let planner = |winning: Document| {
        doc! {
            "namespace": &ns,
            "indexFilterSet": false,
            "parsedQuery": shape.filter_doc.clone(),
            "winningPlan": winning,
            "rejectedPlans": [],
        }
    };
    let mut reply = doc! {"explainVersion": "1"};
    if let Some(stages) = &shape.pipeline {
        // The shard reads the whole collection, then runs every stage over it.
        let mut cursor = doc! {"queryPlanner": planner(plan(&shape, chosen.as_ref(), None))};
        if let Some(c) = &counts {
            cursor.insert(
                "executionStats",
                execution_stats(&shape, chosen.as_ref(), c),
            );
        }
        let mut all = vec![Bson::Document(doc! {"$cursor": cursor})];
        all.extend(stages.iter().cloned());
        reply.insert("stages", all);
    } else {
        reply.insert("queryPlanner", planner(plan(&shape, chosen.as_ref(), None)));
        if let Some(c) = &counts {
            reply.insert(
                "executionStats",
                execution_stats(&shape, chosen.as_ref(), c),
            );
        }
    }
    reply.insert("serverInfo", server_info);
    reply.insert("command", inner);
    reply.insert("ok", 1.0);
    Ok(Reply::read(reply))
}

fn op_err(e: crate::writer::OpError) -> MongoError {
    match e {
        crate::writer::OpError::Mongo(e) => e,
        crate::writer::OpError::Storage(e) => e.into_mongo(),
    }
}

fn execution_stats(shape: &Shape, chosen: Option<&Plan>, c: &Counts) -> Document {
    doc! {
        "executionSuccess": true,
        "nReturned": if shape.write.is_some() { 0 } else { c.returned },
        "executionTimeMillis": c.millis,
        "totalKeysExamined": c.keys_examined,
        "totalDocsExamined": c.docs_examined,
        "executionStages": plan(shape, chosen, Some(c)),
    }
}

/// Runs the read part of the plan and counts; a write is tried on copies, never applied.
fn run(
    ctx: &Ctx<'_>,
    shape: &Shape,
    filter: &Filter,
    chosen: Option<&Plan>,
) -> Result<Counts, MongoError> {
    let started = Instant::now();
    let mut counts = Counts::default();
    let update_ctx = crate::update::UpdateContext::new(
        bson::DateTime::now(),
        bson::Timestamp {
            time: 0,
            increment: 0,
        },
    );
    let one = matches!(
        shape.write,
        Some(Write::Update { multi: false, .. } | Write::Delete { multi: false })
    );
    let mut failure = None;
    ctx.read(|txn, catalog| {
        let Some(entry) = catalog.lookup(&ctx.db, &shape.coll) else {
            return Ok(());
        };
        let Some(chosen) = chosen else {
            return Ok(());
        };
        let mut examined = crate::query::Examined::default();
        let mut visit = |_: &[u8], d: Document| {
            if !filter.matches(&d) {
                return Scan::Continue;
            }
            counts.matched += 1;
            if let Some(Write::Update { spec, .. }) = &shape.write {
                match spec.apply(&d, &update_ctx) {
                    Ok(new) if new != d => counts.would_modify += 1,
                    Ok(_) => {}
                    Err(e) => {
                        failure = Some(e);
                        return Scan::Stop;
                    }
                }
            }
            if one { Scan::Stop } else { Scan::Continue }
        };
        let done = crate::query::run_plan(
            txn,
            entry,
            &chosen.access,
            None,
            &mut std::collections::HashSet::new(),
            &mut examined,
            &mut visit,
        )
        .map_err(|e| MongoError::internal(format!("storage: {e}")));
        // A collection scan examines documents, not keys.
        let collscan = matches!(
            chosen.access,
            Access::Documents { bounded: false, .. } | Access::Natural { .. }
        );
        counts.keys_examined = if collscan { 0 } else { examined.keys };
        counts.docs_examined = examined.docs;
        done
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    let after_skip = (counts.matched - shape.skip as i64).max(0);
    counts.returned = match shape.limit {
        Some(l) => after_skip.min(l as i64),
        None => after_skip,
    };
    counts.millis = started.elapsed().as_millis() as i64;
    Ok(counts)
}
