//! Where the watchers' clients run: beside the writers (niceness 0), or on a runtime of their
//! own whose threads run at a given niceness, with a driver client of their own so that its
//! connections' work (pool, reads, decoding) runs on those threads too.
//!
//! On a machine whose cores the bench shares with the server, watchers at niceness 19 take
//! only the CPU the server and the writers leave, which is what watchers on other machines
//! would cost them: the server's own work for every watcher still counts against the writers.

use std::future::Future;

use anyhow::Result;
use bson::RawDocumentBuf;
use mongodb::Client;
use mongodb::change_stream::ChangeStream;
use mongodb::options::ClientOptions;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use crate::workload::{self, WatchSpec};

pub struct WatcherSide {
    /// The watchers' own runtime; `None`: they run on the bench's.
    runtime: Option<Runtime>,
    client: Client,
}

impl WatcherSide {
    pub fn new(nice: i32, client: &Client, opts: ClientOptions) -> Result<WatcherSide> {
        if nice == 0 {
            return Ok(WatcherSide {
                runtime: None,
                client: client.clone(),
            });
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name("watchers")
            .on_thread_start(move || set_niceness(nice))
            .build()?;
        // The client's background tasks start on the runtime current at its creation.
        let client = {
            let _inside = runtime.enter();
            Client::with_options(opts)?
        };
        Ok(WatcherSide {
            runtime: Some(runtime),
            client,
        })
    }

    /// Opens one watcher's stream, on the watchers' side.
    pub async fn open(
        &self,
        db: &str,
        coll: &str,
        spec: &WatchSpec,
    ) -> Result<ChangeStream<RawDocumentBuf>> {
        let (client, db, coll, spec) = (
            self.client.clone(),
            db.to_string(),
            coll.to_string(),
            spec.clone(),
        );
        self.spawn(async move { workload::open(&client, &db, &coll, &spec).await })
            .await?
    }

    /// Runs a watcher's task on the watchers' side.
    pub fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.runtime {
            Some(runtime) => runtime.spawn(task),
            None => tokio::spawn(task),
        }
    }

    /// Stops the watchers' runtime without waiting for it (it may not block inside the bench's).
    pub fn shutdown(self) {
        if let Some(runtime) = self.runtime {
            runtime.shutdown_background();
        }
    }
}

/// Sets the calling thread's niceness (on Linux, `PRIO_PROCESS` with `who` 0 names the calling
/// thread, not the whole process). Best effort: a refusal leaves the thread as it was.
#[allow(unsafe_code)]
fn set_niceness(nice: i32) {
    // SAFETY: `setpriority` takes plain integers, touches no memory of ours, and reports
    // failure through its return value, which is ignored on purpose (see above).
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, nice);
    }
}
