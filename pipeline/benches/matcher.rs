//! Matching a typical filter against a typical document, and a typical pipeline.

// Fixed, known-valid inputs: a failure to parse them is a bug the bench should stop on.
#![allow(clippy::unwrap_used)]

use bson::doc;
use criterion::{Criterion, black_box, criterion_group, criterion_main};
use pipeline::Matcher;
use pipeline::agg::Pipeline;

fn typical_doc() -> bson::Document {
    doc! {
        "_id": bson::oid::ObjectId::from_bytes([7; 12]),
        "status": "active",
        "age": 37,
        "name": {"first": "Ada", "last": "Lovelace"},
        "tags": ["math", "engines", "poetry"],
        "orders": [
            {"sku": "a1", "qty": 2, "price": 9.5},
            {"sku": "b2", "qty": 1, "price": 120.0},
        ],
        "created": bson::DateTime::from_millis(1_700_000_000_000),
    }
}

fn bench(c: &mut Criterion) {
    let d = typical_doc();
    let m = Matcher::parse(&doc! {
        "status": "active",
        "age": {"$gte": 18, "$lt": 65},
        "tags": {"$in": ["poetry", "music"]},
        "orders.qty": {"$gt": 1},
    })
    .unwrap();
    assert!(m.matches(&d));
    c.bench_function("matcher/typical", |b| {
        b.iter(|| black_box(&m).matches(black_box(&d)))
    });

    let re = Matcher::parse(&doc! {"name.last": {"$regex": "^love", "$options": "i"}}).unwrap();
    c.bench_function("matcher/regex", |b| {
        b.iter(|| black_box(&re).matches(black_box(&d)))
    });

    let ex = Matcher::parse(&doc! {"$expr": {"$gt": [{"$size": "$orders"}, 1]}}).unwrap();
    c.bench_function("matcher/expr", |b| {
        b.iter(|| black_box(&ex).matches(black_box(&d)))
    });

    // The same filter and a string sort, without and with a collation (`en`, strength 2):
    // what comparing strings through ICU costs over comparing bytes.
    let collated = pipeline::expr::Env {
        collation: pipeline::collation::Collation::parse_doc(&doc! {"locale": "en", "strength": 2})
            .unwrap(),
        ..pipeline::expr::Env::default()
    };
    let simple = pipeline::expr::Env::default();
    for (name, env) in [("simple", &simple), ("en-2", &collated)] {
        c.bench_function(&format!("matcher/typical/collation={name}"), |b| {
            b.iter(|| black_box(&m).try_matches_in(black_box(&d), env).unwrap())
        });
    }
    let words: Vec<bson::Document> = (0..10_000_u32)
        .map(|i| doc! {"w": format!("{}{:x}", ["Ab", "ab", "Zz", "é"][(i % 4) as usize], i.wrapping_mul(2_654_435_761))})
        .collect();
    let sort = pipeline::sort::SortSpec::parse(&doc! {"w": 1}).unwrap();
    for (name, env) in [("simple", &simple), ("en-2", &collated)] {
        c.bench_function(&format!("sort/strings=10000/collation={name}"), |b| {
            b.iter(|| {
                let mut docs = words.clone();
                sort.sort_in(&mut docs, env.collation.as_ref());
                docs
            })
        });
    }

    let p = Pipeline::parse(&[
        doc! {"$match": {"status": "active"}},
        doc! {"$addFields": {"total": {"$sum": "$orders.price"}}},
        doc! {"$project": {"name": 1, "total": 1}},
    ])
    .unwrap();
    let docs: Vec<bson::Document> = (0..100).map(|_| typical_doc()).collect();
    c.bench_function("pipeline/docs=100", |b| {
        b.iter(|| p.run(black_box(docs.clone())).unwrap())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
