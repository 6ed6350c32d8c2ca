//! The operations in flight on this router: what `currentOp` lists as active and what
//! `killOp` interrupts.
//!
//! Owns: operation ids (`opid`, from 1), each operation's facts (command, namespace, client,
//! start time) and its cancellation token.
//!
//! Invariants: an operation is listed from just before its command runs until its reply is
//! built (the [`Running`] guard removes it however the command ends); `killOp` cancels the
//! operation's token, and the command then answers 11601 `Interrupted` at once; what a shard
//! already started for it finishes there (as a killed mongos operation's remote parts may).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bson::{Bson, DateTime, Document, doc};
use tokio_util::sync::CancellationToken;
use wire::server::ConnectionInfo;

struct Op {
    name: String,
    ns: String,
    command: Document,
    client: String,
    connection: u64,
    started: Instant,
    started_at: DateTime,
    cancel: CancellationToken,
}

/// The router's operations in flight.
#[derive(Default)]
pub struct Ops {
    next: AtomicU64,
    running: Mutex<HashMap<u64, Op>>,
}

/// An operation in flight; dropping it ends it.
pub struct Running<'a> {
    ops: &'a Ops,
    pub id: u64,
    pub cancel: CancellationToken,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.ops.lock().remove(&self.id);
    }
}

/// The fields of a command that `currentOp` does not show (credentials, gossip).
const HIDDEN: &[&str] = &["$clusterTime", "payload", "pwd", "lsid", "$readPreference"];

impl Ops {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Op>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts tracking command `name` on database `db`.
    pub fn start(
        &self,
        conn: &ConnectionInfo,
        name: &str,
        db: &str,
        cmd: &Document,
    ) -> Running<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let cancel = CancellationToken::new();
        let ns = match cmd.get(name) {
            Some(Bson::String(coll)) => format!("{db}.{coll}"),
            _ => format!("{db}.$cmd"),
        };
        let command = cmd
            .iter()
            .filter(|(k, _)| !HIDDEN.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        self.lock().insert(
            id,
            Op {
                name: name.to_string(),
                ns,
                command,
                client: conn.peer.to_string(),
                connection: conn.id,
                started: Instant::now(),
                started_at: DateTime::now(),
                cancel: cancel.clone(),
            },
        );
        Running {
            ops: self,
            id,
            cancel,
        }
    }

    /// Interrupts operation `id`; whether it was running.
    pub fn kill(&self, id: u64) -> bool {
        match self.lock().get(&id) {
            Some(op) => {
                op.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// The `inprog` entries of the operations in flight.
    pub fn active(&self, host: &str) -> Vec<Document> {
        let mut out: Vec<(u64, Document)> = self
            .lock()
            .iter()
            .map(|(id, op)| {
                let elapsed = op.started.elapsed();
                (
                    *id,
                    doc! {
                        "type": "op",
                        "host": host,
                        "desc": format!("conn{}", op.connection),
                        "connectionId": op.connection as i64,
                        "client": &op.client,
                        "active": true,
                        "opid": *id as i64,
                        "secs_running": elapsed.as_secs() as i64,
                        "microsecs_running": elapsed.as_micros() as i64,
                        "currentOpTime": op.started_at,
                        "op": op_kind(&op.name),
                        "ns": &op.ns,
                        "command": op.command.clone(),
                        "killPending": op.cancel.is_cancelled(),
                    },
                )
            })
            .collect();
        out.sort_by_key(|(id, _)| *id);
        out.into_iter().map(|(_, d)| d).collect()
    }
}

/// MongoDB's `op` field.
fn op_kind(name: &str) -> &'static str {
    match name {
        "find" => "query",
        "insert" => "insert",
        "update" => "update",
        "delete" => "remove",
        "getMore" => "getmore",
        _ => "command",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> ConnectionInfo {
        ConnectionInfo {
            id: 7,
            peer: "127.0.0.1:5000".parse().expect("addr"),
        }
    }

    #[test]
    fn an_operation_is_listed_while_it_runs_and_can_be_killed() {
        let ops = Ops::default();
        let running = ops.start(&conn(), "find", "app", &doc! {"find": "c", "pwd": "x"});
        let listed = ops.active("h");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].get_str("ns").ok(), Some("app.c"));
        assert_eq!(listed[0].get_str("op").ok(), Some("query"));
        assert!(
            !listed[0]
                .get_document("command")
                .is_ok_and(|c| c.contains_key("pwd")),
            "no secrets"
        );
        assert!(ops.kill(running.id));
        assert!(running.cancel.is_cancelled());
        drop(running);
        assert!(ops.active("h").is_empty());
        assert!(!ops.kill(1), "gone");
    }
}
