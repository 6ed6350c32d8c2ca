//! Authentication (`--auth`): users, the SCRAM conversations that log a connection in, and who
//! each connection is.
//!
//! Owns: the user documents (`admin.system.users` on the config shard, as MongoDB keeps them:
//! salted SCRAM-SHA-1 and SCRAM-SHA-256 credentials, never the password), the user commands
//! (`createUser`, `updateUser`, `dropUser`, `usersInfo`, `grantRolesToUser`,
//! `revokeRolesFromUser`), `saslStart` / `saslContinue` (and the speculative conversation in
//! `hello`), `logout`, and the check that a command may run on this connection. Custom roles
//! are in [`custom`], what roles and privileges grant in [`roles`].
//!
//! Invariants:
//! * with `--auth`, a connection that has not authenticated runs only the commands that
//!   authenticate it or describe the server ([`allowed_before_auth`]); everything else is
//!   13 `Unauthorized`, except `createUser` over a loopback connection while no user exists
//!   (the localhost exception, for the first user);
//! * a failed conversation answers 18 `AuthenticationFailed` whatever went wrong, and leaves
//!   the connection as it was;
//! * an authenticated connection runs a command only when one of its users' roles (built-in,
//!   or custom with what they inherit) grants what the command needs ([`roles`]), else 13
//!   `Unauthorized`; roles are read when the connection authenticates;
//! * a cursor belongs to the users of the connection that opened it: `getMore` or
//!   `killCursors` on it from a connection with none of them is 13 `Unauthorized`;
//! * a connection's state is dropped when it closes.

pub mod builtin;
pub mod custom;
pub mod roles;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bson::{Binary, Bson, Document, doc, spec::BinarySubtype};
use shard::sharding::ShardId;
use wire::server::ConnectionInfo;
use wire::{ErrorCode, MongoError, Result};

use crate::kernel::transport::{ShardTransport, Shards};
use wire::sasl::{self, auth_failed, binary, payload_of};
use wire::scram::{Conversation, Credential, Mechanism};

/// Where users are kept, on the config shard.
const USERS_DB: &str = "admin";
const USERS_COLL: &str = "system.users";

/// MongoDB's built-in roles that Tributary records.
pub const BUILT_IN_ROLES: &[&str] = &[
    "read",
    "readWrite",
    "dbAdmin",
    "userAdmin",
    "dbOwner",
    "clusterMonitor",
    "readAnyDatabase",
    "readWriteAnyDatabase",
    "userAdminAnyDatabase",
    "dbAdminAnyDatabase",
    "clusterAdmin",
    "root",
];

/// Roles that exist only on `admin`.
const ADMIN_ONLY_ROLES: &[&str] = &[
    "clusterMonitor",
    "readAnyDatabase",
    "readWriteAnyDatabase",
    "userAdminAnyDatabase",
    "dbAdminAnyDatabase",
    "clusterAdmin",
    "root",
];

/// Commands a connection may run before it authenticates.
pub fn allowed_before_auth(name: &str) -> bool {
    matches!(
        name,
        "hello"
            | "isMaster"
            | "ismaster"
            | "saslStart"
            | "saslContinue"
            | "ping"
            | "buildInfo"
            | "buildinfo"
            | "getnonce"
            | "endSessions"
            | "logout"
    )
}

/// A `(name, db)` pair: a user, or a role.
pub type Pair = (String, String);

/// A conversation in progress on a connection.
struct Pending {
    db: String,
    /// The user's roles, as its user document lists them (`connectionStatus`).
    roles: Vec<(String, String)>,
    /// What the user's roles grant.
    grants: custom::Grants,
    conversation: Conversation,
    credential: Credential,
    /// The proof checked out; the client may still send an empty last step.
    proven: bool,
    /// The client asked to skip that empty step (`options.skipEmptyExchange` at the start).
    skip_empty: bool,
}

#[derive(Default)]
struct ConnectionAuth {
    /// `(user, db)` pairs this connection authenticated as.
    users: Vec<(String, String)>,
    /// `(role, db)` pairs their user documents list, each once (`connectionStatus`).
    roles: Vec<(String, String)>,
    /// What their roles grant.
    grants: custom::Grants,
    pending: HashMap<i32, Pending>,
    next_conversation: i32,
}

impl ConnectionAuth {
    /// Records that the connection proved it is `who`, with its roles and what they grant.
    fn admit(&mut self, who: Pair, roles: &[Pair], grants: &custom::Grants) {
        if self.users.contains(&who) {
            return;
        }
        self.users.push(who);
        for role in roles {
            if !self.roles.contains(role) {
                self.roles.push(role.clone());
            }
        }
        self.grants.extend(grants.clone());
    }
}

/// How many password hashes (HTTP Basic) run at once.
static PASSWORD_CHECKS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// How long a proven password is remembered, and how many are.
const PROVEN_FOR: Duration = Duration::from_secs(300);
const PROVEN_MAX: usize = 1024;

/// Passwords proven lately (HTTP Basic sends one with every request, and checking it costs a
/// PBKDF2): each as a digest, keyed by a secret of this process, of the password and the
/// stored key it was checked against, so a changed password or credential is checked again.
/// At most [`PROVEN_MAX`], each for [`PROVEN_FOR`].
pub(crate) struct Proven {
    secret: [u8; 32],
    seen: Mutex<ProvenMap>,
}

/// `(user, db)` → the digest proven, and when.
type ProvenMap = HashMap<Pair, (Vec<u8>, std::time::Instant)>;

impl Default for Proven {
    fn default() -> Self {
        Proven {
            secret: rand::random(),
            seen: Mutex::default(),
        }
    }
}

impl Proven {
    fn digest(&self, stored_key: &[u8], password: &str) -> Vec<u8> {
        use hmac::{KeyInit, Mac};
        let Ok(mut mac) = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(&self.secret)
        else {
            return Vec::new();
        };
        mac.update(&(stored_key.len() as u64).to_be_bytes());
        mac.update(stored_key);
        mac.update(password.as_bytes());
        mac.finalize().into_bytes().to_vec()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ProvenMap> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn remembers(&self, user: &str, db: &str, digest: &[u8]) -> bool {
        !digest.is_empty()
            && self
                .lock()
                .get(&(user.to_string(), db.to_string()))
                .is_some_and(|(d, at)| d == digest && at.elapsed() < PROVEN_FOR)
    }

    fn remember(&self, user: &str, db: &str, digest: Vec<u8>) {
        let mut seen = self.lock();
        if seen.len() >= PROVEN_MAX {
            seen.retain(|_, (_, at)| at.elapsed() < PROVEN_FOR);
            if seen.len() >= PROVEN_MAX {
                seen.clear();
            }
        }
        seen.insert(
            (user.to_string(), db.to_string()),
            (digest, std::time::Instant::now()),
        );
    }
}

/// Who each connection is, and whose each cursor is.
#[derive(Default)]
pub struct Auth {
    /// Passwords proven lately over HTTP Basic.
    pub(crate) proven: Proven,
    connections: Mutex<HashMap<u64, ConnectionAuth>>,
    /// The users of the connection that opened each open cursor.
    cursor_owners: Mutex<HashMap<i64, Vec<(String, String)>>>,
}

/// Past this many recorded owners, the records of cursors that are gone are dropped.
const OWNERS_KEPT: usize = 10_000;

fn unauthorized(what: impl Into<String>) -> MongoError {
    MongoError::new(ErrorCode::UNAUTHORIZED, what)
}

impl Auth {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, ConnectionAuth>> {
        self.connections.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_authenticated(&self, conn: u64) -> bool {
        self.lock().get(&conn).is_some_and(|c| !c.users.is_empty())
    }

    /// Which databases `listDatabases` shows a connection: `None` for every one (its roles
    /// grant the `listDatabases` action: a cluster-wide read or monitoring role, or a custom
    /// privilege), else the test for one database (a role or privilege there).
    #[allow(clippy::type_complexity)]
    pub fn databases_listed(&self, conn: u64) -> Option<Box<dyn Fn(&str) -> bool + Send>> {
        let grants = self.lock().get(&conn).map(|c| c.grants.clone())?;
        let all = roles::allows(&grants.roles, &roles::Need::ReadAll)
            || roles::allows(&grants.roles, &roles::Need::ClusterMonitor)
            || roles::privileges_allow(
                &grants.privileges,
                &[("listDatabases", roles::Resource::Cluster)],
            );
        if all {
            return None;
        }
        Some(Box::new(move |db: &str| {
            let probe = bson::doc! {"listCollections": 1};
            grants.allow("listCollections", db, &probe)
                || grants.allow("insert", db, &bson::doc! {"insert": "x"})
        }))
    }

    /// The users a connection authenticated as (`connectionStatus`).
    pub fn users_of(&self, conn: u64) -> Vec<(String, String)> {
        self.lock()
            .get(&conn)
            .map(|c| c.users.clone())
            .unwrap_or_default()
    }

    /// The users a connection authenticated as and their roles (`connectionStatus`): `(user,
    /// db)` and `(role, db)` pairs.
    pub fn status_of(&self, conn: u64) -> (Vec<Pair>, Vec<Pair>) {
        self.lock()
            .get(&conn)
            .map(|c| (c.users.clone(), c.roles.clone()))
            .unwrap_or_default()
    }

    /// What a connection's roles grant, merged by resource (`connectionStatus` with
    /// `showPrivileges`): the built-in roles' privileges and the custom roles' own.
    pub fn privileges_of(&self, conn: u64) -> Vec<roles::Privilege> {
        let Some(grants) = self.lock().get(&conn).map(|c| c.grants.clone()) else {
            return Vec::new();
        };
        let mut by_resource = std::collections::BTreeMap::new();
        let all = grants
            .roles
            .iter()
            .flat_map(|(role, db)| builtin::privileges(role, db))
            .chain(grants.privileges);
        for p in all {
            by_resource
                .entry(builtin::ResourceKey::of(&p.resource))
                .or_insert_with(Vec::new)
                .extend(p.actions);
        }
        builtin::merged(by_resource)
    }

    /// Notes who opened cursor `id` (a reply that returned a live cursor over `conn`).
    pub fn opened_cursor(&self, conn: u64, id: i64, cursors: &crate::cursors::CursorTable) {
        let users = self.users_of(conn);
        let mut owners = self.cursor_owners.lock().unwrap_or_else(|e| e.into_inner());
        if owners.len() > OWNERS_KEPT {
            owners.retain(|id, _| cursors.get(*id).is_ok());
        }
        owners.insert(id, users);
    }

    /// Forgets cursor `id` (exhausted or killed).
    pub fn closed_cursor(&self, id: i64) {
        self.cursor_owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    /// Whether `conn` may use cursor `id`: one of its users opened it (or nobody recorded).
    fn may_use_cursor(&self, conn: u64, id: i64) -> bool {
        let users = self.users_of(conn);
        self.cursor_owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .is_none_or(|owners| owners.iter().any(|o| users.contains(o)))
    }

    pub fn closed(&self, conn: u64) {
        self.lock().remove(&conn);
    }

    fn logout(&self, conn: u64) {
        self.lock().remove(&conn);
    }
}

/// What authentication and the user and role commands use of the router.
pub struct AuthCx<'a> {
    /// Who each connection authenticated as.
    pub auth: &'a Auth,
    /// How users and roles are read and written on the config shard.
    pub transport: &'a ShardTransport,
    /// Whether the router authenticates its clients (`--auth`).
    pub required: bool,
}

/// Whether `name` may run on database `db` over `conn` now (with `--auth`).
pub async fn check(
    cx: &AuthCx<'_>,
    conn: &ConnectionInfo,
    name: &str,
    db: &str,
    cmd: &Document,
) -> Result<()> {
    if !cx.required || allowed_before_auth(name) {
        return Ok(());
    }
    let granted = {
        let conns = cx.auth.lock();
        conns
            .get(&conn.id)
            .filter(|c| !c.users.is_empty())
            .map(|c| c.grants.allow(name, db, cmd))
    };
    match granted {
        Some(true) => check_cursors(cx, conn, name, db, cmd),
        Some(false) => Err(unauthorized(format!(
            "not authorized on {db} to execute command {{ {name}: ... }}"
        ))),
        None if name == "createUser" && conn.peer.ip().is_loopback() && !any_user(cx).await? => {
            Ok(()) // the localhost exception
        }
        None => Err(unauthorized(format!(
            "Command {name} requires authentication"
        ))),
    }
}

/// `getMore` and `killCursors` only on cursors the connection's users opened.
fn check_cursors(
    cx: &AuthCx<'_>,
    conn: &ConnectionInfo,
    name: &str,
    db: &str,
    cmd: &Document,
) -> Result<()> {
    let ids: Vec<i64> = match name {
        "getMore" => cmd.get_i64("getMore").into_iter().collect(),
        "killCursors" => cmd
            .get_array("cursors")
            .map(|c| c.iter().filter_map(Bson::as_i64).collect())
            .unwrap_or_default(),
        _ => return Ok(()),
    };
    match ids.iter().find(|id| !cx.auth.may_use_cursor(conn.id, **id)) {
        None => Ok(()),
        Some(id) => Err(unauthorized(format!(
            "not authorized on {db} to use cursor {id}: another user opened it"
        ))),
    }
}

async fn any_user(cx: &AuthCx<'_>) -> Result<bool> {
    let reply = cx
        .transport
        .command(
            ShardId::CONFIG,
            USERS_DB,
            doc! {"find": USERS_COLL, "filter": {}, "limit": 1, "batchSize": 1},
        )
        .await?;
    Ok(reply
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .is_ok_and(|b| !b.is_empty()))
}

async fn find_user(cx: &AuthCx<'_>, user: &str, db: &str) -> Result<Option<Document>> {
    let reply = cx
        .transport
        .command(
            ShardId::CONFIG,
            USERS_DB,
            doc! {"find": USERS_COLL, "filter": {"_id": format!("{db}.{user}")}, "limit": 1},
        )
        .await?;
    Ok(reply
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .ok()
        .and_then(|b| b.first())
        .and_then(Bson::as_document)
        .cloned())
}

fn credential_of(user: &Document, mechanism: Mechanism) -> Option<Credential> {
    let c = user
        .get_document("credentials")
        .ok()?
        .get_document(mechanism.name())
        .ok()?;
    let bytes = |k: &str| B64.decode(c.get_str(k).ok()?).ok();
    Some(Credential {
        iterations: u32::try_from(c.get_i32("iterationCount").ok()?).ok()?,
        salt: bytes("salt")?,
        stored_key: bytes("storedKey")?,
        server_key: bytes("serverKey")?,
    })
}

fn credentials(user: &str, password: &str, mechanisms: &[Mechanism]) -> Result<Document> {
    let mut out = Document::new();
    for &m in mechanisms {
        let salt: Vec<u8> = (0..if m == Mechanism::Sha1 { 16 } else { 28 })
            .map(|_| rand::random::<u8>())
            .collect();
        let c = Credential::derive(m, user, password, salt).map_err(MongoError::bad_value)?;
        out.insert(
            m.name(),
            doc! {
                "iterationCount": c.iterations as i32,
                "salt": B64.encode(&c.salt),
                "storedKey": B64.encode(&c.stored_key),
                "serverKey": B64.encode(&c.server_key),
            },
        );
    }
    Ok(out)
}

/// `saslStart` on database `db` (also the speculative one in `hello`).
pub async fn sasl_start(
    cx: &AuthCx<'_>,
    conn: &ConnectionInfo,
    db: &str,
    cmd: &Document,
) -> Result<Document> {
    let (mechanism, first) = sasl::start_of(cmd)?;
    let user = find_user(cx, &first.user, db).await?;
    let Some(credential) = user.as_ref().and_then(|u| credential_of(u, mechanism)) else {
        tracing::info!(user = %first.user, db, "authentication failed: no such user");
        return Err(auth_failed());
    };
    let roles = user.as_ref().map(custom::pairs).unwrap_or_default();
    let grants = match &user {
        Some(_) => custom::resolve(cx, roles.clone()).await?,
        None => custom::Grants::default(),
    };
    let nonce: Vec<u8> = (0..24).map(|_| rand::random::<u8>()).collect();
    let (conversation, server_first) =
        Conversation::start(mechanism, first, &B64.encode(nonce), &credential);
    let mut conns = cx.auth.lock();
    let state = conns.entry(conn.id).or_default();
    // A connection has one conversation at a time, as in MongoDB: a new start ends the one
    // before, so clients that start and never finish hold no more than one each.
    state.pending.clear();
    state.next_conversation += 1;
    let id = state.next_conversation;
    state.pending.insert(
        id,
        Pending {
            db: db.to_string(),
            roles,
            grants,
            conversation,
            credential,
            proven: false,
            skip_empty: cmd
                .get_document("options")
                .ok()
                .and_then(|o| o.get_bool("skipEmptyExchange").ok())
                .unwrap_or(false),
        },
    );
    Ok(doc! {"conversationId": id, "done": false, "payload": binary(server_first), "ok": 1.0})
}

/// `saslContinue`.
pub fn sasl_continue(cx: &AuthCx<'_>, conn: &ConnectionInfo, cmd: &Document) -> Result<Document> {
    let id = match cmd.get("conversationId") {
        Some(Bson::Int32(i)) => *i,
        Some(Bson::Int64(i)) => i32::try_from(*i).unwrap_or(-1),
        _ => {
            return Err(MongoError::failed_to_parse(
                "saslContinue needs a conversationId",
            ));
        }
    };
    let payload = payload_of(cmd)?;
    let mut conns = cx.auth.lock();
    let state = conns.entry(conn.id).or_default();
    let Some(mut pending) = state.pending.remove(&id) else {
        return Err(MongoError::new(
            ErrorCode::PROTOCOL_ERROR,
            "No SASL session state found",
        ));
    };
    if pending.proven {
        return Ok(
            doc! {"conversationId": id, "done": true, "payload": binary(Vec::new()), "ok": 1.0},
        );
    }
    let Ok(server_final) = pending.conversation.finish(&payload, &pending.credential) else {
        tracing::info!(user = %pending.conversation.user, "authentication failed: wrong proof");
        return Err(auth_failed());
    };
    let who = (pending.conversation.user.clone(), pending.db.clone());
    state.admit(who, &pending.roles, &pending.grants);
    if pending.skip_empty {
        return Ok(
            doc! {"conversationId": id, "done": true, "payload": binary(server_final), "ok": 1.0},
        );
    }
    pending.proven = true;
    state.pending.insert(id, pending);
    Ok(doc! {"conversationId": id, "done": false, "payload": binary(server_final), "ok": 1.0})
}

/// Logs connection `conn` in as `user` of `db` by its password (HTTP Basic), checked against
/// the stored SCRAM-SHA-256 credential (else SCRAM-SHA-1's), off the async threads: the
/// connection is then that user, with its roles read now, as after a SCRAM conversation.
/// Anything wrong is 18 `AuthenticationFailed`, as a failed conversation is.
pub async fn log_in_with_password(
    cx: &AuthCx<'_>,
    conn: u64,
    user: &str,
    db: &str,
    password: &str,
) -> Result<()> {
    let Some(doc) = find_user(cx, user, db).await? else {
        tracing::info!(user, db, "authentication failed: no such user");
        return Err(auth_failed());
    };
    let Some((mechanism, credential)) = [Mechanism::Sha256, Mechanism::Sha1]
        .into_iter()
        .find_map(|m| credential_of(&doc, m).map(|c| (m, c)))
    else {
        return Err(auth_failed());
    };
    let seen = cx.auth.proven.digest(&credential.stored_key, password);
    let proven = cx.auth.proven.remembers(user, db, &seen) || {
        // At most PASSWORD_CHECKS hashes at once: each costs milliseconds of CPU, and a client
        // without a password can ask for as many as it likes.
        let permit = tokio::time::timeout(Duration::from_secs(10), PASSWORD_CHECKS.acquire()).await;
        let Ok(Ok(_permit)) = permit else {
            return Err(MongoError::new(
                ErrorCode::EXCEEDED_TIME_LIMIT,
                "too many password checks waiting: try again, or use a bearer token",
            ));
        };
        let (name, password) = (user.to_string(), password.to_string());
        tokio::task::spawn_blocking(move || credential.verify(mechanism, &name, &password))
            .await
            .unwrap_or(false)
    };
    if proven {
        cx.auth.proven.remember(user, db, seen);
    } else {
        tracing::info!(user, db, "authentication failed: wrong password");
        return Err(auth_failed());
    }
    admit(cx, conn, user, db, &doc).await
}

/// Logs connection `conn` in as `user` of `db` on the router's word (a bearer token it
/// signed names them): the user must still exist, and its roles are read now, so a dropped
/// user or a revoked role takes effect on the token's next use.
pub async fn log_in_as(cx: &AuthCx<'_>, conn: u64, user: &str, db: &str) -> Result<()> {
    let Some(doc) = find_user(cx, user, db).await? else {
        tracing::info!(user, db, "authentication failed: the token's user is gone");
        return Err(auth_failed());
    };
    admit(cx, conn, user, db, &doc).await
}

async fn admit(cx: &AuthCx<'_>, conn: u64, user: &str, db: &str, doc: &Document) -> Result<()> {
    let roles = custom::pairs(doc);
    let grants = custom::resolve(cx, roles.clone()).await?;
    cx.auth.lock().entry(conn).or_default().admit(
        (user.to_string(), db.to_string()),
        &roles,
        &grants,
    );
    Ok(())
}

/// What `hello` adds with `--auth`: the mechanisms a named user has (`saslSupportedMechs`)
/// and the first step of a speculative conversation (`speculativeAuthenticate`).
pub async fn augment_hello(
    cx: &AuthCx<'_>,
    conn: &ConnectionInfo,
    cmd: &Document,
    reply: &mut Document,
) -> Result<()> {
    if !cx.required {
        return Ok(());
    }
    if let Ok(named) = cmd.get_str("saslSupportedMechs")
        && let Some((db, user)) = named.split_once('.')
        && let Some(u) = find_user(cx, user, db).await?
    {
        let mechs: Vec<Bson> = [Mechanism::Sha1, Mechanism::Sha256]
            .into_iter()
            .filter(|m| credential_of(&u, *m).is_some())
            .map(|m| Bson::String(m.name().to_string()))
            .collect();
        reply.insert("saslSupportedMechs", mechs);
    }
    if let Ok(spec) = cmd.get_document("speculativeAuthenticate")
        && spec.contains_key("saslStart")
    {
        let db = spec.get_str("db").unwrap_or("admin").to_string();
        // A failed speculative start is not an error: the driver authenticates normally.
        if let Ok(mut started) = sasl_start(cx, conn, &db, spec).await {
            started.remove("ok");
            reply.insert("speculativeAuthenticate", started);
        }
    }
    Ok(())
}

/// `logout`.
pub fn logout(cx: &AuthCx<'_>, conn: &ConnectionInfo) -> Document {
    cx.auth.logout(conn.id);
    doc! {"ok": 1.0}
}

fn mechanisms_of(cmd: &Document) -> Result<Vec<Mechanism>> {
    match cmd.get_array("mechanisms") {
        Err(_) => Ok(vec![Mechanism::Sha1, Mechanism::Sha256]),
        Ok(list) => list
            .iter()
            .map(|m| {
                m.as_str()
                    .and_then(Mechanism::parse)
                    .ok_or_else(|| MongoError::bad_value(format!("Unknown auth mechanism '{m}'")))
            })
            .collect(),
    }
}

fn user_name(cmd: &Document, field: &str) -> Result<String> {
    match cmd.get(field) {
        Some(Bson::String(s)) if !s.is_empty() => Ok(s.clone()),
        _ => Err(MongoError::bad_value(format!(
            "{field} must be a non-empty string"
        ))),
    }
}

fn password(cmd: &Document) -> Result<String> {
    match cmd.get("pwd") {
        Some(Bson::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Bson::String(_)) => Err(MongoError::bad_value("Password cannot be empty")),
        _ => Err(MongoError::bad_value("pwd must be a string")),
    }
}

/// Runs a write on the users collection and fails on its write errors.
async fn write_users(cx: &AuthCx<'_>, cmd: Document) -> Result<Document> {
    let reply = cx.transport.command(ShardId::CONFIG, USERS_DB, cmd).await?;
    if let Some(e) = reply
        .get_array("writeErrors")
        .ok()
        .and_then(|e| e.first())
        .and_then(Bson::as_document)
    {
        return Err(MongoError::with_code(
            e.get_i32("code").unwrap_or(8),
            e.get_str("errmsg").unwrap_or("write failed").to_string(),
        ));
    }
    Ok(reply)
}

/// The update that grants `values` into the array `field` (once each), or revokes them.
fn add_or_pull(field: &str, values: Vec<Bson>, grant: bool) -> Document {
    if grant {
        doc! {"$addToSet": {field: {"$each": values}}}
    } else {
        doc! {"$pull": {field: {"$in": values}}}
    }
}

/// Inserts a new user or role document into `coll`; `exists` when one with its `_id` is there.
async fn insert_new(cx: &AuthCx<'_>, coll: &str, doc: Document, exists: MongoError) -> Result<()> {
    match write_users(cx, doc! {"insert": coll, "documents": [doc]}).await {
        Err(e) if e.code == 11000 => Err(exists),
        other => other.map(|_| ()),
    }
}

fn not_found(user: &str, db: &str) -> MongoError {
    MongoError::with_code(
        11,
        format!("Could not find user \"{user}\" for db \"{db}\""),
    )
}

/// `createUser`.
pub async fn create_user(cx: &AuthCx<'_>, db: &str, cmd: &Document) -> Result<Document> {
    let user = user_name(cmd, "createUser")?;
    let pwd = password(cmd)?;
    let roles = custom::parse_roles(cx, cmd.get("roles"), db).await?;
    let mechanisms = mechanisms_of(cmd)?;
    let doc = doc! {
        "_id": format!("{db}.{user}"),
        "userId": Bson::Binary(Binary { subtype: BinarySubtype::Uuid, bytes: uuid::Uuid::new_v4().as_bytes().to_vec() }),
        "user": &user,
        "db": db,
        "credentials": credentials(&user, &pwd, &mechanisms)?,
        "roles": roles,
    };
    insert_new(
        cx,
        USERS_COLL,
        doc,
        MongoError::with_code(51003, format!("User \"{user}@{db}\" already exists")),
    )
    .await?;
    Ok(doc! {"ok": 1.0})
}

/// `updateUser`: a new password and/or roles.
pub async fn update_user(cx: &AuthCx<'_>, db: &str, cmd: &Document) -> Result<Document> {
    let user = user_name(cmd, "updateUser")?;
    let mut set = Document::new();
    if cmd.contains_key("pwd") {
        let pwd = password(cmd)?;
        set.insert(
            "credentials",
            credentials(&user, &pwd, &mechanisms_of(cmd)?)?,
        );
    }
    if cmd.contains_key("roles") {
        set.insert(
            "roles",
            custom::parse_roles(cx, cmd.get("roles"), db).await?,
        );
    }
    if set.is_empty() {
        return Err(MongoError::bad_value(
            "Must specify at least one field to update in updateUser",
        ));
    }
    let reply = write_users(
        cx,
        doc! {"update": USERS_COLL, "updates": [{"q": {"_id": format!("{db}.{user}")}, "u": {"$set": set}}]},
    )
    .await?;
    if reply.get_i32("n").unwrap_or(0) == 0 {
        return Err(not_found(&user, db));
    }
    Ok(doc! {"ok": 1.0})
}

/// `grantRolesToUser` and `revokeRolesFromUser`.
pub async fn change_roles(
    cx: &AuthCx<'_>,
    db: &str,
    cmd: &Document,
    grant: bool,
) -> Result<Document> {
    let field = if grant {
        "grantRolesToUser"
    } else {
        "revokeRolesFromUser"
    };
    let user = user_name(cmd, field)?;
    let roles = custom::parse_roles(cx, cmd.get("roles"), db).await?;
    let update = add_or_pull("roles", roles, grant);
    let reply = write_users(
        cx,
        doc! {"update": USERS_COLL, "updates": [{"q": {"_id": format!("{db}.{user}")}, "u": update}]},
    )
    .await?;
    if reply.get_i32("n").unwrap_or(0) == 0 {
        return Err(not_found(&user, db));
    }
    Ok(doc! {"ok": 1.0})
}

/// `dropUser`.
pub async fn drop_user(cx: &AuthCx<'_>, db: &str, cmd: &Document) -> Result<Document> {
    let user = user_name(cmd, "dropUser")?;
    let reply = write_users(
        cx,
        doc! {"delete": USERS_COLL, "deletes": [{"q": {"_id": format!("{db}.{user}")}, "limit": 1}]},
    )
    .await?;
    if reply.get_i32("n").unwrap_or(0) == 0 {
        return Err(not_found(&user, db));
    }
    Ok(doc! {"ok": 1.0})
}

/// `usersInfo`: `1` (every user of `db`), a name, `{user, db}`, or a list of those.
pub async fn users_info(cx: &AuthCx<'_>, db: &str, cmd: &Document) -> Result<Document> {
    let one = |v: &Bson| -> Result<Document> {
        match v {
            Bson::String(u) => Ok(doc! {"_id": format!("{db}.{u}")}),
            Bson::Document(d) => match (d.get_str("user"), d.get_str("db")) {
                (Ok(u), Ok(d)) => Ok(doc! {"_id": format!("{d}.{u}")}),
                _ => Err(MongoError::bad_value("usersInfo needs {user, db}")),
            },
            _ => Err(MongoError::bad_value(
                "usersInfo: a user is a name or {user, db}",
            )),
        }
    };
    let filter = match cmd.get("usersInfo") {
        Some(Bson::Int32(1)) | Some(Bson::Int64(1)) | Some(Bson::Double(1.0)) => doc! {"db": db},
        Some(Bson::Array(list)) => {
            let ids: Result<Vec<Bson>> = list
                .iter()
                .map(|v| one(v).map(|d| d.get("_id").cloned().unwrap_or(Bson::Null)))
                .collect();
            doc! {"_id": {"$in": ids?}}
        }
        Some(v) => one(v)?,
        None => return Err(MongoError::bad_value("usersInfo needs a value")),
    };
    let show = cmd.get_bool("showCredentials").unwrap_or(false);
    let reply = cx
        .transport
        .command(
            ShardId::CONFIG,
            USERS_DB,
            doc! {"find": USERS_COLL, "filter": filter, "batchSize": i32::MAX},
        )
        .await?;
    let users: Vec<Bson> = reply
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .map(|b| {
            b.iter()
                .filter_map(Bson::as_document)
                .cloned()
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .map(|mut u| {
            let mechanisms: Vec<Bson> = u
                .get_document("credentials")
                .map(|c| c.keys().map(|k| Bson::String(k.clone())).collect())
                .unwrap_or_default();
            if !show {
                u.remove("credentials");
            }
            u.insert("mechanisms", mechanisms);
            Bson::Document(u)
        })
        .collect();
    Ok(doc! {"users": users, "ok": 1.0})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proven_password_is_remembered_only_as_it_was_proven() {
        let proven = Proven::default();
        let seen = proven.digest(b"stored key", "s3cret");
        assert!(!proven.remembers("ada", "admin", &seen), "nothing yet");
        proven.remember("ada", "admin", seen.clone());
        assert!(proven.remembers("ada", "admin", &seen));
        // Another password, another stored key (the password was changed), another user or
        // database: checked again.
        assert!(!proven.remembers("ada", "admin", &proven.digest(b"stored key", "s3cret ")));
        assert!(!proven.remembers("ada", "admin", &proven.digest(b"new key", "s3cret")));
        assert!(!proven.remembers("bob", "admin", &seen));
        assert!(!proven.remembers("ada", "app", &seen));
        // Another process's digests differ: the secret is its own.
        assert_ne!(Proven::default().digest(b"stored key", "s3cret"), seen);
        // Bounded.
        for i in 0..(PROVEN_MAX + 10) {
            proven.remember(&format!("u{i}"), "admin", seen.clone());
        }
        assert!(proven.lock().len() <= PROVEN_MAX);
    }
}
