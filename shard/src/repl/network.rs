//! How members reach each other ([`Net`]): inside one process each member's Raft by a direct
//! call, with links that can be cut (one way or both) to partition a set ([`LocalNet`]: the
//! embedded cluster and the consensus tests); across processes over the wire (`wire_net`).
//!
//! Invariants:
//! * A message crosses a link only while the link from its sender to its receiver is up; the
//!   reply crosses back only while the reverse link is up (a reply lost on a one-way cut
//!   leaves the call executed on the receiver, as a real network would).
//! * An unreachable member is `Unreachable`, never an error of the receiver's own.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::alias::{SnapshotOf, VoteOf};
use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};

use super::snapshot::Snapshot;
use super::wire_net::{WireNet, WirePeer};
use super::{Member, MemberId, Raft, TypeConfig};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The members of one process and the links between them.
#[derive(Default)]
pub struct LocalNet {
    members: Mutex<HashMap<MemberId, Raft>>,
    /// Links that are down: (from, to).
    cut: Mutex<HashSet<(MemberId, MemberId)>>,
}

impl LocalNet {
    pub fn new() -> Arc<LocalNet> {
        Arc::new(LocalNet::default())
    }

    pub(super) fn register(&self, id: MemberId, raft: Raft) {
        lock(&self.members).insert(id, raft);
    }

    /// The member `id` is gone (stopped): nothing reaches it until it registers again.
    pub fn remove(&self, id: MemberId) {
        lock(&self.members).remove(&id);
    }

    /// Cuts the link from `from` to `to` (one way).
    pub fn cut(&self, from: MemberId, to: MemberId) {
        lock(&self.cut).insert((from, to));
    }

    /// Cuts `id` off from every other member, both ways.
    pub fn isolate(&self, id: MemberId) {
        let others: Vec<MemberId> = lock(&self.members).keys().copied().collect();
        let mut cut = lock(&self.cut);
        for other in others.into_iter().filter(|o| *o != id) {
            cut.insert((id, other));
            cut.insert((other, id));
        }
    }

    /// Every link up again.
    pub fn heal(&self) {
        lock(&self.cut).clear();
    }

    fn up(&self, from: MemberId, to: MemberId) -> bool {
        !lock(&self.cut).contains(&(from, to))
    }

    /// `to`'s Raft, if the link from `from` is up and `to` runs.
    fn reach(&self, from: MemberId, to: MemberId) -> Result<Raft, Unreachable<TypeConfig>> {
        if !self.up(from, to) {
            return Err(Unreachable::from_string(format!(
                "the link from member {from} to member {to} is cut"
            )));
        }
        lock(&self.members)
            .get(&to)
            .cloned()
            .ok_or_else(|| Unreachable::from_string(format!("member {to} is not running")))
    }

    /// Sends one call from `from` to `to` and brings its reply back, across the links.
    async fn call<T, E: std::fmt::Display, F: Future<Output = Result<T, E>>>(
        &self,
        from: MemberId,
        to: MemberId,
        call: impl FnOnce(Raft) -> F,
    ) -> Result<T, Unreachable<TypeConfig>> {
        let raft = self.reach(from, to)?;
        let reply = call(raft)
            .await
            .map_err(|e| Unreachable::from_string(format!("member {to}: {e}")))?;
        if !self.up(to, from) {
            return Err(Unreachable::from_string(format!(
                "the reply from member {to} to member {from} was lost"
            )));
        }
        Ok(reply)
    }
}

/// How a member reaches the others: directly in this process, or over the wire.
#[derive(Clone)]
pub enum Net {
    Local(Arc<LocalNet>),
    Wire(Arc<WireNet>),
}

impl Net {
    pub(super) fn factory(&self, from: MemberId) -> Factory {
        Factory {
            from,
            net: self.clone(),
        }
    }
}

/// Makes the links out of one member.
pub(super) struct Factory {
    from: MemberId,
    net: Net,
}

impl RaftNetworkFactory<TypeConfig> for Factory {
    type Network = Peer;

    async fn new_client(&mut self, target: MemberId, node: &Member) -> Peer {
        match &self.net {
            Net::Local(net) => Peer::Local(LocalPeer {
                from: self.from,
                to: target,
                net: net.clone(),
            }),
            Net::Wire(net) => Peer::Wire(WirePeer {
                to: target,
                client: net.client(&node.addr),
            }),
        }
    }
}

/// The link to one member.
pub(super) enum Peer {
    Local(LocalPeer),
    Wire(WirePeer),
}

/// Runs the same call on whichever link `peer` is.
macro_rules! on_link {
    ($peer:expr, $p:ident => $call:expr) => {
        match $peer {
            Peer::Local($p) => $call,
            Peer::Wire($p) => $call,
        }
    };
}

impl RaftNetworkV2<TypeConfig> for Peer {
    type SnapshotData = Snapshot;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        on_link!(self, p => p.append_entries(rpc, option).await)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        on_link!(self, p => p.vote(rpc, option).await)
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        on_link!(self, p => p.pre_vote(rpc, option).await)
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<TypeConfig>,
        snapshot: SnapshotOf<TypeConfig, Snapshot>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        on_link!(self, p => p.full_snapshot(vote, snapshot, cancel, option).await)
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        on_link!(self, p => p.transfer_leader(req, option).await)
    }
}

/// The link from one member to another.
pub(super) struct LocalPeer {
    from: MemberId,
    to: MemberId,
    net: Arc<LocalNet>,
}

impl RaftNetworkV2<TypeConfig> for LocalPeer {
    type SnapshotData = Snapshot;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let reply = self
            .net
            .call(self.from, self.to, |raft| async move {
                raft.append_entries(rpc).await
            })
            .await?;
        Ok(reply)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let reply = self
            .net
            .call(
                self.from,
                self.to,
                |raft| async move { raft.vote(rpc).await },
            )
            .await?;
        Ok(reply)
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let reply = self
            .net
            .call(self.from, self.to, |raft| async move {
                raft.pre_vote(rpc).await
            })
            .await?;
        Ok(reply)
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<TypeConfig>,
        snapshot: SnapshotOf<TypeConfig, Snapshot>,
        _cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let reply = self
            .net
            .call(self.from, self.to, |raft| async move {
                raft.install_full_snapshot(vote, snapshot).await
            })
            .await?;
        Ok(reply)
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        let reply = self
            .net
            .call(self.from, self.to, |raft| async move {
                raft.handle_transfer_leader(req).await
            })
            .await?;
        Ok(reply)
    }
}
