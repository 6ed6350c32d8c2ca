//! Three members in one process, on real files: what is committed reaches every member byte
//! for byte, a cut-off leader commits nothing, a stale term's batch applies nowhere, and a
//! member restarted from its disk catches up.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::log::{Op, WriteSet};
use crate::storage::{Storage, Table};

/// Fast elections, so the tests take seconds.
const FAST: Timing = Timing {
    heartbeat: Duration::from_millis(50),
    election: (Duration::from_millis(300), Duration::from_millis(500)),
};
const PATIENCE: Duration = Duration::from_secs(5);

struct Set {
    net: Arc<LocalNet>,
    dir: tempfile::TempDir,
    members: Vec<Option<(Replica, Arc<dyn Storage>)>>,
}

async fn open_member(
    dir: &std::path::Path,
    id: MemberId,
    net: &Arc<LocalNet>,
) -> (Replica, Arc<dyn Storage>) {
    Replica::open_in(
        &dir.join(format!("m{id}")),
        id,
        Net::Local(net.clone()),
        FAST,
    )
    .await
    .expect("replica")
}

impl Set {
    async fn start(n: u64) -> Set {
        let net = LocalNet::new();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut members = Vec::new();
        for id in 0..n {
            members.push(Some(open_member(dir.path(), id, &net).await));
        }
        let all: BTreeMap<MemberId, Member> = (0..n)
            .map(|id| {
                (
                    id,
                    Member {
                        addr: format!("m{id}"),
                    },
                )
            })
            .collect();
        members[0]
            .as_ref()
            .expect("member 0")
            .0
            .initialize(all)
            .await
            .expect("initialize");
        Set { net, dir, members }
    }

    fn member(&self, id: MemberId) -> &Replica {
        &self.members[id as usize]
            .as_ref()
            .expect("a running member")
            .0
    }

    /// The leader the running members other than `except` agree on, once they do.
    async fn leader(&self, except: Option<MemberId>) -> MemberId {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let running: Vec<&Replica> = self
                .members
                .iter()
                .flatten()
                .map(|(r, _)| r)
                .filter(|r| Some(r.id()) != except)
                .collect();
            let first = running[0].leader();
            if let Some(l) = first
                && Some(l) != except
                && running.iter().all(|r| r.leader() == Some(l))
                && self.member(l).is_leader()
                // Leading in a term, with a majority heard from: it takes proposals (until a
                // majority acknowledged it, a proposal's outcome would be unknown at once).
                && self.member(l).wait_leading(PATIENCE).await
            {
                return l;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no leader within {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(&mut self, id: MemberId) {
        if let Some((replica, _)) = self.members[id as usize].take() {
            replica.shutdown().await;
        }
        self.net.remove(id);
    }

    async fn restart(&mut self, id: MemberId) {
        self.members[id as usize] = Some(open_member(self.dir.path(), id, &self.net).await);
    }

    /// Every row of every table of member `id`.
    fn dump(&self, id: MemberId) -> Vec<u8> {
        let storage = &self.members[id as usize].as_ref().expect("running").1;
        let mut rows = super::snapshot::Rows::new(storage.begin_read().expect("read"));
        let mut all = Vec::new();
        while let Some(piece) = rows.next_piece().expect("read a piece") {
            all.extend_from_slice(piece.encoded());
        }
        all
    }

    fn has(&self, id: MemberId, key: &[u8]) -> bool {
        let storage = &self.members[id as usize].as_ref().expect("running").1;
        let txn = storage.begin_read().expect("read");
        txn.get(Table::Documents, key).expect("get").is_some()
    }

    /// Stops a follower, then commits ten more entries without it: (leader, follower, the
    /// last entry's index).
    async fn write_with_a_follower_down(&mut self) -> (MemberId, MemberId, u64) {
        let leader = self.leader(None).await;
        propose(self, leader, "a").await;
        let follower = (leader + 1) % 3;
        self.stop(follower).await;
        let mut last = 0;
        for i in 0..10 {
            last = propose(self, leader, &format!("b{i}")).await.index;
        }
        (leader, follower, last)
    }

    async fn shutdown(mut self) {
        for id in 0..self.members.len() as u64 {
            self.stop(id).await;
        }
    }
}

/// A proposal that puts `key` in the documents table, executed in `term`.
fn put(term: u64, key: &str) -> Proposal {
    let mut set = WriteSet::with_prefix(0, 64);
    set.push(Op {
        table: Table::Documents.index(),
        key: key.as_bytes(),
        value: Some(b"value"),
    })
    .expect("a small op");
    Proposal {
        term,
        promise: 0,
        ops: set.encoded().to_vec(),
    }
}

async fn propose(set: &Set, leader: MemberId, key: &str) -> Applied {
    let replica = set.member(leader);
    replica
        .propose(put(replica.term(), key), PATIENCE)
        .await
        .expect("committed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_write_sets_reach_every_member_byte_for_byte() {
    let set = Set::start(3).await;
    let leader = set.leader(None).await;
    let mut last = 0;
    for i in 0..20 {
        let applied = propose(&set, leader, &format!("k{i}")).await;
        assert!(applied.executed);
        assert!(applied.index > last, "entries in log order");
        last = applied.index;
    }
    for id in 0..3 {
        assert!(
            set.member(id).wait_applied(last, PATIENCE).await,
            "member {id} applied"
        );
    }
    let leader_rows = set.dump(leader);
    for id in 0..3 {
        assert_eq!(
            set.dump(id),
            leader_rows,
            "member {id}'s tables are the leader's"
        );
    }
    assert!(set.has(1, b"k19"));
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_majority_commits_nothing_and_is_replaced() {
    let set = Set::start(3).await;
    let old = set.leader(None).await;
    propose(&set, old, "before").await;
    set.net.isolate(old);
    let cut_off = set.member(old);
    let refused = cut_off
        .propose(put(cut_off.term(), "lost"), Duration::from_secs(2))
        .await;
    assert!(
        refused.is_err(),
        "a leader without a majority commits nothing: {refused:?}"
    );

    let new = set.leader(Some(old)).await;
    assert_ne!(new, old);
    assert!(set.member(new).term() > cut_off.term() || !cut_off.is_leader());
    let applied = propose(&set, new, "after").await;
    set.net.heal();
    for id in 0..3 {
        assert!(
            set.member(id).wait_applied(applied.index, PATIENCE).await,
            "member {id}"
        );
    }
    for id in 0..3 {
        assert!(
            set.has(id, b"before") && set.has(id, b"after"),
            "member {id}"
        );
        assert!(
            !set.has(id, b"lost"),
            "member {id} applied an uncommitted write"
        );
    }
    assert_eq!(
        set.dump(old),
        set.dump(new),
        "the old leader's log was cut back to the new one's"
    );
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_executed_in_an_earlier_term_applies_nowhere() {
    let set = Set::start(3).await;
    let leader = set.leader(None).await;
    let term = set.member(leader).term();
    let stale = set
        .member(leader)
        .propose(put(term - 1, "stale"), PATIENCE)
        .await
        .expect("committed");
    assert!(!stale.executed, "the term fence skips it");
    assert_eq!(stale.term, term);
    for id in 0..3 {
        assert!(set.member(id).wait_applied(stale.index, PATIENCE).await);
        assert!(!set.has(id, b"stale"), "member {id}");
    }
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restarted_from_its_disk_catches_up() {
    let mut set = Set::start(3).await;
    let (leader, follower, last) = set.write_with_a_follower_down().await;
    set.restart(follower).await;
    assert!(
        set.member(follower).wait_applied(last, PATIENCE).await,
        "caught up"
    );
    assert_eq!(set.dump(follower), set.dump(leader));
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_behind_a_purged_log_catches_up_from_a_snapshot() {
    let mut set = Set::start(3).await;
    let (leader, follower, last) = set.write_with_a_follower_down().await;
    set.member(leader)
        .compact(PATIENCE)
        .await
        .expect("compacted");
    set.restart(follower).await;
    assert!(
        set.member(follower).wait_applied(last, PATIENCE).await,
        "caught up"
    );
    let installed = set
        .member(follower)
        .raft
        .metrics()
        .borrow_watched()
        .snapshot;
    assert!(
        installed.is_some(),
        "from the leader's snapshot, the log it needed being gone"
    );
    assert_eq!(set.dump(follower), set.dump(leader));
    set.shutdown().await;
}

/// A member's log and state machine on fresh files, for openraft's storage suite.
struct Stores;

impl
    openraft::testing::log::StoreBuilder<
        TypeConfig,
        log_store::LogStore,
        state_machine::StateMachine,
        tempfile::TempDir,
    > for Stores
{
    async fn build(
        &self,
    ) -> Result<
        (
            tempfile::TempDir,
            log_store::LogStore,
            state_machine::StateMachine,
        ),
        openraft::StorageError<TypeConfig>,
    > {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage: Arc<dyn Storage> = Arc::new(
            crate::storage::RedbStorage::open_behind_log(&dir.path().join("member.redb"))
                .expect("storage"),
        );
        let log = log_store::LogStore::open(&dir.path().join("raft.redb")).expect("log");
        let sm = state_machine::StateMachine::open(storage, handover::Handover::new())
            .await
            .expect("state machine");
        Ok((dir, log, sm))
    }
}

/// openraft's own checks of a log store and state machine: appends, votes, truncation,
/// purging, membership and applied state as its core expects them, with appends answered by
/// the log's writer thread after their fsync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_and_state_machine_keep_openrafts_storage_contract() {
    openraft::testing::log::Suite::test_all(Stores)
        .await
        .expect("openraft's storage suite");
}
