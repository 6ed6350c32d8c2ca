//! The operations of the change-stream spec files, run on the driver, and their
//! `expectResult` / `expectError` / `saveResultAsEntity` handling.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use mongodb::IndexModel;
use mongodb::bson::{Bson, Document, doc};
use mongodb::change_stream::ChangeStream;
use mongodb::change_stream::event::ChangeStreamEvent;
use mongodb::error::{Error as DriverError, ErrorKind, WriteFailure};
use mongodb::options::{
    ChangeStreamOptions, FullDocumentBeforeChangeType, FullDocumentType, IndexOptions,
};

use super::matcher;
use super::{Entities, Entity};

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
}

type Outcome = std::result::Result<Value, DriverError>;

pub(super) async fn run_operation(uri: &str, op: &Document, entities: &mut Entities) -> Result<()> {
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
    let _ = uri;
    let outcome = if object == "testRunner" {
        test_runner(name, args, entities).await?;
        Ok(Value::None)
    } else {
        execute(name, object, args, entities).await?
    };
    let ignore = op.get_bool("ignoreResultAndError").unwrap_or(false);
    if let Ok(expected) = op.get_document("expectError") {
        return match outcome {
            Ok(v) => bail!("expected an error, got {}", v.describe()),
            Err(e) => check_error(expected, &e),
        };
    }
    let value = match outcome {
        Ok(v) => v,
        Err(_) if ignore => return Ok(()),
        Err(e) => bail!("unexpected error: {}", describe(&e)),
    };
    if let Some(expected) = op.get("expectResult") {
        let actual = match &value {
            Value::Bson(b) => Some(b),
            Value::None => None,
            Value::Stream(_) => bail!("expectResult on a change stream is not supported"),
        };
        matcher::matches(expected, actual, true)
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
    Ok(())
}

fn check_arguments(args: &Document, allowed: &[&str]) -> Result<()> {
    for k in args.keys() {
        if !allowed.contains(&k.as_str()) {
            bail!("argument {k} is not supported by this runner");
        }
    }
    Ok(())
}

async fn test_runner(name: &str, args: &Document, entities: &mut Entities) -> Result<()> {
    match name {
        "failPoint" => {
            check_arguments(args, &["client", "failPoint"])?;
            let client_id = args.get_str("client")?;
            let fp = args.get_document("failPoint")?.clone();
            let fp_name = fp.get_str("configureFailPoint")?.to_string();
            let client = &entities.client(client_id)?.client;
            client
                .database("admin")
                .run_command(fp)
                .await
                .context("configureFailPoint")?;
            entities.fail_points.push((client_id.to_string(), fp_name));
            Ok(())
        }
        other => bail!("testRunner operation {other} is not supported by this runner"),
    }
}

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
        let n = match n {
            Bson::Int32(n) => i64::from(*n),
            Bson::Int64(n) => *n,
            Bson::Double(n) => *n as i64,
            other => bail!("batchSize {other}"),
        };
        opts.batch_size = Some(u32::try_from(n).context("batchSize")?);
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
        let ms = match ms {
            Bson::Int32(n) => u64::try_from(*n)?,
            Bson::Int64(n) => u64::try_from(*n)?,
            other => bail!("maxAwaitTimeMS {other}"),
        };
        opts.max_await_time = Some(Duration::from_millis(ms));
    }
    if let Ok(ts) = args.get_timestamp("startAtOperationTime") {
        opts.start_at_operation_time = Some(ts);
    }
    Ok((pipeline, opts))
}

/// A driver result struct as the BSON document the spec compares against.
macro_rules! to_value {
    ($v:expr) => {
        match mongodb::bson::serialize_to_bson($v) {
            Ok(b) => Value::Bson(b),
            Err(_) => Value::None,
        }
    };
}

async fn execute(
    name: &str,
    object: &str,
    args: &Document,
    entities: &mut Entities,
) -> Result<Outcome> {
    if name == "iterateUntilDocumentOrError" {
        check_arguments(args, &[])?;
        let Some(Entity::ChangeStream(stream)) = entities.map.get_mut(object) else {
            bail!("entity {object:?} is not a change stream");
        };
        return match tokio::time::timeout(ITERATE_WAIT, stream.next()).await {
            Err(_) => bail!("no document or error within {ITERATE_WAIT:?}"),
            Ok(None) => bail!("the change stream ended"),
            Ok(Some(Ok(d))) => Ok(Ok(Value::Bson(Bson::Document(d)))),
            Ok(Some(Err(e))) => Ok(Err(e)),
        };
    }
    let entity = entities.get(object)?;
    let out = match (entity, name) {
        (Entity::Client(c), "createChangeStream") => {
            let (pipeline, opts) = stream_options(args)?;
            c.client
                .watch()
                .pipeline(pipeline)
                .with_options(opts)
                .await
                .map(stream_value)
        }
        (Entity::Database(db), "createChangeStream") => {
            let (pipeline, opts) = stream_options(args)?;
            db.watch()
                .pipeline(pipeline)
                .with_options(opts)
                .await
                .map(stream_value)
        }
        (Entity::Collection(coll), "createChangeStream") => {
            let (pipeline, opts) = stream_options(args)?;
            coll.watch()
                .pipeline(pipeline)
                .with_options(opts)
                .await
                .map(stream_value)
        }
        (Entity::Database(db), "runCommand") => {
            check_arguments(args, &["command", "commandName"])?;
            let cmd = args.get_document("command")?.clone();
            db.run_command(cmd)
                .await
                .map(|d| Value::Bson(Bson::Document(d)))
        }
        (Entity::Database(db), "dropCollection") => {
            check_arguments(args, &["collection"])?;
            db.collection::<Document>(args.get_str("collection")?)
                .drop()
                .await
                .map(|_| Value::None)
        }
        (Entity::Database(db), "createCollection") => {
            check_arguments(args, &["collection", "viewOn", "pipeline"])?;
            let mut create = db.create_collection(args.get_str("collection")?);
            if let Ok(on) = args.get_str("viewOn") {
                create = create.view_on(on.to_string());
            }
            if let Some(p) = args.get("pipeline") {
                create = create.pipeline(docs(p)?);
            }
            create.await.map(|_| Value::None)
        }
        (Entity::Collection(coll), "insertOne") => {
            check_arguments(args, &["document"])?;
            coll.insert_one(args.get_document("document")?.clone())
                .await
                .map(|r| Value::Bson(Bson::Document(doc! {"insertedId": r.inserted_id})))
        }
        (Entity::Collection(coll), "updateOne") => {
            check_arguments(args, &["filter", "update"])?;
            let filter = args.get_document("filter")?.clone();
            let result = match args.get("update") {
                Some(Bson::Document(u)) => coll.update_one(filter, u.clone()).await,
                Some(p @ Bson::Array(_)) => coll.update_one(filter, docs(p)?).await,
                _ => bail!("updateOne without an update"),
            };
            result.map(|r| to_value!(&r))
        }
        (Entity::Collection(coll), "replaceOne") => {
            check_arguments(args, &["filter", "replacement"])?;
            coll.replace_one(
                args.get_document("filter")?.clone(),
                args.get_document("replacement")?.clone(),
            )
            .await
            .map(|r| to_value!(&r))
        }
        (Entity::Collection(coll), "deleteOne") => {
            check_arguments(args, &["filter"])?;
            coll.delete_one(args.get_document("filter")?.clone())
                .await
                .map(|r| to_value!(&r))
        }
        (Entity::Collection(coll), "createIndex") => {
            check_arguments(args, &["keys", "name"])?;
            let mut model = IndexModel::default();
            model.keys = args.get_document("keys")?.clone();
            if let Ok(n) = args.get_str("name") {
                let mut o = IndexOptions::default();
                o.name = Some(n.to_string());
                model.options = Some(o);
            }
            coll.create_index(model)
                .await
                .map(|r| Value::Bson(Bson::String(r.index_name)))
        }
        (Entity::Collection(coll), "dropIndex") => {
            check_arguments(args, &["name"])?;
            coll.drop_index(args.get_str("name")?)
                .await
                .map(|_| Value::None)
        }
        (Entity::Collection(coll), "rename") => {
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
        (e, op) => bail!(
            "operation {op} on a {} is not supported by this runner",
            e.kind()
        ),
    };
    Ok(out)
}

fn stream_value(s: ChangeStream<ChangeStreamEvent<Document>>) -> Value {
    Value::Stream(Box::new(s.with_type::<Document>()))
}

/// The server error code of a driver error, if it carries one.
fn code_of(e: &DriverError) -> Option<(i32, String)> {
    match e.kind.as_ref() {
        ErrorKind::Command(c) => Some((c.code, c.code_name.clone())),
        ErrorKind::Write(WriteFailure::WriteError(w)) => {
            Some((w.code, w.code_name.clone().unwrap_or_default()))
        }
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some((w.code, w.code_name.clone())),
        _ => None,
    }
}

/// A driver error in one line: code, name, message and labels for server errors.
fn describe(e: &DriverError) -> String {
    let mut labels: Vec<&String> = e.labels().iter().collect();
    labels.sort();
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
    !matches!(
        e.kind.as_ref(),
        ErrorKind::Command(_)
            | ErrorKind::Write(_)
            | ErrorKind::BulkWrite(_)
            | ErrorKind::InsertMany(_)
    )
}

fn check_error(expected: &Document, e: &DriverError) -> Result<()> {
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
                let want = match v {
                    Bson::Int32(n) => *n,
                    Bson::Int64(n) => i32::try_from(*n)?,
                    other => bail!("errorCode {other}"),
                };
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
                    if !e.contains_label(l) {
                        bail!("expected label {l} on {}", describe(e));
                    }
                }
            }
            "errorLabelsOmit" => {
                for l in v.as_array().context("errorLabelsOmit")? {
                    let l = l.as_str().context("label")?;
                    if e.contains_label(l) {
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
            other => bail!("expectError.{other} is not supported by this runner"),
        }
    }
    Ok(())
}
