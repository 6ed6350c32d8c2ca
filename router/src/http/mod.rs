//! The router's HTTP service (`--httpPort`; `--metricsPort` serves `/metrics` alone): change
//! feeds for clients without a driver, the streams' bounds, the operators' status page and the
//! Prometheus metrics, one handler per endpoint.
//!
//! | endpoint | what |
//! |---|---|
//! | `GET /v1/changes` | a page of a change stream as JSON, or (`Accept: text/event-stream`) server-sent events ([`feed`]) |
//! | `GET /v1/snapshot` | a collection as of one cluster time (NDJSON), then the cursor that follows it exactly ([`snapshot`]) |
//! | `GET /v1/bounds` | `changeStreamBounds` as JSON |
//! | `GET /v1/status` | shards, streams and subscriptions at a glance, as JSON ([`status`]) |
//! | `GET /` | the status page, drawn from `/v1/status` |
//! | `GET /metrics` | Prometheus's text format |
//!
//! Owns: accepting HTTP connections (HTTP/1.1 on hyper; TLS when the router's port has it),
//! who each request is, and the mapping of MongoDB errors onto HTTP statuses.
//!
//! Invariants:
//! * a request runs the router's own commands (`aggregate`, `getMore`, `killCursors`,
//!   `changeStreamBounds`, `snapshotCursor`, `find`) as a connection of its own, so it gets
//!   exactly what a driver gets and needs exactly the rights a driver needs; that
//!   connection's login and cursors end with the request;
//! * with `--auth`, every endpoint that reads data (`/v1/…`) needs a login: HTTP Basic (a
//!   user's password, only over TLS) or a bearer token from `createHttpToken`; the page at
//!   `/` and `/metrics` hold none;
//! * an error is an HTTP status carrying the MongoDB error document ([`status_of`]);
//! * bounded: at most [`MAX_CONNECTIONS`] connections, a request head within
//!   [`HEAD_TIMEOUT`] and [`MAX_HEAD_BYTES`]; a response body is produced only as fast as the
//!   client takes it (one page, or one batch of events, at a time).

pub mod extjson;
pub mod feed;
pub mod query;
pub mod snapshot;
pub mod status;
pub mod token;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine;
use bson::Document;
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use wire::server::ConnectionInfo;
use wire::{ErrorCode, MongoError, Result};

use crate::seams::Seams;

/// The most HTTP connections served at once; more wait in the listen queue.
pub const MAX_CONNECTIONS: usize = 1024;
/// How long a client has to send a request's head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head read.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The ids of the connections HTTP requests run as: far above the wire server's.
static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1 << 62);

pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// What every handler shares.
pub struct Http {
    pub(crate) seams: Arc<Seams>,
    /// The `--metricsPort` listener: `/metrics` alone, in plain HTTP whatever the router's TLS
    /// (it carries no data and takes no credentials, as before the feeds existed).
    metrics_only: bool,
}

/// Which endpoints a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoints {
    /// Everything (`--httpPort`), over TLS when the router's port has it.
    All,
    /// `GET /metrics` alone, in plain HTTP (`--metricsPort`).
    Metrics,
}

/// Serves HTTP on `listener` until `cancel` fires.
pub(crate) async fn serve(
    seams: Arc<Seams>,
    listener: TcpListener,
    endpoints: Endpoints,
    cancel: CancellationToken,
) {
    let http = Arc::new(Http {
        seams,
        metrics_only: endpoints == Endpoints::Metrics,
    });
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "http: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (http, cancel) = (http.clone(), cancel.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let tls = http
                .seams
                .options
                .tls
                .clone()
                .filter(|_| !http.metrics_only);
            let (io, over_tls): (Box<dyn wire::connection::Transport>, bool) = match tls {
                Some(tls) => match tls.accept(stream, HEAD_TIMEOUT).await {
                    Some(t) => {
                        let over_tls = t.decodes_records();
                        (t, over_tls)
                    }
                    None => return,
                },
                None => (Box::new(stream), false),
            };
            let service = hyper::service::service_fn(move |req| {
                let http = http.clone();
                async move { Ok::<_, Infallible>(http.handle(req, peer, over_tls).await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(TokioIo::new(io), service);
            tokio::select! {
                _ = cancel.cancelled() => {}
                done = connection => {
                    if let Err(e) = done {
                        tracing::debug!(error = %e, %peer, "http connection ended");
                    }
                }
            }
        });
    }
}

impl Http {
    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: SocketAddr,
        tls: bool,
    ) -> Response<Body> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            let e = MongoError::new(ErrorCode::COMMAND_NOT_FOUND, "only GET is served here");
            return error_response(StatusCode::METHOD_NOT_ALLOWED, &e);
        }
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or("").to_string();
        if self.metrics_only && path != "/metrics" {
            let e = MongoError::new(
                ErrorCode::NAMESPACE_NOT_FOUND,
                "only /metrics is served here",
            );
            return error_response(StatusCode::NOT_FOUND, &e);
        }
        match path.as_str() {
            "/metrics" => text(
                "text/plain; version=0.0.4; charset=utf-8",
                status::render_metrics(&self.seams).await,
            ),
            "/" | "/index.html" => text("text/html; charset=utf-8", status::PAGE.to_string()),
            "/v1/status" | "/v1/changes" | "/v1/bounds" | "/v1/snapshot" => {
                let caller = match self.caller(&req, &query, peer, tls).await {
                    Ok(c) => c,
                    Err(e) => return failure(&e),
                };
                match path.as_str() {
                    "/v1/status" => match status::status(&caller).await {
                        Ok(json) => json_response(StatusCode::OK, &json),
                        Err(e) => failure(&e),
                    },
                    "/v1/bounds" => feed::bounds(caller, &query).await,
                    "/v1/snapshot" => snapshot::snapshot(caller, &query).await,
                    _ => feed::changes(caller, &req, &query).await,
                }
            }
            _ => {
                let e = MongoError::new(ErrorCode::NAMESPACE_NOT_FOUND, "no such endpoint");
                error_response(StatusCode::NOT_FOUND, &e)
            }
        }
    }

    /// Who the request is: a connection of its own, logged in by its `Authorization` header
    /// when the router authenticates (`authSource` names a Basic user's database).
    async fn caller(
        &self,
        req: &Request<Incoming>,
        query: &str,
        peer: SocketAddr,
        tls: bool,
    ) -> Result<Caller> {
        let caller = Caller {
            seams: self.seams.clone(),
            conn: ConnectionInfo {
                id: NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed),
                peer,
            },
        };
        if !self.seams.options.auth {
            return Ok(caller);
        }
        let cx = self.seams.auth_cx();
        let header = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if let Some(basic) = header.strip_prefix("Basic ") {
            if !tls {
                return Err(MongoError::new(
                    ErrorCode::AUTHENTICATION_FAILED,
                    "HTTP Basic credentials are taken only over TLS; use a bearer token from \
                     createHttpToken",
                ));
            }
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(basic.trim())
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(wire::sasl::auth_failed)?;
            let (user, password) = decoded
                .split_once(':')
                .ok_or_else(wire::sasl::auth_failed)?;
            let source = query::params(query)?
                .into_iter()
                .find(|(k, _)| k == "authSource")
                .map_or_else(|| "admin".to_string(), |(_, v)| v);
            crate::auth::log_in_with_password(&cx, caller.conn.id, user, &source, password).await?;
            return Ok(caller);
        }
        if let Some(bearer) = header.strip_prefix("Bearer ") {
            let key = self.seams.cluster_key().await?;
            let claims = token::verify(&key.key, bearer.trim(), token::now_secs())
                .ok_or_else(wire::sasl::auth_failed)?;
            crate::auth::log_in_as(&cx, caller.conn.id, &claims.user, &claims.db).await?;
            return Ok(caller);
        }
        Err(MongoError::new(
            ErrorCode::AUTHENTICATION_FAILED,
            "authentication required: HTTP Basic over TLS, or a bearer token",
        ))
    }
}

/// A request's standing with the router: a connection id of its own, logged in as the
/// request's credentials say; its login is dropped with it.
pub struct Caller {
    seams: Arc<Seams>,
    conn: ConnectionInfo,
}

impl Drop for Caller {
    fn drop(&mut self) {
        self.seams.auth.closed(self.conn.id);
    }
}

impl Caller {
    /// Runs `body` on `db` as this caller's command, the reply as the router made it.
    async fn send(&self, db: &str, mut body: Document) -> Result<wire::raw::Body> {
        body.insert("$db", db);
        let req = wire::server::Request {
            body,
            db: db.to_string(),
            more_to_come: false,
            exhaust_allowed: false,
            legacy_op_query: false,
        };
        crate::commands::run(&self.seams, &self.conn, &req)
            .await
            .ok_or_else(|| MongoError::new(ErrorCode::HOST_UNREACHABLE, "connection closed"))
    }

    /// Runs `body` on `db` as this caller's command; an error reply is the error.
    pub async fn run(&self, db: &str, body: Document) -> Result<Document> {
        let reply = self.send(db, body).await?.into_document()?;
        match MongoError::from_reply(&reply) {
            Some(e) => Err(e),
            None => Ok(reply),
        }
    }

    /// [`Caller::run`] with the reply kept as the router encoded it.
    pub async fn run_raw(&self, db: &str, body: Document) -> Result<bson::RawDocumentBuf> {
        let reply = self.send(db, body).await?.into_raw()?;
        let ok = match reply.get("ok") {
            Ok(Some(bson::RawBsonRef::Double(v))) => v != 0.0,
            Ok(Some(bson::RawBsonRef::Int32(v))) => v != 0,
            Ok(Some(bson::RawBsonRef::Int64(v))) => v != 0,
            _ => false,
        };
        if ok {
            return Ok(reply);
        }
        let doc = Document::try_from(reply.as_ref())
            .map_err(|e| MongoError::internal(format!("an error reply: {e}")))?;
        Err(MongoError::from_reply(&doc)
            .unwrap_or_else(|| MongoError::internal("a reply neither ok nor an error")))
    }

    pub(crate) fn seams(&self) -> &Arc<Seams> {
        &self.seams
    }

    /// Kills cursor `id` on `db.coll` in the background, then ends the login (for a client
    /// that went away mid-response: its cursor goes now, not when it idles out).
    fn kill_cursor_later(self, db: &str, coll: &str, id: i64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let cmd = bson::doc! {"killCursors": coll, "cursors": [id]};
        let db = db.to_string();
        runtime.spawn(async move {
            let _ = self.run(&db, cmd).await;
        });
    }
}

/// The HTTP status for a MongoDB error: lost history is gone (410), a login that failed or
/// is missing 401, missing rights 403, a shard away (what a driver would resume on) 503, the
/// router's own failure 500, and anything else the request's fault (400).
pub fn status_of(e: &MongoError) -> StatusCode {
    match e.code {
        286 => StatusCode::GONE,
        18 => StatusCode::UNAUTHORIZED,
        13 => StatusCode::FORBIDDEN,
        26 => StatusCode::NOT_FOUND,
        1 | 8 => StatusCode::INTERNAL_SERVER_ERROR,
        _ if crate::streams::is_resumable(e) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_REQUEST,
    }
}

pub fn failure(e: &MongoError) -> Response<Body> {
    error_response(status_of(e), e)
}

fn error_response(status: StatusCode, e: &MongoError) -> Response<Body> {
    let json = bson::Bson::Document(e.to_document()).into_relaxed_extjson();
    let mut response = json_response(status, &json);
    match status {
        StatusCode::UNAUTHORIZED => {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"tributary\", Bearer realm=\"tributary\""),
            );
        }
        StatusCode::SERVICE_UNAVAILABLE => {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        _ => {}
    }
    response
}

pub fn json_response(status: StatusCode, json: &serde_json::Value) -> Response<Body> {
    json_text(status, serde_json::to_string(json).unwrap_or_default())
}

/// A response of JSON already written.
pub fn json_text(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn text(content_type: &'static str, body: String) -> Response<Body> {
    let mut response = Response::new(full(body));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

pub fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into()).boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_onto_http_statuses() {
        let status = |code: i32| status_of(&MongoError::with_code(code, "x"));
        assert_eq!(status(286), StatusCode::GONE);
        assert_eq!(status(18), StatusCode::UNAUTHORIZED);
        assert_eq!(status(13), StatusCode::FORBIDDEN);
        assert_eq!(status(6), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(status(91), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(status(1), StatusCode::INTERNAL_SERVER_ERROR);
        for client in [2, 9, 14, 260, 280, 40573] {
            assert_eq!(status(client), StatusCode::BAD_REQUEST, "{client}");
        }
        // A shard away with the label that says not to resume is not a retry.
        let fatal = MongoError::with_code(6, "x").with_label("NonResumableChangeStreamError");
        assert_eq!(status_of(&fatal), StatusCode::BAD_REQUEST);
    }
}
