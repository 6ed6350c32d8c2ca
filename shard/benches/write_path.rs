//! The durable write path: single-document inserts (sequential, and concurrent so the writer
//! group-commits them) and batches of 100 documents per command, on both engines in the same
//! run: `wal` (redb behind the write-ahead log, `LocalLog`, what shards run on: one log append
//! and `fdatasync` per commit) and `redb` (every commit durable through redb itself).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{Bson, doc};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use shard::log::{LocalLog, Log, Unlogged};
use shard::storage::RedbStorage;
use shard::{Shard, ShardOptions, SystemClock};

fn open(rt: &tokio::runtime::Runtime, dir: &std::path::Path, engine: &str) -> Arc<Shard> {
    let path = dir.join("bench.redb");
    let (storage, log): (_, Arc<dyn Log>) = match engine {
        "wal" => {
            let redb = Arc::new(RedbStorage::open_behind_log(&path).expect("open"));
            let log = LocalLog::open(&path, redb.clone()).expect("open log");
            (redb, Arc::new(log))
        }
        _ => (
            Arc::new(RedbStorage::open(&path).expect("open")),
            Arc::new(Unlogged),
        ),
    };
    let opts = ShardOptions {
        dbpath: dir.to_path_buf(),
        name: "bench".into(),
        clock: Arc::new(SystemClock),
    };
    rt.block_on(Shard::open_with_storage(opts, storage, log))
        .expect("open")
}

fn insert_cmd(first_id: i64, n: i64) -> bson::Document {
    let docs: Vec<Bson> = (first_id..first_id + n)
        .map(|i| Bson::Document(doc! {"_id": i, "payload": "x".repeat(200)}))
        .collect();
    doc! {"insert": "c", "documents": docs, "$db": "bench"}
}

fn write_path(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    fdatasync(c);
    for engine in ["wal", "redb"] {
        engine_group(c, &rt, engine);
    }
}

/// The floor under any durable commit: a 300-byte write into a file's existing blocks and an
/// `fdatasync`, as the write-ahead log does, on the same disk as the engines' files.
fn fdatasync(c: &mut Criterion) {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = std::fs::File::create(dir.path().join("sync")).expect("file");
    file.set_len(0).expect("len");
    file.write_all_at(&vec![0u8; 4 << 20], 0).expect("fill");
    file.sync_all().expect("sync");
    let record = [b'x'; 300];
    let mut at = 0u64;
    let mut group = c.benchmark_group("write_path");
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_millis(500));
    group.sample_size(10);
    group.bench_function("fdatasync/300B", |b| {
        b.iter(|| {
            file.write_all_at(&record, at).expect("write");
            file.sync_data().expect("fdatasync");
            at = (at + 300) % (4 << 20);
        })
    });
    group.finish();
}

fn engine_group(c: &mut Criterion, rt: &tokio::runtime::Runtime, engine: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let shard = open(rt, dir.path(), engine);
    let mut next_id: i64 = 0;
    let mut group = c.benchmark_group(format!("write_path/{engine}"));
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_millis(500));
    group.sample_size(10);

    group.throughput(Throughput::Elements(1));
    group.bench_function("single_insert/concurrency=1", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            rt.block_on(async {
                for _ in 0..iters {
                    let r = shard.run_command(insert_cmd(next_id, 1)).await;
                    next_id += 1;
                    assert_eq!(r.get_i32("n").ok(), Some(1));
                }
            });
            start.elapsed()
        })
    });

    for concurrency in [16_i64, 64] {
        group.throughput(Throughput::Elements(concurrency as u64));
        group.bench_function(format!("single_insert/concurrency={concurrency}"), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                rt.block_on(async {
                    for _ in 0..iters {
                        let mut tasks = Vec::new();
                        for k in 0..concurrency {
                            let s = shard.clone();
                            let id = next_id + k;
                            tasks.push(tokio::spawn(async move {
                                s.run_command(insert_cmd(id, 1)).await
                            }));
                        }
                        next_id += concurrency;
                        for t in tasks {
                            let r = t.await.expect("task");
                            assert_eq!(r.get_i32("n").ok(), Some(1));
                        }
                    }
                });
                start.elapsed()
            })
        });
    }

    group.throughput(Throughput::Elements(100));
    group.bench_function("insert_batch/docs=100", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            rt.block_on(async {
                for _ in 0..iters {
                    let r = shard.run_command(insert_cmd(next_id, 100)).await;
                    next_id += 100;
                    assert_eq!(r.get_i32("n").ok(), Some(100));
                }
            });
            start.elapsed()
        })
    });
    group.finish();
    rt.block_on(shard.shutdown());
}

criterion_group!(benches, write_path);
criterion_main!(benches);
