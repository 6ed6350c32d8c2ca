//! Splitting a pipeline between the shards and the router, as mongos does: the shards run a
//! prefix over their own documents, the router merges their streams and runs the rest.
//!
//! The shards' part is the leading per-document stages (single-document transforms and
//! `$unwind`), then either a `$sort` (followed
//! by a copy of a `$limit` right after it, which the router applies again, or by a `$limit` of
//! skip + limit for a `$skip` then `$limit`) or a `$limit` copy,
//! or a `$sample` (each shard keeps its documents with the smallest random keys, the router
//! the smallest of all: a uniform sample), or a `$group` whose accumulators split (all of the ones `$group` has: see `split_group`),
//! or a `$bucket`, `$count` or `$sortByCount`: each shard groups its own documents, and the router groups
//! the partial groups by `_id` and finishes what needs finishing (`$avg` divides, `$push`
//! concatenates the shards' arrays).
//!
//! Invariant: running the shards' part on every shard, merging the streams (in `merge_sort`
//! order when given) and running the router's part equals running the whole pipeline over all
//! documents, up to the order in which `$group` emits its groups (unspecified in MongoDB).
//! Stages that read other collections never go to the shards.

use bson::{Bson, Document, doc};

use super::{Pipeline, Stage};

/// The two halves of a pipeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// What every shard runs over its documents.
    pub shards: Vec<Document>,
    /// What the router runs over the merged stream.
    pub merger: Vec<Document>,
    /// The sort order the shards' streams come in, to merge by (the shards' final `$sort`).
    pub merge_sort: Option<Document>,
}

/// Splits `stages` (whose parse is `parsed`, one stage per document).
pub fn split(stages: &[Document], parsed: &Pipeline) -> Split {
    let kinds = parsed.stages();
    let mut shards = Vec::new();
    let mut i = 0;
    while i < stages.len() && kinds.get(i).is_some_and(runs_per_document) {
        shards.push(stages[i].clone());
        i += 1;
    }
    let mut merge_sort = None;
    match kinds.get(i) {
        Some(Stage::Sort(_)) => {
            shards.push(stages[i].clone());
            merge_sort = stages[i].get_document("$sort").ok().cloned();
            i += 1;
            match (kinds.get(i), kinds.get(i + 1)) {
                (Some(Stage::Limit(_)), _) => shards.push(stages[i].clone()),
                // The router skips; each shard keeps what the skip and the limit may need.
                (Some(Stage::Skip(n)), Some(Stage::Limit(m))) => {
                    let keep = n.saturating_add(*m);
                    shards.push(doc! {"$limit": i64::try_from(keep).unwrap_or(i64::MAX)});
                }
                _ => {}
            }
        }
        Some(Stage::Limit(_)) => shards.push(stages[i].clone()),
        Some(Stage::Sample(n)) => {
            // Every document draws a random key; the `n` smallest keys of all shards are a
            // uniform sample, and each shard sends only its own `n` smallest.
            let n = i64::try_from(*n).unwrap_or(i64::MAX);
            shards.extend([
                doc! {"$replaceRoot": {"newRoot": {"r": {"$rand": {}}, "d": "$$ROOT"}}},
                doc! {"$sort": {"r": 1}},
                doc! {"$limit": n},
            ]);
            let mut merger = vec![doc! {"$limit": n}, doc! {"$replaceRoot": {"newRoot": "$d"}}];
            merger.extend(stages[i + 1..].iter().cloned());
            return Split {
                shards,
                merger,
                merge_sort: Some(doc! {"r": 1}),
            };
        }
        Some(Stage::Group(_) | Stage::Bucket(_) | Stage::Count(_) | Stage::SortByCount(_)) => {
            let halves = match kinds[i] {
                Stage::Group(_) => split_group(&stages[i]),
                Stage::Bucket(_) => split_bucket(&stages[i]),
                _ => split_count(&stages[i]),
            };
            if let Some((partial, mut merger)) = halves {
                shards.push(partial);
                merger.extend(stages[i + 1..].iter().cloned());
                return Split {
                    shards,
                    merger,
                    merge_sort: None,
                };
            }
        }
        _ => {}
    }
    Split {
        shards,
        merger: stages[i..].to_vec(),
        merge_sort,
    }
}

/// Whether the stage's output for each document depends on that document alone, so every
/// shard can run it over its own: the single-document transforms and `$unwind`.
fn runs_per_document(stage: &Stage) -> bool {
    stage.is_single_document_transform() || matches!(stage, Stage::Unwind(_))
}

/// A `$group` as a per-shard partial group and the router's stages over the partials (see
/// [`split_accumulators`]).
fn split_group(stage: &Document) -> Option<(Document, Vec<Document>)> {
    let spec = stage.get_document("$group").ok()?;
    let mut accumulators = spec.clone();
    let id = accumulators.remove("_id")?;
    let (partial, merger) = split_accumulators(&accumulators)?;
    let mut group = doc! {"_id": id};
    group.extend(partial);
    Some((doc! {"$group": group}, merger))
}

/// A `$bucket` as per-shard buckets of partial accumulators, then the router's group of the
/// partials by bucket, sorted by bucket as `$bucket` sorts.
fn split_bucket(stage: &Document) -> Option<(Document, Vec<Document>)> {
    let spec = stage.get_document("$bucket").ok()?;
    let output = match spec.get("output") {
        Some(o) => o.as_document()?.clone(),
        None => doc! {"count": {"$sum": 1}},
    };
    let (partial, mut merger) = split_accumulators(&output)?;
    let mut shard = spec.clone();
    shard.insert("output", partial);
    merger.push(doc! {"$sort": {"_id": 1}});
    Some((doc! {"$bucket": shard}, merger))
}

/// Named accumulators as the shards' partial accumulators and the router's stages over the
/// partial groups (a group by `_id`, then whatever finishes an accumulator), when every
/// accumulator splits:
///
/// * `$sum`, `$min`, `$max`, `$mergeObjects`, `$first`, `$last` combine with themselves
///   (`$count` is a `$sum` of 1; `$first`/`$last` take some shard's first or last, which is
///   as good as any when the input has no order, and with a `$sort` before it the group runs
///   on the router);
/// * `$push` and `$addToSet` push each shard's array, then concatenate (or unite) them;
/// * `$avg` sums the numbers and counts them on each shard (in a hidden field), then divides.
fn split_accumulators(spec: &Document) -> Option<(Document, Vec<Document>)> {
    let mut partial = Document::new();
    let mut merge = doc! {"_id": "$_id"};
    let mut finish = Document::new();
    let mut hidden = Vec::new();
    for (name, v) in spec {
        let acc = v.as_document()?;
        let (op, arg) = acc.iter().next()?;
        let field = format!("${name}");
        let (shard_acc, merge_acc) = match op.as_str() {
            "$sum" | "$min" | "$max" | "$mergeObjects" | "$first" | "$last" => {
                (doc! {op: arg.clone()}, doc! {op: field.clone()})
            }
            "$count" => (doc! {"$sum": 1}, doc! {"$sum": field.clone()}),
            "$push" | "$addToSet" => {
                let combine = if op == "$push" {
                    "$concatArrays"
                } else {
                    "$setUnion"
                };
                finish.insert(
                    name.clone(),
                    doc! {"$reduce": {
                        "input": field.clone(),
                        "initialValue": [],
                        "in": {combine: ["$$value", "$$this"]},
                    }},
                );
                (doc! {op: arg.clone()}, doc! {"$push": field.clone()})
            }
            "$avg" => {
                let count = format!("{name}{AVG_COUNT_SUFFIX}");
                if spec.contains_key(&count) || count == "_id" {
                    return None;
                }
                let numbers = doc! {"$cond": [{"$isNumber": [arg.clone()]}, 1, 0]};
                partial.insert(count.clone(), doc! {"$sum": numbers});
                merge.insert(count.clone(), doc! {"$sum": format!("${count}")});
                finish.insert(
                    name.clone(),
                    doc! {"$cond": [
                        {"$eq": [format!("${count}"), 0]},
                        null,
                        {"$divide": [field.clone(), format!("${count}")]},
                    ]},
                );
                hidden.push(Bson::String(count));
                (doc! {"$sum": arg.clone()}, doc! {"$sum": field.clone()})
            }
            _ => return None,
        };
        partial.insert(name.clone(), shard_acc);
        merge.insert(name.clone(), merge_acc);
    }
    let mut merger = vec![doc! {"$group": merge}];
    if !finish.is_empty() {
        merger.push(doc! {"$set": finish});
    }
    if !hidden.is_empty() {
        merger.push(doc! {"$unset": hidden});
    }
    Some((partial, merger))
}

/// Names `$avg`'s per-shard count of numbers beside its sum (removed before the output).
const AVG_COUNT_SUFFIX: &str = "__tributaryAvgCount";

/// `$count` and `$sortByCount` as a per-shard count and the router's sum of the counts.
fn split_count(stage: &Document) -> Option<(Document, Vec<Document>)> {
    let (name, v) = stage.iter().next()?;
    match name.as_str() {
        "$count" => {
            let field = v.as_str()?;
            Some((
                doc! {"$group": {"_id": null, field: {"$sum": 1}}},
                vec![
                    doc! {"$group": {"_id": null, field: {"$sum": format!("${field}")}}},
                    doc! {"$project": {"_id": 0}},
                ],
            ))
        }
        "$sortByCount" => Some((
            doc! {"$group": {"_id": v.clone(), "count": {"$sum": 1}}},
            vec![
                doc! {"$group": {"_id": "$_id", "count": {"$sum": "$count"}}},
                doc! {"$sort": {"count": -1}},
            ],
        )),
        _ => None,
    }
}

/// `{shardsPart, mergerPart}` for explain.
pub fn explain(split: &Split) -> Document {
    let list = |v: &[Document]| v.iter().cloned().map(Bson::Document).collect::<Vec<_>>();
    doc! {"shardsPart": list(&split.shards), "mergerPart": list(&split.merger)}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_of(stages: Vec<Document>) -> Split {
        let parsed = Pipeline::parse(&stages).unwrap();
        split(&stages, &parsed)
    }

    /// Runs the split over two "shards" and compares with the whole pipeline over all documents.
    fn same_as_unsplit(stages: Vec<Document>, docs: Vec<Document>) {
        let (whole, split) = both_ways(stages, docs, |_| {});
        assert_eq!(split, whole);
    }

    /// The whole pipeline's output over all documents and the split's over two "shards", each
    /// document passed through `normalize`, in one (string) order.
    fn both_ways(
        stages: Vec<Document>,
        docs: Vec<Document>,
        normalize: impl Fn(&mut Document),
    ) -> (Vec<Document>, Vec<Document>) {
        let whole = Pipeline::parse(&stages).unwrap().run(docs.clone()).unwrap();
        let s = split_of(stages);
        let shards = Pipeline::parse(&s.shards).unwrap();
        let (a, b): (Vec<_>, Vec<_>) = docs.into_iter().enumerate().partition(|(i, _)| i % 3 == 0);
        let mut merged = Vec::new();
        for part in [a, b] {
            merged.extend(shards.run(part.into_iter().map(|(_, d)| d)).unwrap());
        }
        if let Some(sort) = &s.merge_sort {
            crate::sort::SortSpec::parse(sort)
                .unwrap()
                .sort(&mut merged);
        }
        let split = Pipeline::parse(&s.merger).unwrap().run(merged).unwrap();
        let ordered = |mut out: Vec<Document>| {
            out.iter_mut().for_each(&normalize);
            out.sort_by_key(|d| d.to_string());
            out
        };
        (ordered(whole), ordered(split))
    }

    fn docs() -> Vec<Document> {
        (0..30)
            .map(|i| doc! {"_id": i, "g": i % 4, "x": i * 3 % 7, "s": format!("s{}", i % 5)})
            .collect()
    }

    #[test]
    fn transforms_and_sort_with_limit_go_to_the_shards() {
        let s = split_of(vec![
            doc! {"$match": {"x": {"$gt": 1}}},
            doc! {"$project": {"x": 1, "g": 1}},
            doc! {"$sort": {"x": -1, "_id": 1}},
            doc! {"$limit": 5},
            doc! {"$group": {"_id": "$g"}},
        ]);
        assert_eq!(s.shards.len(), 4);
        assert_eq!(s.merge_sort, Some(doc! {"x": -1, "_id": 1}));
        assert_eq!(s.merger[0], doc! {"$limit": 5});
        same_as_unsplit(
            vec![
                doc! {"$match": {"x": {"$gt": 1}}},
                doc! {"$project": {"x": 1, "g": 1}},
                doc! {"$sort": {"x": -1, "_id": 1}},
                doc! {"$limit": 5},
                doc! {"$group": {"_id": "$g", "n": {"$sum": 1}}},
            ],
            docs(),
        );
    }

    #[test]
    fn sample_draws_keys_on_the_shards_and_keeps_the_smallest() {
        let stages = vec![doc! {"$match": {"g": 1}}, doc! {"$sample": {"size": 3}}];
        let s = split_of(stages.clone());
        assert_eq!(s.shards.len(), 4);
        assert_eq!(s.merge_sort, Some(doc! {"r": 1}));
        // The sample is 3 distinct documents of the input's, whole.
        let (_, split) = both_ways(stages, docs(), |_| {});
        assert_eq!(split.len(), 3);
        let input = docs();
        for d in &split {
            assert!(input.contains(d) && d.get_i32("g").ok() == Some(1), "{d}");
        }
        // A sample larger than the input is all of it.
        same_as_unsplit(
            vec![doc! {"$sample": {"size": 100}}, doc! {"$sort": {"_id": 1}}],
            docs(),
        );
    }

    #[test]
    fn unwind_runs_on_the_shards_before_a_group() {
        let mut input = docs();
        input.push(doc! {"_id": 50, "g": 1, "tags": ["a", "b", "a"]});
        input.push(doc! {"_id": 51, "g": 2, "tags": []});
        input.push(doc! {"_id": 52, "g": 2, "tags": ["b"]});
        let stages = vec![
            doc! {"$unwind": {"path": "$tags", "includeArrayIndex": "at"}},
            doc! {"$project": {"tags": 1, "at": 1}},
            doc! {"$group": {"_id": "$tags", "n": {"$sum": 1}, "at": {"$max": "$at"}}},
        ];
        let s = split_of(stages.clone());
        assert_eq!(s.shards.len(), 3, "unwind, project and the partial group");
        same_as_unsplit(stages, input);
    }

    #[test]
    fn a_skip_then_limit_after_the_sort_limits_each_shard_to_both() {
        let stages = vec![
            doc! {"$sort": {"x": 1, "_id": 1}},
            doc! {"$skip": 4},
            doc! {"$limit": 6},
        ];
        let s = split_of(stages.clone());
        assert_eq!(
            s.shards,
            vec![doc! {"$sort": {"x": 1, "_id": 1}}, doc! {"$limit": 10_i64}]
        );
        assert_eq!(s.merger, vec![doc! {"$skip": 4}, doc! {"$limit": 6}]);
        let whole = Pipeline::parse(&stages).unwrap().run(docs()).unwrap();
        let shards = Pipeline::parse(&s.shards).unwrap();
        let mut merged = Vec::new();
        for part in [&docs()[..15], &docs()[15..]] {
            merged.extend(shards.run(part.to_vec()).unwrap());
        }
        crate::sort::SortSpec::parse(s.merge_sort.as_ref().unwrap())
            .unwrap()
            .sort(&mut merged);
        assert_eq!(
            Pipeline::parse(&s.merger).unwrap().run(merged).unwrap(),
            whole
        );
    }

    #[test]
    fn combinable_groups_split_into_partial_and_final() {
        let stages = vec![
            doc! {"$match": {"g": {"$ne": 3}}},
            doc! {"$group": {"_id": "$g", "n": {"$count": {}}, "t": {"$sum": "$x"}, "lo": {"$min": "$s"}, "hi": {"$max": "$x"}}},
            doc! {"$sort": {"_id": 1}},
        ];
        let s = split_of(stages.clone());
        assert_eq!(s.shards.len(), 2);
        assert_eq!(
            s.merger[0],
            doc! {"$group": {"_id": "$_id", "n": {"$sum": "$n"}, "t": {"$sum": "$t"}, "lo": {"$min": "$lo"}, "hi": {"$max": "$hi"}}}
        );
        same_as_unsplit(stages, docs());
    }

    #[test]
    fn every_group_accumulator_splits_and_matches_the_unsplit_run() {
        // Documents with missing, null and non-numeric values, so `$avg` skips some.
        let mut input = docs();
        input.push(doc! {"_id": 100, "g": 1, "x": "text"});
        input.push(doc! {"_id": 101, "g": 2, "x": null});
        input.push(doc! {"_id": 102, "g": 7});
        input.push(doc! {"_id": 103, "g": 1, "x": 2.5, "o": {"a": 1}});
        input.push(doc! {"_id": 104, "g": 2, "x": 4, "o": {"b": 2}});
        let stages = vec![doc! {"$group": {
            "_id": {"$mod": ["$g", 3]},
            "avg": {"$avg": "$x"},
            "all": {"$push": "$x"},
            "set": {"$addToSet": "$s"},
            "obj": {"$mergeObjects": "$o"},
            "n": {"$count": {}},
        }}];
        let s = split_of(stages.clone());
        assert_eq!(s.shards.len(), 1, "the group goes to the shards");
        assert_eq!(s.merger.len(), 3, "group, then $set to finish, then $unset");
        // Arrays come back in shard order: compare them sorted.
        let (whole, split) = both_ways(stages, input.clone(), |d| {
            for field in ["all", "set"] {
                if let Ok(a) = d.get_array_mut(field) {
                    a.sort_by_key(|v| v.to_string());
                }
            }
        });
        assert_eq!(split, whole);
        // The order-free ones, with a group of no numbers (whose `$avg` is null).
        let (whole, split) = both_ways(
            vec![doc! {"$group": {
                "_id": "$g",
                "avg": {"$avg": "$x"},
                "lo": {"$min": "$x"},
                "total": {"$sum": "$x"},
            }}],
            input.clone(),
            |_| {},
        );
        assert!(whole.iter().any(|d| d.get("avg") == Some(&Bson::Null)));
        assert_eq!(split, whole);
        // `$first`/`$last` take some shard's: with one document per group they are exact.
        same_as_unsplit(
            vec![doc! {"$group": {"_id": "$_id", "f": {"$first": "$x"}, "l": {"$last": "$o"}}}],
            input.clone(),
        );
        // An accumulator name that would clash with the hidden count keeps the group whole.
        let clash = split_of(vec![doc! {"$group": {
            "_id": null,
            "a": {"$avg": "$x"},
            "a__tributaryAvgCount": {"$sum": 1},
        }}]);
        assert!(clash.shards.is_empty());
    }

    #[test]
    fn buckets_split_into_partial_buckets_merged_in_bucket_order() {
        let mut input = docs();
        input.push(doc! {"_id": 60, "x": "not a number"});
        let with_output = vec![doc! {"$bucket": {
            "groupBy": "$x",
            "boundaries": [0, 2, 5, 7],
            "default": "other",
            "output": {"n": {"$sum": 1}, "avg": {"$avg": "$g"}, "ids": {"$push": "$_id"}},
        }}];
        let s = split_of(with_output.clone());
        assert_eq!(s.shards.len(), 1, "the buckets are made on the shards");
        assert_eq!(s.merger.last(), Some(&doc! {"$sort": {"_id": 1}}));
        let (whole, split) = both_ways(with_output, input.clone(), |d| {
            if let Ok(a) = d.get_array_mut("ids") {
                a.sort_by_key(|v| v.to_string());
            }
        });
        assert_eq!(split, whole);
        // Without `output`, a count; and the router's order is the buckets' order.
        let plain =
            vec![doc! {"$bucket": {"groupBy": "$x", "boundaries": [0, 3, 7], "default": -1}}];
        let whole = Pipeline::parse(&plain).unwrap().run(input.clone()).unwrap();
        let s = split_of(plain);
        let shards = Pipeline::parse(&s.shards).unwrap();
        let mut merged = shards.run(input[..10].to_vec()).unwrap();
        merged.extend(shards.run(input[10..].to_vec()).unwrap());
        let out = Pipeline::parse(&s.merger).unwrap().run(merged).unwrap();
        assert_eq!(out, whole);
        assert_eq!(out[0].get("_id"), Some(&Bson::Int32(-1)));
    }

    #[test]
    fn count_and_sort_by_count_split_into_partial_counts() {
        let count = vec![doc! {"$match": {"g": {"$gt": 0}}}, doc! {"$count": "n"}];
        let s = split_of(count.clone());
        assert_eq!(s.shards.len(), 2);
        same_as_unsplit(count, docs());
        same_as_unsplit(vec![doc! {"$count": "n"}], Vec::new());
        let by = vec![doc! {"$sortByCount": "$g"}];
        let s = split_of(by.clone());
        assert_eq!(
            s.shards,
            vec![doc! {"$group": {"_id": "$g", "count": {"$sum": 1}}}]
        );
        assert_eq!(s.merger[1], doc! {"$sort": {"count": -1}});
        same_as_unsplit(by, docs());
    }

    #[test]
    fn stages_reading_other_collections_stay_on_the_router() {
        let s = split_of(vec![
            doc! {"$match": {"g": 1}},
            doc! {"$lookup": {"from": "f", "localField": "g", "foreignField": "g", "as": "o"}},
            doc! {"$project": {"o": 0}},
        ]);
        assert_eq!(s.shards, vec![doc! {"$match": {"g": 1}}]);
        assert_eq!(s.merger.len(), 2);
    }
}
