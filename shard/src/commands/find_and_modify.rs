//! `findAndModify`: update or remove one document (chosen by `query` and `sort`) and return it
//! (before or after), in one writer job.
//!
//! Reply: `{lastErrorObject: {n, updatedExisting?, upserted?}, value, ok}`. A retried
//! retryable findAndModify returns the recorded reply without touching anything.

use bson::{Bson, Document, doc};
use wire::MongoError;

use super::write::{begin_retry, build_update_stmt};
use super::{Ctx, Reply};
use crate::catalog::check_coll_name;
use crate::query::{Filter, Sort};
use crate::retryable::RetryInfo;
use crate::storage::StorageResult;
use crate::write::ops::{delete_one, lookup_writable, run_update, targets};
use crate::writer::{OpError, WriteCtx, WriteOutput};

pub async fn find_and_modify(ctx: &Ctx<'_>) -> Result<Reply, MongoError> {
    let coll = ctx.collection()?;
    check_coll_name(&ctx.db, &coll)?;
    let query = ctx.opt_doc("query")?.unwrap_or_default();
    let env = ctx.env_for(&coll)?;
    let sort = ctx
        .opt_doc("sort")?
        .map(|s| Sort::parse(&s))
        .transpose()?
        .map(|s| s.with_collation(env.collation.clone()));
    let remove = ctx.bool_or("remove", false)?;
    let return_new = ctx.bool_or("new", false)?;
    let upsert = ctx.bool_or("upsert", false)?;
    let fields = ctx
        .opt_doc("fields")?
        .filter(|f| !f.is_empty())
        .map(|f| crate::query::find_projection(&f, &query))
        .transpose()?;
    let update = ctx.cmd.get("update").cloned().filter(|u| *u != Bson::Null);
    let array_filters = ctx.opt_array("arrayFilters")?;
    let fail = |m: &str| Err(MongoError::failed_to_parse(m.to_string()));
    match (&update, remove) {
        (Some(_), true) => return fail("Cannot specify both an update and remove=true"),
        (None, false) => return fail("Either an update or remove=true must be specified"),
        _ => {}
    }
    if remove && upsert {
        return fail("Cannot specify both upsert=true and remove=true");
    }
    if remove && return_new {
        return fail(
            "Cannot specify both new=true and remove=true; 'remove' always returns the deleted document",
        );
    }
    let stmt = match &update {
        Some(u) => Some(build_update_stmt(
            query.clone(),
            u,
            array_filters,
            upsert,
            false,
            sort.clone(),
            &env,
        )?),
        None => None,
    };
    let hint = ctx.cmd.get("hint");
    let stmt = match stmt {
        Some(mut s) => {
            s.filter = s.filter.with_hint(hint)?;
            Some(s)
        }
        None => None,
    };
    let filter = Filter::parse_in(&query, &env)?.with_hint(hint)?;
    let retry_info = RetryInfo::from_command(&ctx.cmd)?;
    let bypass = ctx.bool_or("bypassDocumentValidation", false)?;
    let db = ctx.db.clone();
    let job = move |w: &mut WriteCtx<'_>| -> StorageResult<WriteOutput> {
        w.bypass_validation = bypass;
        let mut retry = match begin_retry(w, retry_info)? {
            Ok(r) => r,
            Err(out) => return Ok(out),
        };
        let sid = retry.as_ref().map(|r| r.info.stmt_id(0)).unwrap_or(0);
        if let Some(prev) = retry.as_ref().and_then(|r| r.executed(sid)) {
            let mut reply = prev.clone();
            reply.insert("retriedStmtId", sid);
            reply.insert("ok", 1.0);
            return Ok(WriteOutput {
                reply,
                op_time: retry.as_ref().and_then(|r| r.record.last_op),
            });
        }
        let project = |d: Option<Document>| -> Result<Bson, MongoError> {
            match (d, &fields) {
                (None, _) => Ok(Bson::Null),
                (Some(d), Some(p)) => Ok(Bson::Document(p.apply(&d)?)),
                (Some(d), None) => Ok(Bson::Document(d)),
            }
        };
        let result: Result<(Document, Option<resume::ClusterTime>), OpError> = (|| {
            if let Some(stmt) = &stmt {
                let o = run_update(w, &db, &coll, stmt, retry.as_mut(), sid)?;
                let mut leo = doc! {"n": if o.n > 0 || o.upserted.is_some() { 1 } else { 0 }};
                leo.insert("updatedExisting", o.n > 0);
                let value = if return_new {
                    project(o.after.clone())?
                } else {
                    project(o.before.clone())?
                };
                if let Some(id) = &o.upserted {
                    leo.insert("upserted", id.clone());
                }
                Ok((doc! {"lastErrorObject": leo, "value": value}, o.last_ts))
            } else {
                let Some(c) = lookup_writable(w, &db, &coll)? else {
                    return Ok((
                        doc! {"lastErrorObject": {"n": 0}, "value": Bson::Null},
                        None,
                    ));
                };
                let found = targets(w, &c, &filter, false, sort.as_ref())?;
                match found.into_iter().next() {
                    None => Ok((
                        doc! {"lastErrorObject": {"n": 0}, "value": Bson::Null},
                        None,
                    )),
                    Some(d) => {
                        let ts = delete_one(w, &c, &d, retry.as_mut(), sid)?;
                        let value = project(Some(d))?;
                        Ok((doc! {"lastErrorObject": {"n": 1}, "value": value}, Some(ts)))
                    }
                }
            }
        })();
        match result {
            Ok((mut reply, ts)) => {
                if let Some(r) = retry.as_mut() {
                    r.record(sid, reply.clone());
                    let wall = w.wall_ms;
                    r.save(w.txn_mut(), wall)?;
                }
                reply.insert("ok", 1.0);
                Ok(WriteOutput { reply, op_time: ts })
            }
            Err(OpError::Storage(e)) => Err(e),
            Err(OpError::Mongo(e)) => Ok(WriteOutput {
                reply: e.to_document(),
                op_time: None,
            }),
        }
    };
    let out = ctx.submit_statements(Box::new(job)).await?;
    Ok(Reply {
        body: out.reply.into(),
        op_time: out.op_time,
    })
}
