//! Collection-level `bulkWrite` as the CRUD spec's Bulk API has drivers carry it out over the
//! `insert`, `update` and `delete` commands; the mongodb 3.9 crate has none (only the 8.0
//! `bulkWrite` command), so the runner does the driver's part here and the server sees what
//! it would see from pymongo:
//!
//! * requests are checked client-side first (an update needs atomic modifiers or a pipeline,
//!   a replacement must have none): a violation is a client error and nothing is sent;
//! * ordered: consecutive requests of one kind form a batch, batches run in order and the
//!   first write error stops the rest; unordered: all inserts, then all updates, then all
//!   deletes (pymongo's grouping), every batch runs;
//! * inserted documents without `_id` get an ObjectId first, as drivers do; `rawData` (an 8.2
//!   option) is not sent, as drivers leave it out for older servers;
//! * without the operation's own session, on a client that retries writes, a batch whose
//!   statements each write one document is a retryable write, as drivers make it: it carries
//!   a `txnNumber` and is sent once more after a network error (the connection handshake's
//!   included) or a `RetryableWriteError` label (on an error or on a write concern error);
//!   when the retry fails with `NoWritesPerformed`, the first error stands. The 3.9 driver
//!   keeps a session's transaction number private, so the runner numbers batches on a session
//!   of its own, one per call, which it holds until the client goes ([`Retrying`]): returned
//!   to the pool, its lsid could reach the driver, whose own numbers would collide;
//! * with the operation's own session (perhaps in a transaction, which the driver does not let
//!   the runner see) batches carry no write concern and no `txnNumber`; without one, the
//!   collection's write concern;
//! * the result counts come from the replies (`n`, `nModified`, `upserted`), with request
//!   indexes mapped back; write errors or a write concern error make the whole call fail with
//!   a [`BulkFailure`] that keeps the partial result, as a driver's `BulkWriteError` does;
//! * a batch that ends in a network error (after its retry, if it had one) fails the call
//!   with a [`NetworkFailure`] that keeps what the earlier batches did, the partial result the
//!   retryable-writes spec tests expect ("… is never committed": the fail point closes the
//!   connection on both attempts). pymongo reports no partial result there (PYTHON-4597) and
//!   skips those tests.

use anyhow::{Context, Result, bail};
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{Bson, Document, doc};
use mongodb::error::{Error as DriverError, ErrorKind};
use mongodb::{ClientSession, Collection};

/// A client entity's part in making batches retryable writes (see the module header).
pub struct Retrying {
    /// The client retries writes (`retryWrites` is not `false`).
    enabled: bool,
    /// The sessions batches were numbered on, held until the client entity goes.
    held: tokio::sync::Mutex<Vec<ClientSession>>,
}

impl Retrying {
    pub fn new(enabled: bool) -> Retrying {
        Retrying {
            enabled,
            held: tokio::sync::Mutex::new(Vec::new()),
        }
    }
}

/// A failed bulk write: the server's write errors (request indexes mapped back) or write
/// concern error, with what was done before.
#[derive(Debug, Clone)]
pub struct BulkFailure {
    pub partial: Document,
    pub write_errors: Vec<Document>,
    pub write_concern_error: Option<Document>,
}

impl BulkFailure {
    /// The first error's code (a write error's, else the write concern error's).
    pub fn code(&self) -> Option<(i32, String)> {
        self.write_errors
            .first()
            .or(self.write_concern_error.as_ref())
            .map(|e| {
                (
                    e.get_i32("code").unwrap_or(0),
                    e.get_str("codeName").unwrap_or("").to_string(),
                )
            })
    }
}

/// A batch's network error with what the call did before it. A retryable batch's carries the
/// `RetryableWriteError` label a driver gives it (a driver error takes no labels from outside
/// the driver).
#[derive(Debug, Clone)]
pub struct NetworkFailure {
    pub error: DriverError,
    pub retryable: bool,
    pub partial: Document,
}

/// A request the driver refuses before sending anything.
#[derive(Debug, Clone)]
pub struct ClientValidation(pub String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Insert,
    Update,
    Delete,
}

/// One request as its command sends it, with its index in the call.
struct Request {
    index: usize,
    kind: Kind,
    /// The inserted document, or the update/delete statement.
    body: Document,
}

/// Carries out `bulkWrite` with `args` on `coll`; `Ok(Err(_))` is the operation's error.
pub async fn bulk_write(
    coll: &Collection<Document>,
    args: &Document,
    session: Option<&mut ClientSession>,
    retrying: Option<&Retrying>,
) -> Result<std::result::Result<Document, DriverError>> {
    for key in args.keys() {
        if !matches!(
            key.as_str(),
            "requests"
                | "ordered"
                | "bypassDocumentValidation"
                | "let"
                | "comment"
                | "session"
                | "rawData"
        ) {
            bail!("bulkWrite argument {key} is not supported by this runner");
        }
    }
    let ordered = args.get_bool("ordered").unwrap_or(true);
    let mut requests = Vec::new();
    for (index, r) in args.get_array("requests")?.iter().enumerate() {
        let r = r.as_document().context("a bulkWrite request")?;
        match request(index, r)? {
            Ok(req) => requests.push(req),
            Err(refused) => return Ok(Err(DriverError::custom(refused))),
        }
    }
    if requests.is_empty() {
        return Ok(Err(DriverError::custom(ClientValidation(
            "a bulk write needs at least one request".into(),
        ))));
    }
    let batches = batches(requests, ordered);
    // Retryable writes need an acknowledged write concern and a session the runner numbers.
    let acknowledged = coll
        .write_concern()
        .and_then(|wc| wc.w.as_ref())
        .is_none_or(|w| *w != mongodb::options::Acknowledgment::Nodes(0));
    let mut own = match (&session, retrying) {
        (None, Some(r)) if r.enabled && acknowledged => Some(coll.client().start_session().await?),
        _ => None,
    };
    let (mut session, numbered) = match own.as_mut() {
        Some(s) => (Some(s), true),
        None => (session, false),
    };
    let mut txn_number = 0_i64;
    let mut totals = Totals::default();
    let mut failure: Option<(Vec<Document>, Option<Document>)> = None;
    for batch in batches {
        let mut cmd = command(coll, &batch, ordered, args);
        // The driver keeps a session's transaction state private: with the operation's own
        // session (perhaps in a transaction) the batch carries no write concern.
        if (session.is_none() || numbered)
            && let Some(wc) = coll.write_concern()
        {
            cmd.insert("writeConcern", mongodb::bson::serialize_to_document(wc)?);
        }
        let retryable = numbered && batch.iter().all(Request::single_document);
        if retryable {
            txn_number += 1;
            cmd.insert("txnNumber", txn_number);
        }
        let db = coll.client().database(&coll.namespace().db);
        let mut send = async |cmd: &Document| {
            let action = db.run_command(cmd.clone());
            match session.as_deref_mut() {
                Some(s) => action.session(s).await,
                None => action.await,
            }
        };
        let mut reply = send(&cmd).await;
        if retryable && calls_for_retry(&reply) {
            reply = match send(&cmd).await {
                Err(e) if e.contains_label("NoWritesPerformed") => reply,
                second => second,
            };
        }
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                hold(retrying, own).await;
                if is_network_error(&e) {
                    return Ok(Err(DriverError::custom(NetworkFailure {
                        error: e,
                        retryable,
                        partial: totals.result(),
                    })));
                }
                return Ok(Err(e));
            }
        };
        let (errors, wce) = totals.add(&batch, &reply);
        if !errors.is_empty() || wce.is_some() {
            let (all_errors, all_wce) = failure.get_or_insert_with(Default::default);
            all_errors.extend(errors);
            if all_wce.is_none() {
                *all_wce = wce;
            }
            if ordered && !all_errors.is_empty() {
                break;
            }
        }
    }
    hold(retrying, own).await;
    let result = totals.result();
    Ok(match failure {
        None => Ok(result),
        Some((write_errors, write_concern_error)) => Err(DriverError::custom(BulkFailure {
            partial: result,
            write_errors,
            write_concern_error,
        })),
    })
}

/// Whether a driver sends a retryable write again after `reply`: a network error (the
/// connection handshake's too), or a `RetryableWriteError` label on an error or on a reply
/// with a write concern error.
fn calls_for_retry(reply: &std::result::Result<Document, DriverError>) -> bool {
    match reply {
        Err(e) => is_network_error(e) || e.contains_label("RetryableWriteError"),
        Ok(r) => r.get_array("errorLabels").is_ok_and(|labels| {
            labels
                .iter()
                .any(|l| l.as_str() == Some("RetryableWriteError"))
        }),
    }
}

fn is_network_error(e: &DriverError) -> bool {
    matches!(
        *e.kind,
        ErrorKind::Io(_) | ErrorKind::ConnectionPoolCleared { .. }
    )
}

/// Keeps the runner's session (if the call had one) until the client entity goes.
async fn hold(retrying: Option<&Retrying>, own: Option<ClientSession>) {
    if let (Some(r), Some(s)) = (retrying, own) {
        r.held.lock().await.push(s);
    }
}

impl Request {
    /// An insert, or an update or delete of at most one document: what a retryable write may
    /// hold.
    fn single_document(&self) -> bool {
        match self.kind {
            Kind::Insert => true,
            Kind::Update => !self.body.get_bool("multi").unwrap_or(false),
            Kind::Delete => self.body.get_i32("limit").unwrap_or(0) == 1,
        }
    }
}

/// One request of the call, checked as a driver checks it.
fn request(index: usize, r: &Document) -> Result<std::result::Result<Request, ClientValidation>> {
    let (kind, spec) = r.iter().next().context("an empty bulkWrite request")?;
    let spec = spec.as_document().context("a bulkWrite request's fields")?;
    let allowed: &[&str] = match kind.as_str() {
        "insertOne" => &["document"],
        "updateOne" | "updateMany" => &[
            "filter",
            "update",
            "upsert",
            "arrayFilters",
            "collation",
            "hint",
            "sort",
        ],
        "replaceOne" => &[
            "filter",
            "replacement",
            "upsert",
            "collation",
            "hint",
            "sort",
        ],
        "deleteOne" | "deleteMany" => &["filter", "collation", "hint"],
        other => bail!("bulkWrite request {other} is not supported by this runner"),
    };
    if let Some(k) = spec.keys().find(|k| !allowed.contains(&k.as_str())) {
        bail!("bulkWrite {kind}.{k} is not supported by this runner");
    }
    let copy = |out: &mut Document, fields: &[&str]| {
        for f in fields {
            if let Some(v) = spec.get(*f) {
                out.insert(*f, v.clone());
            }
        }
    };
    let filter = || spec.get("filter").cloned().context("filter");
    let req = match kind.as_str() {
        "insertOne" => {
            let doc = spec.get_document("document").context("document")?;
            let mut body =
                doc! {"_id": doc.get("_id").cloned().unwrap_or_else(|| ObjectId::new().into())};
            body.extend(
                doc.iter()
                    .filter(|(k, _)| *k != "_id")
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
            Request {
                index,
                kind: Kind::Insert,
                body,
            }
        }
        "updateOne" | "updateMany" | "replaceOne" => {
            let multi = kind == "updateMany";
            let u = if kind == "replaceOne" {
                let replacement = spec.get_document("replacement").context("replacement")?;
                if replacement
                    .keys()
                    .next()
                    .is_some_and(|k| k.starts_with('$'))
                {
                    return Ok(Err(ClientValidation(
                        "replacement document must not contain update operators".into(),
                    )));
                }
                Bson::Document(replacement.clone())
            } else {
                match spec.get("update") {
                    Some(Bson::Document(d))
                        if d.keys().next().is_some_and(|k| k.starts_with('$')) =>
                    {
                        Bson::Document(d.clone())
                    }
                    Some(Bson::Array(p)) => Bson::Array(p.clone()),
                    _ => {
                        return Ok(Err(ClientValidation(
                            "update document must contain update operators".into(),
                        )));
                    }
                }
            };
            let mut body = doc! {"q": filter()?, "u": u};
            copy(&mut body, &["upsert"]);
            body.insert("multi", multi);
            copy(&mut body, &["arrayFilters", "collation", "hint", "sort"]);
            Request {
                index,
                kind: Kind::Update,
                body,
            }
        }
        _ => {
            let multi = kind == "deleteMany";
            let mut body = doc! {"q": filter()?, "limit": if multi { 0 } else { 1 }};
            copy(&mut body, &["collation", "hint"]);
            Request {
                index,
                kind: Kind::Delete,
                body,
            }
        }
    };
    Ok(Ok(req))
}

/// The batches the requests are sent in (see the module header).
fn batches(requests: Vec<Request>, ordered: bool) -> Vec<Vec<Request>> {
    let mut out: Vec<Vec<Request>> = Vec::new();
    if ordered {
        for r in requests {
            match out.last_mut() {
                Some(b) if b.first().is_some_and(|f| f.kind == r.kind) => b.push(r),
                _ => out.push(vec![r]),
            }
        }
        return out;
    }
    let mut rest = requests;
    for kind in [Kind::Insert, Kind::Update, Kind::Delete] {
        let (batch, others): (Vec<Request>, Vec<Request>) =
            rest.into_iter().partition(|r| r.kind == kind);
        rest = others;
        if !batch.is_empty() {
            out.push(batch);
        }
    }
    out
}

/// A batch's write command.
fn command(
    coll: &Collection<Document>,
    batch: &[Request],
    ordered: bool,
    args: &Document,
) -> Document {
    let bodies: Vec<Bson> = batch
        .iter()
        .map(|r| Bson::Document(r.body.clone()))
        .collect();
    let kind = batch.first().map_or(Kind::Insert, |r| r.kind);
    let mut cmd = match kind {
        Kind::Insert => doc! {"insert": coll.name(), "documents": bodies},
        Kind::Update => doc! {"update": coll.name(), "updates": bodies},
        Kind::Delete => doc! {"delete": coll.name(), "deletes": bodies},
    };
    cmd.insert("ordered", ordered);
    if kind != Kind::Delete
        && let Some(b) = args.get("bypassDocumentValidation")
    {
        cmd.insert("bypassDocumentValidation", b.clone());
    }
    if kind != Kind::Insert
        && let Some(l) = args.get("let")
    {
        cmd.insert("let", l.clone());
    }
    if let Some(c) = args.get("comment") {
        cmd.insert("comment", c.clone());
    }
    cmd
}

/// What the replies add up to.
#[derive(Default)]
struct Totals {
    inserted: Vec<(usize, Bson)>,
    matched: i64,
    modified: i64,
    deleted: i64,
    upserted: Vec<(usize, Bson)>,
}

impl Totals {
    /// Adds one batch's reply; returns its write errors (indexes mapped back to the call's)
    /// and write concern error.
    fn add(&mut self, batch: &[Request], reply: &Document) -> (Vec<Document>, Option<Document>) {
        let n = reply.get("n").and_then(int).unwrap_or(0);
        let mut errors = Vec::new();
        let mut failed = Vec::new();
        for e in reply.get_array("writeErrors").into_iter().flatten() {
            let Some(e) = e.as_document() else { continue };
            let at = e.get("index").and_then(int).unwrap_or(0) as usize;
            failed.push(at);
            let mut e = e.clone();
            if let Some(r) = batch.get(at) {
                e.insert("index", r.index as i64);
            }
            errors.push(e);
        }
        let kind = batch.first().map(|r| r.kind);
        match kind {
            Some(Kind::Insert) => {
                // The `n` inserted are the first requests without a write error (an ordered
                // batch stops at its first error, so they are the ones before it).
                let mut taken = 0_i64;
                for (i, r) in batch.iter().enumerate() {
                    if taken >= n {
                        break;
                    }
                    if !failed.contains(&i) {
                        self.inserted
                            .push((r.index, r.body.get("_id").cloned().unwrap_or(Bson::Null)));
                        taken += 1;
                    }
                }
            }
            Some(Kind::Update) => {
                let upserted: Vec<(usize, Bson)> = reply
                    .get_array("upserted")
                    .into_iter()
                    .flatten()
                    .filter_map(Bson::as_document)
                    .map(|u| {
                        let at = u.get("index").and_then(int).unwrap_or(0) as usize;
                        let index = batch.get(at).map_or(at, |r| r.index);
                        (index, u.get("_id").cloned().unwrap_or(Bson::Null))
                    })
                    .collect();
                self.matched += n - upserted.len() as i64;
                self.modified += reply.get("nModified").and_then(int).unwrap_or(0);
                self.upserted.extend(upserted);
            }
            Some(Kind::Delete) => self.deleted += n,
            None => {}
        }
        (
            errors,
            reply.get_document("writeConcernError").ok().cloned(),
        )
    }

    fn result(&self) -> Document {
        let by_index = |v: &[(usize, Bson)]| -> Document {
            v.iter()
                .map(|(i, id)| (i.to_string(), id.clone()))
                .collect()
        };
        doc! {
            "deletedCount": self.deleted,
            "insertedCount": self.inserted.len() as i64,
            "insertedIds": by_index(&self.inserted),
            "matchedCount": self.matched,
            "modifiedCount": self.modified,
            "upsertedCount": self.upserted.len() as i64,
            "upsertedIds": by_index(&self.upserted),
        }
    }
}

fn int(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(d) => Some(*d as i64),
        _ => None,
    }
}
