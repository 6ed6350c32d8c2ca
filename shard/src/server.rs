//! Serves a shard's `run_command` over the MongoDB wire protocol (multi-process mode, and
//! direct connections that tail `local.oplog.rs`), or a replica-set member's
//! (`replica_set`: its shard while it leads, its peers' Raft messages always).
//!
//! A thin shell: the request body (with `$db`) goes to [`Shard::run_command_body`] unchanged; the
//! connection id is filled into handshake replies; unacknowledged writes (`moreToCome`) get no
//! reply.
//!
//! With the cluster's key file (`--keyFile`), a connection runs nothing but the handshake and
//! `ping` until it has logged in as `__system@local` with the key as password (SCRAM-SHA-256
//! or -1): everything else is 13 `Unauthorized`, a failed login 18 `AuthenticationFailed`.
//! Routers and the other shards log in so; a shard never takes a client's users.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bson::{Bson, Document, doc};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use wire::keyfile::{KeyFile, SYSTEM_DB, SYSTEM_USER};
use wire::raw::Body;
use wire::sasl::{self, auth_failed, binary, payload_of};
use wire::scram::Conversation;
use wire::{ConnectionInfo, ErrorCode, Handler, MongoError, Reply, Request};

use crate::Shard;
use crate::replica_set::ReplicaSetMember;

/// What a server serves: a shard, or a replica-set member (which serves its shard while it
/// leads, and its peers' Raft messages always).
pub enum Served {
    Shard(Arc<Shard>),
    Member(Arc<ReplicaSetMember>),
}

impl Served {
    async fn run(&self, body: Document) -> Body {
        match self {
            Served::Shard(shard) => shard.run_command_body(body).await,
            Served::Member(member) => member.run_command_body(body).await,
        }
    }
}

struct ShardHandler {
    served: Served,
    key: Option<Arc<KeyFile>>,
    logins: Mutex<HashMap<u64, Login>>,
}

/// Where a connection is in its key-file login.
enum Login {
    Started(Conversation),
    /// The proof checked out (the reply says `done`; an empty last step is still answered).
    Done,
}

#[wire::async_trait]
impl Handler for ShardHandler {
    async fn handle(&self, conn: &ConnectionInfo, req: Request) -> Reply {
        let mut body = req.body;
        if !body.contains_key("$db") {
            body.insert("$db", req.db.clone());
        }
        let name = body.keys().next().cloned().unwrap_or_default();
        let is_hello = matches!(name.as_str(), "hello" | "isMaster" | "ismaster");
        if let Some(key) = &self.key {
            let answer = match name.as_str() {
                "saslStart" => Some(self.sasl_start(conn, key, &req.db, &body)),
                "saslContinue" => Some(self.sasl_continue(conn, key, &body)),
                _ if is_hello || matches!(name.as_str(), "ping" | "buildInfo" | "buildinfo") => {
                    None
                }
                _ if self.logged_in(conn) => None,
                _ => Some(Err(MongoError::new(
                    ErrorCode::UNAUTHORIZED,
                    format!("Command {name} requires authentication"),
                ))),
            };
            if let Some(answer) = answer {
                return match answer {
                    _ if req.more_to_come => Reply::NoReply,
                    Ok(reply) => Reply::Document(reply),
                    Err(e) => Reply::Document(e.to_document()),
                };
            }
        }
        let internal_mechs = self.key.is_some()
            && body
                .get_str("saslSupportedMechs")
                .is_ok_and(|named| named == format!("{SYSTEM_DB}.{SYSTEM_USER}"));
        match self.served.run(body).await {
            _ if req.more_to_come => Reply::NoReply,
            Body::Document(mut reply) => {
                if is_hello && reply.contains_key("connectionId") {
                    reply.insert(
                        "connectionId",
                        Bson::Int64(i64::try_from(conn.id).unwrap_or(i64::MAX)),
                    );
                }
                if is_hello && internal_mechs {
                    reply.insert("saslSupportedMechs", vec!["SCRAM-SHA-1", "SCRAM-SHA-256"]);
                }
                Reply::Document(reply)
            }
            Body::Raw(reply) => Reply::Raw(reply),
            Body::Cursor(reply) => Reply::Cursor(reply),
        }
    }

    fn closed(&self, conn: &ConnectionInfo) {
        self.lock().remove(&conn.id);
    }
}

/// The one conversation a connection has at a time.
const CONVERSATION_ID: i32 = 1;

impl ShardHandler {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Login>> {
        self.logins.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn logged_in(&self, conn: &ConnectionInfo) -> bool {
        matches!(self.lock().get(&conn.id), Some(Login::Done))
    }

    fn sasl_start(
        &self,
        conn: &ConnectionInfo,
        key: &KeyFile,
        db: &str,
        cmd: &Document,
    ) -> Result<Document, MongoError> {
        let (mechanism, first) = sasl::start_of(cmd)?;
        if first.user != SYSTEM_USER || db != SYSTEM_DB {
            tracing::info!(user = %first.user, db, "refused a login: a shard takes only the key file's");
            return Err(auth_failed());
        }
        let nonce = B64.encode((0..24).map(|_| rand::random::<u8>()).collect::<Vec<u8>>());
        let (conversation, server_first) =
            Conversation::start(mechanism, first, &nonce, key.credential(mechanism));
        self.lock().insert(conn.id, Login::Started(conversation));
        Ok(doc! {
            "conversationId": CONVERSATION_ID,
            "done": false,
            "payload": binary(server_first),
            "ok": 1.0,
        })
    }

    fn sasl_continue(
        &self,
        conn: &ConnectionInfo,
        key: &KeyFile,
        cmd: &Document,
    ) -> Result<Document, MongoError> {
        let payload = payload_of(cmd)?;
        let mut logins = self.lock();
        let reply = |payload: Vec<u8>| {
            doc! {"conversationId": CONVERSATION_ID, "done": true, "payload": binary(payload), "ok": 1.0}
        };
        match logins.remove(&conn.id) {
            Some(Login::Started(conversation)) => {
                let credential = key.credential(conversation.mechanism);
                let Ok(server_final) = conversation.finish(&payload, credential) else {
                    tracing::warn!(peer = %conn.peer, "a key file login failed: wrong key");
                    return Err(auth_failed());
                };
                logins.insert(conn.id, Login::Done);
                Ok(reply(server_final))
            }
            Some(Login::Done) => {
                logins.insert(conn.id, Login::Done);
                Ok(reply(Vec::new()))
            }
            None => Err(MongoError::new(
                ErrorCode::PROTOCOL_ERROR,
                "No SASL session state found",
            )),
        }
    }
}

/// Accepts connections until `cancel` fires.
pub async fn serve(shard: Arc<Shard>, listener: TcpListener, cancel: CancellationToken) {
    serve_secured(shard, listener, cancel, None, None).await;
}

/// [`serve`], with TLS as `tls` says (`None`: plain only) and, with `key`, only connections
/// that log in with the cluster's key file.
pub async fn serve_secured(
    shard: Arc<Shard>,
    listener: TcpListener,
    cancel: CancellationToken,
    tls: Option<Arc<wire::tls::ServerTls>>,
    key: Option<Arc<KeyFile>>,
) {
    serve_any(Served::Shard(shard), listener, cancel, tls, key).await;
}

/// [`serve_secured`] for a shard or a replica-set member.
pub async fn serve_any(
    served: Served,
    listener: TcpListener,
    cancel: CancellationToken,
    tls: Option<Arc<wire::tls::ServerTls>>,
    key: Option<Arc<KeyFile>>,
) {
    let handler = ShardHandler {
        served,
        key,
        logins: Mutex::new(HashMap::new()),
    };
    wire::server::serve_with_tls(listener, Arc::new(handler), cancel, tls).await;
}
