//! Change-stream hot paths: the shard's match + transform of CRUD entries (events/s), from
//! decoded entries (`shard/insert`, `shard/update`) and from their stored bytes to the event's
//! bytes (`shard/*_encoded`, what a shard cursor runs), and the router's merge over N shards
//! (`merge/shards=N`).

use std::hint::black_box;

use bson::{Binary, Bson, DateTime, Document, RawDocumentBuf, Timestamp, doc, spec::BinarySubtype};
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use pipeline::changestream::ChangeEvent;
use pipeline::changestream::merge::Merger;
use pipeline::changestream::shard::ShardStream;
use pipeline::changestream::spec::{ChangeStreamSpec, StreamLevel};
use pipeline::changestream::unwind::OpTime;
use resume::ClusterTime;
use resume::token::{ResumeToken, ResumeTokenData, TokenVersion};

const N: u32 = 1000;

fn ts(secs: u32) -> Bson {
    Bson::Timestamp(Timestamp {
        time: secs,
        increment: 1,
    })
}

fn ui() -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::Uuid,
        bytes: vec![7; 16],
    })
}

fn inserts() -> Vec<Document> {
    (0..N)
        .map(|i| {
            doc! {"ts": ts(1000 + i), "t": 1_i64, "v": 2, "op": "i", "ns": "db.c", "ui": ui(),
            "o": {"_id": i64::from(i), "name": "widget", "qty": i, "tags": ["a", "b"]},
            "o2": {"_id": i64::from(i)}, "wall": DateTime::from_millis(i64::from(i))}
        })
        .collect()
}

fn updates() -> Vec<Document> {
    (0..N)
        .map(|i| {
            doc! {"ts": ts(1000 + i), "t": 1_i64, "v": 2, "op": "u", "ns": "db.c", "ui": ui(),
                  "o": {"$v": 2, "diff": {"u": {"qty": i}, "d": {"old": false}, "stags": {"a": true, "u2": "c"}}},
                  "o2": {"_id": i64::from(i)}, "wall": DateTime::from_millis(i64::from(i))}
        })
        .collect()
}

fn shard_side(c: &mut Criterion) {
    let spec = ChangeStreamSpec::new(StreamLevel::Collection, "db", Some("c"));
    let mut g = c.benchmark_group("shard");
    g.throughput(Throughput::Elements(u64::from(N)));
    for (name, entries) in [("insert", inserts()), ("update", updates())] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut s = ShardStream::new(spec.clone(), vec![]);
                let mut lookup = |_: OpTime| None;
                let mut n = 0;
                for e in &entries {
                    n += s
                        .process_entry(e, &mut lookup)
                        .map(|v| v.len())
                        .unwrap_or(0);
                }
                black_box(n)
            })
        });
    }
    // What a shard does with each entry it reads: from its stored bytes to the event's bytes.
    for (name, entries) in [("insert_encoded", inserts()), ("update_encoded", updates())] {
        let stored: Vec<RawDocumentBuf> = entries
            .iter()
            .map(|e| RawDocumentBuf::try_from(e).unwrap_or_default())
            .collect();
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut s = ShardStream::new(spec.clone(), vec![]);
                let mut n = 0;
                for e in &stored {
                    n += s.process_encoded(e).ok().flatten().map_or(0, |v| v.len());
                }
                black_box(n)
            })
        });
    }
    g.finish();
}

fn merge(c: &mut Criterion) {
    let mut g = c.benchmark_group("merge");
    for shards in [1usize, 3, 8] {
        // Each shard gets N/shards events at interleaved times, in batches of 50.
        let per: Vec<Vec<Vec<ChangeEvent>>> = (0..shards)
            .map(|s| {
                let events: Vec<_> = (0..N as usize / shards)
                    .map(|i| {
                        let secs = (i * shards + s) as u32 + 1;
                        let data = ResumeTokenData::event(
                            ClusterTime::new(secs, 1),
                            TokenVersion::V2,
                            0,
                            Some(bson::Uuid::from_bytes([7; 16])),
                            Some(doc! {"operationType": "insert", "documentKey": {"_id": secs as i32}}),
                        )
                        .unwrap_or_else(|_| unreachable!());
                        let token = data.encode();
                        let doc = doc! {"_id": token.to_document(), "operationType": "insert"};
                        ChangeEvent { token, data, doc }
                    })
                    .collect();
                events.chunks(50).map(<[_]>::to_vec).collect()
            })
            .collect();
        let total: usize = per.iter().flatten().map(Vec::len).sum();
        g.throughput(Throughput::Elements(total as u64));
        // Batches with their promises, built outside the timed loop.
        let with_promises: Vec<Vec<(Vec<ChangeEvent>, ResumeToken)>> = per
            .iter()
            .map(|batches| {
                batches
                    .iter()
                    .map(|b| {
                        let last = b.last().map_or(0, |e| e.data.cluster_time().secs);
                        let promise = ResumeTokenData::high_water_mark(
                            ClusterTime::new(last + 1, 0),
                            TokenVersion::V2,
                        )
                        .encode();
                        (b.clone(), promise)
                    })
                    .collect()
            })
            .collect();
        g.bench_with_input(
            BenchmarkId::from_parameter(format!("shards={shards}")),
            &with_promises,
            |b, input| {
                b.iter_batched(
                    || input.clone(),
                    |input| {
                        let mut m = Merger::new(shards, None);
                        let mut out = 0;
                        let rounds = input.iter().map(Vec::len).max().unwrap_or(0);
                        let mut its: Vec<_> = input.into_iter().map(Vec::into_iter).collect();
                        for _ in 0..rounds {
                            for (s, it) in its.iter_mut().enumerate() {
                                if let Some((batch, promise)) = it.next() {
                                    let _ = m.push_batch(s, batch, promise);
                                }
                            }
                            while m.pop_ready().is_some() {
                                out += 1;
                            }
                        }
                        black_box(out)
                    },
                    BatchSize::LargeInput,
                )
            },
        );
    }
    g.finish();
}

criterion_group!(benches, shard_side, merge);
criterion_main!(benches);
