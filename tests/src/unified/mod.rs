//! A runner for the drivers' unified test format (schema 1.x up to 1.21), on the Rust
//! `mongodb` driver, covering what the change-stream and transaction spec files use: client /
//! database / collection / session entities with command-started event observation,
//! `runOnRequirements`, `initialData`, the operations of those files (CRUD with and without a
//! session, transactions, the convenient `withTransaction`), the special matchers,
//! `expectError`, `expectEvents` (with `ignoreExtraEvents`) and the final `outcome`.
//!
//! Invariants: the JSON files are read unchanged; anything the runner does not implement (an
//! operation, an argument, a matcher, a requirement) fails the test loudly, never passes it;
//! what the driver cannot do or does not let the runner see (a [`DriverLimitation`], an
//! assertion on driver state it keeps private) skips the test with the reason, never passes
//! it; every fail point a test sets is turned off afterwards; a test that is listed as a known
//! failure must fail (a listed test that passes or is skipped fails the run), so the list stays
//! true.

mod bulk;
pub mod harness;
pub mod matcher;
mod ops;

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};
use mongodb::event::EventHandler;
use mongodb::event::cmap::CmapEvent;
use mongodb::event::command::CommandEvent;
use mongodb::options::{ClientOptions, CollectionOptions, DatabaseOptions, SessionOptions};
use mongodb::{Client, ClientSession};

/// The newest schema version this runner understands.
pub const SCHEMA: (u64, u64) = (1, 21);
/// The longest one test may take.
const TEST_TIMEOUT: Duration = Duration::from_secs(90);
/// How long `expectEvents` waits for events that are still missing: an ended session's
/// implicit `abortTransaction` is sent by a task the driver spawns.
const LATE_EVENTS: Duration = Duration::from_secs(2);

/// Something the test needs that the driver cannot do: the test is skipped with this reason
/// (it is not the server's to fix).
#[derive(Debug)]
pub struct DriverLimitation(pub String);

impl fmt::Display for DriverLimitation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "driver limitation: {}", self.0)
    }
}

impl std::error::Error for DriverLimitation {}

/// What the runner learnt about the server before running anything.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// `buildInfo.version`, as `[major, minor, patch]`.
    pub version: [u64; 3],
    /// `single`, `replicaset` or `sharded`.
    pub topology: String,
    /// Whether clients log in (the URI carries credentials): `runOnRequirements.auth`.
    pub auth: bool,
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
    close(client).await;
    Ok(ServerInfo {
        version,
        topology: topology.to_string(),
        auth: client_credentials(uri).is_some(),
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
    let tests = file.get_array("tests").context("tests")?;
    // A file of a schema this runner does not read is not run: each of its tests fails,
    // saying so (the known-failures list names them until the runner reads it).
    if let Err(e) = check_schema(file.get_str("schemaVersion").context("schemaVersion")?) {
        return Ok(tests
            .iter()
            .filter_map(Bson::as_document)
            .map(|t| TestResult {
                file: name.to_string(),
                description: t.get_str("description").unwrap_or("?").to_string(),
                outcome: Outcome::Failed(e.to_string()),
            })
            .collect());
    }
    let file_skip = requirements_unmet(file.get_array("runOnRequirements").ok(), server)?;
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
            let step = Step::default();
            match tokio::time::timeout(TEST_TIMEOUT, run_test(uri, file, test, &step)).await {
                Ok(Ok(unverified)) if unverified.is_empty() => Outcome::Passed,
                Ok(Ok(unverified)) => Outcome::Skipped(format!(
                    "everything else held, but the runner cannot check: {}",
                    unverified.join("; ")
                )),
                Ok(Err(e)) if e.downcast_ref::<DriverLimitation>().is_some() => {
                    Outcome::Skipped(format!("{e:#}"))
                }
                Ok(Err(e)) => Outcome::Failed(format!("{e:#}")),
                Err(_) => Outcome::Failed(format!(
                    "timed out after {TEST_TIMEOUT:?} in {}",
                    step.get()
                )),
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
            "auth" => match v.as_bool() {
                Some(true) if !server.auth => Some("requires auth".to_string()),
                Some(false) if server.auth => Some("requires no auth".to_string()),
                _ => None,
            },
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

/// URI options the Rust driver refuses (`ClientOptions::parse` fails on them).
const DRIVER_UNSUPPORTED_URI_OPTIONS: &[&str] = &["socketTimeoutMS"];

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
    /// Every command event of the client, in order.
    events: Arc<Mutex<Vec<CommandEvent>>>,
    /// Every connection-pool (CMAP) event of the client, in order, by its unified-format name.
    cmap: Arc<Mutex<Vec<&'static str>>>,
    /// The `observeEvents` kinds (`commandStartedEvent`, ...).
    observe: Vec<String>,
    ignore: Vec<String>,
}

impl ClientEntity {
    /// The server (`host:port`) the last command of the session `lsid` went to: the mongos a
    /// session in a transaction is pinned to.
    fn server_of_session(&self, lsid: &Document) -> Option<String> {
        let events = self.events.lock().ok()?;
        events.iter().rev().find_map(|e| match e {
            CommandEvent::Started(s) if s.command.get_document("lsid").is_ok_and(|l| l == lsid) => {
                Some(s.connection.address.to_string())
            }
            _ => None,
        })
    }

    /// The command events this entity observes, in order, with the database each command
    /// ran on (succeeded and failed events have it from their started event).
    fn observed(&self) -> Vec<(CommandEvent, String)> {
        let events = self.events.lock().map(|e| e.clone()).unwrap_or_default();
        let mut db_of_request = HashMap::new();
        let mut out = Vec::new();
        for e in events {
            let (kind, name, request) = match &e {
                CommandEvent::Started(s) => {
                    db_of_request.insert(s.request_id, s.db.clone());
                    ("commandStartedEvent", &s.command_name, s.request_id)
                }
                CommandEvent::Succeeded(s) => {
                    ("commandSucceededEvent", &s.command_name, s.request_id)
                }
                CommandEvent::Failed(f) => ("commandFailedEvent", &f.command_name, f.request_id),
                _ => continue,
            };
            if self.observe.iter().any(|o| o == kind)
                && !NEVER_OBSERVED.contains(&name.as_str())
                && !self.ignore.contains(name)
            {
                let db = db_of_request.get(&request).cloned().unwrap_or_default();
                out.push((e, db));
            }
        }
        out
    }

    /// The CMAP events this entity observes, in order.
    fn observed_cmap(&self) -> Vec<&'static str> {
        let events = self.cmap.lock().map(|e| e.clone()).unwrap_or_default();
        events
            .into_iter()
            .filter(|kind| self.observe.iter().any(|o| o == kind))
            .collect()
    }
}

/// The unified-format name of a CMAP event.
fn cmap_name(e: &CmapEvent) -> &'static str {
    match e {
        CmapEvent::PoolCreated(_) => "poolCreatedEvent",
        CmapEvent::PoolReady(_) => "poolReadyEvent",
        CmapEvent::PoolCleared(_) => "poolClearedEvent",
        CmapEvent::PoolClosed(_) => "poolClosedEvent",
        CmapEvent::ConnectionCreated(_) => "connectionCreatedEvent",
        CmapEvent::ConnectionReady(_) => "connectionReadyEvent",
        CmapEvent::ConnectionClosed(_) => "connectionClosedEvent",
        CmapEvent::ConnectionCheckoutStarted(_) => "connectionCheckOutStartedEvent",
        CmapEvent::ConnectionCheckoutFailed(_) => "connectionCheckOutFailedEvent",
        CmapEvent::ConnectionCheckedOut(_) => "connectionCheckedOutEvent",
        CmapEvent::ConnectionCheckedIn(_) => "connectionCheckedInEvent",
        _ => "unknownCmapEvent",
    }
}

/// Where a client entity's driver reports its events.
#[derive(Clone, Default)]
struct Recorders {
    commands: Arc<Mutex<Vec<CommandEvent>>>,
    cmap: Arc<Mutex<Vec<&'static str>>>,
}

/// A `session` entity. `session` is `None` while an operation has it (taken out, put back
/// after) and once the session ended.
pub(crate) struct SessionEntity {
    session: Option<Box<ClientSession>>,
    client: String,
    ended: bool,
}

pub(crate) enum Entity {
    Client(ClientEntity),
    Database(mongodb::Database),
    Collection(mongodb::Collection<Document>),
    ChangeStream(Box<mongodb::change_stream::ChangeStream<Document>>),
    Session(SessionEntity),
}

impl Entity {
    fn kind(&self) -> &'static str {
        match self {
            Entity::Client(_) => "client",
            Entity::Database(_) => "database",
            Entity::Collection(_) => "collection",
            Entity::ChangeStream(_) => "changeStream",
            Entity::Session(_) => "session",
        }
    }
}

#[derive(Default)]
pub(crate) struct Entities {
    pub map: HashMap<String, Entity>,
    /// Fail points set by `failPoint` operations: (client entity id, fail point name).
    pub fail_points: Vec<(String, String)>,
    /// The lsid of every session entity created, by id, for `$$sessionLsid`.
    lsids: HashMap<String, Document>,
    /// What the collection-level `bulkWrite` of a client's entities (the client, its
    /// databases and collections, by id) needs to make its batches retryable writes.
    pub retrying: HashMap<String, Arc<bulk::Retrying>>,
    /// Assertions the runner had to leave unchecked: the test cannot pass.
    unverified: Vec<String>,
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

    /// Takes session `id` out of its entity, for one operation; [`Entities::put_session`] puts it
    /// back.
    pub fn take_session(&mut self, id: &str) -> Result<Box<ClientSession>> {
        match self.map.get_mut(id) {
            Some(Entity::Session(s)) => match s.session.take() {
                Some(session) => Ok(session),
                None if s.ended => bail!("session {id:?} has ended"),
                None => bail!("session {id:?} is in use by another operation"),
            },
            Some(other) => bail!("entity {id:?} is a {}, not a session", other.kind()),
            None => bail!("no entity named {id:?}"),
        }
    }

    pub fn put_session(&mut self, id: &str, session: Box<ClientSession>) {
        if let Some(Entity::Session(s)) = self.map.get_mut(id) {
            s.session = Some(session);
        }
    }

    /// Marks session `id` ended (its lsid stays known).
    pub fn end_session(&mut self, id: &str) {
        if let Some(Entity::Session(s)) = self.map.get_mut(id) {
            s.session = None;
            s.ended = true;
        }
    }

    /// The lsid of session `id`.
    pub fn lsid(&self, id: &str) -> Result<&Document> {
        self.lsids
            .get(id)
            .ok_or_else(|| anyhow!("no session named {id:?}"))
    }

    /// The id of the client entity session `id` belongs to.
    pub fn session_client(&self, id: &str) -> Result<&str> {
        match self.get(id)? {
            Entity::Session(s) => Ok(&s.client),
            other => bail!("entity {id:?} is a {}, not a session", other.kind()),
        }
    }

    /// Records an assertion the runner could not check.
    pub fn unverified(&mut self, why: String) {
        if !self.unverified.contains(&why) {
            self.unverified.push(why);
        }
    }

    /// What the matcher needs from the entities.
    pub fn cx(&self) -> matcher::Cx<'_> {
        matcher::Cx {
            lsids: Some(&self.lsids),
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

/// The `host:port`s of a `mongodb://[user:pw@]h1,h2/...` URI.
pub(crate) fn hosts(uri: &str) -> Vec<String> {
    let rest = uri.strip_prefix("mongodb://").unwrap_or(uri);
    let list = rest.split(['/', '?']).next().unwrap_or("");
    let list = list.rsplit_once('@').map_or(list, |(_, hosts)| hosts);
    list.split(',')
        .filter(|h| !h.is_empty())
        .map(String::from)
        .collect()
}

async fn new_client(uri: &str, recorders: Option<Recorders>) -> Result<Client> {
    let mut opts = ClientOptions::parse(uri).await?;
    opts.server_selection_timeout = Some(Duration::from_secs(10));
    opts.connect_timeout = Some(Duration::from_secs(5));
    if let Some(Recorders { commands, cmap }) = recorders {
        opts.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| {
            if let Ok(mut events) = commands.lock() {
                events.push(ev);
            }
        }));
        opts.cmap_event_handler = Some(EventHandler::callback(move |ev: CmapEvent| {
            if let Ok(mut events) = cmap.lock() {
                events.push(cmap_name(&ev));
            }
        }));
    }
    Ok(Client::with_options(opts)?)
}

/// `readConcern` / `writeConcern` / `readPreference` of `databaseOptions` or
/// `collectionOptions`.
fn concerns(
    d: &Document,
) -> Result<(
    Option<mongodb::options::ReadConcern>,
    Option<mongodb::options::WriteConcern>,
    Option<mongodb::options::SelectionCriteria>,
)> {
    let (mut rc, mut wc, mut rp) = (None, None, None);
    for (k, v) in d {
        match k.as_str() {
            "readConcern" => rc = Some(ops::read_concern(v)?),
            "writeConcern" => wc = Some(ops::write_concern(v)?),
            "readPreference" => rp = Some(ops::read_preference(v)?),
            other => bail!("collection/database option {other} is not supported by this runner"),
        }
    }
    Ok((rc, wc, rp))
}

pub(crate) async fn create_entities(
    uri: &str,
    list: &[Bson],
    entities: &mut Entities,
) -> Result<()> {
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
                if let Some(other) = observe.iter().find(|e| {
                    !OBSERVABLE.contains(&e.as_str()) && !CMAP_EVENTS.contains(&e.as_str())
                }) {
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
                // Every router for a client that asks for several, else the first only.
                let mut client_uri = if spec.get_bool("useMultipleMongoses").unwrap_or(false) {
                    uri.to_string()
                } else {
                    first_router(uri)
                };
                if let Ok(opts) = spec.get_document("uriOptions") {
                    for (k, v) in opts {
                        if DRIVER_UNSUPPORTED_URI_OPTIONS.contains(&k.as_str()) {
                            return Err(anyhow::Error::new(DriverLimitation(format!(
                                "the mongodb 3.9 driver does not support the URI option {k}"
                            ))));
                        }
                        let sep = if client_uri.contains('?') { '&' } else { '?' };
                        let v = match v {
                            Bson::String(s) => s.clone(),
                            other => other.to_string(),
                        };
                        client_uri.push_str(&format!("{sep}{k}={v}"));
                    }
                }
                let recorders = Recorders::default();
                let client = new_client(&client_uri, Some(recorders.clone())).await?;
                let retry_writes = spec
                    .get_document("uriOptions")
                    .ok()
                    .and_then(|o| o.get_bool("retryWrites").ok())
                    .unwrap_or(true);
                entities
                    .retrying
                    .insert(id.to_string(), Arc::new(bulk::Retrying::new(retry_writes)));
                Entity::Client(ClientEntity {
                    client,
                    events: recorders.commands,
                    cmap: recorders.cmap,
                    observe,
                    ignore,
                })
            }
            "database" => {
                for key in spec.keys() {
                    if !matches!(
                        key.as_str(),
                        "id" | "client" | "databaseName" | "databaseOptions"
                    ) {
                        bail!("database option {key} is not supported by this runner");
                    }
                }
                let client_id = spec.get_str("client").context("database.client")?;
                let client = entities.client(client_id)?.client.clone();
                let name = spec.get_str("databaseName").context("databaseName")?;
                let mut opts = DatabaseOptions::default();
                if let Ok(o) = spec.get_document("databaseOptions") {
                    (
                        opts.read_concern,
                        opts.write_concern,
                        opts.selection_criteria,
                    ) = concerns(o)?;
                }
                if let Some(r) = entities.retrying.get(client_id).cloned() {
                    entities.retrying.insert(id.to_string(), r);
                }
                Entity::Database(client.database_with_options(name, opts))
            }
            "collection" => {
                for key in spec.keys() {
                    if !matches!(
                        key.as_str(),
                        "id" | "database" | "collectionName" | "collectionOptions"
                    ) {
                        bail!("collection option {key} is not supported by this runner");
                    }
                }
                let db_id = spec.get_str("database").context("collection.database")?;
                let Entity::Database(db) = entities.get(db_id)? else {
                    bail!("entity {db_id:?} is not a database");
                };
                let name = spec.get_str("collectionName").context("collectionName")?;
                let mut opts = CollectionOptions::default();
                if let Ok(o) = spec.get_document("collectionOptions") {
                    (
                        opts.read_concern,
                        opts.write_concern,
                        opts.selection_criteria,
                    ) = concerns(o)?;
                }
                let collection = db.collection_with_options(name, opts);
                if let Some(r) = entities.retrying.get(db_id).cloned() {
                    entities.retrying.insert(id.to_string(), r);
                }
                Entity::Collection(collection)
            }
            "session" => {
                for key in spec.keys() {
                    if !matches!(key.as_str(), "id" | "client" | "sessionOptions") {
                        bail!("session option {key} is not supported by this runner");
                    }
                }
                let client_id = spec.get_str("client").context("session.client")?;
                let client = entities.client(client_id)?.client.clone();
                let mut opts = SessionOptions::default();
                if let Ok(o) = spec.get_document("sessionOptions") {
                    for (k, v) in o {
                        match k.as_str() {
                            "causalConsistency" => {
                                opts.causal_consistency =
                                    Some(v.as_bool().context("causalConsistency")?);
                            }
                            "snapshot" => opts.snapshot = Some(v.as_bool().context("snapshot")?),
                            "defaultTransactionOptions" => {
                                let d = v.as_document().context("defaultTransactionOptions")?;
                                opts.default_transaction_options =
                                    Some(ops::transaction_options(d, &[])?);
                            }
                            other => {
                                bail!("session option {other} is not supported by this runner")
                            }
                        }
                    }
                }
                let session = client
                    .start_session()
                    .with_options(opts)
                    .await
                    .context("starting a session")?;
                entities.lsids.insert(id.to_string(), session.id().clone());
                Entity::Session(SessionEntity {
                    session: Some(Box::new(session)),
                    client: client_id.to_string(),
                    ended: false,
                })
            }
            other => bail!("entity type {other} is not supported by this runner"),
        };
        entities.insert(id, entity)?;
    }
    Ok(())
}

async fn initial_data(uri: &str, data: &[Bson], step: &Step) -> Result<()> {
    let client = new_client(uri, None).await?;
    let majority = mongodb::options::WriteConcern::majority();
    for item in data {
        let item = item.as_document().context("initialData entry")?;
        let db = client.database(item.get_str("databaseName")?);
        let coll_name = item.get_str("collectionName")?;
        let coll = db.collection::<Document>(coll_name);
        step.set(format!("initialData: drop {}", coll.namespace()));
        coll.drop().write_concern(majority.clone()).await?;
        let docs: Vec<Document> = item
            .get_array("documents")?
            .iter()
            .filter_map(|d| d.as_document().cloned())
            .collect();
        if docs.is_empty() {
            step.set(format!("initialData: create {}", coll.namespace()));
            db.create_collection(coll_name)
                .write_concern(majority.clone())
                .await?;
        } else {
            step.set(format!("initialData: insert into {}", coll.namespace()));
            coll.insert_many(docs)
                .write_concern(majority.clone())
                .await?;
        }
    }
    step.set("initialData: client shutdown");
    close(client).await;
    Ok(())
}

/// Whether the file's tests use sessions (created up front or by a `createEntities` operation).
fn uses_sessions(file: &Document) -> bool {
    let up_front = file.get_array("createEntities").is_ok_and(|list| {
        list.iter()
            .any(|e| e.as_document().is_some_and(|d| d.contains_key("session")))
    });
    let later = file.get_array("tests").is_ok_and(|tests| {
        tests.iter().any(|t| {
            t.as_document()
                .and_then(|t| t.get_array("operations").ok())
                .is_some_and(|ops| {
                    ops.iter().any(|op| {
                        op.as_document()
                            .is_some_and(|op| op.get_str("name").ok() == Some("createEntities"))
                    })
                })
        })
    });
    up_front || later
}

/// As the spec asks of transaction tests: end every session's transactions left on the
/// server by an earlier test, so its locks cannot fail this one.
async fn kill_all_sessions(uri: &str) -> Result<()> {
    let client = new_client(uri, None).await?;
    let r = client
        .database("admin")
        .run_command(doc! {"killAllSessions": []})
        .await;
    close(client).await;
    r.map(|_| ()).context("killAllSessions")
}

/// Shuts a runner's own client down, giving up after 5 s: the `mongodb` 3.9 driver's shutdown
/// waits on its background work (pool workers, monitors, sessions being ended), which can
/// hang on a loaded machine; it is not what a test checks.
pub(crate) async fn close(client: mongodb::Client) {
    let _ = tokio::time::timeout(Duration::from_secs(5), client.shutdown()).await;
}

/// What a test is doing, so a timeout can say where it hung.
#[derive(Default)]
struct Step(Mutex<String>);

impl Step {
    fn set(&self, what: impl Into<String>) {
        if let Ok(mut s) = self.0.lock() {
            *s = what.into();
        }
    }

    fn get(&self) -> String {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Runs one test; the result lists the assertions the runner could not check.
async fn run_test(uri: &str, file: &Document, test: &Document, step: &Step) -> Result<Vec<String>> {
    let mut entities = Entities::default();
    let result = run_test_in(uri, file, test, &mut entities, step).await;
    step.set("teardown");
    // Teardown: fail points off (through a fresh client: the test's may be broken), sessions
    // ended (which aborts their open transactions), streams and clients closed.
    let mut teardown = Ok(());
    if !entities.fail_points.is_empty() {
        // On every router: a targeted fail point is on the one a session was pinned to.
        for host in hosts(uri) {
            match new_client(&direct(uri, &host), None).await {
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
                    close(c).await;
                }
                Err(e) => teardown = Err(e),
            }
        }
    }
    // The bulk writes' own sessions go first: a client's shutdown waits for its sessions.
    entities.retrying.clear();
    let mut clients = Vec::new();
    for (_, e) in entities.map.drain() {
        if let Entity::Client(c) = e {
            clients.push(c.client);
        }
    }
    for c in clients {
        close(c).await;
    }
    result.and(teardown).map(|()| entities.unverified)
}

async fn run_test_in(
    uri: &str,
    file: &Document,
    test: &Document,
    entities: &mut Entities,
    step: &Step,
) -> Result<()> {
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
    if uses_sessions(file) {
        step.set("killAllSessions");
        kill_all_sessions(uri).await?;
    }
    if let Ok(list) = file.get_array("createEntities") {
        step.set("createEntities");
        create_entities(uri, list, entities)
            .await
            .context("createEntities")?;
    }
    if let Ok(data) = file.get_array("initialData") {
        step.set("initialData");
        initial_data(&first_router(uri), data, step)
            .await
            .context("initialData")?;
    }
    if hosts(uri).len() > 1 {
        step.set("distinct on every router");
        distinct_on_every_router(uri, entities).await?;
    }
    for (i, op) in test.get_array("operations")?.iter().enumerate() {
        let op = op.as_document().context("an operation is not a document")?;
        let name = op.get_str("name").unwrap_or("?");
        step.set(format!("operation {i} ({name})"));
        ops::run_operation(uri, op, entities, None)
            .await
            .with_context(|| format!("operation {i} ({name})"))?;
    }
    if let Ok(expected) = test.get_array("expectEvents") {
        for e in expected {
            let e = e.as_document().context("expectEvents entry")?;
            step.set("expectEvents");
            check_events(e, entities).await.context("expectEvents")?;
        }
    }
    if let Ok(outcome) = test.get_array("outcome") {
        step.set("outcome");
        check_outcome(&first_router(uri), outcome)
            .await
            .context("outcome")?;
    }
    Ok(())
}

/// As the drivers' runners do on a sharded cluster before each test: a `distinct` on every
/// collection entity through every router, so each has loaded the collections' routing and
/// heard the cluster time of the initial data (a transaction started on a router that had not
/// would read a snapshot from before it).
async fn distinct_on_every_router(uri: &str, entities: &Entities) -> Result<()> {
    let namespaces: Vec<(String, String)> = entities
        .map
        .values()
        .filter_map(|e| match e {
            Entity::Collection(c) => Some((c.namespace().db, c.namespace().coll)),
            _ => None,
        })
        .collect();
    for host in hosts(uri) {
        let client = new_client(&direct(uri, &host), None).await?;
        for (db, coll) in &namespaces {
            let r = client
                .database(db)
                .run_command(doc! {"distinct": coll, "key": "_id"})
                .await;
            if let Err(e) = r
                && ops::code_of(&e).is_none_or(|c| c.0 != 26)
            {
                close(client).await;
                return Err(anyhow!("distinct on {db}.{coll} through {host}: {e}"));
            }
        }
        close(client).await;
    }
    Ok(())
}

/// A direct connection to `host`, with `uri`'s credentials and options (TLS).
pub(crate) fn direct(uri: &str, host: &str) -> String {
    let credentials = client_credentials(uri).unwrap_or("");
    let at = if credentials.is_empty() { "" } else { "@" };
    let query = uri.split_once('?').map_or("", |(_, q)| q);
    let sep = if query.is_empty() { "" } else { "&" };
    format!("mongodb://{credentials}{at}{host}/?{query}{sep}directConnection=true")
}

/// The `user:password` of `uri`, if it has any.
fn client_credentials(uri: &str) -> Option<&str> {
    let rest = uri.strip_prefix("mongodb://").unwrap_or(uri);
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    authority.rsplit_once('@').map(|(c, _)| c)
}

/// The URI with only its first router (the initial data and the outcome go through one, as
/// the unified format asks on a sharded cluster).
fn first_router(uri: &str) -> String {
    let all = hosts(uri);
    match all.first() {
        Some(first) => uri.replacen(&all.join(","), first, 1),
        None => uri.to_string(),
    }
}

/// The test's `outcome`: each collection holds exactly these documents, read through a fresh
/// client (primary, read concern local) in `_id` order.
async fn check_outcome(uri: &str, outcome: &[Bson]) -> Result<()> {
    let client = new_client(uri, None).await?;
    let result = async {
        for item in outcome {
            let item = item.as_document().context("an outcome entry")?;
            let db = item.get_str("databaseName")?;
            let coll = item.get_str("collectionName")?;
            let want = item.get_array("documents")?;
            let have: Vec<Document> = client
                .database(db)
                .collection::<Document>(coll)
                .find(doc! {})
                .sort(doc! {"_id": 1})
                .read_concern(mongodb::options::ReadConcern::local())
                .selection_criteria(mongodb::options::SelectionCriteria::ReadPreference(
                    mongodb::options::ReadPreference::Primary,
                ))
                .await?
                .try_collect()
                .await?;
            if have.len() != want.len() {
                bail!(
                    "{db}.{coll}: expected {} documents {want:?}, found {} {have:?}",
                    want.len(),
                    have.len()
                );
            }
            for (i, (w, h)) in want.iter().zip(&have).enumerate() {
                matcher::matches(w, Some(&Bson::Document(h.clone())), false)
                    .map_err(|why| anyhow!("{db}.{coll} document {i}: {why}; found {have:?}"))?;
            }
        }
        Ok(())
    }
    .await;
    close(client).await;
    result
}

/// One `expectEvents` entry against what the client observed.
async fn check_events(expected: &Document, entities: &Entities) -> Result<()> {
    let client_id = expected.get_str("client")?;
    let ignore_extra = expected.get_bool("ignoreExtraEvents").unwrap_or(false);
    let want = expected.get_array("events")?;
    let client = entities.client(client_id)?;
    match expected.get_str("eventType").unwrap_or("command") {
        "command" => {}
        "cmap" => return check_cmap_events(client_id, client, want, ignore_extra),
        kind => bail!("eventType {kind} is not supported by this runner"),
    }
    let mut have = client.observed();
    let deadline = tokio::time::Instant::now() + LATE_EVENTS;
    while have.len() < want.len() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        have = client.observed();
    }
    let names: Vec<String> = have.iter().map(|(e, _)| describe_event(e)).collect();
    check_count(client_id, "events", want.len(), &names, ignore_extra)?;
    for (i, (w, (h, db))) in want.iter().zip(&have).enumerate() {
        let w = w
            .as_document()
            .context("an expected event is not a document")?;
        let (kind, spec) = w.iter().next().context("empty expected event")?;
        let spec = spec.as_document().context("an expected event's fields")?;
        let name = match (kind.as_str(), h) {
            ("commandStartedEvent", CommandEvent::Started(s)) => &s.command_name,
            ("commandSucceededEvent", CommandEvent::Succeeded(s)) => &s.command_name,
            ("commandFailedEvent", CommandEvent::Failed(f)) => &f.command_name,
            ("commandStartedEvent" | "commandSucceededEvent" | "commandFailedEvent", _) => bail!(
                "client {client_id}, event {i}: expected a {kind}, observed {}; observed {names:?}",
                describe_event(h)
            ),
            (other, _) => bail!("expected event kind {other} is not supported by this runner"),
        };
        for (k, v) in spec {
            let r = match (k.as_str(), h) {
                ("command", CommandEvent::Started(s)) => matcher::matches_in(
                    entities.cx(),
                    v,
                    Some(&Bson::Document(s.command.clone())),
                    true,
                ),
                ("reply", CommandEvent::Succeeded(s)) => matcher::matches_in(
                    entities.cx(),
                    v,
                    Some(&Bson::Document(s.reply.clone())),
                    true,
                ),
                ("commandName", _) => matcher::matches(v, Some(&Bson::String(name.clone())), false),
                ("databaseName", _) => matcher::matches(v, Some(&Bson::String(db.clone())), false),
                (other, _) => bail!("{kind}.{other} is not supported by this runner"),
            };
            r.map_err(|why| {
                anyhow!(
                    "client {client_id}, event {i} ({}): {why}; observed {names:?}",
                    describe_event(h)
                )
            })?;
        }
    }
    Ok(())
}

/// Whether `have` holds `want` events (or more, with `ignoreExtraEvents`).
fn check_count<T: fmt::Debug>(
    client_id: &str,
    what: &str,
    want: usize,
    have: &[T],
    ignore_extra: bool,
) -> Result<()> {
    if have.len() < want || (!ignore_extra && have.len() != want) {
        bail!(
            "client {client_id}: expected {want} {what}{}, observed {}: {have:?}",
            if ignore_extra { " or more" } else { "" },
            have.len()
        );
    }
    Ok(())
}

/// One `expectEvents` entry of `eventType: cmap`: the kinds, in order. An expected event's
/// fields (`reason`, `hasServiceId`, ...) are not checked yet, so one that has any is refused.
fn check_cmap_events(
    client_id: &str,
    client: &ClientEntity,
    want: &[Bson],
    ignore_extra: bool,
) -> Result<()> {
    let have = client.observed_cmap();
    check_count(client_id, "CMAP events", want.len(), &have, ignore_extra)?;
    for (i, (w, h)) in want.iter().zip(&have).enumerate() {
        let w = w
            .as_document()
            .context("an expected event is not a document")?;
        let (kind, spec) = w.iter().next().context("empty expected event")?;
        if !CMAP_EVENTS.contains(&kind.as_str()) {
            bail!("expected CMAP event kind {kind} is not supported by this runner");
        }
        if let Some((field, _)) = spec.as_document().and_then(|d| d.iter().next()) {
            bail!("{kind}.{field} is not supported by this runner");
        }
        if kind != h {
            bail!(
                "client {client_id}, CMAP event {i}: expected {kind}, observed {h}; observed {have:?}"
            );
        }
    }
    Ok(())
}

/// The connection-pool event kinds of the unified format.
const CMAP_EVENTS: &[&str] = &[
    "poolCreatedEvent",
    "poolReadyEvent",
    "poolClearedEvent",
    "poolClosedEvent",
    "connectionCreatedEvent",
    "connectionReadyEvent",
    "connectionClosedEvent",
    "connectionCheckOutStartedEvent",
    "connectionCheckOutFailedEvent",
    "connectionCheckedOutEvent",
    "connectionCheckedInEvent",
];

/// The command event kinds a client entity can observe (and every one of [`CMAP_EVENTS`]).
const OBSERVABLE: &[&str] = &[
    "commandStartedEvent",
    "commandSucceededEvent",
    "commandFailedEvent",
];

/// An event as error messages show it.
fn describe_event(e: &CommandEvent) -> String {
    match e {
        CommandEvent::Started(s) => format!("started {} {}", s.command_name, s.command),
        CommandEvent::Succeeded(s) => format!("succeeded {} {}", s.command_name, s.reply),
        CommandEvent::Failed(f) => format!("failed {} ({})", f.command_name, f.failure),
        _ => "other".to_string(),
    }
}
