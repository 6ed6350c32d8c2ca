//! The router's wire server: each request becomes a command run by [`crate::commands`].

use std::sync::Arc;

use async_trait::async_trait;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use wire::server::{ConnectionInfo, Handler, Reply, Request};

use crate::router::Router;
use wire::raw::Body;

/// Serves drivers on `listener` until `cancel` fires.
pub async fn serve(router: Arc<Router>, listener: TcpListener, cancel: CancellationToken) {
    let reaper = tokio::spawn(reap_idle_cursors(router.clone(), cancel.clone()));
    wire::server::serve(listener, Arc::new(RouterHandler { router }), cancel).await;
    reaper.abort();
}

struct RouterHandler {
    router: Arc<Router>,
}

#[async_trait]
impl Handler for RouterHandler {
    async fn handle(&self, conn: &ConnectionInfo, req: Request) -> Reply {
        let Some(reply) = crate::commands::run(&self.router, conn, &req).await else {
            return Reply::CloseConnection;
        };
        match reply {
            _ if req.more_to_come => Reply::NoReply,
            Body::Document(reply) => Reply::Document(reply),
            Body::Raw(reply) => Reply::Raw(reply),
        }
    }
}

/// Kills cursors nobody has used for [`crate::cursors::IDLE_TIMEOUT`].
async fn reap_idle_cursors(router: Arc<Router>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(30));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        for cursor in router.cursors.take_idle(std::time::Instant::now()) {
            cursor.lock().await.kill(&router).await;
        }
    }
}
