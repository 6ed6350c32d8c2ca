//! A shard whose writer runs on the leader of a three-member replica set in one process:
//! every write it acknowledges is in every member's storage, byte for byte, oplog included
//! (`repl::RaftLog`).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use common::*;
use shard::repl::{LocalNet, Member, MemberId, Net, RaftLog, Replica, Timing};
use shard::storage::{KeyRange, Scan, Storage, Table};

const FAST: Timing = Timing {
    heartbeat: Duration::from_millis(50),
    election: (Duration::from_millis(300), Duration::from_millis(500)),
};
const PATIENCE: Duration = Duration::from_secs(5);

async fn member(dir: &Path, id: MemberId, net: &Arc<LocalNet>) -> (Arc<Replica>, Arc<dyn Storage>) {
    let home = dir.join(format!("m{id}"));
    let (replica, storage) = Replica::open_in(&home, id, Net::Local(net.clone()), FAST)
        .await
        .expect("replica");
    (Arc::new(replica), storage)
}

/// Members 0, 1 and 2, reached in process.
fn three() -> BTreeMap<MemberId, Member> {
    (0..3)
        .map(|id| {
            (
                id,
                Member {
                    addr: format!("m{id}"),
                },
            )
        })
        .collect()
}

/// The rows of `table` in `storage`.
fn rows(storage: &dyn Storage, table: Table) -> Vec<(Vec<u8>, Vec<u8>)> {
    let txn = storage.begin_read().expect("read");
    let mut out = Vec::new();
    txn.scan(table, &KeyRange::all(), false, &mut |k, v| {
        out.push((k.to_vec(), v.to_vec()));
        Scan::Continue
    })
    .expect("scan");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_leaders_shard_acknowledges_is_on_every_member() {
    let dir = tempfile::tempdir().expect("tempdir");
    let net = LocalNet::new();
    let mut members = Vec::new();
    for id in 0..3 {
        members.push(member(dir.path(), id, &net).await);
    }
    members[0].0.initialize(three()).await.expect("initialize");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let leader = loop {
        if let Some(l) = members.iter().find(|(r, _)| r.is_leader()) {
            assert!(l.0.wait_leading(PATIENCE).await, "the leader takes writes");
            break l.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let log = Arc::new(RaftLog::new(
        leader.0.clone(),
        tokio::runtime::Handle::current(),
        PATIENCE,
    ));
    let shard_dir = dir.path().join("shard");
    std::fs::create_dir_all(&shard_dir).expect("dir");
    let s = shard::Shard::open_with_storage(
        options(&shard_dir, Arc::new(shard::SystemClock)),
        leader.1.clone(),
        log,
    )
    .await
    .expect("the shard opens over the leader");

    for i in 0..30 {
        ok(
            &s,
            "app",
            doc! {"insert": "c", "documents": [{"_id": i, "v": i}]},
        )
        .await;
    }
    ok(
        &s,
        "app",
        doc! {"update": "c", "updates": [{"q": {"_id": 3}, "u": {"$set": {"v": -3}}}]},
    )
    .await;
    ok(
        &s,
        "app",
        doc! {"delete": "c", "deletes": [{"q": {"_id": 4}, "limit": 1}]},
    )
    .await;
    assert_eq!(find(&s, "app", "c", doc! {}).await.len(), 29);

    // Every acknowledged write is in the leader's log; its applied index (a metric published
    // after the write is answered) may not show the last one yet.
    let written = leader.0.last_log_index().expect("written");
    for (replica, _) in &members {
        assert!(
            replica.wait_applied(written, PATIENCE).await,
            "member {}",
            replica.id()
        );
    }
    for table in [Table::Documents, Table::Oplog, Table::Catalog, Table::Meta] {
        let on_leader = rows(leader.1.as_ref(), table);
        assert!(!on_leader.is_empty(), "{table:?} has rows");
        for (replica, storage) in &members {
            assert_eq!(
                rows(storage.as_ref(), table),
                on_leader,
                "member {}'s {table:?}",
                replica.id()
            );
        }
    }
    assert_eq!(rows(leader.1.as_ref(), Table::Documents).len(), 29);
    for (replica, _) in &members {
        replica.shutdown().await;
    }
}

/// Three members each following leadership (`replica_set`): the primary serves the shard; when
/// it dies a new primary serves every acknowledged write within seconds, with its clock above
/// every `ts` the old one handed out.
/// Three members serving a shard while they lead, the first initialising the set.
async fn three_members(
    dir: &Path,
    net: &Arc<LocalNet>,
) -> Vec<Arc<shard::replica_set::ReplicaSetMember>> {
    use shard::replica_set::{ReplicaSetMember, SetInfo};
    let mut members = Vec::new();
    for id in 0..3 {
        let (replica, storage) = member(dir, id, net).await;
        let home = dir.join(format!("shard{id}"));
        std::fs::create_dir_all(&home).expect("dir");
        let opts = options(&home, Arc::new(shard::SystemClock));
        let set = SetInfo {
            name: "rs".into(),
            hosts: (0..3).map(|m| format!("m{m}")).collect(),
            me: id,
        };
        members.push(ReplicaSetMember::start(
            opts, set, replica, storage, PATIENCE,
        ));
    }
    members[0]
        .replica()
        .initialize(three())
        .await
        .expect("initialize");
    members
}

/// Three members in a fresh directory, and which of them serves as primary.
async fn serving_set() -> (
    tempfile::TempDir,
    Arc<LocalNet>,
    Vec<Arc<shard::replica_set::ReplicaSetMember>>,
    usize,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let net = LocalNet::new();
    let members = three_members(dir.path(), &net).await;
    let old = wait_primary(&members, &[]).await;
    (dir, net, members, old)
}

/// The member serving as primary, once one does (not one of `skip`), within [`PATIENCE`].
async fn wait_primary(
    members: &[Arc<shard::replica_set::ReplicaSetMember>],
    skip: &[usize],
) -> usize {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let serving =
            (0..members.len()).find(|i| !skip.contains(i) && members[*i].primary().is_some());
        if let Some(p) = serving {
            return p;
        }
        assert!(tokio::time::Instant::now() < deadline, "no primary");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_primary_serves_every_acknowledged_write_soon_after_the_old_one_dies() {
    let (_dir, net, members, old) = serving_set().await;
    for m in &members {
        if !std::ptr::eq(m.as_ref(), members[old].as_ref()) {
            // A secondary refuses writes, and reads from clients that ask for the primary.
            let r = m
                .run_command(doc! {"insert": "c", "documents": [{"_id": -1}], "$db": "app"})
                .await;
            assert_eq!(r.get_i32("code").ok(), Some(10107), "{r}");
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while m.secondary().is_none() {
                assert!(tokio::time::Instant::now() < deadline, "no secondary");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let r = m.run_command(doc! {"find": "c", "$db": "app"}).await;
            assert_eq!(r.get_i32("code").ok(), Some(13435), "{r}");
        }
    }
    let mut last_ts = None;
    for i in 0..20 {
        let r = members[old]
            .run_command(doc! {"insert": "c", "documents": [{"_id": i}], "$db": "app"})
            .await;
        assert!(is_ok(&r), "{r}");
        last_ts = r.get_timestamp("operationTime").ok();
    }

    let died = std::time::Instant::now();
    members[old].shutdown().await;
    net.remove(old as MemberId);
    let survivors: Vec<Arc<shard::replica_set::ReplicaSetMember>> = members
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != old)
        .map(|(_, m)| m.clone())
        .collect();
    let (new, reply) = loop {
        let mut written = None;
        for m in &survivors {
            let r = m
                .run_command(doc! {"insert": "c", "documents": [{"_id": 100}], "$db": "app"})
                .await;
            if is_ok(&r) {
                written = Some((m.clone(), r));
                break;
            }
        }
        if let Some(w) = written {
            break w;
        }
        assert!(
            died.elapsed() < Duration::from_secs(10),
            "no new primary took a write"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = died.elapsed();
    println!("kill -> first acknowledged write on the new primary: {took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    let ts = reply.get_timestamp("operationTime").expect("operationTime");
    assert!(
        Some(ts) > last_ts,
        "the new primary's clock is above the old one's"
    );
    let shard = new.primary().expect("serving");
    let docs = find(&shard, "app", "c", doc! {}).await;
    assert_eq!(docs.len(), 21, "every acknowledged write, and the new one");
    for m in &survivors {
        m.shutdown().await;
    }
}

/// A member's server for its peers' messages only (the test's stand-in for the shard server).
struct PeerServer(Arc<Replica>);

#[async_trait::async_trait]
impl wire::server::Handler for PeerServer {
    async fn handle(
        &self,
        _conn: &wire::server::ConnectionInfo,
        req: wire::server::Request,
    ) -> wire::server::Reply {
        let name = req.body.keys().next().cloned().unwrap_or_default();
        let reply = match self.0.answer(&name, &req.body).await {
            Ok(reply) => reply,
            Err(e) => e.to_document(),
        };
        wire::server::Reply::Document(reply)
    }
}

/// The same set over TCP: each member behind its own port, its Raft messages as OP_MSG
/// commands (`_repl*`); what commits is on every member, and when the leader's process stops
/// answering, the others elect a new one and go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_on_their_own_ports_replicate_and_elect_over_the_wire() {
    use shard::storage::Table;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(
            tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind"),
        );
    }
    let addrs: Vec<String> = listeners
        .iter()
        .map(|l| l.local_addr().expect("addr").to_string())
        .collect();
    let net = Net::Wire(shard::repl::WireNet::new(None, None));
    let mut members = Vec::new();
    for (id, listener) in (0..3u64).zip(listeners) {
        let home = dir.path().join(format!("m{id}"));
        let (replica, storage) = Replica::open_in(&home, id, net.clone(), FAST)
            .await
            .expect("replica");
        let replica = Arc::new(replica);
        let cancel = tokio_util::sync::CancellationToken::new();
        tokio::spawn(wire::server::serve(
            listener,
            Arc::new(PeerServer(replica.clone())),
            cancel.clone(),
        ));
        members.push((replica, storage, cancel));
    }
    let all: BTreeMap<MemberId, Member> = (0..3u64)
        .map(|id| {
            (
                id,
                Member {
                    addr: addrs[id as usize].clone(),
                },
            )
        })
        .collect();
    members[0].0.initialize(all).await.expect("initialize");

    async fn leader_among(members: &[&Arc<Replica>]) -> Arc<Replica> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(l) = members.iter().find(|r| r.is_leader())
                && l.wait_leading(PATIENCE).await
            {
                return (*l).clone();
            }
            assert!(tokio::time::Instant::now() < deadline, "no leader");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let put = |term: u64, key: &str| {
        let mut set = shard::log::WriteSet::with_prefix(0, 64);
        set.push(shard::log::Op {
            table: Table::Documents.index(),
            key: key.as_bytes(),
            value: Some(b"v"),
        })
        .expect("op");
        shard::repl::Proposal {
            term,
            promise: 0,
            ops: set.encoded().to_vec(),
        }
    };
    let everyone: Vec<&Arc<Replica>> = members.iter().map(|(r, _, _)| r).collect();
    let leader = leader_among(&everyone).await;
    let mut last = 0;
    for i in 0..10 {
        last = leader
            .propose(put(leader.term(), &format!("k{i}")), PATIENCE)
            .await
            .expect("committed")
            .index;
    }
    for (replica, _, _) in &members {
        assert!(
            replica.wait_applied(last, PATIENCE).await,
            "member {}",
            replica.id()
        );
    }
    let on_leader = rows(members[leader.id() as usize].1.as_ref(), Table::Documents);
    assert_eq!(on_leader.len(), 10);
    for (replica, storage, _) in &members {
        assert_eq!(
            rows(storage.as_ref(), Table::Documents),
            on_leader,
            "member {}",
            replica.id()
        );
    }

    // The leader's process stops answering: the others elect one of themselves.
    let old = leader.id();
    members[old as usize].2.cancel();
    leader.shutdown().await;
    let survivors: Vec<&Arc<Replica>> = members
        .iter()
        .map(|(r, _, _)| r)
        .filter(|r| r.id() != old)
        .collect();
    let new = leader_among(&survivors).await;
    assert_ne!(new.id(), old);
    let applied = new
        .propose(put(new.term(), "after"), PATIENCE)
        .await
        .expect("the new leader commits with the other survivor");
    for r in &survivors {
        assert!(r.wait_applied(applied.index, PATIENCE).await);
    }
    for r in survivors {
        r.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_cut_off_from_its_majority_stops_serving_and_the_majority_elects_another() {
    let (_dir, net, members, old) = serving_set().await;
    let r = members[old]
        .run_command(doc! {"insert": "c", "documents": [{"_id": 1}], "$db": "app"})
        .await;
    assert!(is_ok(&r), "{r}");
    let old_term = members[old].replica().term();

    net.isolate(old as MemberId);
    let cut = std::time::Instant::now();
    let new = wait_primary(&members, &[old]).await;
    // The old primary steps down once its lease passes without a majority.
    while members[old].primary().is_some() {
        assert!(cut.elapsed() < PATIENCE, "the cut-off primary kept serving");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = members[old]
        .run_command(doc! {"insert": "c", "documents": [{"_id": 2}], "$db": "app"})
        .await;
    assert_eq!(r.get_i32("code").ok(), Some(10107), "{r}");
    let r = members[new]
        .run_command(doc! {"insert": "c", "documents": [{"_id": 3}], "$db": "app"})
        .await;
    assert!(is_ok(&r), "{r}");

    // The new primary's entries carry its term as `t`.
    let term = members[new].replica().term();
    assert!(term > old_term, "{term} > {old_term}");
    let shard = members[new].primary().expect("serving");
    let entries = find(&shard, "local", "oplog.rs", doc! {"o._id": {"$in": [1, 3]}}).await;
    let terms: Vec<i64> = entries.iter().filter_map(|e| e.get_i64("t").ok()).collect();
    assert_eq!(
        terms,
        [
            i64::try_from(old_term).unwrap(),
            i64::try_from(term).unwrap()
        ]
    );

    // Back in touch, the old primary follows the new one.
    net.heal();
    let deadline = std::time::Instant::now() + PATIENCE;
    while members[old].replica().leader() != Some(new as MemberId) {
        assert!(
            std::time::Instant::now() < deadline,
            "the old primary did not rejoin"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(members[old].primary().is_none());
    for m in &members {
        m.shutdown().await;
    }
}
