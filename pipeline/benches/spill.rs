//! What bounding a blocking stage's memory costs: documents through a `Spool` (in memory, and
//! past its limit to disk and back) and a `Sorter` (an in-memory sort, and an external one of
//! spilled runs), and a `$lookup` joining a chunk at a time (`lookup::join_each`).

// Fixed, known-valid inputs: a failure is a bug the bench should stop on.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use bson::{Document, doc};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use pipeline::agg::Pipeline;
use pipeline::agg::lookup::{self, Foreign};
use pipeline::agg::spill::{self, Purpose, Sorter, Spool};
use pipeline::expr::Env;

const DOCS: usize = 20_000;

/// `DOCS` documents of about 300 bytes, keys in a scrambled order.
fn docs() -> Vec<Document> {
    (0..DOCS as i64)
        .map(|i| doc! {"_id": i, "k": (i * 7_919) % DOCS as i64, "g": i % 100, "pad": "p".repeat(250)})
        .collect()
}

/// Runs `f` with the sort limit at `limit` bytes, then puts it back.
fn with_limit<R>(limit: usize, f: impl FnOnce() -> R) -> R {
    let old = spill::set_sort_limit(limit);
    let out = f();
    spill::set_sort_limit(old);
    out
}

fn spool(docs: Vec<Document>, limit: usize) -> usize {
    with_limit(limit, || {
        let mut s = Spool::new("bench", true);
        for d in docs {
            s.push(d).unwrap();
        }
        s.finish().unwrap().map(|d| d.unwrap().len()).sum()
    })
}

fn sort(docs: Vec<Document>, limit: usize) -> usize {
    with_limit(limit, || {
        let by_k = Arc::new(|a: &Document, b: &Document| {
            a.get_i64("k").unwrap().cmp(&b.get_i64("k").unwrap())
        });
        let mut s = Sorter::new(by_k, Purpose::Sort, true);
        for d in docs {
            s.push(d).unwrap();
        }
        s.finish().unwrap().map(|d| d.unwrap().len()).sum()
    })
}

fn bench(c: &mut Criterion) {
    let input = docs();
    let mut g = c.benchmark_group("spill");
    g.throughput(Throughput::Elements(DOCS as u64));
    g.sample_size(10);
    for (name, limit) in [("memory", usize::MAX), ("disk", 1 << 20)] {
        g.bench_function(format!("spool/{name}"), |b| {
            b.iter_batched(|| input.clone(), |d| spool(d, limit), BatchSize::LargeInput)
        });
        g.bench_function(format!("sort/{name}"), |b| {
            b.iter_batched(|| input.clone(), |d| sort(d, limit), BatchSize::LargeInput)
        });
    }
    // A sort of many runs (~1,000 at 16 KiB each): how its runs are merged on the way shows.
    g.bench_function("sort/many_runs", |b| {
        b.iter_batched(
            || input.clone(),
            |d| sort(d, 16 << 10),
            BatchSize::LargeInput,
        )
    });
    // A $lookup on localField/foreignField, 1,000 documents at a time against the 100 groups.
    let mut groups = Foreign::default();
    groups.insert(
        "groups",
        (0..100_i64)
            .map(|g| doc! {"_id": g, "name": format!("g{g}")})
            .collect(),
    );
    let env = Env {
        foreign: Some(Arc::new(groups)),
        ..Env::default()
    };
    let stage = Pipeline::parse(&[doc! {
        "$lookup": {"from": "groups", "localField": "g", "foreignField": "_id", "as": "j"}
    }])
    .unwrap()
    .stages()[0]
        .clone();
    g.bench_function("lookup/join_each", |b| {
        b.iter_batched(
            || input.clone(),
            |d| {
                let mut n = 0;
                for chunk in d.chunks(lookup::CHUNK_DOCS) {
                    let joined = lookup::join_each(&stage, chunk.to_vec(), &env)
                        .unwrap()
                        .unwrap();
                    n += joined.map(|d| d.unwrap().len()).sum::<usize>();
                }
                n
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
