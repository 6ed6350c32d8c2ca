//! A data directory put back from a copy within the clock's reservation window: the restored
//! run's clock starts inside the lost run's times, so times alone cannot tell the two apart.
//! Once the router marks the boot lost with how far the history had reached, every time of
//! the lost run is refused (286) and the shard's clock is fenced past it. The wall clock is
//! frozen, so the whole story happens within one second.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use std::path::Path;
use std::sync::Arc;

use bson::{Bson, Document, doc};
use common::*;
use resume::ClusterTime;
use shard::{ManualClock, Shard};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

async fn lineage(s: &Shard) -> Document {
    ok(s, "admin", doc! {"_shardsvrLineage": 1}).await
}

fn newest(reply: &Document) -> ClusterTime {
    ClusterTime::from(reply.get_timestamp("newest").unwrap())
}

fn last_boot_to(reply: &Document) -> Bson {
    let boots = reply
        .get_document("lineage")
        .unwrap()
        .get_array("boots")
        .unwrap();
    let last = boots.last().unwrap().as_document().unwrap();
    last.get("to").cloned().unwrap()
}

/// `aggregate` opening a change stream on `db.c` at `at`: its error code, or 0.
async fn start_at(s: &Shard, at: ClusterTime) -> i32 {
    let reply = run(
        s,
        "db",
        doc! {
            "aggregate": "c",
            "pipeline": [{"$changeStream": {"startAtOperationTime": Bson::Timestamp(at.timestamp())}}],
            "cursor": {},
        },
    )
    .await;
    reply.get_i32("code").unwrap_or(0)
}

#[tokio::test]
async fn a_copy_put_back_within_the_reservation_window_refuses_all_the_lost_run_reached() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let copy = dir.path().join("copy");
    let clock = Arc::new(ManualClock::new(1_000_000_000_000));

    let s = Shard::open(options(&data, clock.clone())).await.unwrap();
    ok(&s, "db", doc! {"insert": "c", "documents": [{"_id": 0}]}).await;
    s.shutdown().await;
    drop(s);
    copy_dir(&data, &copy);

    // The run that will be lost: same second, its clock starts at the copy's reservation.
    let s = Shard::open(options(&data, clock.clone())).await.unwrap();
    ok(
        &s,
        "db",
        doc! {"insert": "c", "documents": [{"_id": 1}, {"_id": 2}]},
    )
    .await;
    let reached = newest(&lineage(&s).await);
    s.shutdown().await;
    drop(s);

    // The copy put back, still in the same second.
    std::fs::remove_dir_all(&data).unwrap();
    copy_dir(&copy, &data);
    let s = Shard::open(options(&data, clock.clone())).await.unwrap();
    let before = lineage(&s).await;
    assert!(
        newest(&before) < reached,
        "the restored data does not have the lost run's entries"
    );
    // Its clock starts inside the lost run's times: not yet known lost, the time is taken.
    assert_eq!(
        start_at(&s, reached).await,
        0,
        "inside the window, before the router knows"
    );

    // The router marks the boot lost, with how far the history had reached.
    let marked = ok(
        &s,
        "admin",
        doc! {"_shardsvrMarkLineageLost": 1, "to": last_boot_to(&before), "reached": Bson::Timestamp(reached.timestamp())},
    )
    .await;
    assert!(marked.get_bool("changed").unwrap());
    assert_eq!(start_at(&s, reached).await, 286, "the lost run's last time");
    assert!(
        s.state().cluster_time() > reached,
        "the clock is fenced past the lost run"
    );
    // What this run writes now has times of its own, past the fence, and streams from there.
    let reply = ok(&s, "db", doc! {"insert": "c", "documents": [{"_id": 3}]}).await;
    let written = ClusterTime::from(reply.get_timestamp("operationTime").unwrap());
    assert!(written > reached, "{written} after {reached}");
    assert_eq!(start_at(&s, written).await, 0);
    s.shutdown().await;
}

/// A mark is a writer job, one at a time: of concurrent marks of a boot exactly one changes
/// it, marks of two boots racing both hold, in memory and in storage (a restart still has
/// them).
#[tokio::test]
async fn racing_marks_each_change_a_boot_once_and_all_of_them_are_stored() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let clock = Arc::new(ManualClock::new(1_000_000_000_000));
    // Three runs, a minute apart: the second and the third are boots.
    for _ in 0..2 {
        let s = Shard::open(options(&data, clock.clone())).await.unwrap();
        ok(&s, "db", doc! {"insert": "c", "documents": [{}]}).await;
        s.shutdown().await;
        drop(s);
        clock.advance(60_000);
    }
    let s = Shard::open(options(&data, clock.clone())).await.unwrap();
    let boots = |reply: &Document| -> Vec<(Bson, bool)> {
        let lineage = reply.get_document("lineage").unwrap();
        let boots = lineage.get_array("boots").unwrap();
        boots
            .iter()
            .map(|b| {
                let b = b.as_document().unwrap();
                (b.get("to").cloned().unwrap(), b.get_bool("lost").unwrap())
            })
            .collect()
    };
    let before = boots(&lineage(&s).await);
    assert_eq!(before.len(), 2, "{before:?}");
    assert!(before.iter().all(|(_, lost)| !lost));

    let mut marks = Vec::new();
    for i in 0..8 {
        let (s, to) = (s.clone(), before[i % 2].0.clone());
        marks.push(tokio::spawn(async move {
            let reply = ok(&s, "admin", doc! {"_shardsvrMarkLineageLost": 1, "to": to}).await;
            (i % 2, reply.get_bool("changed").unwrap())
        }));
    }
    let mut changed = [0, 0];
    for m in marks {
        let (boot, did) = m.await.unwrap();
        changed[boot] += usize::from(did);
    }
    assert_eq!(
        changed,
        [1, 1],
        "each boot was marked by exactly one of its marks"
    );
    let marked = boots(&lineage(&s).await);
    assert!(marked.iter().all(|(_, lost)| *lost), "{marked:?}");
    s.shutdown().await;
    drop(s);

    let s = Shard::open(options(&data, clock.clone())).await.unwrap();
    let after = boots(&lineage(&s).await);
    assert_eq!(&after[..2], &marked[..], "the marks were stored");
    s.shutdown().await;
}
