//! A runner for the drivers' unified test format (schema 1.x up to 1.7), on the Rust
//! `mongodb` driver, covering what the change-stream spec files use: client / database /
//! collection entities with command-started event observation, `runOnRequirements`,
//! `initialData`, the operations of those files, the special matchers, `expectError` and
//! `expectEvents` (with `ignoreExtraEvents`).
//!
//! Invariants: the JSON files are read unchanged; anything the runner does not implement (an
//! operation, an argument, a matcher, a requirement) fails or skips the test loudly, never
//! passes it; every fail point a test sets is turned off afterwards; a test that is listed as a
//! known failure must fail (a listed test that passes or is skipped fails the run), so the list
//! stays true.

pub mod matcher;
mod ops;

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use mongodb::Client;
use mongodb::bson::{Bson, Document, doc};
use mongodb::event::EventHandler;
use mongodb::event::command::{CommandEvent, CommandStartedEvent};
use mongodb::options::ClientOptions;

/// The newest schema version this runner understands.
pub const SCHEMA: (u64, u64) = (1, 7);
/// The longest one test may take.
const TEST_TIMEOUT: Duration = Duration::from_secs(90);

/// What the runner learnt about the server before running anything.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// `buildInfo.version`, as `[major, minor, patch]`.
    pub version: [u64; 3],
    /// `single`, `replicaset` or `sharded`.
    pub topology: String,
}

/// Asks the server at `uri` for its version and topology (as a driver would see it).
pub async fn probe(uri: &str) -> Result<ServerInfo> {
    let client = new_client(uri, None).await?;
    let admin = client.database("admin");
    let info = admin.run_command(doc! {"buildInfo": 1}).await?;
    let version = parse_version(info.get_str("version").context("buildInfo.version")?);
    let hello = admin.run_command(doc! {"hello": 1}).await?;
    let topology = if hello.get_str("msg").ok() == Some("isdbgrid") {
        "sharded"
    } else if hello.contains_key("setName") {
        "replicaset"
    } else {
        "single"
    };
    client.shutdown().await;
    Ok(ServerInfo {
        version,
        topology: topology.to_string(),
    })
}

fn parse_version(s: &str) -> [u64; 3] {
    let mut out = [0; 3];
    for (slot, part) in out.iter_mut().zip(s.split('.')) {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        *slot = digits.parse().unwrap_or(0);
    }
    out
}

/// The outcome of one test.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Passed,
    Failed(String),
    Skipped(String),
}

#[derive(Debug, Clone)]
pub struct TestResult {
    pub file: String,
    pub description: String,
    pub outcome: Outcome,
}

/// One line of the known-failures list: `topology | file | description | reason`
/// (`*` for every topology).
#[derive(Debug, Clone)]
pub struct KnownFailure {
    pub topology: String,
    pub file: String,
    pub description: String,
    pub reason: String,
}

impl KnownFailure {
    /// Parses the list; `#` starts a comment, blank lines are ignored.
    pub fn parse_list(text: &str) -> Result<Vec<KnownFailure>> {
        let mut out = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let parts: Vec<&str> = line.splitn(4, '|').map(str::trim).collect();
            let [topology, file, description, reason] = parts[..] else {
                bail!(
                    "known failures line {}: expected 4 fields separated by '|'",
                    i + 1
                );
            };
            anyhow::ensure!(
                !reason.is_empty(),
                "known failures line {}: a reason is required",
                i + 1
            );
            out.push(KnownFailure {
                topology: topology.to_string(),
                file: file.to_string(),
                description: description.to_string(),
                reason: reason.to_string(),
            });
        }
        Ok(out)
    }

    pub fn applies(&self, topology: &str, file: &str, description: &str) -> bool {
        (self.topology == "*" || self.topology == topology)
            && self.file == file
            && self.description == description
    }
}

/// Counts of one run, and whether it matches the known-failures list.
#[derive(Debug, Default)]
pub struct Summary {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
    /// Failures not on the list, listed tests that passed or were skipped: each makes the run
    /// fail.
    pub problems: Vec<String>,
    /// Failures that are on the list.
    pub known: usize,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        )
    }
}

/// Tallies results against the known-failures list for `topology`.
pub fn summarize(topology: &str, results: &[TestResult], known: &[KnownFailure]) -> Summary {
    let mut s = Summary::default();
    for r in results {
        let listed = known
            .iter()
            .find(|k| k.applies(topology, &r.file, &r.description));
        match (&r.outcome, listed) {
            (Outcome::Passed, None) => s.passed += 1,
            (Outcome::Passed, Some(k)) => {
                s.passed += 1;
                s.problems.push(format!(
                    "{} / {:?} is listed as a known failure ({}) but passed: remove it from the list",
                    r.file, r.description, k.reason
                ));
            }
            (Outcome::Failed(why), None) => {
                s.failed += 1;
                s.problems
                    .push(format!("{} / {:?} failed: {why}", r.file, r.description));
            }
            (Outcome::Failed(_), Some(_)) => {
                s.failed += 1;
                s.known += 1;
            }
            (Outcome::Skipped(_), None) => s.skipped += 1,
            (Outcome::Skipped(why), Some(_)) => {
                s.skipped += 1;
                s.problems.push(format!(
                    "{} / {:?} is listed as a known failure but was skipped ({why})",
                    r.file, r.description
                ));
            }
        }
    }
    s
}

/// Runs every test of the unified-format file at `path` against `uri`.
pub async fn run_file(uri: &str, server: &ServerInfo, path: &Path) -> Result<Vec<TestResult>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    // Extended JSON, as the drivers read these files (small integers become int32).
    let file: Document = match serde_json::from_str::<Bson>(&text)? {
        Bson::Document(d) => d,
        _ => bail!("{}: not a JSON object", path.display()),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    run_document(uri, server, &name, &file).await
}

/// Runs the tests of an already-parsed unified-format file named `name`.
pub async fn run_document(
    uri: &str,
    server: &ServerInfo,
    name: &str,
    file: &Document,
) -> Result<Vec<TestResult>> {
    check_schema(file.get_str("schemaVersion").context("schemaVersion")?)?;
    let file_skip = requirements_unmet(file.get_array("runOnRequirements").ok(), server)?;
    let tests = file.get_array("tests").context("tests")?;
    let mut out = Vec::new();
    for t in tests {
        let test = t.as_document().context("a test is not a document")?;
        let description = test.get_str("description").unwrap_or("?").to_string();
        let outcome = if let Some(why) = &file_skip {
            Outcome::Skipped(why.clone())
        } else if let Some(why) =
            requirements_unmet(test.get_array("runOnRequirements").ok(), server)?
        {
            Outcome::Skipped(why)
        } else if let Ok(reason) = test.get_str("skipReason") {
            Outcome::Skipped(reason.to_string())
        } else {
            match tokio::time::timeout(TEST_TIMEOUT, run_test(uri, file, test)).await {
                Ok(Ok(())) => Outcome::Passed,
                Ok(Err(e)) => Outcome::Failed(format!("{e:#}")),
                Err(_) => Outcome::Failed(format!("timed out after {TEST_TIMEOUT:?}")),
            }
        };
        out.push(TestResult {
            file: name.to_string(),
            description,
            outcome,
        });
    }
    Ok(out)
}

fn check_schema(v: &str) -> Result<()> {
    let parts: Vec<u64> = v
        .split('.')
        .map(|p| p.parse().unwrap_or(u64::MAX))
        .collect();
    let major = parts.first().copied().unwrap_or(u64::MAX);
    let minor = parts.get(1).copied().unwrap_or(0);
    if major != SCHEMA.0 || minor > SCHEMA.1 {
        bail!(
            "schema version {v} is not supported (runner: {}.{})",
            SCHEMA.0,
            SCHEMA.1
        );
    }
    Ok(())
}

/// `None` when one of the requirement entries holds (or there are none), else why not.
fn requirements_unmet(reqs: Option<&Vec<Bson>>, server: &ServerInfo) -> Result<Option<String>> {
    let Some(reqs) = reqs else { return Ok(None) };
    if reqs.is_empty() {
        return Ok(None);
    }
    let mut reasons = Vec::new();
    for r in reqs {
        let r = r
            .as_document()
            .context("a runOnRequirement is not a document")?;
        match requirement_unmet(r, server) {
            None => return Ok(None),
            Some(why) => reasons.push(why),
        }
    }
    Ok(Some(reasons.join("; ")))
}

fn requirement_unmet(r: &Document, server: &ServerInfo) -> Option<String> {
    for (k, v) in r {
        let why = match k.as_str() {
            "minServerVersion" => {
                let min = parse_version(v.as_str().unwrap_or(""));
                (server.version < min).then(|| format!("server older than {v}"))
            }
            "maxServerVersion" => {
                let max = parse_version(v.as_str().unwrap_or(""));
                (server.version > max).then(|| format!("server newer than {v}"))
            }
            "topologies" => {
                let ok = v.as_array().is_some_and(|a| {
                    a.iter()
                        .any(|t| t.as_str() == Some(server.topology.as_str()))
                });
                (!ok).then(|| format!("topology {} not in {v}", server.topology))
            }
            "serverless" => {
                (v.as_str() == Some("require")).then(|| "requires serverless".to_string())
            }
            "auth" => (v.as_bool() == Some(true)).then(|| "requires auth".to_string()),
            other => Some(format!(
                "requirement {other} is not supported by this runner"
            )),
        };
        if why.is_some() {
            return why;
        }
    }
    None
}

// ----- entities ------------------------------------------------------------------------------

/// Commands never recorded: fail-point configuration and the security-sensitive ones.
const NEVER_OBSERVED: &[&str] = &[
    "configureFailPoint",
    "hello",
    "isMaster",
    "ismaster",
    "authenticate",
    "saslStart",
    "saslContinue",
    "getnonce",
    "createUser",
    "updateUser",
    "copydbgetnonce",
    "copydbsaslstart",
    "copydb",
];

pub(crate) struct ClientEntity {
    pub client: Client,
    events: Arc<Mutex<Vec<CommandStartedEvent>>>,
    observe_started: bool,
    ignore: Vec<String>,
}

impl ClientEntity {
    /// The command-started events this entity observes, in order.
    fn started(&self) -> Vec<CommandStartedEvent> {
        if !self.observe_started {
            return Vec::new();
        }
        let events = self.events.lock().map(|e| e.clone()).unwrap_or_default();
        events
            .into_iter()
            .filter(|e| {
                !NEVER_OBSERVED.contains(&e.command_name.as_str())
                    && !self.ignore.contains(&e.command_name)
            })
            .collect()
    }
}

pub(crate) enum Entity {
    Client(ClientEntity),
    Database(mongodb::Database),
    Collection(mongodb::Collection<Document>),
    ChangeStream(Box<mongodb::change_stream::ChangeStream<Document>>),
}

impl Entity {
    fn kind(&self) -> &'static str {
        match self {
            Entity::Client(_) => "client",
            Entity::Database(_) => "database",
            Entity::Collection(_) => "collection",
            Entity::ChangeStream(_) => "changeStream",
        }
    }
}

pub(crate) struct Entities {
    pub map: HashMap<String, Entity>,
    /// Fail points set by `failPoint` operations: (client entity id, fail point name).
    pub fail_points: Vec<(String, String)>,
}

impl Entities {
    pub fn get(&self, id: &str) -> Result<&Entity> {
        self.map
            .get(id)
            .ok_or_else(|| anyhow!("no entity named {id:?}"))
    }

    pub fn client(&self, id: &str) -> Result<&ClientEntity> {
        match self.get(id)? {
            Entity::Client(c) => Ok(c),
            other => bail!("entity {id:?} is a {}, not a client", other.kind()),
        }
    }

    pub fn insert(&mut self, id: &str, e: Entity) -> Result<()> {
        if self.map.contains_key(id) {
            bail!("entity {id:?} already exists");
        }
        self.map.insert(id.to_string(), e);
        Ok(())
    }
}

async fn new_client(
    uri: &str,
    events: Option<Arc<Mutex<Vec<CommandStartedEvent>>>>,
) -> Result<Client> {
    let mut opts = ClientOptions::parse(uri).await?;
    opts.server_selection_timeout = Some(Duration::from_secs(10));
    opts.connect_timeout = Some(Duration::from_secs(5));
    if let Some(events) = events {
        opts.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| {
            if let CommandEvent::Started(started) = ev
                && let Ok(mut events) = events.lock()
            {
                events.push(started);
            }
        }));
    }
    Ok(Client::with_options(opts)?)
}

async fn create_entities(uri: &str, list: &[Bson], entities: &mut Entities) -> Result<()> {
    for item in list {
        let item = item.as_document().context("an entity is not a document")?;
        let (kind, spec) = item.iter().next().context("empty entity")?;
        let spec = spec
            .as_document()
            .context("entity spec is not a document")?;
        let id = spec.get_str("id").context("entity without id")?;
        let entity = match kind.as_str() {
            "client" => {
                for key in spec.keys() {
                    if !matches!(
                        key.as_str(),
                        "id" | "observeEvents"
                            | "ignoreCommandMonitoringEvents"
                            | "useMultipleMongoses"
                            | "uriOptions"
                    ) {
                        bail!("client option {key} is not supported by this runner");
                    }
                }
                let observe: Vec<String> = spec
                    .get_array("observeEvents")
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                if let Some(other) = observe.iter().find(|e| *e != "commandStartedEvent") {
                    bail!("observing {other} is not supported by this runner");
                }
                let ignore = spec
                    .get_array("ignoreCommandMonitoringEvents")
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                let mut client_uri = uri.to_string();
                if let Ok(opts) = spec.get_document("uriOptions") {
                    for (k, v) in opts {
                        let sep = if client_uri.contains('?') { '&' } else { '?' };
                        let v = match v {
                            Bson::String(s) => s.clone(),
                            other => other.to_string(),
                        };
                        client_uri.push_str(&format!("{sep}{k}={v}"));
                    }
                }
                let events = Arc::new(Mutex::new(Vec::new()));
                let client = new_client(&client_uri, Some(events.clone())).await?;
                Entity::Client(ClientEntity {
                    client,
                    events,
                    observe_started: !observe.is_empty(),
                    ignore,
                })
            }
            "database" => {
                let client = entities.client(spec.get_str("client").context("database.client")?)?;
                let name = spec.get_str("databaseName").context("databaseName")?;
                Entity::Database(client.client.database(name))
            }
            "collection" => {
                let db_id = spec.get_str("database").context("collection.database")?;
                let Entity::Database(db) = entities.get(db_id)? else {
                    bail!("entity {db_id:?} is not a database");
                };
                let name = spec.get_str("collectionName").context("collectionName")?;
                Entity::Collection(db.collection(name))
            }
            other => bail!("entity type {other} is not supported by this runner"),
        };
        entities.insert(id, entity)?;
    }
    Ok(())
}

async fn initial_data(uri: &str, data: &[Bson]) -> Result<()> {
    let client = new_client(uri, None).await?;
    let majority = mongodb::options::WriteConcern::majority();
    for item in data {
        let item = item.as_document().context("initialData entry")?;
        let db = client.database(item.get_str("databaseName")?);
        let coll_name = item.get_str("collectionName")?;
        let coll = db.collection::<Document>(coll_name);
        coll.drop().write_concern(majority.clone()).await?;
        let docs: Vec<Document> = item
            .get_array("documents")?
            .iter()
            .filter_map(|d| d.as_document().cloned())
            .collect();
        if docs.is_empty() {
            db.create_collection(coll_name)
                .write_concern(majority.clone())
                .await?;
        } else {
            coll.insert_many(docs)
                .write_concern(majority.clone())
                .await?;
        }
    }
    client.shutdown().await;
    Ok(())
}

async fn run_test(uri: &str, file: &Document, test: &Document) -> Result<()> {
    let mut entities = Entities {
        map: HashMap::new(),
        fail_points: Vec::new(),
    };
    let result = run_test_in(uri, file, test, &mut entities).await;
    // Teardown: fail points off (through a fresh client: the test's may be broken), streams
    // and clients closed.
    let mut teardown = Ok(());
    if !entities.fail_points.is_empty() {
        match new_client(uri, None).await {
            Ok(c) => {
                for (_, name) in &entities.fail_points {
                    if let Err(e) = c
                        .database("admin")
                        .run_command(doc! {"configureFailPoint": name, "mode": "off"})
                        .await
                    {
                        teardown = Err(anyhow!("turning fail point {name} off: {e}"));
                    }
                }
                c.shutdown().await;
            }
            Err(e) => teardown = Err(e),
        }
    }
    let mut clients = Vec::new();
    for (_, e) in entities.map.drain() {
        if let Entity::Client(c) = e {
            clients.push(c.client);
        }
    }
    for c in clients {
        let _ = tokio::time::timeout(Duration::from_secs(5), c.shutdown()).await;
    }
    result.and(teardown)
}

async fn run_test_in(
    uri: &str,
    file: &Document,
    test: &Document,
    entities: &mut Entities,
) -> Result<()> {
    if let Ok(list) = file.get_array("createEntities") {
        create_entities(uri, list, entities)
            .await
            .context("createEntities")?;
    }
    if let Ok(data) = file.get_array("initialData") {
        initial_data(uri, data).await.context("initialData")?;
    }
    for key in test.keys() {
        if !matches!(
            key.as_str(),
            "description"
                | "operations"
                | "expectEvents"
                | "runOnRequirements"
                | "skipReason"
                | "outcome"
        ) {
            bail!("test field {key} is not supported by this runner");
        }
    }
    if test.contains_key("outcome") {
        bail!("test outcome assertions are not supported by this runner");
    }
    for (i, op) in test.get_array("operations")?.iter().enumerate() {
        let op = op.as_document().context("an operation is not a document")?;
        let name = op.get_str("name").unwrap_or("?");
        ops::run_operation(uri, op, entities)
            .await
            .with_context(|| format!("operation {i} ({name})"))?;
    }
    if let Ok(expected) = test.get_array("expectEvents") {
        for e in expected {
            let e = e.as_document().context("expectEvents entry")?;
            check_events(e, entities).context("expectEvents")?;
        }
    }
    Ok(())
}

/// One `expectEvents` entry against what the client observed.
fn check_events(expected: &Document, entities: &Entities) -> Result<()> {
    let client_id = expected.get_str("client")?;
    if let Ok(kind) = expected.get_str("eventType")
        && kind != "command"
    {
        bail!("eventType {kind} is not supported by this runner");
    }
    let ignore_extra = expected.get_bool("ignoreExtraEvents").unwrap_or(false);
    let want = expected.get_array("events")?;
    let have = entities.client(client_id)?.started();
    let names: Vec<&str> = have.iter().map(|e| e.command_name.as_str()).collect();
    if have.len() < want.len() || (!ignore_extra && have.len() != want.len()) {
        bail!(
            "client {client_id}: expected {} events{}, observed {}: {names:?}",
            want.len(),
            if ignore_extra { " or more" } else { "" },
            have.len()
        );
    }
    for (i, (w, h)) in want.iter().zip(&have).enumerate() {
        let w = w
            .as_document()
            .context("an expected event is not a document")?;
        let (kind, spec) = w.iter().next().context("empty expected event")?;
        if kind != "commandStartedEvent" {
            bail!("expected event kind {kind} is not supported by this runner");
        }
        let spec = spec.as_document().context("commandStartedEvent")?;
        for (k, v) in spec {
            let r = match k.as_str() {
                "command" => matcher::matches(v, Some(&Bson::Document(h.command.clone())), true),
                "commandName" => {
                    matcher::matches(v, Some(&Bson::String(h.command_name.clone())), false)
                }
                "databaseName" => matcher::matches(v, Some(&Bson::String(h.db.clone())), false),
                other => bail!("commandStartedEvent.{other} is not supported by this runner"),
            };
            r.map_err(|why| {
                anyhow!(
                    "client {client_id}, event {i} ({}): {why}; observed {names:?}; command {}",
                    h.command_name,
                    h.command
                )
            })?;
        }
    }
    Ok(())
}
