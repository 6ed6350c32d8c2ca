//! Serves a shard's `run_command` over the MongoDB wire protocol (multi-process mode, and
//! direct connections that tail `local.oplog.rs`).
//!
//! A thin shell: the request body (with `$db`) goes to [`Shard::run_command_body`] unchanged; the
//! connection id is filled into handshake replies; unacknowledged writes (`moreToCome`) get no
//! reply.

use std::sync::Arc;

use bson::Bson;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use wire::raw::Body;
use wire::{ConnectionInfo, Handler, Reply, Request};

use crate::Shard;

struct ShardHandler {
    shard: Arc<Shard>,
}

#[wire::async_trait]
impl Handler for ShardHandler {
    async fn handle(&self, conn: &ConnectionInfo, req: Request) -> Reply {
        let mut body = req.body;
        if !body.contains_key("$db") {
            body.insert("$db", req.db.clone());
        }
        let is_hello = matches!(
            body.keys().next().map(String::as_str),
            Some("hello" | "isMaster" | "ismaster")
        );
        match self.shard.run_command_body(body).await {
            _ if req.more_to_come => Reply::NoReply,
            Body::Document(mut reply) => {
                if is_hello && reply.contains_key("connectionId") {
                    reply.insert(
                        "connectionId",
                        Bson::Int64(i64::try_from(conn.id).unwrap_or(i64::MAX)),
                    );
                }
                Reply::Document(reply)
            }
            Body::Raw(reply) => Reply::Raw(reply),
        }
    }
}

/// Accepts connections until `cancel` fires.
pub async fn serve(shard: Arc<Shard>, listener: TcpListener, cancel: CancellationToken) {
    serve_with_tls(shard, listener, cancel, None).await;
}

/// [`serve`], with TLS as `tls` says (`None`: plain only).
pub async fn serve_with_tls(
    shard: Arc<Shard>,
    listener: TcpListener,
    cancel: CancellationToken,
    tls: Option<Arc<wire::tls::ServerTls>>,
) {
    wire::server::serve_with_tls(listener, Arc::new(ShardHandler { shard }), cancel, tls).await;
}
