//! A small command client to one `host:port`, used by the router to reach remote shards.
//!
//! Invariants:
//! * A connection is in the idle pool only while no command is using it; a command takes one
//!   (or opens one) and puts it back only after a complete, matching reply. A connection that
//!   saw any error, or whose command was cancelled (its future dropped, e.g. by a timeout), is
//!   dropped, so a late reply can never be read as the answer to another command.
//! * The pool lock is a std `Mutex` held only to push or pop, never across an `.await`.
//! * Replies are returned as documents, `ok: 0` included; [`ClientError`] is only for failures
//!   to connect, I/O and protocol errors.
//! * With a key file, a new connection logs in as `__system` before its first command, and a
//!   connection whose login failed is never used ([`ClientError::Refused`]).
//! * Connecting times out after [`CONNECT_TIMEOUT`]; reads have no timeout (a getMore with
//!   `awaitData` may wait a long time): wrap [`Client::command`] in `tokio::time::timeout`.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{Document, RawDocumentBuf};
use tokio::net::TcpStream;

use crate::codec::CodecError;
use crate::connection::Connection;
use crate::error::{ErrorCode, MongoError};
use crate::keyfile::KeyFile;
use crate::message::{Message, Op, to_document};

/// How long to wait for a TCP connection to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// At most this many idle connections are kept; more are closed when returned.
pub const MAX_IDLE: usize = 16;

/// Why a command did not produce a reply document.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("connecting to {addr} timed out after {CONNECT_TIMEOUT:?}")]
    ConnectTimeout { addr: String },
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("I/O error talking to {addr}: {source}")]
    Io {
        addr: String,
        source: std::io::Error,
    },
    #[error("protocol error talking to {addr}: {message}")]
    Protocol { addr: String, message: String },
    #[error("{addr} closed the connection before replying")]
    Closed { addr: String },
    #[error("{addr} refused our key file login: {message}")]
    Refused { addr: String, message: String },
}

impl ClientError {
    /// Whether the command was never sent (no connection could be opened): sending it again
    /// cannot run it twice.
    pub fn is_unsent(&self) -> bool {
        matches!(
            self,
            ClientError::ConnectTimeout { .. }
                | ClientError::Connect { .. }
                | ClientError::Refused { .. }
        )
    }

    /// The error a client of the router should see: a network error, as a driver would report
    /// one from a shard (`HostUnreachable`, `NetworkTimeout` or `SocketException`).
    pub fn to_mongo_error(&self) -> MongoError {
        let code = match self {
            ClientError::ConnectTimeout { .. } => ErrorCode::NETWORK_TIMEOUT,
            ClientError::Connect { .. } => ErrorCode::HOST_UNREACHABLE,
            ClientError::Refused { .. } => ErrorCode::AUTHENTICATION_FAILED,
            ClientError::Io { .. } | ClientError::Closed { .. } | ClientError::Protocol { .. } => {
                ErrorCode::SOCKET_EXCEPTION
            }
        };
        MongoError::new(code, self.to_string())
    }
}

/// A pooled OP_MSG command client to one server.
#[derive(Debug)]
pub struct Client {
    addr: String,
    idle: Mutex<Vec<Connection>>,
    next_request_id: AtomicI32,
    /// TLS to the server, when it needs it.
    tls: Option<crate::tls::ClientTls>,
    /// The cluster's key, when the server wants a key file login.
    key: Option<Arc<KeyFile>>,
}

impl Client {
    pub fn new(addr: String) -> Client {
        Client::with_tls(addr, None)
    }

    /// A client that speaks TLS to the server when `tls` is given.
    pub fn with_tls(addr: String, tls: Option<crate::tls::ClientTls>) -> Client {
        Client {
            addr,
            idle: Mutex::new(Vec::new()),
            next_request_id: AtomicI32::new(1),
            tls,
            key: None,
        }
    }

    /// Logs every new connection in with the cluster's key, when `key` is given.
    pub fn with_key(mut self, key: Option<Arc<KeyFile>>) -> Client {
        self.key = key;
        self
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Runs `body` against database `db` (sets `$db`) and returns the reply document as is.
    /// The body is borrowed, so a caller can send it again when no connection could be opened
    /// ([`ClientError::is_unsent`]).
    pub async fn command(&self, db: &str, body: &Document) -> Result<Document, ClientError> {
        let raw = self.command_raw(db, body).await?;
        to_document(&raw).map_err(|e| self.protocol(e.to_string()))
    }

    /// [`Client::command`], with the reply as it arrived (framing checked, the BSON not yet).
    pub async fn command_raw(
        &self,
        db: &str,
        body: &Document,
    ) -> Result<RawDocumentBuf, ClientError> {
        let raw = if body.contains_key("$db") {
            let mut body = body.clone();
            body.insert("$db", db);
            RawDocumentBuf::try_from(&body)
        } else {
            RawDocumentBuf::try_from(body).map(|mut raw| {
                raw.append(bson::raw::cstr!("$db"), db);
                raw
            })
        }
        .map_err(|e| self.protocol(e.to_string()))?;
        let mut conn = match self.take_idle() {
            Some(conn) => conn,
            None => self.connect().await?,
        };
        let body = self.exchange(&mut conn, raw).await?;
        self.put_idle(conn);
        Ok(body)
    }

    /// Sends one command over `conn` and reads its reply.
    async fn exchange(
        &self,
        conn: &mut Connection,
        raw: RawDocumentBuf,
    ) -> Result<RawDocumentBuf, ClientError> {
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed) & i32::MAX;
        let request = Message::msg(request_id, raw);
        conn.write_message(&request)
            .await
            .map_err(|e| self.codec_error(e))?;
        let reply = conn
            .read_message()
            .await
            .map_err(|e| self.codec_error(e))?
            .ok_or_else(|| ClientError::Closed {
                addr: self.addr.clone(),
            })?;
        // One request in flight per connection: any other reply means the stream is confused.
        if reply.response_to != request_id {
            return Err(self.protocol(format!(
                "reply to request {} while waiting for {request_id}",
                reply.response_to
            )));
        }
        match reply.op {
            Op::Msg(msg) => {
                if msg.flags.more_to_come() {
                    return Err(self.protocol("unexpected moreToCome reply".to_string()));
                }
                Ok(msg.body)
            }
            Op::Reply(r) => match r.documents.into_iter().next() {
                Some(d) => Ok(d),
                None => Err(self.protocol("OP_REPLY without a document".to_string())),
            },
            Op::Query(_) => Err(self.protocol("server sent an OP_QUERY".to_string())),
        }
    }

    /// The most recently used idle connection that still looks alive; stale ones are dropped.
    fn take_idle(&self) -> Option<Connection> {
        loop {
            let conn = self.idle.lock().ok().and_then(|mut idle| idle.pop())?;
            if !conn.is_stale() {
                return Some(conn);
            }
        }
    }

    fn put_idle(&self, conn: Connection) {
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < MAX_IDLE
        {
            idle.push(conn);
        }
    }

    /// A new connection, logged in when there is a key.
    async fn connect(&self) -> Result<Connection, ClientError> {
        let mut conn = self.open().await?;
        if let Some(key) = &self.key {
            let refused = |message| ClientError::Refused {
                addr: self.addr.clone(),
                message,
            };
            let (mut login, mut cmd) = key.login().map_err(refused)?;
            let login = async {
                loop {
                    let reply = self.exchange(&mut conn, cmd).await?;
                    match login.next(&reply).map_err(refused)? {
                        Some(next) => cmd = next,
                        None => return Ok::<(), ClientError>(()),
                    }
                }
            };
            tokio::time::timeout(CONNECT_TIMEOUT, login)
                .await
                .map_err(|_| ClientError::ConnectTimeout {
                    addr: self.addr.clone(),
                })??;
        }
        Ok(conn)
    }

    async fn open(&self) -> Result<Connection, ClientError> {
        let stream = self.connecting(TcpStream::connect(&self.addr)).await?;
        let _ = stream.set_nodelay(true);
        let Some(tls) = &self.tls else {
            return Ok(Connection::new(stream));
        };
        // The name or address dialled, without the port (and an IPv6 address's brackets).
        let host = self
            .addr
            .rsplit_once(':')
            .map_or(self.addr.as_str(), |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let transport = self.connecting(tls.connect(host, stream)).await?;
        Ok(Connection::over(transport))
    }

    /// One step of opening a connection, within [`CONNECT_TIMEOUT`].
    async fn connecting<T>(
        &self,
        step: impl std::future::Future<Output = std::io::Result<T>>,
    ) -> Result<T, ClientError> {
        tokio::time::timeout(CONNECT_TIMEOUT, step)
            .await
            .map_err(|_| ClientError::ConnectTimeout {
                addr: self.addr.clone(),
            })?
            .map_err(|source| ClientError::Connect {
                addr: self.addr.clone(),
                source,
            })
    }

    fn protocol(&self, message: String) -> ClientError {
        ClientError::Protocol {
            addr: self.addr.clone(),
            message,
        }
    }

    fn codec_error(&self, e: CodecError) -> ClientError {
        match e {
            CodecError::Io(source) => ClientError::Io {
                addr: self.addr.clone(),
                source,
            },
            other => self.protocol(other.to_string()),
        }
    }

    /// Number of idle pooled connections (for tests and metrics).
    pub fn idle_connections(&self) -> usize {
        self.idle.lock().map(|idle| idle.len()).unwrap_or(0)
    }
}
