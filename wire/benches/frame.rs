//! Decode and encode of typical OP_MSG frames: an insert with one 1 KiB document in the body, and
//! an insert with a 100-document kind-1 sequence; plain and zstd-compressed.
//!
//! Names: `frame/decode/<shape>/<compressor>` and `frame/encode/<shape>/<compressor>`.
//! `cargo bench -p wire --bench frame -- --test` runs each once (CI keeps them compiling).

#![allow(clippy::unwrap_used)] // benches may unwrap like tests

use bson::{RawDocumentBuf, rawdoc};
use bytes::BytesMut;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wire::frame::{decode, encode, encode_to_vec};
use wire::message::{Compressor, DocumentSequence, Message, Op, OpMsg};

fn document(i: i32, payload: usize) -> RawDocumentBuf {
    rawdoc! {
        "_id": i,
        "name": format!("user-{i}"),
        "tags": ["a", "b", "c"],
        "pad": "x".repeat(payload),
    }
}

fn shapes() -> Vec<(&'static str, Message)> {
    let insert_1k = rawdoc! {
        "insert": "coll",
        "documents": [document(1, 1000)],
        "ordered": true,
        "$db": "bench",
    };
    let mut seq = OpMsg::new(rawdoc! { "insert": "coll", "ordered": true, "$db": "bench" });
    seq.sequences.push(DocumentSequence {
        identifier: "documents".into(),
        documents: (0..100).map(|i| document(i, 100)).collect(),
    });
    vec![
        ("insert_1KiB", Message::msg(1, insert_1k)),
        (
            "insert_seq_100",
            Message {
                request_id: 2,
                response_to: 0,
                compressor: None,
                op: Op::Msg(seq),
            },
        ),
    ]
}

fn bench(c: &mut Criterion) {
    for (shape, base) in shapes() {
        for compressor in [None, Some(Compressor::Zstd)] {
            let m = Message {
                compressor,
                ..base.clone()
            };
            let bytes = encode_to_vec(&m).unwrap();
            let param = format!("{shape}/{}", compressor.map_or("none", |c| c.name()));

            let mut group = c.benchmark_group("frame/decode");
            group.throughput(Throughput::Bytes(bytes.len() as u64));
            group.bench_with_input(BenchmarkId::from_parameter(&param), &bytes, |b, bytes| {
                b.iter(|| decode(bytes).unwrap())
            });
            group.finish();

            let mut group = c.benchmark_group("frame/encode");
            group.throughput(Throughput::Bytes(bytes.len() as u64));
            group.bench_with_input(BenchmarkId::from_parameter(&param), &m, |b, m| {
                let mut buf = BytesMut::with_capacity(bytes.len());
                b.iter(|| {
                    buf.clear();
                    encode(m, &mut buf).unwrap();
                })
            });
            group.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
