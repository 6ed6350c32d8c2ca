use std::sync::Arc;

use bson::{Bson, Document, doc};

use super::{
    Foreign, GraphPrefetch, UnionSource, foreign_collections, join_prefetch, union_source,
};
use crate::agg::Pipeline;
use crate::expr::Env;

fn env_with(colls: &[(&str, Vec<Document>)]) -> Env {
    let mut f = Foreign::default();
    for (name, docs) in colls {
        f.insert(*name, docs.clone());
    }
    Env {
        foreign: Some(Arc::new(f)),
        ..Env::default()
    }
}

fn run(stages: Vec<Document>, input: Vec<Document>, env: &Env) -> Vec<Document> {
    Pipeline::parse(&stages)
        .unwrap()
        .run_in(input, env)
        .unwrap()
}

fn code(stages: Vec<Document>) -> i32 {
    Pipeline::parse(&stages).unwrap_err().code
}

/// MongoDB's documented example: orders joined to inventory by item / sku.
fn orders() -> Vec<Document> {
    vec![
        doc! {"_id": 1, "item": "almonds", "price": 12, "quantity": 2},
        doc! {"_id": 2, "item": "pecans", "price": 20, "quantity": 1},
        doc! {"_id": 3},
    ]
}

fn inventory() -> Vec<Document> {
    vec![
        doc! {"_id": 1, "sku": "almonds", "instock": 120},
        doc! {"_id": 2, "sku": "bread", "instock": 80},
        doc! {"_id": 3, "sku": "cashews", "instock": 60},
        doc! {"_id": 4, "sku": "pecans", "instock": 70},
        doc! {"_id": 5, "sku": null},
        doc! {"_id": 6},
    ]
}

fn ids(v: &Bson) -> Vec<i32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_document().unwrap().get_i32("_id").unwrap())
        .collect()
}

#[test]
fn lookup_equality_matches_values_and_missing_matches_null_or_missing() {
    let env = env_with(&[("inventory", inventory())]);
    let out = run(
        vec![
            doc! {"$lookup": {"from": "inventory", "localField": "item", "foreignField": "sku", "as": "inventory_docs"}},
        ],
        orders(),
        &env,
    );
    let joined: Vec<Vec<i32>> = out
        .iter()
        .map(|d| ids(d.get("inventory_docs").unwrap()))
        .collect();
    // Order 3 has no item: it joins the inventory documents whose sku is null or missing.
    assert_eq!(joined, vec![vec![1], vec![4], vec![5, 6]]);
    assert_eq!(out[0].get_str("item").unwrap(), "almonds");
}

#[test]
fn lookup_array_values_on_either_side_match_any_element() {
    let classes = vec![
        doc! {"_id": 1, "title": "Reading is ...", "enrollmentlist": ["giraffe2", "pandabear", "artie"]},
        doc! {"_id": 2, "title": "Empty", "enrollmentlist": []},
    ];
    let members = vec![
        doc! {"_id": 1, "name": "artie"},
        doc! {"_id": 2, "name": ["giraffe2", "other"]},
        doc! {"_id": 3, "name": "giraffe1"},
        doc! {"_id": 4, "name": null},
    ];
    let env = env_with(&[("members", members)]);
    let out = run(
        vec![
            doc! {"$lookup": {"from": "members", "localField": "enrollmentlist", "foreignField": "name", "as": "enrollee_info"}},
        ],
        classes,
        &env,
    );
    assert_eq!(ids(out[0].get("enrollee_info").unwrap()), vec![1, 2]);
    // An empty local array looks for null, as a missing field does.
    assert_eq!(ids(out[1].get("enrollee_info").unwrap()), vec![4]);
}

#[test]
fn lookup_let_and_pipeline_see_the_local_document_through_variables() {
    let orders = vec![
        doc! {"_id": 1, "item": "almonds", "ordered": 2},
        doc! {"_id": 2, "item": "pecans", "ordered": 100},
    ];
    let stock = vec![
        doc! {"_id": 1, "stock_item": "almonds", "instock": 120},
        doc! {"_id": 2, "stock_item": "pecans", "instock": 70},
        doc! {"_id": 3, "stock_item": "almonds", "instock": 1},
    ];
    let env = env_with(&[("warehouses", stock)]);
    let spec = doc! {"$lookup": {
        "from": "warehouses",
        "let": {"order_item": "$item", "order_qty": "$ordered"},
        "pipeline": [
            {"$match": {"$expr": {"$and": [
                {"$eq": ["$stock_item", "$$order_item"]},
                {"$gte": ["$instock", "$$order_qty"]},
            ]}}},
            {"$project": {"stock_item": 0}},
        ],
        "as": "stockdata",
    }};
    let out = run(vec![spec], orders, &env);
    assert_eq!(
        out[0].get_array("stockdata").unwrap(),
        &vec![Bson::Document(doc! {"_id": 1, "instock": 120})]
    );
    assert_eq!(out[1].get_array("stockdata").unwrap(), &Vec::<Bson>::new());
}

#[test]
fn lookup_combines_the_equality_join_with_a_pipeline() {
    let env = env_with(&[("inventory", inventory())]);
    let out = run(
        vec![doc! {"$lookup": {
            "from": "inventory",
            "localField": "item",
            "foreignField": "sku",
            "let": {"q": "$quantity"},
            "pipeline": [{"$set": {"q": "$$q"}}, {"$project": {"_id": 1, "q": 1}}],
            "as": "found",
        }}],
        orders(),
        &env,
    );
    assert_eq!(
        out[0].get_array("found").unwrap(),
        &vec![Bson::Document(doc! {"_id": 1, "q": 2})]
    );
    // An undefined let value (order 3 has no quantity) leaves the variable missing.
    assert_eq!(
        out[2].get_array("found").unwrap(),
        &vec![
            Bson::Document(doc! {"_id": 5}),
            Bson::Document(doc! {"_id": 6})
        ]
    );
}

#[test]
fn lookup_and_union_with_read_documents_without_a_collection() {
    let env = Env::default();
    let out = run(
        vec![doc! {"$lookup": {
            "localField": "id_name",
            "foreignField": "xx",
            "pipeline": [{"$documents": [{"xx": 1}, {"xx": 2}]}],
            "as": "names",
        }}],
        vec![doc! {"id_name": 1}, doc! {"id_name": 3}],
        &env,
    );
    assert_eq!(
        out,
        vec![
            doc! {"id_name": 1, "names": [{"xx": 1}]},
            doc! {"id_name": 3, "names": []}
        ]
    );
    let out = run(
        vec![
            doc! {"$unionWith": {"pipeline": [{"$documents": {"$map": {"input": {"$range": [0, 2]}, "in": {"x": "$$this"}}}}]}},
        ],
        vec![doc! {"a": 1}],
        &env,
    );
    assert_eq!(out, vec![doc! {"a": 1}, doc! {"x": 0}, doc! {"x": 1}]);
}

#[test]
fn union_with_appends_the_other_collection_after_its_pipeline() {
    let env = env_with(&[
        ("sales_2018", vec![doc! {"store": "A", "qty": 1}]),
        (
            "sales_2019",
            vec![doc! {"store": "B", "qty": 5}, doc! {"store": "A", "qty": 7}],
        ),
    ]);
    let out = run(
        vec![
            doc! {"$set": {"_id": "2017"}},
            doc! {"$unionWith": "sales_2018"},
            doc! {"$unionWith": {"coll": "sales_2019", "pipeline": [{"$match": {"qty": {"$gt": 6}}}]}},
            doc! {"$group": {"_id": "$store", "total": {"$sum": "$qty"}}},
            doc! {"$sort": {"_id": 1}},
        ],
        vec![doc! {"store": "A", "qty": 2}],
        &env,
    );
    assert_eq!(out, vec![doc! {"_id": "A", "total": 10}]);
}

fn employees() -> Vec<Document> {
    vec![
        doc! {"_id": 1, "name": "Dev"},
        doc! {"_id": 2, "name": "Eliot", "reportsTo": "Dev"},
        doc! {"_id": 3, "name": "Ron", "reportsTo": "Eliot"},
        doc! {"_id": 4, "name": "Andrew", "reportsTo": "Eliot"},
        doc! {"_id": 5, "name": "Asya", "reportsTo": "Ron"},
        doc! {"_id": 6, "name": "Dan", "reportsTo": "Andrew"},
    ]
}

#[test]
fn graph_lookup_walks_the_hierarchy_with_depths_and_max_depth() {
    let env = env_with(&[("employees", employees())]);
    let spec = |max: Option<i32>| {
        let mut g = doc! {
            "from": "employees",
            "startWith": "$reportsTo",
            "connectFromField": "reportsTo",
            "connectToField": "name",
            "as": "reportingHierarchy",
            "depthField": "depth",
        };
        if let Some(m) = max {
            g.insert("maxDepth", m);
        }
        vec![doc! {"$match": {"name": "Asya"}}, doc! {"$graphLookup": g}]
    };
    let out = run(spec(None), employees(), &env);
    let chain: Vec<(String, i64)> = out[0]
        .get_array("reportingHierarchy")
        .unwrap()
        .iter()
        .map(|d| {
            let d = d.as_document().unwrap();
            (
                d.get_str("name").unwrap().into(),
                d.get_i64("depth").unwrap(),
            )
        })
        .collect();
    assert_eq!(
        chain,
        vec![("Ron".into(), 0), ("Eliot".into(), 1), ("Dev".into(), 2)]
    );
    let out = run(spec(Some(1)), employees(), &env);
    assert_eq!(ids(out[0].get("reportingHierarchy").unwrap()), vec![3, 2]);
}

#[test]
fn graph_lookup_ends_on_cycles_and_honours_restrict_search_with_match() {
    let foreign: Vec<Document> = (0..10)
        .map(|i| doc! {"_id": i, "neighbors": [(i + 9) % 10, (i + 1) % 10], "even": i % 2 == 0})
        .collect();
    let env = env_with(&[("foreign", foreign)]);
    let out = run(
        vec![doc! {"$graphLookup": {
            "from": "foreign", "startWith": 0, "connectFromField": "neighbors",
            "connectToField": "_id", "as": "all",
        }}],
        vec![doc! {"_id": "start"}],
        &env,
    );
    let mut all = ids(out[0].get("all").unwrap());
    all.sort();
    assert_eq!(all, (0..10).collect::<Vec<_>>());
    // Only even nodes may be reached: from 0 the neighbours 9 and 1 are odd.
    let out = run(
        vec![doc! {"$graphLookup": {
            "from": "foreign", "startWith": 0, "connectFromField": "neighbors",
            "connectToField": "_id", "as": "all", "restrictSearchWithMatch": {"even": true},
        }}],
        vec![doc! {"_id": "start"}],
        &env,
    );
    assert_eq!(ids(out[0].get("all").unwrap()), vec![0]);
    // A missing startWith finds nothing.
    let out = run(
        vec![doc! {"$graphLookup": {
            "from": "foreign", "startWith": "$nope", "connectFromField": "neighbors",
            "connectToField": "_id", "as": "all",
        }}],
        vec![doc! {"_id": "start"}],
        &env,
    );
    assert_eq!(out[0].get_array("all").unwrap().len(), 0);
}

#[test]
fn nested_pipelines_name_every_collection_they_read() {
    let p = Pipeline::parse(&[
        doc! {"$lookup": {"from": "a", "pipeline": [
            {"$unionWith": {"coll": "b", "pipeline": [{"$graphLookup": {"from": "c", "startWith": 1, "connectFromField": "x", "connectToField": "y", "as": "z"}}]}},
        ], "as": "out"}},
        doc! {"$facet": {"f": [{"$lookup": {"from": "d", "localField": "x", "foreignField": "y", "as": "w"}}]}},
    ])
    .unwrap();
    let names: Vec<String> = foreign_collections(&p).into_iter().collect();
    assert_eq!(names, vec!["a", "b", "c", "d"]);
    assert!(p.stages().iter().all(super::reads_other_collections));
}

#[test]
fn sub_pipelines_nest_at_most_twenty_deep() {
    let nested = |depth: usize| {
        let mut stage = doc! {"$match": {}};
        for i in 0..depth {
            stage = if i % 2 == 0 {
                doc! {"$lookup": {"from": "c", "pipeline": [stage], "as": "x"}}
            } else {
                doc! {"$unionWith": {"coll": "c", "pipeline": [stage]}}
            };
        }
        Pipeline::parse(&[stage])
    };
    assert!(nested(20).is_ok());
    assert_eq!(nested(21).unwrap_err().code, 232);
}

#[test]
fn a_collection_the_environment_lacks_is_refused_not_read_as_empty() {
    let p = Pipeline::parse(&[
        doc! {"$lookup": {"from": "x", "localField": "a", "foreignField": "b", "as": "c"}},
    ])
    .unwrap();
    let e = p.run_in(vec![doc! {"a": 1}], &Env::default()).unwrap_err();
    assert_eq!(e.code, 115);
}

#[test]
fn documents_yields_its_array_and_rejects_other_values() {
    let env = Env::default();
    assert_eq!(
        run(
            vec![doc! {"$documents": [{"a": 1}, {"a": 2}]}],
            vec![],
            &env
        ),
        vec![doc! {"a": 1}, doc! {"a": 2}]
    );
    let err = |v: Bson| {
        Pipeline::parse(&[doc! {"$documents": v}])
            .unwrap()
            .run_in(Vec::<Document>::new(), &env)
            .unwrap_err()
            .code
    };
    assert_eq!(err(Bson::Array(vec![Bson::Int32(1)])), 40228);
    assert_eq!(err(Bson::String("s".into())), 5858203);
    assert_eq!(
        code(vec![doc! {"$match": {}}, doc! {"$documents": []}]),
        40602
    );
    // So are the other first-stage-only stages, even those the pipeline cannot run itself.
    for stage in [
        "$currentOp",
        "$listLocalSessions",
        "$collStats",
        "$changeStream",
    ] {
        let mut later = Document::new();
        later.insert(stage, Document::new());
        assert_eq!(code(vec![doc! {"$match": {}}, later]), 40602, "{stage}");
    }
}

#[test]
fn malformed_specifications_answer_mongodb_codes() {
    let lookup = |spec: Document| code(vec![doc! {"$lookup": spec}]);
    assert_eq!(
        lookup(doc! {"from": "f", "localField": "a", "foreignField": "b"}),
        9
    );
    assert_eq!(lookup(doc! {"from": "f", "localField": "a", "as": "x"}), 9);
    assert_eq!(
        lookup(doc! {"from": 1, "localField": "a", "foreignField": "b", "as": "x"}),
        9
    );
    assert_eq!(lookup(doc! {"from": "f", "bogus": "a", "as": "x"}), 9);
    assert_eq!(
        lookup(doc! {"let": {"a": 1}, "as": "x", "pipeline": [{"$match": {}}]}),
        9
    );
    assert_eq!(
        lookup(
            doc! {"from": "f", "localField": "a", "foreignField": "b", "let": {"v": 1}, "as": "x"}
        ),
        9
    );
    assert_eq!(
        lookup(doc! {"from": "f", "pipeline": [], "let": {"Bad": 1}, "as": "x"}),
        16867
    );
    assert_eq!(
        lookup(doc! {"from": "f", "pipeline": [{"$out": "o"}], "as": "x"}),
        51047
    );
    assert_eq!(lookup(doc! {"from": "f", "pipeline": "no", "as": "x"}), 14);
    assert_eq!(
        lookup(doc! {"from": "f", "localField": "a", "foreignField": "b", "as": "$x"}),
        16410
    );

    let union = |spec: Bson| code(vec![doc! {"$unionWith": spec}]);
    assert_eq!(union(Bson::Int32(1)), 9);
    assert_eq!(union(Bson::Document(doc! {"coll": "c", "nope": 1})), 40415);
    assert_eq!(
        union(Bson::Document(doc! {"pipeline": [{"$match": {}}]})),
        9
    );
    assert_eq!(union(Bson::Document(doc! {"coll": 3})), 14);

    let graph = |extra: Document| {
        let mut g = doc! {"from": "f", "startWith": 0, "connectFromField": "a", "connectToField": "b", "as": "o"};
        for (k, v) in extra {
            if v == Bson::Null {
                g.remove(&k);
            } else {
                g.insert(k, v);
            }
        }
        code(vec![doc! {"$graphLookup": g}])
    };
    assert_eq!(code(vec![doc! {"$graphLookup": 4}]), 9);
    assert_eq!(graph(doc! {"maxDepth": "s"}), 40100);
    assert_eq!(graph(doc! {"maxDepth": -1}), 40101);
    assert_eq!(graph(doc! {"maxDepth": 2.3}), 40102);
    assert_eq!(graph(doc! {"from": -1}), 9);
    assert_eq!(graph(doc! {"from": ""}), 73);
    assert_eq!(graph(doc! {"as": 0}), 40103);
    assert_eq!(graph(doc! {"as": "$o"}), 16410);
    assert_eq!(graph(doc! {"restrictSearchWithMatch": "x"}), 40185);
    assert_eq!(graph(doc! {"notAField": "x"}), 40104);
    assert_eq!(graph(doc! {"connectToField": null}), 40105);
    assert_eq!(graph(doc! {"startWith": null}), 40105);
    assert_eq!(graph(doc! {"from": null}), 9);
}

#[test]
fn the_join_index_never_leaves_out_a_document_the_join_matches() {
    use super::{JoinIndex, join_filter};
    use crate::matcher::Matcher;
    let foreign = vec![
        doc! {"_id": 0, "f": 1},
        doc! {"_id": 1, "f": 1.0},
        doc! {"_id": 2, "f": [1, 2]},
        doc! {"_id": 3, "f": [[1], 3]},
        doc! {"_id": 4, "f": {"x": 1}},
        doc! {"_id": 5, "f": "1"},
        doc! {"_id": 6, "f": 2_i64},
        doc! {"_id": 7, "a": [{"f": 1}, {"f": [5]}]},
        doc! {"_id": 8, "f": [{"x": 1}]},
        doc! {"_id": 9},
        doc! {"_id": 10, "a": {"f": [1, 2]}},
    ];
    let cases: Vec<Vec<Bson>> = vec![
        vec![Bson::Int32(1)],
        vec![Bson::Double(2.0)],
        vec![Bson::Array(vec![Bson::Int32(1)])],
        vec![Bson::Document(doc! {"x": 1})],
        vec![Bson::String("1".into()), Bson::Int64(5)],
        vec![Bson::Array(vec![Bson::Int32(1), Bson::Int32(2)])],
    ];
    for field in ["f", "a.f"] {
        let index = JoinIndex::build(&foreign, field, &Env::default()).unwrap();
        for values in &cases {
            let m = Matcher::parse(&join_filter(field, values.clone())).unwrap();
            let scan: Vec<usize> = (0..foreign.len())
                .filter(|i| m.matches(&foreign[*i]))
                .collect();
            let candidates = index.candidates(values).unwrap();
            assert!(
                scan.iter().all(|i| candidates.contains(i)),
                "{field} {values:?}: scan {scan:?}, index {candidates:?}"
            );
        }
        // null looks for missing fields too: the index does not answer, the scan does.
        assert!(index.candidates(&[Bson::Null]).is_none());
    }
    assert!(JoinIndex::build(&foreign, "f.0", &Env::default()).is_none());
    // Through the stage: the indexed join equals the matcher's verdict.
    let env = env_with(&[("foreign", foreign.clone())]);
    let out = run(
        vec![
            doc! {"$lookup": {"from": "foreign", "localField": "v", "foreignField": "f", "as": "o"}},
        ],
        vec![doc! {"v": 1}, doc! {"v": [2, "1"]}, doc! {"v": null}],
        &env,
    );
    assert_eq!(ids(out[0].get("o").unwrap()), vec![0, 1, 2]);
    assert_eq!(ids(out[1].get("o").unwrap()), vec![2, 5, 6]);
    assert_eq!(ids(out[2].get("o").unwrap()), vec![7, 9, 10]);
}

/// The documents of `docs` that pass any of `filters` (what a shard read of them returns).
fn passing_any(filters: &[Document], docs: &[Document]) -> Vec<Document> {
    let matchers: Vec<_> = filters
        .iter()
        .map(|f| crate::matcher::Matcher::parse(f).unwrap())
        .collect();
    docs.iter()
        .filter(|d| matchers.iter().any(|m| m.matches(d)))
        .cloned()
        .collect()
}

fn regex(pattern: &str) -> bson::Regex {
    bson::Regex {
        pattern: pattern.try_into().unwrap(),
        options: "".try_into().unwrap(),
    }
}

/// Reading only what `join_prefetch`'s filters select gives the same `$lookup` as reading the
/// whole foreign collection: values from arrays, missing fields (null), numbers of several
/// types, a regex, nested documents, in chunks smaller than the value count.
#[test]
fn join_prefetch_reads_a_superset_of_what_the_join_needs_and_nothing_more() {
    let input = vec![
        doc! {"_id": 1, "k": "almonds"},
        doc! {"_id": 2, "k": ["pecans", 3]},
        doc! {"_id": 3},
        doc! {"_id": 4, "k": 3.0},
        doc! {"_id": 5, "k": Bson::RegularExpression(regex("^c"))},
        doc! {"_id": 6, "k": {"a": 1}},
    ];
    let mut foreign = inventory();
    foreign.push(doc! {"_id": 7, "sku": 3_i64});
    foreign.push(doc! {"_id": 8, "sku": ["walnuts", "pecans"]});
    foreign.push(doc! {"_id": 9, "sku": {"a": 1}});
    foreign.push(doc! {"_id": 10, "sku": "cashews butter"});
    let stage = doc! {"$lookup": {"from": "inventory", "localField": "k", "foreignField": "sku", "as": "j"}};
    let parsed = Pipeline::parse(std::slice::from_ref(&stage)).unwrap();
    let (from, filters) = join_prefetch(&parsed.stages()[0], &input, 2, &Env::default())
        .unwrap()
        .unwrap();
    assert_eq!(from, "inventory");
    // almonds, pecans, 3 (3.0 is the same value), null, the regex, {a: 1}: six values.
    assert_eq!(filters.len(), 3);
    let read = passing_any(&filters, &foreign);
    let read_ids: Vec<i32> = read.iter().map(|d| d.get_i32("_id").unwrap()).collect();
    // bread (2), cashews (3) and "cashews butter" (10) join nothing: a regex value joins
    // only an equal regex, as the join's `$eq` does.
    assert_eq!(read_ids, vec![1, 4, 5, 6, 7, 8, 9]);
    let whole = run(
        vec![stage.clone()],
        input.clone(),
        &env_with(&[("inventory", foreign)]),
    );
    let narrowed = run(vec![stage], input, &env_with(&[("inventory", read)]));
    assert_eq!(narrowed, whole);

    // What needs whole collections: a correlated pipeline without an `$eq` on a one-name
    // field first, a $documents sub-pipeline, other stages.
    for stage in [
        doc! {"$lookup": {"from": "inventory", "let": {"k": "$k"}, "pipeline": [{"$match": {"$expr": {"$gt": ["$sku", "$$k"]}}}], "as": "j"}},
        doc! {"$lookup": {"from": "inventory", "let": {"k": "$k"}, "pipeline": [{"$match": {"$expr": {"$eq": ["$a.sku", "$$k"]}}}], "as": "j"}},
        doc! {"$lookup": {"from": "inventory", "let": {"k": "$k"}, "pipeline": [{"$set": {"sku": 1}}, {"$match": {"$expr": {"$eq": ["$sku", "$$k"]}}}], "as": "j"}},
        doc! {"$lookup": {"localField": "k", "foreignField": "sku", "pipeline": [{"$documents": [{"sku": 1}]}], "as": "j"}},
        doc! {"$unionWith": "inventory"},
    ] {
        let parsed = Pipeline::parse(&[stage]).unwrap();
        let plan = join_prefetch(&parsed.stages()[0], &orders(), 10, &Env::default()).unwrap();
        assert!(plan.is_none());
    }
    // No input documents: nothing to read.
    let (_, none) = join_prefetch(&parsed.stages()[0], &[], 10, &Env::default())
        .unwrap()
        .unwrap();
    assert!(none.is_empty());
}

#[test]
fn union_with_reads_its_collection_or_makes_its_documents() {
    let of = |stage: Document| {
        let parsed = Pipeline::parse(&[stage]).unwrap();
        match union_source(&parsed.stages()[0]) {
            Some(UnionSource::Collection(c, s)) => Some((c.to_string(), s.to_vec())),
            Some(UnionSource::Documents(p)) => Some((
                "$documents".into(),
                vec![doc! {"stages": p.stages().len() as i32}],
            )),
            None => None,
        }
    };
    assert_eq!(of(doc! {"$unionWith": "inv"}), Some(("inv".into(), vec![])));
    assert_eq!(
        of(
            doc! {"$unionWith": {"coll": "inv", "pipeline": [{"$match": {"a": 1}}, {"$count": "n"}]}}
        ),
        Some((
            "inv".into(),
            vec![doc! {"$match": {"a": 1}}, doc! {"$count": "n"}]
        ))
    );
    // A sub-pipeline that joins is an aggregate of its own all the same (its joins run on the
    // router, reading what they join).
    let lookup = doc! {"$lookup": {"from": "o", "localField": "a", "foreignField": "b", "as": "j"}};
    assert_eq!(
        of(doc! {"$unionWith": {"coll": "inv", "pipeline": [lookup.clone()]}}),
        Some(("inv".into(), vec![lookup.clone()]))
    );
    assert_eq!(
        of(doc! {"$unionWith": {"pipeline": [{"$documents": [{"a": 1}]}, lookup]}}),
        Some(("$documents".into(), vec![doc! {"stages": 2}]))
    );
    assert_eq!(of(doc! {"$match": {"a": 1}}), None);
}

/// Reading only what `GraphPrefetch` reaches, level by level, gives the same `$graphLookup` as
/// reading the whole collection: chains, a cycle, arrays, `maxDepth`, a restriction.
#[test]
fn graph_prefetch_reads_what_the_search_reaches_and_nothing_more() {
    // 0 → 1 → 2 → 3, 3 → 1 (a cycle), 4 → [5, 6], 7 alone, 8 points at a missing node.
    let nodes = vec![
        doc! {"_id": 0, "next": 1},
        doc! {"_id": 1, "next": 2},
        doc! {"_id": 2, "next": 3, "skip": true},
        doc! {"_id": 3, "next": 1},
        doc! {"_id": 4, "next": [5, 6]},
        doc! {"_id": 5},
        doc! {"_id": 6, "next": 99},
        doc! {"_id": 7, "next": 0},
        doc! {"_id": 8, "next": 42},
    ];
    let input = vec![doc! {"_id": "a", "from": 0}, doc! {"_id": "b", "from": [4]}];
    let stages = [
        doc! {"$graphLookup": {"from": "nodes", "startWith": "$from", "connectFromField": "next", "connectToField": "_id", "as": "path", "depthField": "d"}},
        doc! {"$graphLookup": {"from": "nodes", "startWith": "$from", "connectFromField": "next", "connectToField": "_id", "as": "path", "maxDepth": 1}},
        doc! {"$graphLookup": {"from": "nodes", "startWith": "$from", "connectFromField": "next", "connectToField": "_id", "as": "path", "restrictSearchWithMatch": {"skip": {"$ne": true}}}},
    ];
    let mut reads = Vec::new();
    for stage in stages {
        let parsed = Pipeline::parse(std::slice::from_ref(&stage)).unwrap();
        let mut search = GraphPrefetch::start(&parsed.stages()[0], &input, &Env::default())
            .unwrap()
            .unwrap();
        assert_eq!(search.from(), "nodes");
        let mut levels = 0;
        while let Some(filters) = search.next_filters(1) {
            levels += 1;
            search.found(passing_any(&filters, &nodes)).unwrap();
        }
        let read = search.into_docs();
        let mut ids: Vec<i32> = read.iter().map(|d| d.get_i32("_id").unwrap()).collect();
        ids.sort();
        reads.push((ids, levels));
        let key = |d: &Bson| d.as_document().unwrap().get_i32("_id").unwrap();
        let sorted = |mut out: Vec<Document>| {
            for d in &mut out {
                if let Ok(p) = d.get_array_mut("path") {
                    p.sort_by_key(key);
                }
            }
            out
        };
        let whole = run(
            vec![stage.clone()],
            input.clone(),
            &env_with(&[("nodes", nodes.clone())]),
        );
        let narrowed = run(vec![stage], input.clone(), &env_with(&[("nodes", read)]));
        assert_eq!(sorted(narrowed), sorted(whole));
    }
    // Never 7 or 8: nothing reaches them.
    assert_eq!(reads[0], (vec![0, 1, 2, 3, 4, 5, 6], 4));
    // maxDepth 1: two levels.
    assert_eq!(reads[1], (vec![0, 1, 4, 5, 6], 2));
    // The restricted node 2 is neither kept nor followed (so 3 is never looked for).
    assert_eq!(reads[2].0, vec![0, 1, 4, 5, 6]);
    // Other stages have no search.
    let other = Pipeline::parse(&[doc! {"$match": {}}]).unwrap();
    assert!(
        GraphPrefetch::start(&other.stages()[0], &input, &Env::default())
            .unwrap()
            .is_none()
    );
}

/// A correlated sub-pipeline whose first `$match` equates a foreign field with a `let`
/// variable reads only the documents with the variables' values, and joins as it would over
/// the whole collection: scalars, arrays (compared whole by `$eq`), null and missing fields,
/// the equality inside `$and`s, in either order.
#[test]
fn correlated_prefetch_reads_a_superset_of_what_the_eq_keeps() {
    let input = vec![
        doc! {"_id": 1, "k": "almonds", "n": 1},
        doc! {"_id": 2, "k": ["pecans", "bread"], "n": 2},
        doc! {"_id": 3, "k": null, "n": 3},
        doc! {"_id": 4, "k": 3, "n": 4},
    ];
    let mut foreign = inventory();
    foreign.push(doc! {"_id": 7, "sku": 3.0});
    foreign.push(doc! {"_id": 8, "sku": ["pecans", "bread"]});
    foreign.push(doc! {"_id": 9, "sku": ["x", ["pecans", "bread"]]});
    foreign.push(doc! {"_id": 10, "sku": "pecans"});
    let stages = [
        doc! {"$lookup": {"from": "inventory", "let": {"key": "$k"}, "pipeline": [{"$match": {"$expr": {"$eq": ["$sku", "$$key"]}}}], "as": "j"}},
        doc! {"$lookup": {"from": "inventory", "let": {"key": "$k", "n": "$n"}, "pipeline": [
            {"$match": {"instock": {"$gte": 0}, "$expr": {"$and": [{"$eq": ["$$key", "$sku"]}, {"$gte": ["$$n", 1]}]}}},
            {"$project": {"instock": 0}},
        ], "as": "j"}},
        doc! {"$lookup": {"from": "inventory", "let": {"key": "$k"}, "pipeline": [{"$match": {"$and": [{"_id": {"$gt": 0}}, {"$expr": {"$eq": ["$sku", "$$key"]}}]}}], "as": "j"}},
    ];
    for stage in stages {
        let parsed = Pipeline::parse(std::slice::from_ref(&stage)).unwrap();
        let (from, filters) = join_prefetch(&parsed.stages()[0], &input, 2, &Env::default())
            .unwrap()
            .unwrap_or_else(|| panic!("no prefetch for {stage}"));
        assert_eq!(from, "inventory");
        let read = passing_any(&filters, &foreign);
        assert!(read.len() < foreign.len(), "{stage}: read {read:?}");
        let whole = run(
            vec![stage.clone()],
            input.clone(),
            &env_with(&[("inventory", foreign.clone())]),
        );
        let narrowed = run(
            vec![stage],
            input.clone(),
            &env_with(&[("inventory", read)]),
        );
        assert_eq!(narrowed, whole);
    }
    // A variable missing for some document: the whole collection.
    let missing = Pipeline::parse(&[doc! {"$lookup": {"from": "inventory", "let": {"key": "$nope"}, "pipeline": [{"$match": {"$expr": {"$eq": ["$sku", "$$key"]}}}], "as": "j"}}]).unwrap();
    let plan = join_prefetch(&missing.stages()[0], &input, 2, &Env::default()).unwrap();
    assert!(plan.is_none());
}
