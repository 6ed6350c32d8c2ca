//! A replicated shard as the router reaches it: over TCP (`--shard NAME/h1:p1,h2:p2,h3:p3`), a
//! [`RemoteShard`] per member and a [`SetMonitor`] that follows the set's elections, every
//! command going to the member the monitor takes for the primary ([`ReplicaSetShard`]); in
//! process (`--replicas N`), the member that serves as primary now ([`LocalSet`]).
//!
//! What a member answers decides whether the transport may send the command again
//! (`design/replication.md`, "Router"), and the answer comes back to the transport as the
//! [`TransportError`] that says so:
//! * 10107, 13435, 13436 (not the primary): the member refused the command before running it,
//!   so it is [`TransportError::Unreachable`], sent again to the new primary whatever it is;
//! * 11602, 189, 91, 11600 (stepped down or shut down while running it): it may have run, so
//!   it is [`TransportError::Lost`], sent again only when it may run twice (reads, retryable
//!   writes); otherwise the client gets the member's error with its labels;
//! * a command still waiting on a member when another is elected was sent to a deposed (paused
//!   or cut-off) primary: it is given up as lost at once, not after the liveness check.
//!
//! Invariants: a command is sent to one member at a time, and only to the one believed primary
//! when it is sent; a member that refuses or cannot be reached is reported to the monitor,
//! which looks again at once.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bson::Document;
use wire::raw::Body;
use wire::replset::{
    NOT_PRIMARY_MAYBE_RUN, NOT_PRIMARY_UNRUN, PerMember, SetMonitor, SetSpec, reply_code,
};
use wire::{ErrorCode, MongoError};

use shard::replica_set::ReplicaSetMember;

use super::shard_client::{Failed, RemoteShard, ShardClient, TransportError};

/// How long a command waits for the set to have a known primary before it counts as not
/// sent (the transport then decides, within its patience, whether to try again): about one
/// election.
const ELECTION_WAIT: Duration = Duration::from_millis(1500);

/// One replicated shard (see the module header).
pub struct ReplicaSetShard {
    monitor: Arc<SetMonitor>,
    /// A connection pool per member, by its position in the monitor (members added to the
    /// set are found by the monitor).
    members: PerMember<RemoteShard>,
}

impl ReplicaSetShard {
    /// Follows the set `spec`, over TLS and with the cluster's key when given.
    pub fn start(
        spec: SetSpec,
        tls: Option<wire::tls::ClientTls>,
        key: Option<Arc<wire::keyfile::KeyFile>>,
    ) -> ReplicaSetShard {
        let monitor = SetMonitor::start(spec, tls.clone(), key.clone());
        let members = PerMember::new(move |h: &str| {
            RemoteShard::secured(h.to_string(), tls.clone(), key.clone())
        });
        ReplicaSetShard { monitor, members }
    }
}

#[async_trait]
impl ShardClient for ReplicaSetShard {
    async fn command(&self, db: &str, cmd: Document) -> Result<Body, TransportError> {
        let Some(primary) = self.monitor.wait_primary(ELECTION_WAIT).await else {
            let error = MongoError::new(
                ErrorCode::FAILED_TO_SATISFY_READ_PREFERENCE,
                format!(
                    "no primary found for replica set {} within {ELECTION_WAIT:?}",
                    self.monitor.spec()
                ),
            );
            return Err(TransportError::Unreachable { error, cmd });
        };
        let Some(member) = self.members.get(&self.monitor, primary) else {
            let error = MongoError::internal(format!("no member {primary}"));
            return Err(TransportError::Unreachable { error, cmd });
        };
        let reply = tokio::select! {
            reply = member.send(db, &cmd) => reply,
            () = self.monitor.deposed(primary) => {
                let error = MongoError::new(
                    ErrorCode::NETWORK_TIMEOUT,
                    format!("{} was deposed while the command waited on it", member.describe()),
                );
                return Err(TransportError::Lost { error, cmd });
            }
        };
        let reply = match reply {
            Ok(reply) => reply,
            Err(failed) => {
                if !matches!(failed, Failed::Refused(_)) {
                    self.monitor.suspect(primary);
                }
                return Err(failed.with(cmd));
            }
        };
        let judged = judge(reply, cmd);
        if judged.is_err() {
            self.monitor.suspect(primary);
        }
        judged
    }

    fn describe(&self) -> String {
        self.monitor.spec().to_string()
    }

    fn members(&self) -> usize {
        self.monitor.size()
    }
}

/// A replicated shard whose members run in this process.
pub struct LocalSet {
    name: String,
    members: Vec<Arc<ReplicaSetMember>>,
}

impl LocalSet {
    pub fn new(name: String, members: Vec<Arc<ReplicaSetMember>>) -> LocalSet {
        LocalSet { name, members }
    }

    /// The member serving as primary, waiting up to [`ELECTION_WAIT`] for one.
    async fn primary(&self) -> Option<&ReplicaSetMember> {
        let deadline = tokio::time::Instant::now() + ELECTION_WAIT;
        loop {
            if let Some(m) = self.members.iter().find(|m| m.primary().is_some()) {
                return Some(m);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[async_trait]
impl ShardClient for LocalSet {
    async fn command(&self, db: &str, mut cmd: Document) -> Result<Body, TransportError> {
        let Some(member) = self.primary().await else {
            let error = MongoError::new(
                ErrorCode::FAILED_TO_SATISFY_READ_PREFERENCE,
                format!(
                    "no primary found for replica set {} within {ELECTION_WAIT:?}",
                    self.name
                ),
            );
            return Err(TransportError::Unreachable { error, cmd });
        };
        cmd.insert("$db", db);
        let reply = member.run_command_body(cmd.clone()).await;
        cmd.remove("$db");
        judge(reply, cmd)
    }

    fn describe(&self) -> String {
        format!("in-process replica set {}", self.name)
    }

    fn members(&self) -> usize {
        self.members.len()
    }
}

/// A member's reply as the transport takes it: an error that says the member is not (or no
/// longer) the primary becomes the [`TransportError`] that says whether it may have run.
// The error is what `ShardClient::command` returns, the command handed back whole.
#[allow(clippy::result_large_err)]
fn judge(reply: Body, cmd: Document) -> Result<Body, TransportError> {
    let code = match &reply {
        Body::Raw(raw) => reply_code(raw),
        Body::Document(d) => MongoError::from_reply(d).map(|e| e.code),
        Body::Cursor(_) => None,
    };
    match code {
        Some(code) if NOT_PRIMARY_UNRUN.contains(&code) => Err(TransportError::Unreachable {
            error: member_error(reply),
            cmd,
        }),
        Some(code) if NOT_PRIMARY_MAYBE_RUN.contains(&code) => Err(TransportError::Lost {
            error: member_error(reply),
            cmd,
        }),
        _ => Ok(reply),
    }
}

/// A member's error reply as the error a client sees (its code, message and labels).
fn member_error(reply: Body) -> MongoError {
    match reply.into_document() {
        Ok(d) => MongoError::from_reply(&d)
            .unwrap_or_else(|| MongoError::internal("a member's error reply without an error")),
        Err(e) => e,
    }
}
