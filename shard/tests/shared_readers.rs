//! Change-stream cursors with the same shard-side spec share one reader on the shard: they all
//! see every event, in order, whatever their start, and a cursor that lags past the reader's
//! log goes on by itself without losing or repeating an event.
#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use bson::{Bson, Document, doc};
use common::*;

fn open_stream(start: Option<(&str, Bson)>) -> Document {
    let mut spec = Document::new();
    if let Some((k, v)) = start {
        spec.insert(k, v);
    }
    doc! {"aggregate": "c", "pipeline": [{"$changeStream": spec}], "cursor": {"batchSize": 0}}
}

/// Reads a cursor until it has `n` events (getMores of at most `batch`).
async fn read(s: &shard::Shard, id: i64, n: usize, batch: i64) -> Vec<Document> {
    let mut out = Vec::new();
    while out.len() < n {
        let r = ok(
            s,
            "db",
            doc! {"getMore": id, "collection": "c", "batchSize": batch, "maxTimeMS": 200_i64},
        )
        .await;
        let cursor = r.get_document("cursor").unwrap();
        let batch = cursor.get_array("nextBatch").unwrap();
        assert!(
            !batch.is_empty() || out.len() < n,
            "stalled at {}",
            out.len()
        );
        out.extend(batch.iter().map(|e| e.as_document().unwrap().clone()));
    }
    out
}

fn ids(events: &[Document]) -> Vec<i64> {
    events
        .iter()
        .map(|e| {
            e.get_document("fullDocument")
                .unwrap()
                .get_i64("_id")
                .unwrap()
        })
        .collect()
}

async fn insert(s: &shard::Shard, from: i64, to: i64, pad: usize) {
    let docs: Vec<Document> = (from..to)
        .map(|i| doc! {"_id": i, "pad": "x".repeat(pad)})
        .collect();
    ok(s, "db", doc! {"insert": "c", "documents": docs}).await;
}

#[tokio::test]
async fn cursors_of_one_spec_share_a_reader_whatever_their_start() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(&s, "db", doc! {"create": "c"}).await;
    insert(&s, 0, 10, 10).await;
    let r = ok(&s, "db", open_stream(None)).await;
    let now = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    let first = ok(&s, "db", open_stream(None)).await;
    let also_now = first.get_document("cursor").unwrap().get_i64("id").unwrap();
    // A stream from the beginning: it reads the first ten by itself, then joins.
    let past = ok(
        &s,
        "db",
        open_stream(Some((
            "startAtOperationTime",
            Bson::Timestamp(bson::Timestamp {
                time: 0,
                increment: 1,
            }),
        ))),
    )
    .await;
    let past = past.get_document("cursor").unwrap().get_i64("id").unwrap();
    insert(&s, 10, 20, 10).await;
    assert_eq!(
        ids(&read(&s, now, 10, 1000).await),
        (10..20).collect::<Vec<_>>()
    );
    assert_eq!(
        ids(&read(&s, also_now, 10, 3).await),
        (10..20).collect::<Vec<_>>()
    );
    assert_eq!(
        ids(&read(&s, past, 20, 7).await),
        (0..20).collect::<Vec<_>>()
    );
    assert_eq!(s.change_stream_readers(), 1, "one reader for the spec");
    // A different spec (a pushed-down $match) has a reader of its own.
    let filtered = doc! {"aggregate": "c", "pipeline": [{"$changeStream": {}}, {"$match": {"fullDocument._id": {"$gte": 25}}}], "cursor": {"batchSize": 0}};
    let filtered = ok(&s, "db", filtered).await;
    let filtered = filtered
        .get_document("cursor")
        .unwrap()
        .get_i64("id")
        .unwrap();
    insert(&s, 20, 30, 10).await;
    assert_eq!(
        ids(&read(&s, filtered, 5, 100).await),
        (25..30).collect::<Vec<_>>()
    );
    for id in [now, also_now, past] {
        assert_eq!(
            ids(&read(&s, id, 10, 100).await),
            (20..30).collect::<Vec<_>>()
        );
    }
    assert_eq!(s.change_stream_readers(), 2);
    s.shutdown().await;
}

#[tokio::test]
async fn a_cursor_that_lags_past_the_log_goes_on_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path()).await;
    ok(&s, "db", doc! {"create": "c"}).await;
    let open_id = |r: Document| r.get_document("cursor").unwrap().get_i64("id").unwrap();
    let reader = open_id(ok(&s, "db", open_stream(None)).await);
    let laggard = open_id(ok(&s, "db", open_stream(None)).await);
    // Both join the reader with their first getMore.
    insert(&s, 0, 1, 10).await;
    read(&s, reader, 1, 10).await;
    read(&s, laggard, 1, 10).await;
    // 12 MiB of events (more than the reader's log keeps) while the laggard does not read.
    for chunk in 0..12 {
        insert(&s, 1 + chunk * 16, 1 + (chunk + 1) * 16, 64 * 1024).await;
        read(&s, reader, 16, 1000).await;
    }
    let all = read(&s, laggard, 192, 50).await;
    assert_eq!(
        ids(&all),
        (1..193).collect::<Vec<_>>(),
        "in order, none lost or repeated"
    );
    s.shutdown().await;
}
