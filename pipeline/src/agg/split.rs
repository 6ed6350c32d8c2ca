//! Splitting a pipeline between the shards and the router, as mongos does: the shards run a
//! prefix over their own documents, the router merges their streams and runs the rest.
//!
//! The shards' part is the leading single-document transforms, then either a `$sort` (followed
//! by a copy of a `$limit` right after it, which the router applies again, or by a `$limit` of
//! skip + limit for a `$skip` then `$limit`) or a `$limit` copy,
//! or a `$group` whose accumulators combine (`$sum`, `$count`, `$min`, `$max`): each shard
//! groups its own documents, and the router groups the partial groups by `_id`.
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
    while i < stages.len()
        && kinds
            .get(i)
            .is_some_and(Stage::is_single_document_transform)
    {
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
        Some(Stage::Group(_)) => {
            if let Some((partial, merge)) = split_group(&stages[i]) {
                shards.push(partial);
                let mut merger = vec![merge];
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

/// A `$group` as a per-shard partial group and the router's group of the partials, when every
/// accumulator combines.
fn split_group(stage: &Document) -> Option<(Document, Document)> {
    let spec = stage.get_document("$group").ok()?;
    let mut partial = Document::new();
    let mut merge = Document::new();
    for (name, v) in spec {
        if name == "_id" {
            partial.insert("_id", v.clone());
            merge.insert("_id", "$_id");
            continue;
        }
        let acc = v.as_document()?;
        let (op, arg) = acc.iter().next()?;
        let (shard_acc, merge_op) = match op.as_str() {
            "$sum" => (doc! {"$sum": arg.clone()}, "$sum"),
            "$count" => (doc! {"$sum": 1}, "$sum"),
            "$min" => (doc! {"$min": arg.clone()}, "$min"),
            "$max" => (doc! {"$max": arg.clone()}, "$max"),
            _ => return None,
        };
        partial.insert(name.clone(), shard_acc);
        merge.insert(name.clone(), doc! {merge_op: format!("${name}")});
    }
    Some((doc! {"$group": partial}, doc! {"$group": merge}))
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
        let mut out = Pipeline::parse(&s.merger).unwrap().run(merged).unwrap();
        let mut whole = whole;
        let key = |d: &Document| d.to_string();
        out.sort_by_key(key);
        whole.sort_by_key(key);
        assert_eq!(out, whole);
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
        // $avg does not combine: the group runs on the router.
        let s = split_of(vec![doc! {"$group": {"_id": null, "a": {"$avg": "$x"}}}]);
        assert!(s.shards.is_empty());
        assert_eq!(s.merger.len(), 1);
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
