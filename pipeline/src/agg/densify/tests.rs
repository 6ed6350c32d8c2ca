//! `$densify` and `$fill` tests, after MongoDB's documented examples.

use bson::{Bson, Document, doc};

use crate::agg::test_support::{parse_code, run, run_code};

/// MongoDB's `$densify` documentation example: coffee scores by altitude.
fn coffee() -> Vec<Document> {
    vec![
        doc! {"altitude": 600, "variety": "Arabica Typica", "score": 68.3},
        doc! {"altitude": 750, "variety": "Arabica Typica", "score": 69.5},
        doc! {"altitude": 950, "variety": "Arabica Typica", "score": 70.5},
        doc! {"altitude": 1250, "variety": "Gesha", "score": 88.15},
        doc! {"altitude": 1700, "variety": "Gesha", "score": 85.5},
        doc! {"altitude": 1600, "variety": "SL28", "score": 84.9},
        doc! {"altitude": 1950, "variety": "SL28", "score": 85.3},
    ]
}

/// (variety, altitude, whether generated) of each output document.
fn summary(out: &[Document]) -> Vec<(String, i32, bool)> {
    out.iter()
        .map(|d| {
            (
                d.get_str("variety").unwrap_or("").to_string(),
                d.get_i32("altitude").unwrap_or(-1),
                !d.contains_key("score"),
            )
        })
        .collect()
}

#[test]
fn partition_bounds_fill_between_each_partitions_min_and_max() {
    let out = run(
        doc! {"$densify": {"field": "altitude", "partitionByFields": ["variety"],
        "range": {"bounds": "partition", "step": 200}}},
        coffee(),
    );
    let want = [
        ("Arabica Typica", 600, false),
        ("Arabica Typica", 750, false),
        ("Arabica Typica", 800, true),
        ("Arabica Typica", 950, false),
        ("Gesha", 1250, false),
        ("Gesha", 1450, true),
        ("Gesha", 1650, true),
        ("Gesha", 1700, false),
        ("SL28", 1600, false),
        ("SL28", 1800, true),
        ("SL28", 1950, false),
    ];
    let want: Vec<_> = want
        .iter()
        .map(|(v, a, g)| (v.to_string(), *a, *g))
        .collect();
    assert_eq!(summary(&out), want);
    // A generated document holds only the partition fields and the densified field.
    assert_eq!(out[2], doc! {"variety": "Arabica Typica", "altitude": 800});
}

#[test]
fn full_bounds_use_one_grid_from_the_global_minimum_for_every_partition() {
    let out = run(
        doc! {"$densify": {"field": "altitude", "partitionByFields": ["variety"],
        "range": {"bounds": "full", "step": 200}}},
        coffee(),
    );
    let mut got = summary(&out);
    // Output is sorted by altitude (partitions interleave); compare per partition.
    let altitudes: Vec<i32> = out
        .iter()
        .filter(|d| d.contains_key("score"))
        .map(|d| d.get_i32("altitude").unwrap_or(-1))
        .collect();
    assert_eq!(altitudes, vec![600, 750, 950, 1250, 1600, 1700, 1950]);
    got.sort();
    let arabica: Vec<i32> = got
        .iter()
        .filter(|(v, _, _)| v == "Arabica Typica")
        .map(|(_, a, _)| *a)
        .collect();
    assert_eq!(
        arabica,
        vec![600, 750, 800, 950, 1000, 1200, 1400, 1600, 1800]
    );
    let gesha: Vec<i32> = got
        .iter()
        .filter(|(v, _, _)| v == "Gesha")
        .map(|(_, a, _)| *a)
        .collect();
    assert_eq!(
        gesha,
        vec![600, 800, 1000, 1200, 1250, 1400, 1600, 1700, 1800]
    );
    let sl28 = got.iter().filter(|(v, _, _)| v == "SL28").count();
    // 600..1800 on the grid (7) plus 1950.
    assert_eq!(sl28, 8);
}

#[test]
fn explicit_date_bounds_step_by_units_and_exclude_the_upper_bound() {
    const HOUR: i64 = 3_600_000;
    let t0 = 1_621_296_000_000; // 2021-05-18T00:00:00Z
    let at = |h: i64| bson::DateTime::from_millis(t0 + h * HOUR);
    let input: Vec<Document> = [0, 4, 8, 12]
        .iter()
        .map(|h| doc! {"metadata": {"sensorId": 5578}, "timestamp": at(*h), "temp": 12})
        .collect();
    let out = run(
        doc! {"$densify": {"field": "timestamp",
        "range": {"step": 1, "unit": "hour", "bounds": [at(0), at(8)]}}},
        input,
    );
    let hours: Vec<i64> = out
        .iter()
        .map(|d| (d.get_datetime("timestamp").unwrap().timestamp_millis() - t0) / HOUR)
        .collect();
    assert_eq!(hours, vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 12]);
    assert_eq!(out[1], doc! {"timestamp": at(1)});
    assert!(out[4].contains_key("temp"));
}

#[test]
fn explicit_bounds_pass_outside_documents_and_nulls_through() {
    let out = run(
        doc! {"$densify": {"field": "x", "range": {"step": 2, "bounds": [0, 5]}}},
        vec![
            doc! {"x": -3},
            doc! {"x": 3},
            doc! {"x": null, "k": 1},
            doc! {"x": 9},
        ],
    );
    let xs: Vec<Bson> = out
        .iter()
        .map(|d| d.get("x").cloned().unwrap_or(Bson::Undefined))
        .collect();
    // Null first (it sorts first), then -3, the grid 0 2 (3 is off the grid), 3, 4, then 9.
    assert_eq!(
        xs,
        vec![
            Bson::Null,
            (-3).into(),
            0.into(),
            2.into(),
            3.into(),
            4.into(),
            9.into()
        ]
    );
}

#[test]
fn explicit_bounds_without_partitions_generate_even_from_nothing() {
    let stage = doc! {"$densify": {"field": "x", "range": {"step": 1, "bounds": [0, 3]}}};
    assert_eq!(
        run(stage.clone(), Vec::new()),
        vec![doc! {"x": 0}, doc! {"x": 1}, doc! {"x": 2}]
    );
    // With partitions there is nothing to generate for.
    let partitioned = doc! {"$densify": {"field": "x", "partitionByFields": ["p"],
    "range": {"step": 1, "bounds": [0, 3]}}};
    assert!(run(partitioned, Vec::new()).is_empty());
}

#[test]
fn densify_errors_carry_mongodb_codes() {
    let d = |spec: Document| doc! {"$densify": spec};
    assert_eq!(parse_code(doc! {"$densify": 1}), 9);
    assert_eq!(
        parse_code(d(doc! {"range": {"step": 1, "bounds": "full"}})),
        40414
    );
    assert_eq!(
        parse_code(d(
            doc! {"field": "a", "range": {"step": 0, "bounds": "full"}}
        )),
        5733401
    );
    assert_eq!(
        parse_code(d(
            doc! {"field": "a", "range": {"step": 1, "bounds": [0, 1, 2]}}
        )),
        5733403
    );
    assert_eq!(
        parse_code(d(
            doc! {"field": "a", "range": {"step": 1, "bounds": [2, 1]}}
        )),
        5733402
    );
    assert_eq!(
        parse_code(d(
            doc! {"field": "a", "range": {"step": 1, "bounds": "all"}}
        )),
        5946802
    );
    assert_eq!(
        parse_code(d(
            doc! {"field": "a", "range": {"step": 1, "bounds": "partition"}}
        )),
        5733408
    );
    assert_eq!(
        parse_code(d(
            doc! {"field": "a", "range": {"step": 1, "unit": "hour", "bounds": [0, 1]}}
        )),
        5733409
    );
    assert_eq!(
        parse_code(d(
            doc! {"field": "$a", "range": {"step": 1, "bounds": "full"}}
        )),
        16410
    );
    assert_eq!(
        parse_code(d(
            doc! {"field": "a", "range": {"step": 1, "bounds": "full"}, "z": 1}
        )),
        40415
    );
    assert_eq!(
        run_code(
            d(doc! {"field": "a", "range": {"step": 1, "bounds": "full"}}),
            vec![doc! {"a": "x"}]
        ),
        5733201
    );
    assert_eq!(
        run_code(
            d(doc! {"field": "a", "range": {"step": 1, "bounds": [0, 1_000_000]}}),
            vec![doc! {"a": 0}]
        ),
        5897900
    );
}

#[test]
fn fill_with_values_locf_and_linear_per_partition() {
    let input = vec![
        doc! {"_id": 1, "s": "a", "t": 1, "p": 10, "q": "x"},
        doc! {"_id": 2, "s": "b", "t": 1, "p": 1},
        doc! {"_id": 3, "s": "a", "t": 2, "p": null},
        doc! {"_id": 4, "s": "b", "t": 2},
        doc! {"_id": 5, "s": "a", "t": 3, "p": 20},
        doc! {"_id": 6, "s": "b", "t": 3, "p": 5},
    ];
    let out = run(
        doc! {"$fill": {
            "partitionByFields": ["s"],
            "sortBy": {"t": 1},
            "output": {"p": {"method": "linear"}, "q": {"method": "locf"}, "z": {"value": 0}},
        }},
        input,
    );
    let ids: Vec<i32> = out.iter().map(|d| d.get_i32("_id").unwrap_or(0)).collect();
    assert_eq!(ids, vec![1, 3, 5, 2, 4, 6]);
    let p: Vec<Bson> = out
        .iter()
        .map(|d| d.get("p").cloned().unwrap_or(Bson::Undefined))
        .collect();
    assert_eq!(
        p,
        vec![
            10.into(),
            15.0.into(),
            20.into(),
            1.into(),
            3.0.into(),
            5.into()
        ]
    );
    assert_eq!(out[1].get_str("q").unwrap(), "x");
    assert_eq!(out[3].get("q"), Some(&Bson::Null));
    assert!(out.iter().all(|d| d.get_i32("z").ok() == Some(0)));
}

#[test]
fn fill_value_keeps_present_values() {
    let out = run(
        doc! {"$fill": {"output": {"a": {"value": "none"}}}},
        vec![doc! {"a": 1}, doc! {"a": null}, doc! {}],
    );
    assert_eq!(
        out,
        vec![doc! {"a": 1}, doc! {"a": "none"}, doc! {"a": "none"}]
    );
}

#[test]
fn fill_errors_carry_mongodb_codes() {
    assert_eq!(parse_code(doc! {"$fill": "x"}), 9);
    assert_eq!(parse_code(doc! {"$fill": {"sortBy": {"a": 1}}}), 40414);
    assert_eq!(
        parse_code(
            doc! {"$fill": {"partitionBy": "$a", "partitionByFields": ["a"],
            "output": {"b": {"value": 1}}}}
        ),
        6050204
    );
    assert_eq!(
        parse_code(doc! {"$fill": {"output": {"b": {"method": "mean"}}}}),
        6050202
    );
    assert_eq!(
        parse_code(doc! {"$fill": {"output": {"b": {"method": "locf", "value": 1}}}}),
        6050201
    );
    assert_eq!(parse_code(doc! {"$fill": {"output": {}}}), 6050203);
    assert_eq!(parse_code(doc! {"$fill": {"output": {"b": 1}}}), 6050200);
    assert_eq!(
        parse_code(doc! {"$fill": {"partitionBy": 1, "output": {"b": {"value": 1}}}}),
        14
    );
    assert_eq!(
        parse_code(doc! {"$fill": {"output": {"b": {"method": "linear"}}}}),
        605001
    );
}
