//! The operations of the change-stream and transaction spec files, run on the driver, and
//! their `expectResult` / `expectError` / `saveResultAsEntity` handling.
//!
//! Sessions: a `mongodb::ClientSession` is not `Clone`, so an operation that uses one takes it
//! out of its entity and puts it back afterwards, whatever the outcome. Inside a
//! `withTransaction` callback the driver owns the session; the callback's operations get it as
//! the *active* session, which stands in for the entity of that id.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use futures::{FutureExt, StreamExt, TryStreamExt};
use mongodb::bson::{Bson, Document, doc};
use mongodb::change_stream::ChangeStream;
use mongodb::change_stream::event::ChangeStreamEvent;
use mongodb::error::{Error as DriverError, ErrorKind, WriteFailure};
use mongodb::options::{
    AggregateOptions, ChangeStreamOptions, Collation, CountOptions, DeleteManyModel,
    DeleteOneModel, DeleteOptions, DistinctOptions, EstimatedDocumentCountOptions,
    FindOneAndDeleteOptions, FindOneAndReplaceOptions, FindOneAndUpdateOptions, FindOneOptions,
    FindOptions, FullDocumentBeforeChangeType, FullDocumentType, Hint, IndexOptions,
    InsertManyOptions, InsertOneModel, InsertOneOptions, ReadConcern, ReadPreference,
    ReplaceOneModel, ReplaceOptions, ReturnDocument, SelectionCriteria, TransactionOptions,
    UpdateManyModel, UpdateModifications, UpdateOneModel, UpdateOptions, WriteConcern, WriteModel,
};
use mongodb::results::{DeleteResult, UpdateResult};
use mongodb::{BoxFuture, Client, ClientSession, Collection, Database, IndexModel, Namespace};

use super::bulk::{BulkFailure, ClientValidation, NetworkFailure, Retrying};
use super::{Entities, Entity, matcher};

/// How long `iterateUntilDocumentOrError` waits for an event.
const ITERATE_WAIT: Duration = Duration::from_secs(20);

/// What an operation produced.
enum Value {
    None,
    Bson(Bson),
    Stream(Box<ChangeStream<Document>>),
}

impl Value {
    fn describe(&self) -> String {
        match self {
            Value::None => "nothing".into(),
            Value::Bson(b) => b.to_string(),
            Value::Stream(_) => "a change stream".into(),
        }
    }

    fn doc(d: Document) -> Value {
        Value::Bson(Bson::Document(d))
    }
}

type Outcome = std::result::Result<Value, DriverError>;

/// The session a `withTransaction` callback runs with: the entity id it stands for and the
/// driver's session.
pub(super) type Active<'a> = Option<(&'a str, &'a mut ClientSession)>;

/// Runs one operation and checks its expectations.
///
/// `Ok(Some(e))`: the operation failed as expected (`expectError`) or its error was to be
/// ignored (`ignoreResultAndError`); a `withTransaction` callback hands `e` on to the driver,
/// as the spec requires, so the driver's retry logic sees it.
pub(super) async fn run_operation(
    uri: &str,
    op: &Document,
    entities: &mut Entities,
    active: Active<'_>,
) -> Result<Option<DriverError>> {
    for key in op.keys() {
        if !matches!(
            key.as_str(),
            "name"
                | "object"
                | "arguments"
                | "expectResult"
                | "expectError"
                | "saveResultAsEntity"
                | "ignoreResultAndError"
        ) {
            bail!("operation field {key} is not supported by this runner");
        }
    }
    let name = op.get_str("name")?;
    let object = op.get_str("object")?;
    let empty = Document::new();
    let args = op.get_document("arguments").unwrap_or(&empty);
    let outcome = if object == "testRunner" {
        test_runner(uri, name, args, entities).await?;
        Ok(Value::None)
    } else {
        execute(uri, name, object, args, entities, active).await?
    };
    let ignore = op.get_bool("ignoreResultAndError").unwrap_or(false);
    if let Ok(expected) = op.get_document("expectError") {
        return match outcome {
            Ok(v) => bail!("expected an error, got {}", v.describe()),
            Err(e) => {
                check_error(expected, &e, args, entities)?;
                Ok(Some(e))
            }
        };
    }
    let value = match outcome {
        Ok(v) => v,
        Err(e) if ignore => return Ok(Some(e)),
        Err(e) => bail!("unexpected error: {}", describe(&e)),
    };
    if let Some(expected) = op.get("expectResult") {
        let actual = match &value {
            Value::Bson(b) => Some(b),
            Value::None => None,
            Value::Stream(_) => bail!("expectResult on a change stream is not supported"),
        };
        matcher::matches_in(entities.cx(), expected, actual, true)
            .map_err(|why| anyhow!("result mismatch: {why}"))?;
    }
    if let Ok(id) = op.get_str("saveResultAsEntity") {
        match value {
            Value::Stream(s) => entities.insert(id, Entity::ChangeStream(s))?,
            other => bail!(
                "saving {} as an entity is not supported by this runner",
                other.describe()
            ),
        }
    }
    Ok(None)
}

/// [`run_operation`] behind a box: a `withTransaction` callback runs operations, and an
/// operation may be a `withTransaction`.
fn run_operation_boxed<'a>(
    uri: &'a str,
    op: &'a Document,
    entities: &'a mut Entities,
    active: Active<'a>,
) -> BoxFuture<'a, Result<Option<DriverError>>> {
    Box::pin(run_operation(uri, op, entities, active))
}

fn check_arguments(args: &Document, allowed: &[&str]) -> Result<()> {
    for k in args.keys() {
        if !allowed.contains(&k.as_str()) {
            bail!("argument {k} is not supported by this runner");
        }
    }
    Ok(())
}

// ----- sessions ------------------------------------------------------------------------------

/// A session an operation uses: the callback's active one, or one taken out of its entity.
enum Lent<'a> {
    None,
    Active(&'a mut ClientSession),
    Taken(String, Box<ClientSession>),
}

impl Lent<'_> {
    fn get(&mut self) -> Option<&mut ClientSession> {
        match self {
            Lent::None => None,
            Lent::Active(s) => Some(&mut **s),
            Lent::Taken(_, s) => Some(s),
        }
    }

    /// Puts a taken session back into its entity.
    fn restore(self, entities: &mut Entities) {
        if let Lent::Taken(id, s) = self {
            entities.put_session(&id, s);
        }
    }
}

/// The session entity `id`: the active one if it stands for `id`, else taken from the map.
fn lend<'a>(id: &str, entities: &mut Entities, active: Active<'a>) -> Result<Lent<'a>> {
    if let Some((active_id, s)) = active
        && active_id == id
    {
        return Ok(Lent::Active(s));
    }
    Ok(Lent::Taken(id.to_string(), entities.take_session(id)?))
}

/// The session named by an operation's `session` argument, if any.
fn lend_argument<'a>(
    args: &Document,
    entities: &mut Entities,
    active: Active<'a>,
) -> Result<Lent<'a>> {
    match args.get("session") {
        None => Ok(Lent::None),
        Some(Bson::String(id)) => lend(id, entities, active),
        Some(other) => bail!("session argument {other} is not an entity id"),
    }
}

fn int(v: &Bson, what: &str) -> Result<i64> {
    match v {
        Bson::Int32(n) => Ok(i64::from(*n)),
        Bson::Int64(n) => Ok(*n),
        Bson::Double(n) if n.fract() == 0.0 => Ok(*n as i64),
        other => bail!("{what}: expected an integer, got {other}"),
    }
}

fn millis(v: &Bson, what: &str) -> Result<Duration> {
    Ok(Duration::from_millis(
        u64::try_from(int(v, what)?).context(what.to_string())?,
    ))
}

fn from_bson<T: serde::de::DeserializeOwned>(v: &Bson, what: &str) -> Result<T> {
    mongodb::bson::deserialize_from_bson(v.clone()).with_context(|| format!("parsing {what} {v}"))
}

pub(super) fn read_concern(v: &Bson) -> Result<ReadConcern> {
    if let Bson::Document(d) = v {
        check_arguments(d, &["level"])?;
    }
    from_bson(v, "readConcern")
}

pub(super) fn write_concern(v: &Bson) -> Result<WriteConcern> {
    if let Bson::Document(d) = v {
        check_arguments(d, &["w", "wtimeoutMS", "journal", "j"])?;
    }
    from_bson(v, "writeConcern")
}

pub(super) fn read_preference(v: &Bson) -> Result<SelectionCriteria> {
    if let Bson::Document(d) = v {
        check_arguments(d, &["mode", "tagSets", "maxStalenessSeconds", "hedge"])?;
    }
    Ok(SelectionCriteria::ReadPreference(from_bson::<
        ReadPreference,
    >(
        v, "readPreference"
    )?))
}

/// `startTransaction` / `withTransaction` options and `defaultTransactionOptions`; `skip` names
/// keys the caller handles itself.
pub(super) fn transaction_options(d: &Document, skip: &[&str]) -> Result<TransactionOptions> {
    let mut o = TransactionOptions::default();
    for (k, v) in d {
        match k.as_str() {
            "readConcern" => o.read_concern = Some(read_concern(v)?),
            "writeConcern" => o.write_concern = Some(write_concern(v)?),
            "readPreference" => o.selection_criteria = Some(read_preference(v)?),
            "maxCommitTimeMS" => o.max_commit_time = Some(millis(v, "maxCommitTimeMS")?),
            other if skip.contains(&other) => {}
            other => bail!("transaction option {other} is not supported by this runner"),
        }
    }
    Ok(o)
}

/// The state a `withTransaction` callback works with.
struct Callback<'e> {
    uri: &'e str,
    id: &'e str,
    ops: Vec<Document>,
    entities: &'e mut Entities,
    /// Why the runner failed the test inside the callback (the driver only sees a marker).
    failure: Option<anyhow::Error>,
}

/// The payload of the driver error a callback returns when the runner failed the test.
#[derive(Debug)]
struct RunnerFailure;

async fn session_operation(
    uri: &str,
    name: &str,
    id: &str,
    args: &Document,
    entities: &mut Entities,
    active: Active<'_>,
) -> Result<Outcome> {
    if name == "endSession" {
        check_arguments(args, &[])?;
        if active.as_ref().is_some_and(|(a, _)| *a == id) {
            bail!("endSession inside withTransaction on the same session");
        }
        // Dropping it ends it: the driver aborts an open transaction and returns the server
        // session to its pool, as `endSession` does.
        drop(entities.take_session(id)?);
        entities.end_session(id);
        return Ok(Ok(Value::None));
    }
    let mut lent = lend(id, entities, active)?;
    let out = session_operation_with(uri, name, id, args, &mut lent, entities).await;
    lent.restore(entities);
    out
}

async fn session_operation_with(
    uri: &str,
    name: &str,
    id: &str,
    args: &Document,
    lent: &mut Lent<'_>,
    entities: &mut Entities,
) -> Result<Outcome> {
    let session = lent.get().context("no session")?;
    Ok(match name {
        "startTransaction" => {
            let opts = transaction_options(args, &[])?;
            session
                .start_transaction()
                .with_options(opts)
                .await
                .map(|()| Value::None)
        }
        "commitTransaction" => {
            check_arguments(args, &[])?;
            session.commit_transaction().await.map(|()| Value::None)
        }
        "abortTransaction" => {
            check_arguments(args, &[])?;
            session.abort_transaction().await.map(|()| Value::None)
        }
        "withTransaction" => {
            let opts = transaction_options(args, &["callback"])?;
            let ops = args
                .get_array("callback")
                .context("withTransaction.callback")?
                .iter()
                .map(|o| o.as_document().cloned().context("a callback operation"))
                .collect::<Result<Vec<_>>>()?;
            let mut cb = Callback {
                uri,
                id,
                ops,
                entities,
                failure: None,
            };
            let result = session
                .start_transaction()
                .with_options(opts)
                .and_run(&mut cb, |session, cb| {
                    async move {
                        let Callback {
                            uri,
                            id,
                            ops,
                            entities,
                            failure,
                        } = &mut **cb;
                        for (i, op) in ops.iter().enumerate() {
                            let name = op.get_str("name").unwrap_or("?");
                            match run_operation_boxed(uri, op, entities, Some((id, &mut *session)))
                                .await
                            {
                                Ok(None) => {}
                                Ok(Some(e)) => return Err(e),
                                Err(e) => {
                                    *failure =
                                        Some(e.context(format!("callback operation {i} ({name})")));
                                    return Err(DriverError::custom(RunnerFailure));
                                }
                            }
                        }
                        Ok(())
                    }
                    .boxed()
                })
                .await;
            if let Some(failure) = cb.failure.take() {
                // The runner failed the test inside the callback; the driver only returned the
                // marker error (it has no label, so the driver did not retry).
                return Err(failure);
            }
            result.map(|()| Value::None)
        }
        other => bail!("session operation {other} is not supported by this runner"),
    })
}

// ----- testRunner ----------------------------------------------------------------------------

async fn test_runner(
    uri: &str,
    name: &str,
    args: &Document,
    entities: &mut Entities,
) -> Result<()> {
    match name {
        "failPoint" => {
            check_arguments(args, &["client", "failPoint"])?;
            let client_id = args.get_str("client")?;
            let client = entities.client(client_id)?.client.clone();
            set_fail_point(&client, client_id, args, entities).await
        }
        "targetedFailPoint" => {
            // On the mongos the session is pinned to: the server its last command went to (the
            // driver does not say which it pinned; its command events do).
            check_arguments(args, &["session", "failPoint"])?;
            let session_id = args.get_str("session")?;
            let client_id = entities.session_client(session_id)?.to_string();
            let lsid = entities.lsid(session_id)?.clone();
            let Some(server) = entities.client(&client_id)?.server_of_session(&lsid) else {
                bail!("targetedFailPoint: session {session_id:?} has not run a command");
            };
            let client = super::new_client(&super::direct(uri, &server.to_string()), None).await?;
            let set = set_fail_point(&client, &client_id, args, entities).await;
            super::close(client).await;
            set
        }
        "createEntities" => {
            check_arguments(args, &["entities"])?;
            let list = args.get_array("entities")?;
            super::create_entities(uri, list, entities).await
        }
        "assertSessionTransactionState" => {
            check_arguments(args, &["session", "state"])?;
            entities.session_client(args.get_str("session")?)?;
            entities.unverified(format!(
                "assertSessionTransactionState {}: the mongodb 3.9 driver keeps a session's \
                 transaction state private (no public accessor)",
                args.get_str("state").unwrap_or("?")
            ));
            Ok(())
        }
        "assertSessionPinned" | "assertSessionUnpinned" => {
            check_arguments(args, &["session"])?;
            entities.session_client(args.get_str("session")?)?;
            entities.unverified(format!(
                "{name}: the mongodb 3.9 driver does not expose whether a session is pinned to \
                 a mongos"
            ));
            Ok(())
        }
        "assertCollectionExists" | "assertCollectionNotExists" => {
            check_arguments(args, &["databaseName", "collectionName"])?;
            let db = args.get_str("databaseName")?;
            let coll = args.get_str("collectionName")?;
            let client = super::new_client(uri, None).await?;
            let names = client.database(db).list_collection_names().await;
            super::close(client).await;
            let exists = names?.iter().any(|n| n == coll);
            let want = name == "assertCollectionExists";
            if exists != want {
                bail!(
                    "collection {db}.{coll} {}",
                    if want { "does not exist" } else { "exists" }
                );
            }
            Ok(())
        }
        "assertIndexExists" | "assertIndexNotExists" => {
            check_arguments(args, &["databaseName", "collectionName", "indexName"])?;
            let db = args.get_str("databaseName")?;
            let coll = args.get_str("collectionName")?;
            let index = args.get_str("indexName")?;
            let client = super::new_client(uri, None).await?;
            let names = client
                .database(db)
                .collection::<Document>(coll)
                .list_index_names()
                .await;
            super::close(client).await;
            let exists = match names {
                Ok(names) => names.iter().any(|n| n == index),
                // No collection, no index.
                Err(e) if code_of(&e).is_some_and(|c| c.0 == 26) => false,
                Err(e) => return Err(e.into()),
            };
            let want = name == "assertIndexExists";
            if exists != want {
                bail!(
                    "index {index} on {db}.{coll} {}",
                    if want { "does not exist" } else { "exists" }
                );
            }
            Ok(())
        }
        other => bail!("testRunner operation {other} is not supported by this runner"),
    }
}

async fn set_fail_point(
    client: &Client,
    client_id: &str,
    args: &Document,
    entities: &mut Entities,
) -> Result<()> {
    let fp = args.get_document("failPoint")?.clone();
    let fp_name = fp.get_str("configureFailPoint")?.to_string();
    client
        .database("admin")
        .run_command(fp)
        .await
        .map_err(|e| anyhow!("configureFailPoint: {}", describe(&e)))?;
    entities.fail_points.push((client_id.to_string(), fp_name));
    Ok(())
}

// ----- entity operations ---------------------------------------------------------------------

fn docs(v: &Bson) -> Result<Vec<Document>> {
    v.as_array()
        .context("expected an array of documents")?
        .iter()
        .map(|d| d.as_document().cloned().context("not a document"))
        .collect()
}

fn stream_options(args: &Document) -> Result<(Vec<Document>, ChangeStreamOptions)> {
    check_arguments(
        args,
        &[
            "pipeline",
            "batchSize",
            "comment",
            "fullDocument",
            "fullDocumentBeforeChange",
            "showExpandedEvents",
            "maxAwaitTimeMS",
            "startAtOperationTime",
        ],
    )?;
    let pipeline = match args.get("pipeline") {
        Some(p) => docs(p)?,
        None => Vec::new(),
    };
    let mut opts = ChangeStreamOptions::default();
    if let Some(n) = args.get("batchSize") {
        opts.batch_size = Some(u32::try_from(int(n, "batchSize")?).context("batchSize")?);
    }
    if let Some(c) = args.get("comment") {
        opts.comment = Some(c.clone());
    }
    if let Ok(fd) = args.get_str("fullDocument") {
        opts.full_document = Some(match fd {
            "updateLookup" => FullDocumentType::UpdateLookup,
            "whenAvailable" => FullDocumentType::WhenAvailable,
            "required" => FullDocumentType::Required,
            other => FullDocumentType::Other(other.to_string()),
        });
    }
    if let Ok(fd) = args.get_str("fullDocumentBeforeChange") {
        opts.full_document_before_change = Some(match fd {
            "whenAvailable" => FullDocumentBeforeChangeType::WhenAvailable,
            "required" => FullDocumentBeforeChangeType::Required,
            "off" => FullDocumentBeforeChangeType::Off,
            other => FullDocumentBeforeChangeType::Other(other.to_string()),
        });
    }
    if let Ok(b) = args.get_bool("showExpandedEvents") {
        opts.show_expanded_events = Some(b);
    }
    if let Some(ms) = args.get("maxAwaitTimeMS") {
        opts.max_await_time = Some(millis(ms, "maxAwaitTimeMS")?);
    }
    if let Ok(ts) = args.get_timestamp("startAtOperationTime") {
        opts.start_at_operation_time = Some(ts);
    }
    Ok((pipeline, opts))
}

/// The target of an entity operation, cloned out of the map (the driver's handles are cheap
/// clones) so the map stays free for the session.
enum Target {
    Client(Client),
    Database(Database),
    Collection(Collection<Document>),
}

async fn execute(
    uri: &str,
    name: &str,
    object: &str,
    args: &Document,
    entities: &mut Entities,
    active: Active<'_>,
) -> Result<Outcome> {
    if name == "iterateUntilDocumentOrError" {
        check_arguments(args, &[])?;
        let Some(Entity::ChangeStream(stream)) = entities.map.get_mut(object) else {
            bail!("entity {object:?} is not a change stream");
        };
        return match tokio::time::timeout(ITERATE_WAIT, stream.next()).await {
            Err(_) => bail!("no document or error within {ITERATE_WAIT:?}"),
            Ok(None) => bail!("the change stream ended"),
            Ok(Some(Ok(d))) => Ok(Ok(Value::doc(d))),
            Ok(Some(Err(e))) => Ok(Err(e)),
        };
    }
    let target = match entities.get(object)? {
        Entity::Session(_) => None,
        Entity::Client(c) => Some(Target::Client(c.client.clone())),
        Entity::Database(db) => Some(Target::Database(db.clone())),
        Entity::Collection(coll) => Some(Target::Collection(coll.clone())),
        other => bail!(
            "operation {name} on a {} is not supported by this runner",
            other.kind()
        ),
    };
    let Some(target) = target else {
        return session_operation(uri, name, object, args, entities, active).await;
    };
    let retrying = entities.retrying.get(object).cloned();
    let mut lent = lend_argument(args, entities, active)?;
    let out = execute_on(&target, name, args, lent.get(), retrying).await;
    lent.restore(entities);
    out
}

/// Runs `$action`, with `.session(s)` when the operation has a session.
macro_rules! with_session {
    ($session:expr, $action:expr) => {
        match $session {
            Some(s) => $action.session(s).await,
            None => $action.await,
        }
    };
}

async fn execute_on(
    target: &Target,
    name: &str,
    args: &Document,
    session: Option<&mut ClientSession>,
    retrying: Option<Arc<Retrying>>,
) -> Result<Outcome> {
    let out = match (target, name) {
        (Target::Client(c), "createChangeStream") => {
            let (pipeline, opts) = stream_options(args)?;
            c.watch()
                .pipeline(pipeline)
                .with_options(opts)
                .await
                .map(stream_value)
        }
        (Target::Database(db), "createChangeStream") => {
            let (pipeline, opts) = stream_options(args)?;
            db.watch()
                .pipeline(pipeline)
                .with_options(opts)
                .await
                .map(stream_value)
        }
        (Target::Collection(coll), "createChangeStream") => {
            let (pipeline, opts) = stream_options(args)?;
            coll.watch()
                .pipeline(pipeline)
                .with_options(opts)
                .await
                .map(stream_value)
        }
        (Target::Client(c), "clientBulkWrite") => return client_bulk_write(c, args, session).await,
        (Target::Database(db), "runCommand") => {
            check_arguments(
                args,
                &["command", "commandName", "readPreference", "session"],
            )?;
            let cmd = args.get_document("command")?.clone();
            let mut action = db.run_command(cmd);
            if let Some(rp) = args.get("readPreference") {
                action = action.selection_criteria(read_preference(rp)?);
            }
            with_session!(session, action).map(Value::doc)
        }
        (Target::Database(db), "modifyCollection") => {
            // `collMod` with the given options.
            let coll = args.get_str("collection").context("collection")?;
            let mut cmd = doc! {"collMod": coll};
            for (k, v) in args {
                if k != "collection" && k != "session" {
                    cmd.insert(k.clone(), v.clone());
                }
            }
            with_session!(session, db.run_command(cmd)).map(Value::doc)
        }
        (Target::Database(db), "dropCollection") => {
            check_arguments(args, &["collection", "session"])?;
            let coll = db.collection::<Document>(args.get_str("collection")?);
            with_session!(session, coll.drop()).map(|_| Value::None)
        }
        (Target::Database(db), "createCollection") => {
            check_arguments(args, &["collection", "viewOn", "pipeline", "session"])?;
            let mut create = db.create_collection(args.get_str("collection")?);
            if let Ok(on) = args.get_str("viewOn") {
                create = create.view_on(on.to_string());
            }
            if let Some(p) = args.get("pipeline") {
                create = create.pipeline(docs(p)?);
            }
            with_session!(session, create).map(|_| Value::None)
        }
        (Target::Database(db), "aggregate") => {
            check_with_common(args, &["pipeline", "batchSize", "maxTimeMS", "session"])?;
            let pipeline = docs(args.get("pipeline").context("pipeline")?)?;
            let opts = aggregate_options(args)?;
            match session {
                Some(s) => {
                    let cursor = db
                        .aggregate(pipeline)
                        .with_options(opts)
                        .session(&mut *s)
                        .await;
                    drain_session_cursor(cursor, s).await
                }
                None => drain_cursor(db.aggregate(pipeline).with_options(opts).await).await,
            }
        }
        (Target::Collection(coll), "insertOne") => {
            check_with_common(args, &["document", "session"])?;
            let c = Common::of(args)?;
            let mut opts = InsertOneOptions::default();
            opts.bypass_document_validation = c.bypass_document_validation;
            opts.comment = c.comment;
            let d = args.get_document("document")?.clone();
            with_session!(session, coll.insert_one(d).with_options(opts))
                .map(|r| Value::doc(doc! {"insertedId": r.inserted_id}))
        }
        (Target::Collection(coll), "insertMany") => {
            check_with_common(args, &["documents", "ordered", "session"])?;
            let c = Common::of(args)?;
            let mut opts = InsertManyOptions::default();
            opts.bypass_document_validation = c.bypass_document_validation;
            opts.comment = c.comment;
            opts.ordered = args.get_bool("ordered").ok();
            let d = docs(args.get("documents").context("documents")?)?;
            let action = coll.insert_many(d).with_options(opts);
            with_session!(session, action).map(|r| {
                let mut ids: Vec<(usize, Bson)> = r.inserted_ids.into_iter().collect();
                ids.sort_by_key(|(i, _)| *i);
                let ids: Document = ids.into_iter().map(|(i, id)| (i.to_string(), id)).collect();
                Value::doc(doc! {"insertedIds": ids})
            })
        }
        (Target::Collection(coll), "updateOne" | "updateMany") => {
            check_with_common(args, &["filter", "update", "upsert", "sort", "session"])?;
            let c = Common::of(args)?;
            let filter = args.get_document("filter")?.clone();
            let update = update_modifications(args.get("update"))?;
            let mut opts = UpdateOptions::default();
            opts.upsert = args.get_bool("upsert").ok();
            opts.sort = args.get_document("sort").ok().cloned();
            opts.array_filters = c.array_filters;
            opts.bypass_document_validation = c.bypass_document_validation;
            opts.collation = c.collation;
            opts.hint = c.hint;
            opts.let_vars = c.let_vars;
            opts.comment = c.comment;
            let result = if name == "updateOne" {
                with_session!(session, coll.update_one(filter, update).with_options(opts))
            } else {
                with_session!(session, coll.update_many(filter, update).with_options(opts))
            };
            result.map(|r| Value::doc(update_result(&r)))
        }
        (Target::Collection(coll), "replaceOne") => {
            check_with_common(
                args,
                &["filter", "replacement", "upsert", "sort", "session"],
            )?;
            let c = Common::of(args)?;
            let mut opts = ReplaceOptions::default();
            opts.upsert = args.get_bool("upsert").ok();
            opts.sort = args.get_document("sort").ok().cloned();
            opts.bypass_document_validation = c.bypass_document_validation;
            opts.collation = c.collation;
            opts.hint = c.hint;
            opts.let_vars = c.let_vars;
            opts.comment = c.comment;
            let action = coll
                .replace_one(
                    args.get_document("filter")?.clone(),
                    args.get_document("replacement")?.clone(),
                )
                .with_options(opts);
            with_session!(session, action).map(|r| Value::doc(update_result(&r)))
        }
        (Target::Collection(coll), "deleteOne" | "deleteMany") => {
            check_with_common(args, &["filter", "session"])?;
            let c = Common::of(args)?;
            let mut opts = DeleteOptions::default();
            opts.collation = c.collation;
            opts.hint = c.hint;
            opts.let_vars = c.let_vars;
            opts.comment = c.comment;
            let filter = args.get_document("filter")?.clone();
            let result = if name == "deleteOne" {
                with_session!(session, coll.delete_one(filter).with_options(opts))
            } else {
                with_session!(session, coll.delete_many(filter).with_options(opts))
            };
            result.map(|r| Value::doc(delete_result(&r)))
        }
        (Target::Collection(coll), "find") => {
            check_with_common(
                args,
                &[
                    "filter",
                    "batchSize",
                    "sort",
                    "limit",
                    "skip",
                    "projection",
                    "session",
                ],
            )?;
            let c = Common::of(args)?;
            let filter = args.get_document("filter").cloned().unwrap_or_default();
            let mut opts = FindOptions::default();
            opts.allow_disk_use = c.allow_disk_use;
            opts.collation = c.collation;
            opts.comment = c.comment;
            opts.hint = c.hint;
            opts.let_vars = c.let_vars;
            if let Some(n) = args.get("batchSize") {
                opts.batch_size = Some(u32::try_from(int(n, "batchSize")?)?);
            }
            if let Some(n) = args.get("limit") {
                opts.limit = Some(int(n, "limit")?);
            }
            if let Some(n) = args.get("skip") {
                opts.skip = Some(u64::try_from(int(n, "skip")?)?);
            }
            opts.sort = args.get_document("sort").ok().cloned();
            opts.projection = args.get_document("projection").ok().cloned();
            match session {
                Some(s) => {
                    let cursor = coll.find(filter).with_options(opts).session(&mut *s).await;
                    drain_session_cursor(cursor, s).await
                }
                None => drain_cursor(coll.find(filter).with_options(opts).await).await,
            }
        }
        (Target::Collection(coll), "aggregate") => {
            check_with_common(args, &["pipeline", "batchSize", "maxTimeMS", "session"])?;
            let pipeline = docs(args.get("pipeline").context("pipeline")?)?;
            let opts = aggregate_options(args)?;
            match session {
                Some(s) => {
                    let cursor = coll
                        .aggregate(pipeline)
                        .with_options(opts)
                        .session(&mut *s)
                        .await;
                    drain_session_cursor(cursor, s).await
                }
                None => drain_cursor(coll.aggregate(pipeline).with_options(opts).await).await,
            }
        }
        (Target::Collection(coll), "countDocuments") => {
            check_with_common(args, &["filter", "skip", "limit", "session"])?;
            let c = Common::of(args)?;
            let filter = args.get_document("filter")?.clone();
            let mut opts = CountOptions::default();
            opts.collation = c.collation;
            opts.comment = c.comment;
            opts.hint = c.hint;
            if let Some(n) = args.get("skip") {
                opts.skip = Some(u64::try_from(int(n, "skip")?)?);
            }
            if let Some(n) = args.get("limit") {
                opts.limit = Some(u64::try_from(int(n, "limit")?)?);
            }
            with_session!(session, coll.count_documents(filter).with_options(opts))
                .map(|n| Value::Bson(Bson::Int64(i64::try_from(n).unwrap_or(i64::MAX))))
        }
        (Target::Collection(coll), "count") => {
            // The deprecated count helper, which the 3.9 driver no longer has: it is the `count`
            // command with the filter as `query`, which is what drivers that keep it send.
            check_with_common(args, &["filter", "skip", "limit", "session"])?;
            let mut cmd = doc! {"count": coll.name()};
            if let Ok(f) = args.get_document("filter") {
                cmd.insert("query", f.clone());
            }
            for (from, to) in [
                ("skip", "skip"),
                ("limit", "limit"),
                ("collation", "collation"),
                ("comment", "comment"),
                ("hint", "hint"),
            ] {
                if let Some(v) = args.get(from) {
                    cmd.insert(to, v.clone());
                }
            }
            let db = coll.client().database(&coll.namespace().db);
            with_session!(session, db.run_command(cmd))
                .map(|r| Value::Bson(r.get("n").cloned().unwrap_or(Bson::Null)))
        }
        (Target::Collection(coll), "distinct") => {
            check_with_common(args, &["fieldName", "filter", "session"])?;
            let c = Common::of(args)?;
            let field = args.get_str("fieldName")?;
            let filter = args.get_document("filter").cloned().unwrap_or_default();
            let mut opts = DistinctOptions::default();
            opts.collation = c.collation;
            opts.comment = c.comment;
            with_session!(session, coll.distinct(field, filter).with_options(opts))
                .map(|v| Value::Bson(Bson::Array(v)))
        }
        (Target::Collection(coll), "estimatedDocumentCount") => {
            check_with_common(args, &["maxTimeMS"])?;
            let c = Common::of(args)?;
            let mut opts = EstimatedDocumentCountOptions::default();
            opts.comment = c.comment;
            if let Some(ms) = args.get("maxTimeMS") {
                opts.max_time = Some(millis(ms, "maxTimeMS")?);
            }
            coll.estimated_document_count()
                .with_options(opts)
                .await
                .map(|n| Value::Bson(Bson::Int64(i64::try_from(n).unwrap_or(i64::MAX))))
        }
        (Target::Collection(coll), "findOne") => {
            check_with_common(args, &["filter", "sort", "skip", "projection", "session"])?;
            let c = Common::of(args)?;
            let mut opts = FindOneOptions::default();
            opts.sort = args.get_document("sort").ok().cloned();
            opts.projection = args.get_document("projection").ok().cloned();
            if let Some(n) = args.get("skip") {
                opts.skip = Some(u64::try_from(int(n, "skip")?)?);
            }
            opts.collation = c.collation;
            opts.comment = c.comment;
            opts.hint = c.hint;
            opts.let_vars = c.let_vars;
            let filter = args.get_document("filter").cloned().unwrap_or_default();
            with_session!(session, coll.find_one(filter).with_options(opts)).map(found)
        }
        (Target::Collection(coll), "findOneAndDelete") => {
            check_with_common(args, &["filter", "sort", "projection", "session"])?;
            let c = Common::of(args)?;
            let mut opts = FindOneAndDeleteOptions::default();
            opts.collation = c.collation;
            opts.comment = c.comment;
            opts.hint = c.hint;
            opts.let_vars = c.let_vars;
            opts.sort = args.get_document("sort").ok().cloned();
            opts.projection = args.get_document("projection").ok().cloned();
            let filter = args.get_document("filter")?.clone();
            with_session!(session, coll.find_one_and_delete(filter).with_options(opts)).map(found)
        }
        (Target::Collection(coll), "findOneAndUpdate") => {
            check_with_common(
                args,
                &[
                    "filter",
                    "update",
                    "returnDocument",
                    "upsert",
                    "sort",
                    "projection",
                    "session",
                ],
            )?;
            let c = Common::of(args)?;
            let mut opts = FindOneAndUpdateOptions::default();
            opts.array_filters = c.array_filters;
            opts.bypass_document_validation = c.bypass_document_validation;
            opts.collation = c.collation;
            opts.comment = c.comment;
            opts.hint = c.hint;
            opts.let_vars = c.let_vars;
            opts.sort = args.get_document("sort").ok().cloned();
            opts.projection = args.get_document("projection").ok().cloned();
            opts.upsert = args.get_bool("upsert").ok();
            opts.return_document = return_document(args)?;
            let filter = args.get_document("filter")?.clone();
            let update = update_modifications(args.get("update"))?;
            with_session!(
                session,
                coll.find_one_and_update(filter, update).with_options(opts)
            )
            .map(found)
        }
        (Target::Collection(coll), "findOneAndReplace") => {
            check_with_common(
                args,
                &[
                    "filter",
                    "replacement",
                    "returnDocument",
                    "upsert",
                    "sort",
                    "projection",
                    "session",
                ],
            )?;
            let c = Common::of(args)?;
            let mut opts = FindOneAndReplaceOptions::default();
            opts.bypass_document_validation = c.bypass_document_validation;
            opts.collation = c.collation;
            opts.comment = c.comment;
            opts.hint = c.hint;
            opts.let_vars = c.let_vars;
            opts.sort = args.get_document("sort").ok().cloned();
            opts.projection = args.get_document("projection").ok().cloned();
            opts.upsert = args.get_bool("upsert").ok();
            opts.return_document = return_document(args)?;
            let filter = args.get_document("filter")?.clone();
            let replacement = args.get_document("replacement")?.clone();
            with_session!(
                session,
                coll.find_one_and_replace(filter, replacement)
                    .with_options(opts)
            )
            .map(found)
        }
        (Target::Collection(coll), "bulkWrite") => {
            super::bulk::bulk_write(coll, args, session, retrying.as_deref())
                .await?
                .map(Value::doc)
        }
        (Target::Collection(coll), "createIndex") => {
            check_arguments(args, &["keys", "name", "unique", "session"])?;
            let mut model = IndexModel::default();
            model.keys = args.get_document("keys")?.clone();
            let mut o = IndexOptions::default();
            o.name = args.get_str("name").ok().map(str::to_string);
            o.unique = args.get_bool("unique").ok();
            model.options = Some(o);
            with_session!(session, coll.create_index(model))
                .map(|r| Value::Bson(Bson::String(r.index_name)))
        }
        (Target::Collection(coll), "dropIndex") => {
            check_arguments(args, &["name", "session"])?;
            with_session!(session, coll.drop_index(args.get_str("name")?)).map(|_| Value::None)
        }
        (Target::Collection(coll), "rename") => {
            check_arguments(args, &["to", "dropTarget"])?;
            let db = coll.namespace().db;
            let mut cmd = doc! {
                "renameCollection": coll.namespace().to_string(),
                "to": format!("{db}.{}", args.get_str("to")?),
            };
            if let Ok(d) = args.get_bool("dropTarget") {
                cmd.insert("dropTarget", d);
            }
            coll.client()
                .database("admin")
                .run_command(cmd)
                .await
                .map(|_| Value::None)
        }
        (t, op) => bail!(
            "operation {op} on a {} is not supported by this runner",
            match t {
                Target::Client(_) => "client",
                Target::Database(_) => "database",
                Target::Collection(_) => "collection",
            }
        ),
    };
    Ok(out)
}

fn aggregate_options(args: &Document) -> Result<AggregateOptions> {
    let c = Common::of(args)?;
    let mut opts = AggregateOptions::default();
    if let Some(n) = args.get("batchSize") {
        opts.batch_size = Some(u32::try_from(int(n, "batchSize")?)?);
    }
    if let Some(ms) = args.get("maxTimeMS") {
        opts.max_time = Some(millis(ms, "maxTimeMS")?);
    }
    opts.allow_disk_use = c.allow_disk_use;
    opts.bypass_document_validation = c.bypass_document_validation;
    opts.collation = c.collation;
    opts.comment = c.comment;
    opts.hint = c.hint;
    opts.let_vars = c.let_vars;
    Ok(opts)
}

/// The arguments many operations share, as the driver takes them. `rawData` (8.2+) is
/// accepted and not sent, as drivers do for older servers.
struct Common {
    comment: Option<Bson>,
    hint: Option<Hint>,
    let_vars: Option<Document>,
    collation: Option<Collation>,
    array_filters: Option<Vec<Document>>,
    bypass_document_validation: Option<bool>,
    allow_disk_use: Option<bool>,
}

/// The names [`Common`] reads.
const COMMON: &[&str] = &[
    "comment",
    "hint",
    "let",
    "collation",
    "arrayFilters",
    "bypassDocumentValidation",
    "allowDiskUse",
    "rawData",
];

impl Common {
    fn of(args: &Document) -> Result<Common> {
        let hint = match args.get("hint") {
            None => None,
            Some(Bson::String(name)) => Some(Hint::Name(name.clone())),
            Some(Bson::Document(keys)) => Some(Hint::Keys(keys.clone())),
            Some(other) => bail!("hint {other}"),
        };
        let collation = match args.get_document("collation") {
            Ok(c) => Some(mongodb::bson::deserialize_from_document(c.clone())?),
            Err(_) => None,
        };
        Ok(Common {
            comment: args.get("comment").cloned(),
            hint,
            let_vars: args.get_document("let").ok().cloned(),
            collation,
            array_filters: match args.get("arrayFilters") {
                Some(a) => Some(docs(a)?),
                None => None,
            },
            bypass_document_validation: args.get_bool("bypassDocumentValidation").ok(),
            allow_disk_use: args.get_bool("allowDiskUse").ok(),
        })
    }
}

/// `allowed` and the [`COMMON`] arguments.
fn check_with_common(args: &Document, allowed: &[&str]) -> Result<()> {
    let all: Vec<&str> = allowed.iter().chain(COMMON).copied().collect();
    check_arguments(args, &all)
}

fn return_document(args: &Document) -> Result<Option<ReturnDocument>> {
    Ok(match args.get_str("returnDocument") {
        Err(_) => None,
        Ok("Before") => Some(ReturnDocument::Before),
        Ok("After") => Some(ReturnDocument::After),
        Ok(other) => bail!("returnDocument {other}"),
    })
}

fn update_modifications(v: Option<&Bson>) -> Result<UpdateModifications> {
    match v {
        Some(Bson::Document(u)) => Ok(UpdateModifications::Document(u.clone())),
        Some(p @ Bson::Array(_)) => Ok(UpdateModifications::Pipeline(docs(p)?)),
        _ => bail!("an update must be a document or a pipeline"),
    }
}

/// An `UpdateResult` as the spec's document.
fn update_result(r: &UpdateResult) -> Document {
    let mut d = doc! {
        "matchedCount": i64::try_from(r.matched_count).unwrap_or(i64::MAX),
        "modifiedCount": i64::try_from(r.modified_count).unwrap_or(i64::MAX),
        "upsertedCount": i64::from(r.upserted_id.is_some()),
    };
    if let Some(id) = &r.upserted_id {
        d.insert("upsertedId", id.clone());
    }
    d
}

fn delete_result(r: &DeleteResult) -> Document {
    doc! {"deletedCount": i64::try_from(r.deleted_count).unwrap_or(i64::MAX)}
}

/// A findOneAnd* result: the document, or null.
fn found(d: Option<Document>) -> Value {
    Value::Bson(d.map_or(Bson::Null, Bson::Document))
}

async fn drain_cursor(
    cursor: mongodb::error::Result<mongodb::Cursor<Document>>,
) -> std::result::Result<Value, DriverError> {
    let docs: Vec<Document> = cursor?.try_collect().await?;
    Ok(Value::Bson(Bson::Array(
        docs.into_iter().map(Bson::Document).collect(),
    )))
}

async fn drain_session_cursor(
    cursor: mongodb::error::Result<mongodb::SessionCursor<Document>>,
    session: &mut ClientSession,
) -> std::result::Result<Value, DriverError> {
    let mut cursor = cursor?;
    let mut out = Vec::new();
    while let Some(d) = cursor.next(session).await {
        out.push(Bson::Document(d?));
    }
    Ok(Value::Bson(Bson::Array(out)))
}

async fn client_bulk_write(
    client: &Client,
    args: &Document,
    session: Option<&mut ClientSession>,
) -> Result<Outcome> {
    check_arguments(
        args,
        &[
            "models",
            "verboseResults",
            "ordered",
            "writeConcern",
            "session",
        ],
    )?;
    let mut models = Vec::new();
    for m in args.get_array("models").context("models")? {
        let m = m.as_document().context("a write model")?;
        let (kind, spec) = m.iter().next().context("an empty write model")?;
        let spec = spec.as_document().context("a write model")?;
        let ns: Namespace = spec
            .get_str("namespace")
            .context("namespace")?
            .parse()
            .map_err(|e| anyhow!("namespace: {e:?}"))?;
        let filter = || spec.get_document("filter").cloned().context("filter");
        let model: WriteModel = match kind.as_str() {
            "insertOne" => {
                check_arguments(spec, &["namespace", "document"])?;
                InsertOneModel::builder()
                    .namespace(ns)
                    .document(spec.get_document("document")?.clone())
                    .build()
                    .into()
            }
            "updateOne" => {
                check_arguments(spec, &["namespace", "filter", "update", "upsert"])?;
                UpdateOneModel::builder()
                    .namespace(ns)
                    .filter(filter()?)
                    .update(update_modifications(spec.get("update"))?)
                    .upsert(spec.get_bool("upsert").ok())
                    .build()
                    .into()
            }
            "updateMany" => {
                check_arguments(spec, &["namespace", "filter", "update", "upsert"])?;
                UpdateManyModel::builder()
                    .namespace(ns)
                    .filter(filter()?)
                    .update(update_modifications(spec.get("update"))?)
                    .upsert(spec.get_bool("upsert").ok())
                    .build()
                    .into()
            }
            "replaceOne" => {
                check_arguments(spec, &["namespace", "filter", "replacement", "upsert"])?;
                ReplaceOneModel::builder()
                    .namespace(ns)
                    .filter(filter()?)
                    .replacement(spec.get_document("replacement")?.clone())
                    .upsert(spec.get_bool("upsert").ok())
                    .build()
                    .into()
            }
            "deleteOne" => {
                check_arguments(spec, &["namespace", "filter"])?;
                DeleteOneModel::builder()
                    .namespace(ns)
                    .filter(filter()?)
                    .build()
                    .into()
            }
            "deleteMany" => {
                check_arguments(spec, &["namespace", "filter"])?;
                DeleteManyModel::builder()
                    .namespace(ns)
                    .filter(filter()?)
                    .build()
                    .into()
            }
            other => bail!("write model {other} is not supported by this runner"),
        };
        models.push(model);
    }
    let mut action = client.bulk_write(models);
    if let Ok(o) = args.get_bool("ordered") {
        action = action.ordered(o);
    }
    if let Some(wc) = args.get("writeConcern") {
        action = action.write_concern(write_concern(wc)?);
    }
    Ok(if args.get_bool("verboseResults").unwrap_or(false) {
        let action = action.verbose_results();
        with_session!(session, action).map(|r| {
            let mut d = summary(&r.summary);
            let by_index = |m: Vec<(usize, Document)>| -> Document {
                let mut m = m;
                m.sort_by_key(|(i, _)| *i);
                m.into_iter()
                    .map(|(i, d)| (i.to_string(), Bson::Document(d)))
                    .collect()
            };
            d.insert(
                "insertResults",
                by_index(
                    r.insert_results
                        .into_iter()
                        .map(|(i, r)| (i, doc! {"insertedId": r.inserted_id}))
                        .collect(),
                ),
            );
            d.insert(
                "updateResults",
                by_index(
                    r.update_results
                        .iter()
                        .map(|(i, r)| {
                            let mut u = update_result(r);
                            u.remove("upsertedCount");
                            (*i, u)
                        })
                        .collect(),
                ),
            );
            d.insert(
                "deleteResults",
                by_index(
                    r.delete_results
                        .iter()
                        .map(|(i, r)| (*i, delete_result(r)))
                        .collect(),
                ),
            );
            Value::doc(d)
        })
    } else {
        with_session!(session, action).map(|r| Value::doc(summary(&r)))
    })
}

/// The partial result of a failed `insertMany`, as the CRUD spec defines it: the documents
/// inserted are those before the first write error (ordered) or all but the failed ones
/// (unordered). The 3.9 driver keeps its `inserted_ids` private, so this derives the count
/// from the error's indexed write errors, as the driver itself does.
fn insert_many_partial(e: &mongodb::error::InsertManyError, args: &Document) -> Result<Document> {
    let n = args
        .get_array("documents")
        .context("insertMany.documents")?
        .len();
    let ordered = args.get_bool("ordered").unwrap_or(true);
    let failed: Vec<usize> = e.write_errors.iter().flatten().map(|w| w.index).collect();
    let inserted = if ordered {
        failed.iter().min().copied().unwrap_or(n)
    } else {
        n - failed.len().min(n)
    };
    Ok(doc! {
        "insertedCount": i64::try_from(inserted)?,
        "matchedCount": 0_i64,
        "modifiedCount": 0_i64,
        "upsertedCount": 0_i64,
        "deletedCount": 0_i64,
        "upsertedIds": {},
    })
}

fn summary(r: &mongodb::results::SummaryBulkWriteResult) -> Document {
    doc! {
        "insertedCount": r.inserted_count,
        "matchedCount": r.matched_count,
        "modifiedCount": r.modified_count,
        "upsertedCount": r.upserted_count,
        "deletedCount": r.deleted_count,
    }
}

fn stream_value(s: ChangeStream<ChangeStreamEvent<Document>>) -> Value {
    Value::Stream(Box::new(s.with_type::<Document>()))
}

// ----- errors --------------------------------------------------------------------------------

/// The server error code of a driver error, if it carries one.
pub(crate) fn code_of(e: &DriverError) -> Option<(i32, String)> {
    if let Some(f) = e.get_custom::<BulkFailure>() {
        return f.code();
    }
    match e.kind.as_ref() {
        ErrorKind::Command(c) => Some((c.code, c.code_name.clone())),
        ErrorKind::Write(WriteFailure::WriteError(w)) => {
            Some((w.code, w.code_name.clone().unwrap_or_default()))
        }
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some((w.code, w.code_name.clone())),
        _ => None,
    }
}

/// Whether the error carries `label` (the driver's, or the runner's bulk write's).
fn has_label(e: &DriverError, label: &str) -> bool {
    match e.get_custom::<NetworkFailure>() {
        Some(f) => f.error.contains_label(label) || (label == "RetryableWriteError" && f.retryable),
        None => e.contains_label(label),
    }
}

/// A driver error in one line: code, name, message and labels for server errors.
fn describe(e: &DriverError) -> String {
    let mut labels: Vec<&String> = e.labels().iter().collect();
    labels.sort();
    if let Some(f) = e.get_custom::<BulkFailure>() {
        return format!(
            "bulk write failure: write errors {:?}, write concern error {:?}, partial result {}",
            f.write_errors, f.write_concern_error, f.partial
        );
    }
    if let Some(ClientValidation(why)) = e.get_custom::<ClientValidation>() {
        return format!("client-side validation error: {why}");
    }
    if let Some(f) = e.get_custom::<NetworkFailure>() {
        let labels = if f.retryable {
            "[\"RetryableWriteError\"]"
        } else {
            "[]"
        };
        return format!(
            "{:?}; labels {labels}; partial result {}",
            f.error.kind, f.partial
        );
    }
    match e.kind.as_ref() {
        ErrorKind::Command(c) => format!(
            "server error {} ({}): {}; labels {labels:?}",
            c.code, c.code_name, c.message
        ),
        other => format!("{other:?}; labels {labels:?}"),
    }
}

/// Whether the error came from the driver rather than the server (network errors count).
fn is_client_error(e: &DriverError) -> bool {
    if e.get_custom::<BulkFailure>().is_some() {
        return false;
    }
    !matches!(
        e.kind.as_ref(),
        ErrorKind::Command(_)
            | ErrorKind::Write(_)
            | ErrorKind::BulkWrite(_)
            | ErrorKind::InsertMany(_)
    )
}

fn check_error(
    expected: &Document,
    e: &DriverError,
    args: &Document,
    entities: &Entities,
) -> Result<()> {
    if e.get_custom::<RunnerFailure>().is_some() {
        bail!("the runner failed inside the callback");
    }
    let code = code_of(e);
    for (k, v) in expected {
        match k.as_str() {
            "isError" => {}
            "isClientError" => {
                let want = v.as_bool().context("isClientError")?;
                if is_client_error(e) != want {
                    bail!("expected isClientError {want}, got {}", describe(e));
                }
            }
            "errorCode" => {
                let want = i32::try_from(int(v, "errorCode")?)?;
                if code.as_ref().map(|c| c.0) != Some(want) {
                    bail!("expected error code {want}, got {}", describe(e));
                }
            }
            "errorCodeName" => {
                let want = v.as_str().context("errorCodeName")?;
                if code.as_ref().map(|c| c.1.as_str()) != Some(want) {
                    bail!("expected error code name {want}, got {}", describe(e));
                }
            }
            "errorLabelsContain" => {
                for l in v.as_array().context("errorLabelsContain")? {
                    let l = l.as_str().context("label")?;
                    if !has_label(e, l) {
                        bail!("expected label {l} on {}", describe(e));
                    }
                }
            }
            "errorLabelsOmit" => {
                for l in v.as_array().context("errorLabelsOmit")? {
                    let l = l.as_str().context("label")?;
                    if has_label(e, l) {
                        bail!("expected no label {l} on {}", describe(e));
                    }
                }
            }
            "errorContains" => {
                let want = v.as_str().context("errorContains")?.to_lowercase();
                if !e.to_string().to_lowercase().contains(&want) {
                    bail!(
                        "expected the error to contain {want:?}, got {}",
                        describe(e)
                    );
                }
            }
            "expectResult" => {
                // The partial result a failed write carries.
                let actual = match e.kind.as_ref() {
                    ErrorKind::BulkWrite(b) => match &b.partial_result {
                        Some(mongodb::error::PartialBulkWriteResult::Summary(s)) => {
                            Some(Bson::Document(summary(s)))
                        }
                        Some(mongodb::error::PartialBulkWriteResult::Verbose(v)) => {
                            Some(Bson::Document(summary(&v.summary)))
                        }
                        None => None,
                    },
                    ErrorKind::InsertMany(m) => Some(Bson::Document(insert_many_partial(m, args)?)),
                    ErrorKind::Custom(_) if e.get_custom::<BulkFailure>().is_some() => e
                        .get_custom::<BulkFailure>()
                        .map(|f| Bson::Document(f.partial.clone())),
                    ErrorKind::Custom(_) if e.get_custom::<NetworkFailure>().is_some() => e
                        .get_custom::<NetworkFailure>()
                        .map(|f| Bson::Document(f.partial.clone())),
                    other => bail!(
                        "expectError.expectResult on a {other:?} error is not supported by this \
                         runner"
                    ),
                };
                matcher::matches_in(entities.cx(), v, actual.as_ref(), true)
                    .map_err(|why| anyhow!("partial result mismatch: {why}"))?;
            }
            "errorResponse" => {
                // The server's whole reply to the failed command (extra fields allowed).
                let raw = e
                    .server_response()
                    .with_context(|| format!("no server response on {}", describe(e)))?;
                let actual = Document::try_from(raw.as_ref())
                    .context("the server response is not a document")?;
                matcher::matches_in(entities.cx(), v, Some(&Bson::Document(actual)), true)
                    .map_err(|why| anyhow!("error response mismatch: {why}"))?;
            }
            other => bail!("expectError.{other} is not supported by this runner"),
        }
    }
    Ok(())
}
