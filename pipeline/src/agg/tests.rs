//! Stage-by-stage tests: each runs a small pipeline over fixed input and checks the output.

use bson::{Bson, Document, doc};

use super::*;

fn run(stages: Vec<Document>, input: Vec<Document>) -> Vec<Document> {
    Pipeline::parse(&stages)
        .unwrap_or_else(|e| panic!("{stages:?}: {e}"))
        .run(input)
        .unwrap()
}

fn people() -> Vec<Document> {
    vec![
        doc! {"_id": 1, "name": "ann", "dept": "eng", "age": 30, "tags": ["a", "b"]},
        doc! {"_id": 2, "name": "bob", "dept": "ops", "age": 40, "tags": []},
        doc! {"_id": 3, "name": "cy", "dept": "eng", "age": 25.0},
        doc! {"_id": 4, "name": "di", "dept": "eng", "age": 35, "tags": "solo"},
    ]
}

#[test]
fn count_documents_pipeline_from_drivers_works() {
    let out = run(
        vec![
            doc! {"$match": {"dept": "eng"}},
            doc! {"$skip": 1},
            doc! {"$limit": 5},
            doc! {"$group": {"_id": 1, "n": {"$sum": 1}}},
        ],
        people(),
    );
    assert_eq!(out, vec![doc! {"_id": 1, "n": 2}]);
    let none = run(
        vec![
            doc! {"$match": {"dept": "x"}},
            doc! {"$group": {"_id": 1, "n": {"$sum": 1}}},
        ],
        people(),
    );
    assert!(none.is_empty());
}

#[test]
fn group_accumulators() {
    let out = run(
        vec![
            doc! {"$group": {
                "_id": "$dept",
                "total": {"$sum": "$age"},
                "avg": {"$avg": "$age"},
                "min": {"$min": "$age"},
                "max": {"$max": "$age"},
                "first": {"$first": "$name"},
                "last": {"$last": "$name"},
                "names": {"$push": "$name"},
                "depts": {"$addToSet": "$dept"},
                "n": {"$count": {}},
            }},
            doc! {"$sort": {"_id": 1}},
        ],
        people(),
    );
    assert_eq!(
        out,
        vec![
            doc! {"_id": "eng", "total": 90.0, "avg": 30.0, "min": 25.0, "max": 35,
            "first": "ann", "last": "di", "names": ["ann", "cy", "di"],
            "depts": ["eng"], "n": 3},
            doc! {"_id": "ops", "total": 40, "avg": 40.0, "min": 40, "max": 40,
            "first": "bob", "last": "bob", "names": ["bob"], "depts": ["ops"], "n": 1},
        ]
    );
}

#[test]
fn group_by_null_document_and_numerically_equal_keys() {
    let out = run(
        vec![doc! {"$group": {"_id": null, "n": {"$sum": 1}}}],
        people(),
    );
    assert_eq!(out, vec![doc! {"_id": null, "n": 4}]);
    let out = run(
        vec![
            doc! {"$group": {"_id": {"d": "$dept", "old": {"$gte": ["$age", 30]}}, "n": {"$sum": 1}}},
        ],
        people(),
    );
    assert_eq!(out.len(), 3);
    assert_eq!(out[0], doc! {"_id": {"d": "eng", "old": true}, "n": 2});
    let out = run(
        vec![doc! {"$group": {"_id": "$k"}}],
        vec![doc! {"k": 1}, doc! {"k": 1.0}, doc! {"k": 1i64}, doc! {}],
    );
    assert_eq!(out, vec![doc! {"_id": 1}, doc! {"_id": null}]);
}

#[test]
fn unwind_string_and_document_forms() {
    let out = run(
        vec![doc! {"$unwind": "$tags"}, doc! {"$project": {"tags": 1}}],
        people(),
    );
    assert_eq!(
        out,
        vec![
            doc! {"_id": 1, "tags": "a"},
            doc! {"_id": 1, "tags": "b"},
            doc! {"_id": 4, "tags": "solo"},
        ]
    );
    let out = run(
        vec![
            doc! {"$unwind": {"path": "$tags", "includeArrayIndex": "i", "preserveNullAndEmptyArrays": true}},
            doc! {"$project": {"tags": 1, "i": 1}},
        ],
        people(),
    );
    assert_eq!(
        out,
        vec![
            doc! {"_id": 1, "tags": "a", "i": 0i64},
            doc! {"_id": 1, "tags": "b", "i": 1i64},
            doc! {"_id": 2, "i": Bson::Null},
            doc! {"_id": 3, "i": Bson::Null},
            doc! {"_id": 4, "tags": "solo", "i": Bson::Null},
        ]
    );
}

#[test]
fn shape_stages() {
    let d = vec![doc! {"_id": 1, "a": {"b": 2}, "c": 3}];
    assert_eq!(
        run(
            vec![doc! {"$project": {"c": 1, "x": {"$add": ["$c", 1]}}}],
            d.clone()
        ),
        vec![doc! {"_id": 1, "c": 3, "x": 4}]
    );
    assert_eq!(
        run(vec![doc! {"$set": {"c": 9, "a.z": 1}}], d.clone()),
        vec![doc! {"_id": 1, "a": {"b": 2, "z": 1}, "c": 9}]
    );
    assert_eq!(
        run(vec![doc! {"$addFields": {"n": "$a.b"}}], d.clone()),
        vec![doc! {"_id": 1, "a": {"b": 2}, "c": 3, "n": 2}]
    );
    assert_eq!(
        run(vec![doc! {"$unset": ["c", "a.b"]}], d.clone()),
        vec![doc! {"_id": 1, "a": {}}]
    );
    assert_eq!(
        run(vec![doc! {"$unset": "c"}], d.clone()),
        vec![doc! {"_id": 1, "a": {"b": 2}}]
    );
    assert_eq!(
        run(vec![doc! {"$replaceRoot": {"newRoot": "$a"}}], d.clone()),
        vec![doc! {"b": 2}]
    );
    assert_eq!(
        run(
            vec![doc! {"$replaceWith": {"$mergeObjects": ["$a", {"q": 1}]}}],
            d.clone()
        ),
        vec![doc! {"b": 2, "q": 1}]
    );
    let e = Pipeline::parse(&[doc! {"$replaceWith": "$c"}])
        .unwrap()
        .run(d)
        .unwrap_err();
    assert_eq!(e.code, 40228);
}

#[test]
fn sort_limit_skip_count_sort_by_count() {
    let ids = |v: Vec<Document>| {
        v.into_iter()
            .map(|d| d.get("_id").cloned().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids(run(
            vec![
                doc! {"$sort": {"age": -1}},
                doc! {"$skip": 1},
                doc! {"$limit": 2}
            ],
            people()
        )),
        vec![Bson::Int32(4), Bson::Int32(1)]
    );
    assert_eq!(
        run(vec![doc! {"$count": "n"}], people()),
        vec![doc! {"n": 4}]
    );
    assert!(run(vec![doc! {"$count": "n"}], vec![]).is_empty());
    assert_eq!(
        run(vec![doc! {"$sortByCount": "$dept"}], people()),
        vec![
            doc! {"_id": "eng", "count": 3},
            doc! {"_id": "ops", "count": 1}
        ]
    );
}

#[test]
fn redact_descends_prunes_and_keeps() {
    let input = vec![doc! {
        "_id": 1, "level": 1,
        "sub": {"level": 5, "secret": 1},
        "list": [{"level": 1, "x": 1}, {"level": 9}],
    }];
    let out = run(
        vec![doc! {"$redact": {"$cond": [{"$gt": ["$level", 3]}, "$$PRUNE", "$$DESCEND"]}}],
        input,
    );
    assert_eq!(
        out,
        vec![doc! {"_id": 1, "level": 1, "list": [{"level": 1, "x": 1}]}]
    );
    let e = Pipeline::parse(&[doc! {"$redact": "x"}])
        .unwrap()
        .run(vec![doc! {}])
        .unwrap_err();
    assert_eq!(e.code, 17053);
}

#[test]
fn single_document_stages_apply_one_at_a_time_like_a_batch() {
    let stages = vec![
        doc! {"$match": {"age": {"$gte": 30}}},
        doc! {"$addFields": {"senior": {"$gt": ["$age", 32]}}},
        doc! {"$project": {"name": 1, "senior": 1}},
    ];
    let p = Pipeline::parse(&stages).unwrap();
    assert!(p.is_single_document_transform());
    let batch = p.run(people()).unwrap();
    let mut one_by_one = Vec::new();
    for d in people() {
        let mut cur = Some(d);
        for s in p.stages() {
            cur = match cur {
                Some(d) => s.apply_one(d).unwrap(),
                None => None,
            };
        }
        one_by_one.extend(cur);
    }
    assert_eq!(batch, one_by_one);
    assert!(
        !Stage::parse(&doc! {"$group": {"_id": 1}})
            .unwrap()
            .is_single_document_transform()
    );
}

#[test]
fn parse_errors_carry_mongodb_codes() {
    let cases: Vec<(Document, i32)> = vec![
        (doc! {"$foo": 1}, 40324),
        (doc! {"$match": {}, "$limit": 1}, 40323),
        (doc! {}, 40323),
        (doc! {"$limit": 0}, 15958),
        (doc! {"$limit": -1}, 15958),
        (doc! {"$limit": "x"}, 15957),
        (doc! {"$skip": -1}, 15956),
        (doc! {"$skip": "x"}, 15972),
        (doc! {"$count": 1}, 40156),
        (doc! {"$count": ""}, 40157),
        (doc! {"$count": "$x"}, 40158),
        (doc! {"$count": "a.b"}, 40160),
        (doc! {"$match": 1}, 15959),
        (doc! {"$sort": {}}, 15976),
        (doc! {"$sort": {"a": 3}}, 15975),
        (doc! {"$group": {"n": {"$sum": 1}}}, 15955),
        (doc! {"$group": {"_id": 1, "n": {"$foo": 1}}}, 15952),
        (doc! {"$group": {"_id": 1, "n": 1}}, 40234),
        (doc! {"$group": {"_id": 1, "a.b": {"$sum": 1}}}, 40235),
        (doc! {"$unwind": "tags"}, 28818),
        (doc! {"$unwind": {"path": "$a", "bogus": 1}}, 28811),
        (doc! {"$unwind": {}}, 28812),
        (doc! {"$unset": []}, 31119),
        (doc! {"$unset": [1]}, 31120),
        (doc! {"$project": {}}, 51272),
        (doc! {"$project": {"a": 1, "b": 0}}, 31254),
        (doc! {"$replaceRoot": {}}, 40414),
        (doc! {"$match": {"$expr": {"$nope": 1}}}, 168),
    ];
    for (spec, code) in cases {
        let e = Stage::parse(&spec).expect_err(&format!("{spec}"));
        assert_eq!(e.code, code, "{spec}: {e}");
    }
}

#[test]
fn now_and_let_variables_come_from_the_environment() {
    let vars = vec!["limit".to_string()];
    let p = Pipeline::parse_with_vars(
        &[
            doc! {"$match": {"$expr": {"$lt": ["$age", "$$limit"]}}},
            doc! {"$project": {"_id": 1, "at": "$$NOW"}},
        ],
        &vars,
    )
    .unwrap();
    let now = bson::DateTime::from_millis(1_000);
    let env = Env {
        now: Some(now),
        vars: vec![("limit".into(), Bson::Int32(30))],
        ..Env::default()
    };
    assert_eq!(
        p.run_in(people(), &env).unwrap(),
        vec![doc! {"_id": 3, "at": now}]
    );
    // Without the declaration the variable is undefined at parse time.
    let e = Pipeline::parse(&[doc! {"$match": {"$expr": "$$limit"}}]).unwrap_err();
    assert_eq!(e.code, 17276);
}

#[test]
fn bucket_groups_by_boundaries_and_sorts_by_bucket() {
    let out = run(
        vec![doc! {"$bucket": {"groupBy": "$age", "boundaries": [20, 30, 40], "default": "other"}}],
        people(),
    );
    assert_eq!(
        out,
        vec![
            doc! {"_id": 20, "count": 1},
            doc! {"_id": 30, "count": 2},
            doc! {"_id": "other", "count": 1},
        ]
    );
    let out = run(
        vec![doc! {"$bucket": {
            "groupBy": "$age", "boundaries": [0, 100],
            "output": {"names": {"$push": "$name"}}
        }}],
        people(),
    );
    assert_eq!(
        out,
        vec![doc! {"_id": 0, "names": ["ann", "bob", "cy", "di"]}]
    );
    let e = Pipeline::parse(&[doc! {"$bucket": {"groupBy": "$age", "boundaries": [0, 30]}}])
        .unwrap()
        .run(people())
        .unwrap_err();
    assert_eq!(e.code, 40066);
}

#[test]
fn facet_runs_sub_pipelines_over_the_same_input() {
    let out = run(
        vec![doc! {"$facet": {
            "n": [{"$count": "n"}],
            "eng": [{"$match": {"dept": "eng"}}, {"$project": {"_id": 1}}],
        }}],
        people(),
    );
    assert_eq!(
        out,
        vec![doc! {"n": [{"n": 4}], "eng": [{"_id": 1}, {"_id": 3}, {"_id": 4}]}]
    );
}

#[test]
fn bucket_facet_and_unsupported_stage_errors() {
    let cases: Vec<(Document, i32)> = vec![
        (doc! {"$bucket": {"groupBy": "$a"}}, 40198),
        (
            doc! {"$bucket": {"groupBy": "$a", "boundaries": [1]}},
            40192,
        ),
        (
            doc! {"$bucket": {"groupBy": "$a", "boundaries": [2, 1]}},
            40194,
        ),
        (
            doc! {"$bucket": {"groupBy": "$a", "boundaries": [1, "x"]}},
            40193,
        ),
        (
            doc! {"$bucket": {"groupBy": "$a", "boundaries": [1, 5], "default": 2}},
            40199,
        ),
        (
            doc! {"$bucket": {"groupBy": "a", "boundaries": [1, 5]}},
            40202,
        ),
        (
            doc! {"$bucket": {"groupBy": "$a", "boundaries": [1, 5], "x": 1}},
            40197,
        ),
        (doc! {"$facet": {}}, 40169),
        (doc! {"$facet": {"a": 1}}, 40170),
        (doc! {"$facet": {"a": [{"$facet": {"b": []}}]}}, 40600),
        (doc! {"$lookup": {"from": "x"}}, 9),
        (doc! {"$out": "x"}, 115),
    ];
    for (spec, code) in cases {
        let e = Stage::parse(&spec).expect_err(&format!("{spec}"));
        assert_eq!(e.code, code, "{spec}: {e}");
    }
}

fn parse_err_code(stage: Document) -> i32 {
    match Pipeline::parse(std::slice::from_ref(&stage)) {
        Ok(_) => panic!("{stage} parsed"),
        Err(e) => e.code,
    }
}

fn numbered(n: i32) -> Vec<Document> {
    (0..n).map(|i| doc! {"_id": i}).collect()
}

#[test]
fn sample_returns_min_of_size_and_input_distinct_documents() {
    for (size, n, want) in [(3, 10, 3), (10, 4, 4), (0, 5, 0), (5, 0, 0)] {
        let out = run(vec![doc! {"$sample": {"size": size}}], numbered(n));
        assert_eq!(out.len(), want, "size {size} of {n}");
        let mut seen: Vec<i32> = out.iter().map(|d| d.get_i32("_id").unwrap()).collect();
        assert!(seen.iter().all(|i| (0..n).contains(i)));
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), want, "no document twice");
    }
}

#[test]
fn sample_order_and_choice_are_random() {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    // Over many draws every document comes first at least once, and a full-size sample is
    // not always the input order.
    let mut firsts = std::collections::BTreeSet::new();
    let mut reordered = false;
    for _ in 0..200 {
        let out = sample::sample_with(numbered(5), 5, &mut rng);
        firsts.insert(out[0].get_i32("_id").unwrap());
        reordered |= out != numbered(5);
    }
    assert_eq!(firsts.len(), 5);
    assert!(reordered);
}

#[test]
fn a_sample_keeps_each_document_equally_often_and_holds_only_its_size() {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut counts = [0_u32; 100];
    for _ in 0..2_000 {
        let mut reservoir = sample::Reservoir::new(10);
        for d in numbered(100) {
            reservoir.offer(d, &mut rng);
        }
        for d in reservoir.finish(&mut rng) {
            counts[d.get_i32("_id").unwrap() as usize] += 1;
        }
    }
    // Each is kept 2,000 × 10 / 100 = 200 times on average (standard deviation ~13).
    assert!(counts.iter().all(|c| (140..=260).contains(c)), "{counts:?}");
    // Fed one document at a time under a 4 KiB limit: a sample of three holds three, while a
    // stage that must hold its input stops at the limit.
    let strict = Env::default();
    let three = Pipeline::parse(&[doc! {"$sample": {"size": 3}}]).unwrap();
    assert_eq!(pushed(&three, &strict, 4_096).unwrap().len(), 3);
    let bucket = Pipeline::parse(&[doc! {"$bucket": {
        "groupBy": "$x", "boundaries": [0, 1_000, 4_000], "output": {"all": {"$push": "$pad"}},
    }}])
    .unwrap();
    let e = pushed(&bucket, &strict, 4_096).expect_err("3,000 documents held");
    assert_eq!(e.code, 292, "{e}");
}

#[test]
fn a_sample_under_allow_disk_use_spills_and_is_still_uniform() {
    let disk = Env {
        allow_disk_use: true,
        ..Env::default()
    };
    // 2,000 of 3,000 documents of ~100 bytes through a 4 KiB limit: they go to disk.
    let before = spill::counters()
        .sort_spills
        .load(std::sync::atomic::Ordering::Relaxed);
    let big = Pipeline::parse(&[doc! {"$sample": {"size": 2_000}}]).unwrap();
    let out = pushed(&big, &disk, 4_096).unwrap();
    let ids: std::collections::HashSet<i32> =
        out.iter().map(|d| d.get_i32("_id").unwrap()).collect();
    assert_eq!((out.len(), ids.len()), (2_000, 2_000), "distinct documents");
    assert_eq!(out[0].get_str("pad").unwrap().len(), 40, "whole documents");
    let after = spill::counters()
        .sort_spills
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(after > before, "the sample spilled");
    // Each of 100 documents is in a sample of 10 equally often: 2,000 × 10 / 100 = 200 times
    // on average (standard deviation ~13).
    let ten = Pipeline::parse(&[doc! {"$sample": {"size": 10}}]).unwrap();
    let mut counts = [0_u32; 100];
    for _ in 0..2_000 {
        let mut run = ten.push_run(&disk);
        for d in numbered(100) {
            run.push(d).unwrap();
        }
        for d in run.finish().unwrap() {
            counts[d.unwrap().get_i32("_id").unwrap() as usize] += 1;
        }
    }
    assert!(counts.iter().all(|c| (140..=260).contains(c)), "{counts:?}");
}

#[test]
fn sample_parse_errors() {
    assert_eq!(parse_err_code(doc! {"$sample": 1}), 28745);
    assert_eq!(parse_err_code(doc! {"$sample": {"size": "1"}}), 28746);
    assert_eq!(parse_err_code(doc! {"$sample": {"size": -1}}), 28747);
    assert_eq!(parse_err_code(doc! {"$sample": {"size": 1, "x": 1}}), 28748);
    assert_eq!(parse_err_code(doc! {"$sample": {}}), 28749);
}

/// MongoDB's `$bucketAuto` documentation example: artwork prices.
fn artwork() -> Vec<Document> {
    [199.99, 280.0, 76.04, 167.30, 483.0, 385.0, 159.0, 118.42]
        .iter()
        .enumerate()
        .map(|(i, p)| doc! {"_id": i as i32 + 1, "price": *p})
        .collect()
}

#[test]
fn bucket_auto_chains_bounds_and_balances_counts() {
    let out = run(
        vec![doc! {"$bucketAuto": {"groupBy": "$price", "buckets": 4}}],
        artwork(),
    );
    assert_eq!(
        out,
        vec![
            doc! {"_id": {"min": 76.04, "max": 159.0}, "count": 2},
            doc! {"_id": {"min": 159.0, "max": 199.99}, "count": 2},
            doc! {"_id": {"min": 199.99, "max": 385.0}, "count": 2},
            doc! {"_id": {"min": 385.0, "max": 483.0}, "count": 2},
        ]
    );
}

#[test]
fn bucket_auto_keeps_equal_values_together_and_may_make_fewer_buckets() {
    let input: Vec<Document> = [1, 1, 1, 1, 2, 3].iter().map(|v| doc! {"v": *v}).collect();
    let out = run(
        vec![doc! {"$bucketAuto": {"groupBy": "$v", "buckets": 3,
        "output": {"n": {"$sum": 1}, "vs": {"$push": "$v"}}}}],
        input.clone(),
    );
    assert_eq!(
        out,
        vec![
            // round(6 / 3) = 2 per bucket, then the two equal 1s that follow.
            doc! {"_id": {"min": 1, "max": 2}, "n": 4, "vs": [1, 1, 1, 1]},
            doc! {"_id": {"min": 2, "max": 3}, "n": 2, "vs": [2, 3]},
        ]
    );
    // More buckets than distinct values: one bucket per run of equal values.
    let out = run(
        vec![doc! {"$bucketAuto": {"groupBy": "$v", "buckets": 10}}],
        input,
    );
    assert_eq!(out.len(), 3);
    assert_eq!(out[0], doc! {"_id": {"min": 1, "max": 2}, "count": 4});
    // Missing values group as null, below numbers.
    let out = run(
        vec![doc! {"$bucketAuto": {"groupBy": "$v", "buckets": 2}}],
        vec![doc! {"v": 5}, doc! {}],
    );
    assert_eq!(out[0], doc! {"_id": {"min": null, "max": 5}, "count": 1});
}

#[test]
fn bucket_auto_powers_of_two_granularity_rounds_the_bounds() {
    let input: Vec<Document> = [1, 3, 5, 9, 17, 33]
        .iter()
        .map(|v| doc! {"v": *v})
        .collect();
    let out = run(
        vec![doc! {"$bucketAuto": {"groupBy": "$v", "buckets": 3, "granularity": "POWERSOF2"}}],
        input,
    );
    let bounds: Vec<(Bson, Bson)> = out
        .iter()
        .map(|d| {
            let id = d.get_document("_id").unwrap();
            (
                id.get("min").unwrap().clone(),
                id.get("max").unwrap().clone(),
            )
        })
        .collect();
    // 1 rounds down to 0.5; buckets {1, 3} (max 3 -> 4), {5, 9} (9 -> 16), {17, 33} (33 -> 64).
    assert_eq!(
        bounds,
        vec![
            (Bson::Double(0.5), Bson::Int32(4)),
            (Bson::Int32(4), Bson::Int32(16)),
            (Bson::Int32(16), Bson::Int32(64)),
        ]
    );
}

#[test]
fn bucket_auto_parse_errors() {
    let ba = |spec: Document| doc! {"$bucketAuto": spec};
    assert_eq!(parse_err_code(doc! {"$bucketAuto": 1}), 40240);
    assert_eq!(
        parse_err_code(ba(doc! {"groupBy": "$a", "buckets": "x"})),
        40241
    );
    assert_eq!(
        parse_err_code(ba(doc! {"groupBy": "$a", "buckets": 1.5})),
        40242
    );
    assert_eq!(
        parse_err_code(ba(doc! {"groupBy": "$a", "buckets": 0})),
        40243
    );
    assert_eq!(
        parse_err_code(ba(doc! {"groupBy": "$a", "buckets": 2, "output": 1})),
        40244
    );
    assert_eq!(
        parse_err_code(ba(doc! {"groupBy": "$a", "buckets": 2, "x": 1})),
        40245
    );
    assert_eq!(parse_err_code(ba(doc! {"groupBy": "$a"})), 40246);
    assert_eq!(
        parse_err_code(ba(doc! {"groupBy": "a", "buckets": 2})),
        40239
    );
    assert_eq!(
        parse_err_code(ba(
            doc! {"groupBy": "$a", "buckets": 2, "granularity": "R3"}
        )),
        40257
    );
}

/// 110 documents of 1 MiB each: more than a blocking stage may hold without allowDiskUse.
fn over_the_limit() -> Vec<Document> {
    let big = "x".repeat(1024 * 1024);
    (0..110)
        .map(|i| doc! {"_id": i, "k": i % 2, "s": &big})
        .collect()
}

#[test]
fn blocking_stages_stop_at_one_hundred_megabytes_without_allow_disk_use() {
    let strict = Env::default();
    let allowed = Env {
        allow_disk_use: true,
        ..Env::default()
    };
    for stage in [
        doc! {"$sort": {"_id": -1}},
        doc! {"$group": {"_id": "$k", "all": {"$push": "$s"}}},
        // One value per group, but 110 groups of 1 MiB.
        doc! {"$group": {"_id": "$_id", "s": {"$first": "$s"}}},
        doc! {"$group": {"_id": "$_id", "s": {"$max": "$s"}}},
        doc! {"$bucketAuto": {"groupBy": "$_id", "buckets": 2}},
        doc! {"$setWindowFields": {"sortBy": {"_id": 1}, "output": {"n": {"$documentNumber": {}}}}},
    ] {
        let p = Pipeline::parse(std::slice::from_ref(&stage)).unwrap();
        let e = p
            .run_in(over_the_limit(), &strict)
            .expect_err("over 100 MiB");
        assert_eq!(
            (e.code, e.code_name.as_str()),
            (292, "QueryExceededMemoryLimitNoDiskUseAllowed"),
            "{stage}"
        );
        assert!(p.run_in(over_the_limit(), &allowed).is_ok(), "{stage}");
    }
    // Fed one document at a time, they stop the same way.
    for stage in [
        doc! {"$bucketAuto": {"groupBy": "$_id", "buckets": 2}},
        doc! {"$facet": {"sorted": [{"$sort": {"_id": -1}}]}},
    ] {
        let p = Pipeline::parse(std::slice::from_ref(&stage)).unwrap();
        let mut run = p.push_run(&strict);
        let e = over_the_limit()
            .into_iter()
            .try_for_each(|d| run.push(d).map(drop))
            .and_then(|()| run.finish().map(drop))
            .expect_err("over 100 MiB");
        assert_eq!(e.code, 292, "{stage}: {e}");
    }
    // A $facet's one document may not pass 100 MiB, whatever disk use allows.
    let everything = Pipeline::parse(&[doc! {"$facet": {"all": [{"$match": {}}]}}]).unwrap();
    let e = everything
        .run_in(over_the_limit(), &allowed)
        .expect_err("a 110 MiB document");
    assert_eq!(e.code, 4031700, "{e}");
    assert!(
        e.errmsg.contains("document constructed by $facet is "),
        "{e}"
    );
    // A group that keeps little stays within the limit whatever its input.
    let counts = Pipeline::parse(&[doc! {"$group": {"_id": "$k", "n": {"$sum": 1}}}]).unwrap();
    assert_eq!(counts.run_in(over_the_limit(), &strict).unwrap().len(), 2);
}

fn streaming_input() -> Vec<Document> {
    (0..3_000_i32)
        .map(|i| {
            doc! {
                "_id": i, "x": (i * 7_919) % 3_001, "g": i % 37, "arr": [i % 5, i % 3],
                "name": if i % 2 == 0 { "Ann" } else { "ann" }, "pad": "p".repeat(40),
            }
        })
        .collect()
}

/// A pipeline's output pushed through [`Pipeline::push_run`] with both spill limits at
/// `limit` bytes (on this thread).
fn pushed(p: &Pipeline, env: &Env, limit: usize) -> Result<Vec<Document>> {
    spill::TEST_LIMIT.set(Some(limit));
    let out = (|| {
        let mut run = p.push_run(env);
        for d in streaming_input() {
            if !run.push(d)? {
                break;
            }
        }
        run.finish()?.collect::<Result<Vec<_>>>()
    })();
    spill::TEST_LIMIT.set(None);
    out
}

#[test]
fn a_pipeline_pushed_through_spilling_stages_gives_what_the_batch_run_gives() {
    let mut other = super::lookup::Foreign::default();
    other.insert(
        "other",
        (0..200_i32)
            .map(|i| doc! {"_id": i, "g": i % 37, "next": i + 1})
            .collect(),
    );
    let disk = Env {
        allow_disk_use: true,
        foreign: Some(std::sync::Arc::new(other)),
        ..Env::default()
    };
    let folded = Env {
        collation: crate::collation::Collation::parse(&Bson::Document(
            doc! {"locale": "en", "strength": 2},
        ))
        .unwrap(),
        ..disk.clone()
    };
    let pipelines = [
        vec![
            doc! {"$match": {"x": {"$gte": 10}}},
            doc! {"$sort": {"g": 1, "x": -1}},
            doc! {"$limit": 500},
            doc! {"$project": {"pad": 0}},
        ],
        vec![
            doc! {"$group": {
                "_id": "$g", "n": {"$sum": 1}, "xs": {"$push": "$x"}, "f": {"$first": "$x"},
                "l": {"$last": "$x"}, "a": {"$avg": "$x"}, "s": {"$addToSet": "$arr"},
                "lo": {"$min": "$x"}, "m": {"$mergeObjects": {"last": "$x"}},
            }},
            doc! {"$sort": {"_id": 1}},
        ],
        vec![
            doc! {"$unwind": "$arr"},
            doc! {"$skip": 5},
            doc! {"$sort": {"arr": 1, "x": 1}},
            doc! {"$skip": 3},
        ],
        vec![
            doc! {"$sort": {"x": 1}},
            doc! {"$group": {"_id": {"$mod": ["$x", 4]}, "first": {"$first": "$x"}}},
            doc! {"$sort": {"_id": -1}},
        ],
        vec![doc! {"$limit": 20}, doc! {"$sort": {"x": -1}}],
        vec![
            doc! {"$sortByCount": "$g"},
            doc! {"$sort": {"count": -1, "_id": 1}},
        ],
        vec![
            doc! {"$group": {"_id": "$name", "n": {"$sum": 1}}},
            doc! {"$sort": {"_id": 1}},
        ],
        vec![doc! {"$bucketAuto": {
            "groupBy": "$g", "buckets": 6,
            "output": {"n": {"$sum": 1}, "xs": {"$push": "$x"}, "f": {"$first": "$name"}},
        }}],
        vec![
            doc! {"$match": {"x": {"$gt": 0}}},
            doc! {"$bucketAuto": {"groupBy": "$x", "buckets": 7, "granularity": "1-2-5"}},
        ],
        vec![
            doc! {"$setWindowFields": {
                "partitionBy": {"$mod": ["$_id", 250]}, "sortBy": {"x": 1},
                "output": {
                    "n": {"$documentNumber": {}}, "r": {"$rank": {}},
                    "run": {"$sum": "$x", "window": {"documents": ["unbounded", "current"]}},
                    "near": {"$avg": "$x", "window": {"range": [-100, 100]}},
                },
            }},
            doc! {"$project": {"pad": 0}},
        ],
        vec![doc! {"$setWindowFields": {
            "partitionBy": {"$mod": ["$x", 200]}, "sortBy": {"_id": -1},
            "output": {"c": {"$count": {}}, "prev": {"$shift": {"output": "$x", "by": -1}}},
        }}],
        vec![doc! {"$bucket": {
            "groupBy": "$g", "boundaries": [0, 10, 20, 30], "default": "rest",
            "output": {"n": {"$sum": 1}, "xs": {"$push": "$x"}},
        }}],
        vec![doc! {"$count": "n"}],
        vec![
            doc! {"$project": {"pad": 0}},
            doc! {"$densify": {
                "field": "x", "partitionByFields": ["g"],
                "range": {"step": 50, "bounds": "partition"},
            }},
        ],
        vec![
            doc! {"$match": {"g": {"$lt": 4}}},
            doc! {"$project": {"pad": 0}},
            doc! {"$densify": {"field": "x", "partitionByFields": ["g"], "range": {"step": 100, "bounds": "full"}}},
        ],
        vec![
            doc! {"$project": {"x": 1, "g": 1, "v": {"$cond": [{"$eq": [{"$mod": ["$x", 3]}, 0]}, null, "$x"]}}},
            doc! {"$fill": {"sortBy": {"x": 1}, "partitionByFields": ["g"], "output": {"v": {"method": "locf"}}}},
        ],
        vec![
            doc! {"$lookup": {"from": "other", "localField": "g", "foreignField": "g", "as": "j"}},
            doc! {"$project": {"pad": 0}},
        ],
        vec![
            doc! {"$match": {"g": {"$lt": 6}}},
            doc! {"$lookup": {
                "from": "other", "let": {"x": "$x"},
                "pipeline": [{"$match": {"$expr": {"$eq": ["$_id", {"$mod": ["$$x", 300]}]}}}],
                "as": "j",
            }},
            doc! {"$limit": 400},
        ],
        vec![
            doc! {"$graphLookup": {
                "from": "other", "startWith": "$g", "connectFromField": "next",
                "connectToField": "_id", "maxDepth": 3, "as": "r",
            }},
            doc! {"$project": {"pad": 0}},
        ],
        vec![doc! {"$unionWith": "other"}, doc! {"$skip": 100}],
        vec![doc! {"$facet": {
            "sorted": [{"$sort": {"x": -1}}, {"$limit": 40}, {"$project": {"pad": 0}}],
            "groups": [{"$group": {"_id": "$g", "n": {"$sum": 1}}}, {"$sort": {"_id": 1}}],
            "first": [{"$limit": 3}],
            "buckets": [{"$bucketAuto": {"groupBy": "$x", "buckets": 3}}],
            "joined": [
                {"$lookup": {"from": "other", "localField": "g", "foreignField": "_id", "as": "j"}},
                {"$match": {"j": {"$ne": []}}},
                {"$count": "n"},
            ],
        }}],
    ];
    let before = spill::counters()
        .sort_spills
        .load(std::sync::atomic::Ordering::Relaxed);
    for stages in &pipelines {
        for env in [&disk, &folded] {
            let p = Pipeline::parse(stages).unwrap();
            let expected = p.run_in(streaming_input(), env).unwrap();
            // 16 KiB: a run holds about 30 of these documents in memory (their footprint).
            for limit in [usize::MAX, 16_384] {
                assert_eq!(
                    pushed(&p, env, limit).unwrap(),
                    expected,
                    "{stages:?} {limit}"
                );
            }
        }
    }
    let after = spill::counters()
        .sort_spills
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(after > before, "the 16 KiB runs spilled");
}

/// A window stage holds one partition at a time. Under `allowDiskUse` a partition larger than
/// the limit waits on disk while its functions compute, as MongoDB 7.0 spills it; what the
/// functions themselves hold stops at the limit (5414201); without disk use the sort into
/// partitions stops at it first (292).
#[test]
fn a_window_partition_past_the_limit_spills_and_its_functions_stop_at_it() {
    let disk = Env {
        allow_disk_use: true,
        ..Env::default()
    };
    // 3,000 documents of ~100 bytes in one partition: ~300 KB against a 64 KiB limit, while
    // the functions hold a sort value each (and a running sum).
    let one_partition = Pipeline::parse(&[doc! {"$setWindowFields": {
        "sortBy": {"x": 1},
        "output": {
            "n": {"$documentNumber": {}},
            "run": {"$sum": "$x", "window": {"documents": ["unbounded", "current"]}},
            "near": {"$push": "$g", "window": {"documents": [-2, 2]}},
        },
    }}])
    .unwrap();
    let before = spill::counters()
        .sort_spills
        .load(std::sync::atomic::Ordering::Relaxed);
    let spilled = pushed(&one_partition, &disk, 64 * 1024).unwrap();
    assert!(
        spill::counters()
            .sort_spills
            .load(std::sync::atomic::Ordering::Relaxed)
            > before
    );
    assert_eq!(
        spilled,
        one_partition.run_in(streaming_input(), &disk).unwrap()
    );
    assert_eq!(spilled.len(), 3_000);
    // Functions whose inputs pass the limit: the 40-byte pads of 3,000 documents.
    let padded = Pipeline::parse(&[doc! {"$setWindowFields": {
        "sortBy": {"x": 1},
        "output": {"pads": {"$push": "$pad", "window": {"documents": [-1, 1]}}},
    }}])
    .unwrap();
    let e = pushed(&padded, &disk, 64 * 1024).expect_err("inputs of ~160 KB");
    assert_eq!(e.code, 5414201, "{e}");
    // Without disk use the sort into partitions stops first.
    let e = pushed(&one_partition, &Env::default(), 64 * 1024).expect_err("a 300 KB partition");
    assert_eq!(e.code, 292, "{e}");
    assert!(pushed(&one_partition, &Env::default(), usize::MAX).is_ok());
}

/// A `$push` over wide windows makes values far larger than the partition (each document's
/// array holds most of it): they are made as each document goes out, not all at once.
#[test]
fn a_window_accumulator_makes_each_value_as_its_document_goes_out() {
    let wide = Pipeline::parse(&[doc! {"$setWindowFields": {
        "sortBy": {"x": 1},
        "output": {"before": {"$push": "$x", "window": {"documents": ["unbounded", "current"]}}},
    }}])
    .unwrap();
    let mut run = wide.push_run(&Env::default());
    for d in streaming_input() {
        run.push(d).unwrap();
    }
    let mut out = run.finish().unwrap();
    // The 3,000 arrays together hold 4.5 M values; the first three hold six.
    let first: Vec<usize> = out
        .by_ref()
        .take(3)
        .map(|d| d.unwrap().get_array("before").unwrap().len())
        .collect();
    assert_eq!(first, vec![1, 2, 3]);
    assert_eq!(
        out.last()
            .unwrap()
            .unwrap()
            .get_array("before")
            .unwrap()
            .len(),
        3_000
    );
}

#[test]
fn a_streaming_run_hands_out_its_output_as_it_is_pushed_and_a_blocking_one_holds_it() {
    let env = Env::default();
    let streaming = Pipeline::parse(&[
        doc! {"$match": {"g": {"$lt": 10}}},
        doc! {"$unwind": "$arr"},
        doc! {"$skip": 7},
        doc! {"$limit": 900},
        doc! {"$project": {"pad": 0}},
    ])
    .unwrap();
    let mut run = streaming.push_run(&env);
    let mut taken = Vec::new();
    for (i, d) in streaming_input().into_iter().enumerate() {
        let more = run.push(d).unwrap();
        let ready = run.take_ready();
        // Nothing is held back between pushes: a document out of the prefix is ready at once.
        assert!(ready.len() <= 2, "push {i} gave {}", ready.len());
        taken.extend(ready);
        if !more {
            break;
        }
    }
    taken.extend(run.finish().unwrap().map(Result::unwrap));
    assert_eq!(taken, streaming.run_in(streaming_input(), &env).unwrap());
    assert_eq!(taken.len(), 900);

    let blocking = Pipeline::parse(&[doc! {"$sort": {"x": 1}}, doc! {"$limit": 3}]).unwrap();
    let mut run = blocking.push_run(&env);
    for d in streaming_input() {
        run.push(d).unwrap();
        assert!(
            run.take_ready().is_empty(),
            "a sort hands out nothing before its input ends"
        );
    }
    let out: Vec<Document> = run.finish().unwrap().map(Result::unwrap).collect();
    assert_eq!(out, blocking.run_in(streaming_input(), &env).unwrap());
}

#[test]
fn a_pushed_blocking_stage_stops_at_its_limit_without_allow_disk_use() {
    for stage in [
        doc! {"$sort": {"x": 1}},
        doc! {"$group": {"_id": "$_id", "all": {"$push": "$pad"}}},
    ] {
        let p = Pipeline::parse(std::slice::from_ref(&stage)).unwrap();
        let e = pushed(&p, &Env::default(), 16_384).expect_err("over the limit");
        assert_eq!(e.code, 292, "{stage}");
    }
    // Before a $limit a sort keeps only what the limit passes.
    let top = Pipeline::parse(&[doc! {"$sort": {"x": -1}}, doc! {"$limit": 3}]).unwrap();
    let out = pushed(&top, &Env::default(), 16_384).unwrap();
    let xs: Vec<i32> = out.iter().map(|d| d.get_i32("x").unwrap()).collect();
    assert_eq!(xs, vec![3_000, 2_999, 2_998]);
}
