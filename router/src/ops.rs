//! The operations in flight on this router: what `currentOp` lists as active and what
//! `killOp` interrupts.
//!
//! Owns: operation ids (`opid`, from 1), each operation's facts (command, namespace, client,
//! start time) and its cancellation token.
//!
//! Invariants: an operation is listed from just before its command runs until its reply is
//! built (the [`Running`] guard removes it however the command ends); `killOp` cancels the
//! operation's token, and the command then answers 11601 `Interrupted` at once. Every command
//! the operation sends to a shard carries its `clientOperationKey` (`kernel::transport::OPERATION_KEY`), and a
//! killed operation's key is sent to every shard (`_killOperations`), which stops its work
//! there too, as mongos does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bson::{Bson, DateTime, Document, doc};
use tokio_util::sync::CancellationToken;
use wire::server::ConnectionInfo;

use wire::capped::CappedText;

use crate::kernel::services::Services;
use crate::kernel::transport::{ShardTransport, Shards};
use bson::Binary;

/// Tells every shard to stop what it runs for a killed operation (`_killOperations`), in the
/// background: the client's reply does not wait for it.
pub(crate) fn kill_on_shards(transport: &Arc<ShardTransport>, services: &Services, key: Binary) {
    let transport = transport.clone();
    services.spawn("kill_on_shards", async move {
        let all = transport.all();
        let cmd = doc! {"_killOperations": 1, "operationKeys": [key]};
        for reply in transport.broadcast(&all, "admin", &cmd).await {
            if let Err(e) = reply {
                tracing::debug!(error = %e, "telling a shard of a killed operation");
            }
        }
    });
}

/// A new operation key (a random UUID, as drivers and mongos make them), from the thread's
/// generator: every command has one, and asking the kernel for each costs a system call.
pub fn new_key() -> bson::Binary {
    let uuid = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
    bson::Binary::from_uuid(bson::Uuid::from_bytes(uuid.into_bytes()))
}

struct Op {
    name: String,
    ns: String,
    command: Document,
    client: String,
    connection: u64,
    started: Instant,
    started_at: DateTime,
    cancel: CancellationToken,
    /// The `clientOperationKey` its shard commands carry.
    key: bson::Binary,
    /// Its session's key (`lsid.id`, then `lsid.uid`), if it runs in one.
    session: Option<Vec<u8>>,
}

/// The session key of a command: the bytes of `lsid.id`, then of `lsid.uid` (as shards key
/// their sessions).
fn session_key(cmd: &Document) -> Option<Vec<u8>> {
    let lsid = cmd.get_document("lsid").ok()?;
    let mut key = match lsid.get("id")? {
        Bson::Binary(b) => b.bytes.clone(),
        _ => return None,
    };
    if let Some(Bson::Binary(uid)) = lsid.get("uid") {
        key.extend_from_slice(&uid.bytes);
    }
    Some(key)
}

/// The most of a command `currentOp` shows as a document, in encoded bytes (MongoDB's limit
/// when it truncates operations, as its `currentOp` command does).
const SHOWN_COMMAND_BYTES: usize = 1000;

/// A command as `currentOp` shows it, without [`HIDDEN`] fields: the command itself when it
/// encodes within [`SHOWN_COMMAND_BYTES`], else `{$truncated: <its text cut to that many
/// bytes, ending "...">, comment?}`, as MongoDB shows a large one. Only that much is kept, so
/// a 16 MiB command costs its operation's entry a kilobyte, not a copy of itself.
fn shown_command(cmd: &Document) -> Document {
    let shown = || {
        cmd.iter()
            .filter(|(k, _)| !HIDDEN.contains(&k.as_str()) && k.as_str() != "comment")
    };
    let size: usize = 5 + cmd
        .iter()
        .filter(|(k, _)| !HIDDEN.contains(&k.as_str()))
        .map(|(k, v)| encoded_at_most(k, v, SHOWN_COMMAND_BYTES + 1))
        .fold(0usize, |a, b| a.saturating_add(b));
    if size <= SHOWN_COMMAND_BYTES {
        return cmd
            .iter()
            .filter(|(k, _)| !HIDDEN.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
    }
    let mut text = CappedText::new(SHOWN_COMMAND_BYTES - 3);
    let mut first = true;
    let _ = std::fmt::Write::write_str(&mut text, "{ ");
    for (k, v) in shown() {
        let sep = if first { "" } else { ", " };
        first = false;
        if std::fmt::Write::write_fmt(&mut text, format_args!("{sep}{k}: {v}")).is_err() {
            break;
        }
    }
    let (mut text, cut) = text.into_parts();
    text.push_str(if cut { "..." } else { " }" });
    let mut out = doc! {"$truncated": text};
    if let Some(comment) = cmd.get("comment") {
        out.insert("comment", comment.clone());
    }
    out
}

/// The encoded size of element `key: value`, counted up to `limit` (past it, some size over
/// `limit`): arrays and documents are walked without recursion, and no further than needed.
fn encoded_at_most(key: &str, value: &Bson, limit: usize) -> usize {
    let mut total = 0usize;
    let mut stack: Vec<(usize, &Bson)> = vec![(key.len(), value)];
    while let Some((key_len, v)) = stack.pop() {
        total = total.saturating_add(2 + key_len);
        total = total.saturating_add(match v {
            Bson::Document(d) => {
                stack.extend(d.iter().map(|(k, v)| (k.len(), v)));
                5
            }
            Bson::Array(a) => {
                // An array's keys are its indexes' decimal digits.
                stack.extend(a.iter().enumerate().map(|(i, v)| (digits(i), v)));
                5
            }
            Bson::String(s) | Bson::JavaScriptCode(s) | Bson::Symbol(s) => 5 + s.len(),
            Bson::Binary(b) => 5 + b.bytes.len(),
            Bson::RegularExpression(r) => r.pattern.len() + r.options.len() + 2,
            Bson::JavaScriptCodeWithScope(c) => 14 + c.code.len() + c.scope.len() * 16,
            Bson::Int32(_) => 4,
            Bson::ObjectId(_) => 12,
            Bson::Boolean(_) => 1,
            Bson::Null | Bson::Undefined | Bson::MaxKey | Bson::MinKey => 0,
            Bson::Decimal128(_) => 16,
            Bson::DbPointer(_) => 32,
            _ => 8,
        });
        if total > limit {
            return total;
        }
    }
    total
}

fn digits(mut n: usize) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

/// The commands that end sessions: they never end themselves.
const SESSION_KILLERS: &[&str] = &["endSessions", "killSessions", "killAllSessions"];

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
    /// The `clientOperationKey` its shard commands carry (`kernel::transport::OPERATION_KEY`).
    pub key: bson::Binary,
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
        // A client may name its operation's key (a generic argument), as mongos allows.
        let key = match cmd.get("clientOperationKey") {
            Some(Bson::Binary(b)) => b.clone(),
            _ => new_key(),
        };
        let ns = match cmd.get(name) {
            Some(Bson::String(coll)) => format!("{db}.{coll}"),
            _ => format!("{db}.$cmd"),
        };
        let command = shown_command(cmd);
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
                key: key.clone(),
                session: session_key(cmd),
            },
        );
        Running {
            ops: self,
            id,
            cancel,
            key,
        }
    }

    /// Interrupts operation `id`; its `clientOperationKey` when it was running (the caller
    /// tells the shards).
    pub fn kill(&self, id: u64) -> Option<bson::Binary> {
        let ops = self.lock();
        let op = ops.get(&id)?;
        op.cancel.cancel();
        Some(op.key.clone())
    }

    /// Interrupts the operations running in the sessions `killed` picks (`killSessions`,
    /// `killAllSessions`, `endSessions`); their `clientOperationKey`s (the caller tells the
    /// shards).
    pub fn kill_sessions(&self, killed: &shard::txn::SessionFilter) -> Vec<bson::Binary> {
        self.lock()
            .values()
            .filter(|op| !SESSION_KILLERS.contains(&op.name.as_str()))
            .filter(|op| op.session.as_deref().is_some_and(|s| killed.matches(s)))
            .map(|op| {
                op.cancel.cancel();
                op.key.clone()
            })
            .collect()
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
        assert!(ops.kill(running.id).is_some());
        assert!(running.cancel.is_cancelled());
        drop(running);
        assert!(ops.active("h").is_empty());
        assert!(ops.kill(1).is_none(), "gone");
    }
}

#[cfg(test)]
mod shown_command_tests {
    use super::*;

    #[test]
    fn a_small_command_is_shown_whole_without_its_hidden_fields() {
        let cmd = doc! {"find": "c", "filter": {"a": 1}, "lsid": {"id": 1}, "comment": "x"};
        assert_eq!(
            shown_command(&cmd),
            doc! {"find": "c", "filter": {"a": 1}, "comment": "x"}
        );
    }

    #[test]
    fn a_command_over_a_kilobyte_is_shown_as_its_truncated_text_and_comment() {
        // Half a million small documents: as a `Document` each costs hundreds of bytes, so a
        // whole copy per operation would be hundreds of megabytes.
        let many: Vec<Bson> = (0..500_000)
            .map(|_| Bson::Document(doc! {"k": 1}))
            .collect();
        let cmd = doc! {"dropIndexes": "c", "index": "k_1", "writeConcern": {"wtimeout": many}, "comment": {"who": "me"}};
        let shown = shown_command(&cmd);
        let text = shown.get_str("$truncated").expect("truncated text");
        assert!(text.len() <= SHOWN_COMMAND_BYTES, "{} bytes", text.len());
        assert!(text.starts_with("{ dropIndexes: \"c\", index: \"k_1\", writeConcern: "));
        assert!(text.ends_with("..."));
        assert_eq!(
            shown.get_document("comment").ok(),
            Some(&doc! {"who": "me"})
        );
        assert_eq!(shown.len(), 2);
    }

    #[test]
    fn the_size_walk_stops_past_its_limit_and_counts_exactly_below_it() {
        let v = Bson::Document(doc! {"a": 1_i32, "b": "xy", "c": [true, 2.5]});
        let exact = doc! {"k": v.clone()}.to_vec().expect("encodes").len();
        // The walk counts the element (type byte, key, value); the outer document adds 5.
        assert_eq!(encoded_at_most("k", &v, 1000) + 5, exact);
        let many = Bson::Array((0..100_000).map(Bson::Int32).collect());
        assert!(encoded_at_most("k", &many, 1000) > 1000);
    }
}
