//! The planner's choices for typical queries, and the invariant that bounds are a superset:
//! every value the filter matches encodes inside the chosen intervals.

use super::*;
use crate::indexes::Index;

fn spec(key: Document, name: &str, extra: Document) -> Document {
    let mut d = doc! {"v": 2, "key": key, "name": name};
    d.extend(extra);
    d
}

fn choose_with(
    specs: &[Document],
    multikey: &[&str],
    filter: Document,
    sort: Option<Document>,
) -> Plan {
    choose_under(specs, multikey, filter, sort, None)
}

fn choose_under(
    specs: &[Document],
    multikey: &[&str],
    filter: Document,
    sort: Option<Document>,
    collation: Option<&Collation>,
) -> Plan {
    let candidates: Vec<Candidate<'_>> = specs
        .iter()
        .filter_map(Index::new)
        .map(|index| Candidate {
            multikey: multikey.contains(&index.name),
            index,
        })
        .collect();
    let sort = sort.map(|s| SortSpec::parse(&s).unwrap());
    choose(
        b"C",
        &candidates,
        &filter,
        sort.as_ref(),
        None,
        collation,
        &|i| [b"C".as_slice(), i.name.as_bytes(), &[0]].concat(),
    )
    .unwrap()
}

fn index_name(plan: &Plan) -> Option<&str> {
    match &plan.access {
        Access::Index(s) => Some(&s.name),
        _ => None,
    }
}

fn in_range(r: &KeyRange, key: &[u8]) -> bool {
    let lo = match &r.start {
        Bound::Included(s) => key >= s.as_slice(),
        Bound::Excluded(s) => key > s.as_slice(),
        Bound::Unbounded => true,
    };
    let hi = match &r.end {
        Bound::Included(e) => key <= e.as_slice(),
        Bound::Excluded(e) => key < e.as_slice(),
        Bound::Unbounded => true,
    };
    lo && hi
}

/// The storage key an entry for `values` has in index `name` (non-unique, `_id` 1).
fn entry(name: &str, dirs: &[Direction], values: &[Bson]) -> Vec<u8> {
    let mut k = [b"C".as_slice(), name.as_bytes(), &[0]].concat();
    for (d, v) in dirs.iter().zip(values) {
        append_key(&mut k, *d, v);
    }
    k.extend(resume::keystring::key_bytes(&Bson::Int32(1)));
    k
}

#[test]
fn equality_on_an_indexed_field_uses_the_index() {
    let specs = [spec(doc! {"a": 1}, "a_1", doc! {})];
    let plan = choose_with(&specs, &[], doc! {"a": 5}, None);
    assert_eq!(index_name(&plan), Some("a_1"));
    let Access::Index(scan) = &plan.access else {
        unreachable!()
    };
    assert_eq!(scan.bounds, doc! {"a": ["[5, 5]"]});
    assert!(
        scan.intervals
            .iter()
            .any(|r| in_range(r, &entry("a_1", &[Direction::Ascending], &[Bson::Int32(5)])))
    );
    assert!(
        !scan
            .intervals
            .iter()
            .any(|r| in_range(r, &entry("a_1", &[Direction::Ascending], &[Bson::Int32(6)])))
    );
}

#[test]
fn an_unindexed_filter_scans_the_collection() {
    let specs = [spec(doc! {"a": 1}, "a_1", doc! {})];
    let plan = choose_with(&specs, &[], doc! {"b": 5}, None);
    assert!(matches!(
        plan.access,
        Access::Documents { bounded: false, .. }
    ));
}

#[test]
fn the_longest_equality_prefix_wins() {
    let specs = [
        spec(doc! {"a": 1}, "a_1", doc! {}),
        spec(doc! {"a": 1, "b": 1}, "a_1_b_1", doc! {}),
    ];
    let plan = choose_with(&specs, &[], doc! {"a": 1, "b": 2}, None);
    assert_eq!(index_name(&plan), Some("a_1_b_1"));
}

#[test]
fn range_bounds_stay_within_the_type_and_include_the_matches() {
    let specs = [spec(doc! {"a": 1}, "a_1", doc! {})];
    let plan = choose_with(&specs, &[], doc! {"a": {"$gt": 5, "$lte": 9}}, None);
    let Access::Index(scan) = &plan.access else {
        unreachable!()
    };
    assert_eq!(scan.bounds, doc! {"a": ["(5, 9]"]});
    let has = |v: Bson| {
        scan.intervals.iter().any(|r| {
            in_range(
                r,
                &entry("a_1", &[Direction::Ascending], std::slice::from_ref(&v)),
            )
        })
    };
    assert!(!has(Bson::Int32(5)));
    assert!(has(Bson::Double(5.5)));
    assert!(has(Bson::Int64(9)));
    assert!(!has(Bson::Int32(10)));
    assert!(!has(Bson::String("6".into())));
    // Only a lower bound: up to the end of the numbers, not into strings.
    let plan = choose_with(&specs, &[], doc! {"a": {"$gte": 5}}, None);
    let Access::Index(scan) = &plan.access else {
        unreachable!()
    };
    let has = |v: Bson| {
        scan.intervals.iter().any(|r| {
            in_range(
                r,
                &entry("a_1", &[Direction::Ascending], std::slice::from_ref(&v)),
            )
        })
    };
    assert!(has(Bson::Double(f64::INFINITY)));
    assert!(!has(Bson::String("".into())));
}

#[test]
fn descending_fields_invert_the_bounds() {
    let specs = [spec(doc! {"a": -1}, "a_-1", doc! {})];
    let plan = choose_with(&specs, &[], doc! {"a": {"$gt": 5, "$lt": 9}}, None);
    let Access::Index(scan) = &plan.access else {
        unreachable!()
    };
    assert_eq!(scan.bounds, doc! {"a": ["(9, 5)"]});
    let has = |v: Bson| {
        scan.intervals.iter().any(|r| {
            in_range(
                r,
                &entry("a_-1", &[Direction::Descending], std::slice::from_ref(&v)),
            )
        })
    };
    assert!(has(Bson::Int32(6)));
    assert!(has(Bson::Int32(8)));
    assert!(!has(Bson::Int32(9)));
    assert!(!has(Bson::Int32(5)));
}

#[test]
fn a_multikey_index_keeps_one_side_of_a_range() {
    let specs = [spec(doc! {"a": 1}, "a_1", doc! {})];
    let plan = choose_with(&specs, &["a_1"], doc! {"a": {"$gt": 5, "$lt": 9}}, None);
    let Access::Index(scan) = &plan.access else {
        unreachable!()
    };
    // {a: [1, 20]} matches (20 > 5, 1 < 9): its entry 20 must be inside.
    assert!(scan.intervals.iter().any(|r| in_range(
        r,
        &entry("a_1", &[Direction::Ascending], &[Bson::Int32(20)])
    )));
}

#[test]
fn an_index_gives_the_sort_after_its_equality_prefix() {
    let specs = [spec(doc! {"a": 1, "b": -1}, "a_1_b_-1", doc! {})];
    let plan = choose_with(&specs, &[], doc! {"a": 1}, Some(doc! {"b": 1}));
    assert_eq!(index_name(&plan), Some("a_1_b_-1"));
    assert!(plan.provides_sort);
    let Access::Index(scan) = &plan.access else {
        unreachable!()
    };
    assert!(scan.reverse);
    // Sorting on a field the index does not order next needs a sort stage.
    let plan = choose_with(&specs, &[], doc! {"a": 1}, Some(doc! {"c": 1}));
    assert!(!plan.provides_sort);
    // A multikey index never provides a sort.
    let plan = choose_with(&specs, &["a_1_b_-1"], doc! {"a": 1}, Some(doc! {"b": 1}));
    assert!(!plan.provides_sort);
}

#[test]
fn a_sort_alone_can_pick_an_index_and_id_ranges_use_the_documents_order() {
    let specs = [spec(doc! {"a": 1}, "a_1", doc! {})];
    let plan = choose_with(&specs, &[], doc! {}, Some(doc! {"a": -1}));
    assert_eq!(index_name(&plan), Some("a_1"));
    assert!(plan.provides_sort);
    let plan = choose_with(
        &specs,
        &[],
        doc! {"_id": {"$gt": 10}},
        Some(doc! {"_id": 1}),
    );
    assert!(matches!(
        plan.access,
        Access::Documents {
            bounded: true,
            reverse: false,
            ..
        }
    ));
    assert!(plan.provides_sort);
}

#[test]
fn sparse_and_partial_indexes_are_used_only_when_they_hold_every_match() {
    let specs = [
        spec(doc! {"a": 1}, "a_sparse", doc! {"sparse": true}),
        spec(
            doc! {"b": 1},
            "b_partial",
            doc! {"partialFilterExpression": {"c": true}},
        ),
    ];
    assert_eq!(
        index_name(&choose_with(&specs, &[], doc! {"a": 3}, None)),
        Some("a_sparse")
    );
    assert_eq!(
        index_name(&choose_with(&specs, &[], doc! {"a": null}, None)),
        None
    );
    assert_eq!(
        index_name(&choose_with(&specs, &[], doc! {"b": 3}, None)),
        None
    );
    assert_eq!(
        index_name(&choose_with(&specs, &[], doc! {"b": 3, "c": true}, None)),
        Some("b_partial")
    );
}

#[test]
fn hashed_indexes_serve_equality_only_and_in_lists_become_points() {
    let specs = [spec(doc! {"a": "hashed"}, "a_hashed", doc! {})];
    assert_eq!(
        index_name(&choose_with(&specs, &[], doc! {"a": 7}, None)),
        Some("a_hashed")
    );
    assert_eq!(
        index_name(&choose_with(&specs, &[], doc! {"a": {"$gt": 7}}, None)),
        None
    );
    let specs = [spec(doc! {"a": 1}, "a_1", doc! {})];
    let plan = choose_with(&specs, &[], doc! {"a": {"$in": [3, 1, 2]}}, None);
    let Access::Index(scan) = &plan.access else {
        unreachable!()
    };
    assert_eq!(scan.intervals.len(), 3);
    assert!(
        scan.intervals
            .windows(2)
            .all(|w| match (&w[0].start, &w[1].start) {
                (Bound::Included(a), Bound::Included(b)) => a < b,
                _ => false,
            })
    );
}

#[test]
fn a_bad_hint_is_refused_and_a_good_one_forces_the_index() {
    let specs = [
        spec(doc! {"a": 1}, "a_1", doc! {}),
        spec(doc! {"b": 1}, "b_1", doc! {}),
    ];
    let candidates: Vec<Candidate<'_>> = specs
        .iter()
        .filter_map(Index::new)
        .map(|index| Candidate {
            index,
            multikey: false,
        })
        .collect();
    let prefix = |i: &Index<'_>| [b"C".as_slice(), i.name.as_bytes(), &[0]].concat();
    let err = choose(
        b"C",
        &candidates,
        &doc! {"a": 1},
        None,
        Some(&Hint::Name("nope".into())),
        None,
        &prefix,
    )
    .unwrap_err();
    assert_eq!(err.code, 2);
    let plan = choose(
        b"C",
        &candidates,
        &doc! {"a": 1},
        None,
        Some(&Hint::Pattern(doc! {"b": 1})),
        None,
        &prefix,
    )
    .unwrap();
    assert_eq!(index_name(&plan), Some("b_1"));
}

fn en(strength: i32) -> Collation {
    Collation::parse_doc(&doc! {"locale": "en", "strength": strength})
        .expect("valid collation")
        .expect("not simple")
}

#[test]
fn an_index_bounds_strings_only_under_its_own_collation() {
    let en2 = en(2);
    let specs = [
        spec(doc! {"a": 1}, "a_1", doc! {}),
        spec(doc! {"b": 1}, "b_1", doc! {"collation": en2.spec().clone()}),
    ];
    // A simple index cannot find "PING" for "ping" under strength 2: scan instead.
    let plan = choose_under(&specs, &[], doc! {"a": "ping"}, None, Some(&en2));
    assert_eq!(index_name(&plan), None);
    // Numbers do not depend on the collation: the simple index still serves.
    let plan = choose_under(&specs, &[], doc! {"a": 5}, None, Some(&en2));
    assert_eq!(index_name(&plan), Some("a_1"));
    // The collated index serves its own collation, with the string's collation key as bound:
    // the key of any case variant lies inside it.
    let plan = choose_under(&specs, &[], doc! {"b": "ping"}, None, Some(&en2));
    assert_eq!(index_name(&plan), Some("b_1"));
    let Access::Index(scan) = &plan.access else {
        unreachable!()
    };
    assert!(scan.collated);
    let key = entry(
        "b_1",
        &[Direction::Ascending],
        &[en2.fold(&Bson::from("PiNG"))],
    );
    assert!(scan.intervals.iter().any(|r| in_range(r, &key)));
    // ...but not a simple query on strings, nor another strength.
    assert_eq!(
        index_name(&choose_under(&specs, &[], doc! {"b": "ping"}, None, None)),
        None
    );
    assert_eq!(
        index_name(&choose_under(
            &specs,
            &[],
            doc! {"b": "ping"},
            None,
            Some(&en(1))
        )),
        None
    );
}

#[test]
fn a_collation_changes_which_orders_give_a_sort() {
    let en2 = en(2);
    let specs = [spec(
        doc! {"a": 1},
        "a_1",
        doc! {"collation": en2.spec().clone()},
    )];
    let sort = Some(doc! {"a": 1});
    let plan = choose_under(
        &specs,
        &[],
        doc! {"a": {"$gt": 1}},
        sort.clone(),
        Some(&en2),
    );
    assert!(plan.provides_sort);
    let plan = choose_under(&specs, &[], doc! {"a": {"$gt": 1}}, sort, None);
    assert!(!plan.provides_sort);
    // The documents table is in simple `_id` order, and `{_id: "x"}` is no point lookup.
    let id_sort = Some(doc! {"_id": 1});
    assert!(!choose_under(&[], &[], doc! {}, id_sort.clone(), Some(&en2)).provides_sort);
    assert!(choose_under(&[], &[], doc! {}, id_sort, None).provides_sort);
    let plan = choose_under(&[], &[], doc! {"_id": "x"}, None, Some(&en2));
    assert!(!matches!(plan.access, Access::IdPoint(_)));
    let plan = choose_under(&[], &[], doc! {"_id": 7}, None, Some(&en2));
    assert!(matches!(plan.access, Access::IdPoint(_)));
}
