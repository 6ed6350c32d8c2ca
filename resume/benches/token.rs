//! Resume-token encode/decode throughput for a typical v2 insert token
//! (`{operationType: "insert", documentKey: {_id: ObjectId}}`), the hot path of every event.
//! Target: at least 5M tokens/s per core for `encode` and `decode` of the raw bytes.

use std::hint::black_box;

use bson::{Uuid, doc, oid::ObjectId};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use resume::{ClusterTime, ResumeToken, ResumeTokenData, TokenVersion, event_identifier};

fn insert_token() -> ResumeTokenData {
    let id = event_identifier(
        "insert",
        Some(("documentKey", doc! {"_id": ObjectId::from_bytes([7; 12])})),
    );
    ResumeTokenData::event(
        ClusterTime::new(1_700_000_000, 42),
        TokenVersion::V2,
        0,
        Some(Uuid::from_bytes([9; 16])),
        Some(id),
    )
    .expect("valid token")
}

fn bench(c: &mut Criterion) {
    let data = insert_token();
    let token = data.encode();
    let wire = token.to_document();
    let hwm =
        ResumeTokenData::high_water_mark(ClusterTime::new(1_700_000_000, 42), TokenVersion::V2);

    let mut g = c.benchmark_group("token");
    g.throughput(Throughput::Elements(1));
    g.bench_function("encode/insert_oid", |b| {
        b.iter(|| black_box(&data).encode())
    });
    g.bench_function("decode/insert_oid", |b| {
        b.iter(|| black_box(&token).decode().expect("decodes"))
    });
    g.bench_function("encode/high_water_mark", |b| {
        b.iter(|| black_box(&hwm).encode())
    });
    g.bench_function("to_document/insert_oid", |b| {
        b.iter(|| black_box(&data).encode().to_document())
    });
    g.bench_function("to_raw_document/insert_oid", |b| {
        b.iter(|| black_box(&data).encode().to_raw_document())
    });
    g.bench_function("build_and_encode/insert_oid", |b| {
        b.iter(|| black_box(insert_token()).encode())
    });
    let key = doc! {"_id": ObjectId::from_bytes([7; 12])};
    g.bench_function("event_from_parts_and_encode/insert_oid", |b| {
        b.iter(|| {
            ResumeTokenData::event_from_parts(
                ClusterTime::new(1_700_000_000, 42),
                TokenVersion::V2,
                0,
                Some(Uuid::from_bytes([9; 16])),
                "insert",
                Some(("documentKey", black_box(&key))),
            )
            .expect("valid token")
            .encode()
        })
    });
    g.bench_function("from_document/insert_oid", |b| {
        b.iter(|| ResumeToken::from_document(black_box(&wire)).and_then(|t| t.decode()))
    });
    g.bench_function("cmp/insert_oid", |b| {
        let other = token.clone();
        b.iter(|| black_box(&token).cmp(black_box(&other)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
