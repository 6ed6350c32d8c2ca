//! `$setWindowFields` tests, mostly MongoDB's documented examples (the `cakeSales` collection).

use bson::{Bson, Document, doc};

use crate::agg::test_support::{parse_code, run, run_code};

fn date(ms: i64) -> bson::DateTime {
    bson::DateTime::from_millis(ms)
}

const DAY: i64 = 86_400_000;

/// MongoDB's documentation example collection (dates as days since the epoch, same order).
fn cake_sales() -> Vec<Document> {
    vec![
        doc! {"_id": 0, "type": "chocolate", "orderDate": date(18_400 * DAY), "state": "CA", "price": 13, "quantity": 120},
        doc! {"_id": 1, "type": "chocolate", "orderDate": date(18_706 * DAY), "state": "WA", "price": 14, "quantity": 140},
        doc! {"_id": 2, "type": "vanilla", "orderDate": date(18_638 * DAY), "state": "CA", "price": 12, "quantity": 145},
        doc! {"_id": 3, "type": "vanilla", "orderDate": date(18_300 * DAY), "state": "WA", "price": 13, "quantity": 104},
        doc! {"_id": 4, "type": "strawberry", "orderDate": date(18_034 * DAY), "state": "CA", "price": 41, "quantity": 162},
        doc! {"_id": 5, "type": "strawberry", "orderDate": date(17_904 * DAY), "state": "WA", "price": 43, "quantity": 134},
    ]
}

fn field(out: &[Document], name: &str) -> Vec<Bson> {
    out.iter()
        .map(|d| d.get(name).cloned().unwrap_or(Bson::Undefined))
        .collect()
}

fn ids(out: &[Document]) -> Vec<Bson> {
    field(out, "_id")
}

fn b<T: Into<Bson>>(items: Vec<T>) -> Vec<Bson> {
    items.into_iter().map(Into::into).collect()
}

#[test]
fn running_sum_per_partition_sorted_by_partition_then_sort_key() {
    let out = run(
        doc! {"$setWindowFields": {
            "partitionBy": "$state",
            "sortBy": {"orderDate": 1},
            "output": {"cumulativeQuantityForState": {
                "$sum": "$quantity", "window": {"documents": ["unbounded", "current"]}}},
        }},
        cake_sales(),
    );
    assert_eq!(ids(&out), b(vec![4, 0, 2, 5, 3, 1]));
    assert_eq!(
        field(&out, "cumulativeQuantityForState"),
        b(vec![162, 282, 427, 134, 238, 378])
    );
    // The other fields are kept.
    assert_eq!(out[0].get_str("type").unwrap(), "strawberry");
}

#[test]
fn without_a_window_the_whole_partition_is_the_window() {
    let out = run(
        doc! {"$setWindowFields": {
            "partitionBy": "$state",
            "output": {
                "total": {"$sum": "$quantity"},
                "avg": {"$avg": "$quantity"},
                "n": {"$count": {}},
                "max": {"$max": "$quantity"},
                "types": {"$addToSet": "$type"},
            },
        }},
        cake_sales(),
    );
    // Partitions in key order, input order within a partition (stable).
    assert_eq!(ids(&out), b(vec![0, 2, 4, 1, 3, 5]));
    assert_eq!(field(&out, "total"), b(vec![427, 427, 427, 378, 378, 378]));
    assert_eq!(out[3].get_f64("avg").unwrap(), 126.0);
    assert_eq!(field(&out, "n"), b(vec![3, 3, 3, 3, 3, 3]));
    assert_eq!(out[0].get_i32("max").unwrap(), 162);
    // $addToSet's values come out sorted.
    assert_eq!(
        out[0].get_array("types").unwrap(),
        &b(vec!["chocolate", "strawberry", "vanilla"])
    );
}

#[test]
fn sliding_document_windows_and_every_accumulator() {
    let input: Vec<Document> = [3, 1, 4, 1, 5]
        .iter()
        .enumerate()
        .map(|(i, v)| doc! {"_id": i as i32, "v": v})
        .collect();
    let out = run(
        doc! {"$setWindowFields": {
            "sortBy": {"_id": 1},
            "output": {
                "sum": {"$sum": "$v", "window": {"documents": [-1, 1]}},
                "avg": {"$avg": "$v", "window": {"documents": [-1, 0]}},
                "min": {"$min": "$v", "window": {"documents": [-1, 1]}},
                "first": {"$first": "$v", "window": {"documents": [1, 2]}},
                "last": {"$last": "$v", "window": {"documents": ["current", 1]}},
                "push": {"$push": "$v", "window": {"documents": [-2, 0]}},
                "pop": {"$stdDevPop": "$v", "window": {"documents": [0, 1]}},
                "samp": {"$stdDevSamp": "$v", "window": {"documents": [0, 1]}},
                "n": {"$count": {}, "window": {"documents": ["unbounded", -1]}},
            },
        }},
        input,
    );
    assert_eq!(field(&out, "sum"), b(vec![4, 8, 6, 10, 6]));
    assert_eq!(field(&out, "avg"), b(vec![3.0, 2.0, 2.5, 2.5, 3.0]));
    assert_eq!(field(&out, "min"), b(vec![1, 1, 1, 1, 1]));
    // An empty window: $first is null, $count is 0.
    assert_eq!(
        field(&out, "first"),
        vec![1.into(), 4.into(), 1.into(), 5.into(), Bson::Null]
    );
    assert_eq!(field(&out, "last"), b(vec![1, 4, 1, 5, 5]));
    assert_eq!(out[3].get_array("push").unwrap(), &b(vec![1, 4, 1]));
    assert_eq!(field(&out, "n"), b(vec![0, 1, 2, 3, 4]));
    assert_eq!(out[0].get_f64("pop").unwrap(), 1.0);
    assert_eq!(out[4].get_f64("pop").unwrap(), 0.0);
    assert!((out[0].get_f64("samp").unwrap() - 2f64.sqrt()).abs() < 1e-12);
    // One value: the sample deviation is undefined.
    assert_eq!(out[4].get("samp"), Some(&Bson::Null));
}

#[test]
fn rank_dense_rank_and_document_number_with_ties() {
    let input = vec![
        doc! {"_id": 1, "score": 90},
        doc! {"_id": 2, "score": 70},
        doc! {"_id": 3, "score": 90},
        doc! {"_id": 4, "score": 80},
        doc! {"_id": 5, "score": 70},
    ];
    let out = run(
        doc! {"$setWindowFields": {
            "sortBy": {"score": -1},
            "output": {
                "rank": {"$rank": {}},
                "dense": {"$denseRank": {}},
                "num": {"$documentNumber": {}},
            },
        }},
        input,
    );
    assert_eq!(ids(&out), b(vec![1, 3, 4, 2, 5]));
    assert_eq!(field(&out, "rank"), b(vec![1, 1, 3, 4, 4]));
    assert_eq!(field(&out, "dense"), b(vec![1, 1, 2, 3, 3]));
    assert_eq!(field(&out, "num"), b(vec![1, 2, 3, 4, 5]));
}

#[test]
fn numeric_range_windows_select_by_sort_value() {
    let out = run(
        doc! {"$setWindowFields": {
            "sortBy": {"price": 1},
            "output": {"near": {"$push": "$_id", "window": {"range": [-1, 1]}},
                       "upTo": {"$sum": "$quantity", "window": {"range": ["unbounded", "current"]}}},
        }},
        cake_sales(),
    );
    // Prices sorted: 12 (2), 13 (0), 13 (3), 14 (1), 41 (4), 43 (5).
    assert_eq!(ids(&out), b(vec![2, 0, 3, 1, 4, 5]));
    assert_eq!(out[0].get_array("near").unwrap(), &b(vec![2, 0, 3]));
    assert_eq!(out[1].get_array("near").unwrap(), &b(vec![2, 0, 3, 1]));
    assert_eq!(out[4].get_array("near").unwrap(), &b(vec![4]));
    // "current" in a range window includes the ties of the current value.
    assert_eq!(field(&out, "upTo"), b(vec![145, 369, 369, 509, 671, 805]));
}

#[test]
fn date_range_windows_move_by_units() {
    let out = run(
        doc! {"$setWindowFields": {
            "partitionBy": "$state",
            "sortBy": {"orderDate": 1},
            "output": {"recent": {"$sum": "$quantity",
                "window": {"range": [-1, "current"], "unit": "year"}}},
        }},
        cake_sales(),
    );
    // CA sells on 2019-05-18 (162), 2020-05-18 (120; the window starts on 2019-05-18, bounds
    // are inclusive) and 2021-01-11 (145; the window starts on 2020-01-11).
    let ca: Vec<_> = out.iter().take(3).collect();
    assert_eq!(ca[0].get_i32("recent").unwrap(), 162);
    assert_eq!(ca[1].get_i32("recent").unwrap(), 282);
    assert_eq!(ca[2].get_i32("recent").unwrap(), 265);
}

#[test]
fn shift_reads_neighbours_or_the_default() {
    let input = vec![
        doc! {"_id": 1, "v": 10},
        doc! {"_id": 2},
        doc! {"_id": 3, "v": 30},
    ];
    let out = run(
        doc! {"$setWindowFields": {
            "sortBy": {"_id": 1},
            "output": {
                "prev": {"$shift": {"output": "$v", "by": -1, "default": "none"}},
                "next": {"$shift": {"output": "$v", "by": 1}},
            },
        }},
        input,
    );
    assert_eq!(field(&out, "prev")[0], Bson::from("none"));
    assert_eq!(field(&out, "prev")[1], Bson::from(10));
    // The neighbour exists but its value is missing: the field is not set.
    assert_eq!(field(&out, "prev")[2], Bson::Undefined);
    assert_eq!(
        field(&out, "next"),
        vec![Bson::Undefined, 30.into(), Bson::Null]
    );
}

#[test]
fn locf_and_linear_fill() {
    let input = vec![
        doc! {"t": 1, "p": 10, "q": "a"},
        doc! {"t": 2, "p": null},
        doc! {"t": 3, "q": "b"},
        doc! {"t": 4, "p": 16, "q": null},
        doc! {"t": 5},
    ];
    let out = run(
        doc! {"$setWindowFields": {
            "sortBy": {"t": 1},
            "output": {"p": {"$linearFill": "$p"}, "q": {"$locf": "$q"}},
        }},
        input,
    );
    assert_eq!(
        field(&out, "p"),
        vec![10.into(), 12.0.into(), 14.0.into(), 16.into(), Bson::Null]
    );
    assert_eq!(field(&out, "q"), b(vec!["a", "a", "b", "b", "b"]));
}

#[test]
fn derivative_and_integral_along_the_sort_field() {
    let input = vec![
        doc! {"t": 0, "y": 0},
        doc! {"t": 1, "y": 2},
        doc! {"t": 3, "y": 6},
    ];
    let out = run(
        doc! {"$setWindowFields": {
            "sortBy": {"t": 1},
            "output": {
                "d": {"$derivative": {"input": "$y"}, "window": {"documents": [-1, 0]}},
                "area": {"$integral": {"input": "$y"}, "window": {"documents": ["unbounded", "current"]}},
            },
        }},
        input,
    );
    assert_eq!(field(&out, "d"), vec![Bson::Null, 2.0.into(), 2.0.into()]);
    assert_eq!(field(&out, "area"), b(vec![0.0, 1.0, 9.0]));
}

#[test]
fn outputs_see_the_input_documents_and_set_dotted_paths() {
    let out = run(
        doc! {"$setWindowFields": {
            "output": {"v": {"$sum": 1}, "s.total": {"$sum": "$v"}},
        }},
        vec![doc! {"v": 5}, doc! {"v": 7}],
    );
    assert_eq!(out[0], doc! {"v": 2, "s": {"total": 12}});
}

#[test]
fn parse_errors_carry_mongodb_codes() {
    let swf = |spec: Document| doc! {"$setWindowFields": spec};
    assert_eq!(parse_code(doc! {"$setWindowFields": 1}), 9);
    assert_eq!(
        parse_code(swf(
            doc! {"partitionBy": [1, 2], "output": {"n": {"$sum": 1}}}
        )),
        14
    );
    assert_eq!(parse_code(swf(doc! {"sortBy": {"a": 1}})), 40414);
    assert_eq!(parse_code(swf(doc! {"output": {}, "x": 1})), 40415);
    assert_eq!(parse_code(swf(doc! {"sortBy": 1, "output": {}})), 14);
    assert_eq!(
        parse_code(swf(doc! {"output": {"a": {"$summ": "$x"}}})),
        9,
        "unknown function"
    );
    assert_eq!(
        parse_code(swf(doc! {"output": {"a": {"$median": {"input": "$x"}}}})),
        115
    );
    assert_eq!(
        parse_code(swf(
            doc! {"output": {"a": {"$sum": "$x", "window": {"documents": [-1, 0]}}}}
        )),
        5339901
    );
    assert_eq!(
        parse_code(swf(
            doc! {"sortBy": {"a": 1}, "output": {"a": {"$sum": "$x", "window": {"documents": [1, 0]}}}}
        )),
        5339900
    );
    assert_eq!(
        parse_code(swf(
            doc! {"sortBy": {"a": 1, "b": 1}, "output": {"r": {"$sum": "$x", "window": {"range": [0, 1]}}}}
        )),
        5339902
    );
    assert_eq!(
        parse_code(swf(
            doc! {"sortBy": {"a": -1}, "output": {"r": {"$sum": "$x", "window": {"range": [0, 1]}}}}
        )),
        8947401
    );
    assert_eq!(
        parse_code(swf(doc! {"output": {"r": {"$rank": {}}}})),
        5371602
    );
    assert_eq!(
        parse_code(swf(
            doc! {"sortBy": {"a": 1}, "output": {"r": {"$rank": 1}}}
        )),
        5371603
    );
    assert_eq!(
        parse_code(swf(
            doc! {"output": {"s": {"$shift": {"output": "$a", "by": 1}}}}
        )),
        9
    );
    assert_eq!(
        parse_code(swf(
            doc! {"sortBy": {"a": 1}, "output": {"s": {"$shift": {"output": "$a", "by": 1, "default": "$b"}}}}
        )),
        9
    );
    assert_eq!(
        parse_code(swf(doc! {"output": {"f": {"$linearFill": "$a"}}})),
        605001
    );
    assert_eq!(parse_code(swf(doc! {"output": {"$f": {"$sum": 1}}})), 16410);
    assert_eq!(
        parse_code(swf(
            doc! {"sortBy": {"a": 1}, "output": {"f": {"$derivative": {"input": "$a"}}}}
        )),
        9
    );
}

#[test]
fn runtime_errors_carry_mongodb_codes() {
    let by_array = doc! {"$setWindowFields": {"partitionBy": "$a", "output": {"n": {"$sum": 1}}}};
    assert_eq!(run_code(by_array, vec![doc! {"a": [1, 2]}]), 14);
    let range = doc! {"$setWindowFields": {"sortBy": {"a": 1},
    "output": {"n": {"$sum": 1, "window": {"range": [-1, 0]}}}}};
    assert_eq!(run_code(range.clone(), vec![doc! {"a": "x"}]), 5429414);
    let now = bson::DateTime::from_millis(0);
    assert_eq!(run_code(range, vec![doc! {"a": now}]), 5429413);
    let dated = doc! {"$setWindowFields": {"sortBy": {"a": 1},
    "output": {"n": {"$sum": 1, "window": {"range": [-1, 0], "unit": "day"}}}}};
    assert_eq!(run_code(dated, vec![doc! {"a": 1}]), 5429513);
    let fill =
        doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {"v": {"$linearFill": "$v"}}}};
    assert_eq!(
        run_code(
            fill.clone(),
            vec![doc! {"t": 1, "v": 1}, doc! {"t": 1, "v": null}]
        ),
        6050106
    );
    assert_eq!(run_code(fill.clone(), vec![doc! {"t": 1, "v": "x"}]), 14);
    assert_eq!(run_code(fill, vec![doc! {"t": "x", "v": 1}]), 14);
}

#[test]
fn derivative_with_a_unit_uses_dates_and_checks_types() {
    let t = |h: i64| bson::DateTime::from_millis(h * 3_600_000);
    let input = vec![doc! {"t": t(0), "y": 0}, doc! {"t": t(2), "y": 10}];
    let spec = |unit: Option<&str>| {
        let mut args = doc! {"input": "$y"};
        if let Some(u) = unit {
            args.insert("unit", u);
        }
        doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {
        "d": {"$derivative": args, "window": {"documents": ["unbounded", "current"]}}}}}
    };
    let out = run(spec(Some("hour")), input.clone());
    assert_eq!(field(&out, "d"), vec![Bson::Null, 5.0.into()]);
    assert_eq!(run_code(spec(None), input), 5624901);
    let numbers = vec![doc! {"t": 0, "y": 0}, doc! {"t": 1, "y": null}];
    assert_eq!(run_code(spec(Some("hour")), numbers.clone()), 5624900);
    assert_eq!(run_code(spec(None), numbers), 5624903);
    assert_eq!(
        parse_code(doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {
        "d": {"$derivative": {"input": "$y", "unit": "month"}, "window": {"documents": [0, 1]}}}}}),
        5490710
    );
}

#[test]
fn exp_moving_avg_and_covariance() {
    let input = vec![
        doc! {"t": 1, "x": 10, "y": 1},
        doc! {"t": 2, "x": "skip", "y": 2},
        doc! {"t": 3, "x": 20, "y": 3},
        doc! {"t": 4, "x": 30, "y": 5},
    ];
    let out = run(
        doc! {"$setWindowFields": {
            "sortBy": {"t": 1},
            "output": {
                "ema": {"$expMovingAvg": {"input": "$x", "N": 3}},
                "emaA": {"$expMovingAvg": {"input": "$x", "alpha": 0.25}},
                "cov": {"$covariancePop": ["$t", "$y"]},
                "covS": {"$covarianceSamp": ["$t", "$y"], "window": {"documents": [-1, 0]}},
            },
        }},
        input,
    );
    // alpha = 2 / (3 + 1) = 0.5; non-numbers keep the previous average.
    assert_eq!(field(&out, "ema"), b(vec![10.0, 10.0, 15.0, 22.5]));
    assert_eq!(out[2].get_f64("emaA").unwrap(), 12.5);
    // t = 1..4 (mean 2.5), y = 1 2 3 5 (mean 2.75): sum of products 6.5 over 4.
    assert_eq!(out[0].get_f64("cov").unwrap(), 1.625);
    assert_eq!(out[0].get("covS"), Some(&Bson::Null));
    assert_eq!(out[3].get_f64("covS").unwrap(), 1.0);
    let swf = |o: Document| doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {"e": o}}};
    assert_eq!(parse_code(swf(doc! {"$expMovingAvg": {"input": "$x"}})), 9);
    assert_eq!(
        parse_code(swf(doc! {"$expMovingAvg": {"input": "$x", "N": 0}})),
        9
    );
    assert_eq!(
        parse_code(swf(doc! {"$expMovingAvg": {"input": "$x", "alpha": 1}})),
        9
    );
    assert_eq!(
        parse_code(
            doc! {"$setWindowFields": {"output": {"e": {"$expMovingAvg": {"input": "$x", "N": 2}}}}}
        ),
        9
    );
}
