//! The query planner: from a filter, an optional sort and an optional hint, which key space to
//! scan (one `_id`, the documents in `_id` order, or a secondary index) and within which key
//! intervals. Pure: the caller supplies the candidate indexes and whether each is multikey.
//!
//! Invariants:
//! * Bounds are a superset: every document the filter matches lies in the chosen intervals.
//!   The caller always applies the whole filter to what it fetches, so a bound the planner
//!   cannot derive exactly is widened (a field left unbounded), never narrowed.
//! * Intervals are disjoint and listed in key order; scanning them in order (or all in reverse)
//!   yields keys in the index's order, so `provides_sort` holds exactly when that order is the
//!   requested sort.
//! * A multikey index gets at most one side of a range per field (an array can match `$gt`
//!   with one element and `$lt` with another) and never provides a sort; a sparse index is not
//!   used for a bound that admits `null` (its missing documents have no entry) unless hinted;
//!   a partial index only when the filter repeats its `partialFilterExpression`'s clauses.
//! * Planning is deterministic: equal inputs choose the same plan.

use std::ops::Bound;

use bson::{Bson, Document, doc};
use pipeline::collation::{Collation, has_string};
use pipeline::sort::SortSpec;
use wire::MongoError;

use super::{Direction, Index, append_key};
use crate::storage::KeyRange;

/// At most this many point combinations over a compound index's leading fields.
const MAX_POINTS: usize = 200;

/// One secondary index the planner may use.
pub struct Candidate<'a> {
    pub index: Index<'a>,
    pub multikey: bool,
}

/// Where a query reads.
#[derive(Debug, Clone, PartialEq)]
pub enum Access {
    /// `{_id: v}`: one point lookup in the documents table.
    IdPoint(Bson),
    /// The documents table in `_id` order, within `intervals` (absolute storage keys); a
    /// collection scan when `bounded` is false.
    Documents {
        intervals: Vec<KeyRange>,
        bounded: bool,
        reverse: bool,
        bounds: Document,
    },
    /// A secondary index's entries within `intervals` (absolute storage keys).
    Index(IndexScan),
    /// A capped collection in insertion order (`capped`'s natural entries under `prefix`).
    Natural { prefix: Vec<u8>, reverse: bool },
}

#[derive(Debug, Clone, PartialEq)]
pub struct IndexScan {
    pub name: String,
    pub pattern: Document,
    pub intervals: Vec<KeyRange>,
    pub reverse: bool,
    pub multikey: bool,
    pub unique: bool,
    pub sparse: bool,
    pub partial: bool,
    /// Per key field, its intervals as MongoDB's explain prints them.
    pub bounds: Document,
    /// The key fields and their directions.
    pub directions: Vec<(String, Direction)>,
    /// The index's key prefix (collection UUID ++ name ++ 0).
    pub prefix: Vec<u8>,
    /// The entries' key values answer the query: no document is fetched (see [`cover`]).
    pub covered: bool,
    /// The index has a collation: its string keys are collation keys, not the values.
    pub collated: bool,
}

/// The chosen plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub access: Access,
    /// The scan's order is the requested sort: no sort stage is needed.
    pub provides_sort: bool,
}

/// What a query asks of one field.
#[derive(Debug, Clone)]
enum FieldPred {
    /// Any of these values (equality, `$in`).
    Points(Vec<Bson>),
    /// A range; each side `(value, inclusive)`.
    Range {
        lo: Option<Box<(Bson, bool)>>,
        hi: Option<Box<(Bson, bool)>>,
    },
}

impl FieldPred {
    fn values(&self) -> impl Iterator<Item = &Bson> {
        let (points, lo, hi) = match self {
            FieldPred::Points(v) => (v.as_slice(), None, None),
            FieldPred::Range { lo, hi } => (&[][..], lo.as_deref(), hi.as_deref()),
        };
        points
            .iter()
            .chain(lo.map(|b| &b.0))
            .chain(hi.map(|b| &b.0))
    }
}

/// A `hint`.
#[derive(Debug, Clone)]
pub enum Hint {
    Name(String),
    Pattern(Document),
    Natural(bool),
}

impl Hint {
    /// Parses a command's `hint` (`None` for absent or empty).
    pub fn parse(v: Option<&Bson>) -> Result<Option<Hint>, MongoError> {
        match v {
            None | Some(Bson::Null) => Ok(None),
            Some(Bson::String(s)) if s.is_empty() => Ok(None),
            Some(Bson::String(s)) => Ok(Some(Hint::Name(s.clone()))),
            Some(Bson::Document(d)) if d.is_empty() => Ok(None),
            Some(Bson::Document(d)) => match d.get("$natural") {
                Some(v) => Ok(Some(Hint::Natural(
                    pipeline::value::as_f64(v).is_none_or(|n| n >= 0.0),
                ))),
                None => Ok(Some(Hint::Pattern(d.clone()))),
            },
            Some(_) => Err(MongoError::failed_to_parse(
                "hint must be a string or an object",
            )),
        }
    }
}

fn bad_hint() -> MongoError {
    MongoError::bad_value("hint provided does not correspond to an existing index")
}

/// Chooses how to run a query over `coll_prefix` (the documents' key prefix), under the
/// query's `collation` (`None`: simple). An index whose collation differs serves only the
/// bounds without strings and gives no sort; the `_id` order is the simple collation's.
pub fn choose(
    coll_prefix: &[u8],
    candidates: &[Candidate<'_>],
    filter: &Document,
    sort: Option<&SortSpec>,
    hint: Option<&Hint>,
    collation: Option<&Collation>,
    index_prefix: &dyn Fn(&Index<'_>) -> Vec<u8>,
) -> Result<Plan, MongoError> {
    let preds = predicates(filter);
    let q = collation;
    let sort_fields: Vec<(String, bool)> = sort
        .filter(|s| s.natural().is_none())
        .map(|s| s.fields().map(|(f, a)| (f.to_string(), a)).collect())
        .unwrap_or_default();
    let id_fields = [("_id", Direction::Ascending)];
    match hint {
        Some(Hint::Natural(forward)) => {
            return Ok(collscan(coll_prefix, !forward, &sort_fields, sort, q));
        }
        Some(Hint::Name(n)) if n == "_id_" => {
            return Ok(documents_plan(
                coll_prefix,
                &preds,
                &id_fields,
                &sort_fields,
                q,
            ));
        }
        Some(Hint::Pattern(p)) if is_id_pattern(p) => {
            return Ok(documents_plan(
                coll_prefix,
                &preds,
                &id_fields,
                &sort_fields,
                q,
            ));
        }
        Some(h) => {
            let c = candidates
                .iter()
                .find(|c| match h {
                    Hint::Name(n) => c.index.name == n,
                    Hint::Pattern(p) => {
                        pipeline::value::compare_documents(p, c.index.pattern).is_eq()
                    }
                    Hint::Natural(_) => false,
                })
                .ok_or_else(bad_hint)?;
            if !c.index.materialized() {
                return Err(MongoError::bad_value(format!(
                    "hint provided does not correspond to an index this server can scan: {}",
                    c.index.name
                )));
            }
            return Ok(index_plan(c, &preds, &sort_fields, q, index_prefix(&c.index)).1);
        }
        None => {}
    }
    if filter.len() == 1
        && let Some(v) = filter.get("_id")
        && let Some(FieldPred::Points(p)) = field_pred(v)
        && p.len() == 1
        && !matches!(p[0], Bson::Null | Bson::Undefined)
        && (q.is_none() || !has_string(&p[0]))
    {
        return Ok(Plan {
            access: Access::IdPoint(p[0].clone()),
            provides_sort: true,
        });
    }
    // Score: two per leading equality field, one for a range after them; a unique index
    // pinned by equality on every field wins outright. Ties go to the plan that gives the
    // sort, then to the `_id` order (no fetch per entry), then to the first index listed.
    let mut best: Option<((i64, bool, bool), Plan)> = None;
    let mut consider = |score: i64, is_id: bool, plan: Plan| {
        let key = (score, plan.provides_sort, is_id);
        if score > 0 && best.as_ref().is_none_or(|(k, _)| key > *k) {
            best = Some((key, plan));
        }
    };
    if preds.iter().any(|(f, _)| f == "_id") {
        let plan = documents_plan(coll_prefix, &preds, &id_fields, &sort_fields, q);
        consider(score_of(&under(&preds, q, None), &id_fields), true, plan);
    }
    for c in candidates {
        if !usable(c, filter, &preds) {
            continue;
        }
        let (score, plan) = index_plan(c, &preds, &sort_fields, q, index_prefix(&c.index));
        consider(score, false, plan);
    }
    if let Some((_, plan)) = best {
        return Ok(plan);
    }
    // No bounds anywhere: a scan in an order that gives the sort, else a collection scan.
    let scan = collscan(coll_prefix, false, &sort_fields, sort, q);
    if scan.provides_sort || sort_fields.is_empty() {
        return Ok(scan);
    }
    for c in candidates {
        if c.index.sparse() || c.index.partial().is_some() || !usable(c, filter, &preds) {
            continue;
        }
        let (_, plan) = index_plan(c, &preds, &sort_fields, q, index_prefix(&c.index));
        if plan.provides_sort {
            return Ok(plan);
        }
    }
    Ok(scan)
}

/// Narrows a hinted plan to `find`'s `min` (inclusive) and `max` (exclusive) index keys,
/// whose fields must be a prefix of the hinted index's, in order. The filter still applies.
pub fn restrict_to_min_max(
    plan: &mut Plan,
    coll_prefix: &[u8],
    hinted: bool,
    min: Option<&Document>,
    max: Option<&Document>,
) -> Result<(), MongoError> {
    if min.is_none() && max.is_none() {
        return Ok(());
    }
    let no_hint = || {
        MongoError::with_code(
            51173,
            "When using min()/max() a hint of which index to use must be provided",
        )
    };
    let (prefix, fields): (Vec<u8>, Vec<(String, Direction)>) = match &plan.access {
        _ if !hinted => return Err(no_hint()),
        Access::Index(scan) => (scan.prefix.clone(), scan.directions.clone()),
        Access::Documents { .. } => (
            coll_prefix.to_vec(),
            vec![("_id".to_string(), Direction::Ascending)],
        ),
        Access::IdPoint(_) | Access::Natural { .. } => return Err(no_hint()),
    };
    let key = |d: &Document| -> Result<Vec<u8>, MongoError> {
        let consistent = d.len() <= fields.len() && d.keys().zip(&fields).all(|(k, (f, _))| k == f);
        if !consistent {
            return Err(MongoError::with_code(
                51174,
                "The index chosen is not consistent with min/max",
            ));
        }
        let mut k = prefix.clone();
        for ((_, dir), v) in fields.iter().zip(d.values()) {
            append_key(&mut k, *dir, v);
        }
        Ok(k)
    };
    let start = match min {
        Some(m) => Bound::Included(key(m)?),
        None => Bound::Included(prefix.clone()),
    };
    let end = match max {
        Some(m) => Bound::Excluded(key(m)?),
        None => KeyRange::prefix(&prefix).end,
    };
    let range = KeyRange { start, end };
    match &mut plan.access {
        Access::Index(scan) => scan.intervals = vec![range],
        Access::Documents {
            intervals, bounded, ..
        } => {
            *intervals = vec![range];
            *bounded = true;
        }
        Access::IdPoint(_) | Access::Natural { .. } => {}
    }
    Ok(())
}

/// Marks an index scan covered when its entries alone answer the query: the index is neither
/// multikey nor hashed, has no dotted field, every field the filter or the projection names is
/// one of its fields, the projection is an inclusion that leaves `_id` out (unless the index
/// holds it), and the filter pins each projected field to a non-null value (an index stores a
/// missing field as null, so only then is the entry's value the document's).
pub fn cover(plan: &mut Plan, filter: &Document, projection: Option<&Document>) {
    let Access::Index(scan) = &mut plan.access else {
        return;
    };
    let Some(projection) = projection.filter(|p| !p.is_empty()) else {
        return;
    };
    let fields: Vec<&str> = scan.directions.iter().map(|(f, _)| f.as_str()).collect();
    if scan.multikey
        || scan.collated
        || scan
            .directions
            .iter()
            .any(|(f, d)| *d == Direction::Hashed || f.contains('.'))
    {
        return;
    }
    let included = |v: &Bson| {
        pipeline::value::as_f64(v).is_some_and(|n| n != 0.0) || v == &Bson::Boolean(true)
    };
    let mut projected = Vec::new();
    for (k, v) in projection {
        match (k.as_str(), included(v)) {
            ("_id", false) => {}
            (f, true) if fields.contains(&f) => projected.push(f),
            _ => return,
        }
    }
    if !projection.contains_key("_id") && !fields.contains(&"_id") {
        return;
    }
    if projected.is_empty() {
        return;
    }
    // Every filter field is in the index (top level only; `$and` of such clauses too).
    let mut names = Vec::new();
    if !filter_fields(filter, &mut names) || names.iter().any(|n| !fields.contains(&n.as_str())) {
        return;
    }
    let preds = predicates(filter);
    let non_null = |f: &str| {
        preds.iter().any(|(g, p)| {
            g == f
                && match p {
                    FieldPred::Points(v) => {
                        !v.iter().any(|x| matches!(x, Bson::Null | Bson::Undefined))
                    }
                    FieldPred::Range { .. } => true,
                }
        })
    };
    if projected.iter().all(|f| non_null(f)) {
        scan.covered = true;
    }
}

/// The field names a filter's clauses test; false when it holds operators beyond `$and`.
fn filter_fields(filter: &Document, out: &mut Vec<String>) -> bool {
    for (k, v) in filter {
        match (k.as_str(), v) {
            ("$and", Bson::Array(items)) => {
                for item in items {
                    match item {
                        Bson::Document(d) if filter_fields(d, out) => {}
                        _ => return false,
                    }
                }
            }
            (op, _) if op.starts_with('$') => return false,
            (f, _) => out.push(f.to_string()),
        }
    }
    true
}

fn is_id_pattern(p: &Document) -> bool {
    p.len() == 1 && p.contains_key("_id")
}

fn collscan(
    coll_prefix: &[u8],
    reverse: bool,
    sort_fields: &[(String, bool)],
    sort: Option<&SortSpec>,
    collation: Option<&Collation>,
) -> Plan {
    // The documents table is in `_id` order (simple collation): it gives an `_id` sort, and
    // `$natural` order.
    let (reverse, provides_sort) = match (sort.and_then(SortSpec::natural), sort_fields) {
        (Some(forward), _) => (!forward, true),
        (None, [(f, asc)]) if f == "_id" && collation.is_none() => (!asc, true),
        (None, []) => (reverse, true),
        _ => (reverse, false),
    };
    Plan {
        access: Access::Documents {
            intervals: vec![KeyRange::prefix(coll_prefix)],
            bounded: false,
            reverse,
            bounds: doc! {"_id": ["[MinKey, MaxKey]"]},
        },
        provides_sort,
    }
}

fn documents_plan(
    coll_prefix: &[u8],
    preds: &[(String, FieldPred)],
    id_fields: &[(&str, Direction)],
    sort_fields: &[(String, bool)],
    collation: Option<&Collation>,
) -> Plan {
    let preds = under(preds, collation, None);
    let built = build(coll_prefix, &preds, id_fields, false);
    let (reverse, provides_sort) =
        sort_order_under(id_fields, &built, false, sort_fields, collation, None);
    Plan {
        access: Access::Documents {
            intervals: built.intervals,
            bounded: built.score > 0,
            reverse,
            bounds: built.bounds,
        },
        provides_sort,
    }
}

fn index_plan(
    c: &Candidate<'_>,
    preds: &[(String, FieldPred)],
    sort_fields: &[(String, bool)],
    collation: Option<&Collation>,
    prefix: Vec<u8>,
) -> (i64, Plan) {
    let fields = c.index.fields();
    let index_collation = c.index.collation();
    let preds = under(preds, collation, index_collation.as_ref());
    let built = build(&prefix, &preds, fields, c.multikey);
    let (reverse, provides_sort) = sort_order_under(
        fields,
        &built,
        c.multikey,
        sort_fields,
        collation,
        index_collation.as_ref(),
    );
    let pinned = c.index.unique
        && built.eq_fields == fields.len()
        && built.points == 1
        && fields.iter().all(|(_, d)| *d != Direction::Hashed);
    let score = if pinned { 1000 } else { built.score };
    let plan = Plan {
        access: Access::Index(IndexScan {
            name: c.index.name.to_string(),
            pattern: c.index.pattern.clone(),
            intervals: built.intervals,
            reverse,
            multikey: c.multikey,
            unique: c.index.unique,
            sparse: c.index.sparse(),
            partial: c.index.partial().is_some(),
            bounds: built.bounds,
            directions: fields.iter().map(|(f, d)| (f.to_string(), *d)).collect(),
            prefix: prefix.clone(),
            covered: false,
            collated: index_collation.is_some(),
        }),
        provides_sort,
    };
    (score, plan)
}

/// The score of the `_id` order (a unique, never multikey key).
fn score_of(preds: &[(String, FieldPred)], fields: &[(&str, Direction)]) -> i64 {
    let built = build(&[], preds, fields, false);
    if built.eq_fields == fields.len() && built.points == 1 {
        1000
    } else {
        built.score
    }
}

/// The predicates an index of collation `index` can bound for a query of collation `query`:
/// all of them, with strings as the index stores them (collation keys), when the collations
/// are equal; otherwise only those without strings (the rest are the filter's to check).
fn under(
    preds: &[(String, FieldPred)],
    query: Option<&Collation>,
    index: Option<&Collation>,
) -> Vec<(String, FieldPred)> {
    let same = query == index;
    let fold = |v: &Bson| index.map_or_else(|| v.clone(), |c| c.fold(v));
    preds
        .iter()
        .filter(|(_, p)| same || !p.values().any(has_string))
        .map(|(f, p)| {
            let p = match p {
                FieldPred::Points(v) => FieldPred::Points(v.iter().map(fold).collect()),
                FieldPred::Range { lo, hi } => FieldPred::Range {
                    lo: lo.as_ref().map(|b| Box::new((fold(&b.0), b.1))),
                    hi: hi.as_ref().map(|b| Box::new((fold(&b.0), b.1))),
                },
            };
            (f.clone(), p)
        })
        .collect()
}

/// [`sort_order`] for an index of collation `index` under a query of collation `query`: an
/// index orders strings by its own collation, so it gives no sort under another one.
fn sort_order_under(
    fields: &[(&str, Direction)],
    built: &Built,
    multikey: bool,
    sort_fields: &[(String, bool)],
    query: Option<&Collation>,
    index: Option<&Collation>,
) -> (bool, bool) {
    if query != index && !sort_fields.is_empty() {
        return (false, false);
    }
    sort_order(fields, built, multikey, sort_fields)
}

/// Whether the scan order of `fields` after the equality prefix is the sort (forward or
/// reversed): `(reverse, provides_sort)`.
fn sort_order(
    fields: &[(&str, Direction)],
    built: &Built,
    multikey: bool,
    sort_fields: &[(String, bool)],
) -> (bool, bool) {
    if sort_fields.is_empty() {
        return (false, true);
    }
    if multikey || built.points != 1 {
        return (false, false);
    }
    let rest = &fields[built.eq_fields.min(fields.len())..];
    // Sort fields pinned by equality add no order; skip them.
    let sort: Vec<&(String, bool)> = sort_fields
        .iter()
        .filter(|(f, _)| !fields[..built.eq_fields].iter().any(|(g, _)| g == f))
        .collect();
    if sort.is_empty() {
        return (false, true);
    }
    if sort.len() > rest.len() {
        return (false, false);
    }
    let mut reverse = None;
    for ((f, asc), (g, dir)) in sort.iter().map(|p| (&p.0, p.1)).zip(rest) {
        if f != g || *dir == Direction::Hashed {
            return (false, false);
        }
        let flipped = asc != (*dir == Direction::Ascending);
        if *reverse.get_or_insert(flipped) != flipped {
            return (false, false);
        }
    }
    (reverse.unwrap_or(false), true)
}

/// Whether a candidate may serve the filter at all.
fn usable(c: &Candidate<'_>, filter: &Document, preds: &[(String, FieldPred)]) -> bool {
    if !c.index.materialized() {
        return false;
    }
    if let Some(pfe) = c.index.partial()
        && !pfe.iter().all(|(k, v)| {
            filter
                .get(k)
                .is_some_and(|fv| pipeline::value::equal(fv, v))
        })
    {
        return false;
    }
    if c.index.sparse() {
        // Every document the filter matches must have an entry: the bound on the first
        // field must exclude null (a missing field).
        let first = c.index.fields().first().map(|(f, _)| *f);
        let bounded = preds.iter().any(|(f, p)| {
            Some(f.as_str()) == first
                && match p {
                    FieldPred::Points(v) => !v.iter().any(|x| matches!(x, Bson::Null)),
                    FieldPred::Range { .. } => true,
                }
        });
        if !bounded {
            return false;
        }
    }
    true
}

/// The indexable predicates of a filter, per field, in filter order (top level and `$and`).
fn predicates(filter: &Document) -> Vec<(String, FieldPred)> {
    let mut out: Vec<(String, FieldPred)> = Vec::new();
    collect_preds(filter, &mut out);
    out
}

fn collect_preds(filter: &Document, out: &mut Vec<(String, FieldPred)>) {
    for (k, v) in filter {
        if k == "$and" {
            if let Bson::Array(items) = v {
                for item in items {
                    if let Bson::Document(d) = item {
                        collect_preds(d, out);
                    }
                }
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        if let Some(p) = field_pred(v) {
            out.push((k.clone(), p));
        }
    }
}

/// A value an index can look up by equality (arrays, regexes and `$`-documents match more).
fn point_ok(v: &Bson) -> bool {
    match v {
        Bson::Array(_) | Bson::RegularExpression(_) => false,
        Bson::Document(d) => !d.keys().any(|k| k.starts_with('$')),
        _ => true,
    }
}

fn points_of(v: &Bson) -> Vec<Bson> {
    match v {
        // `{a: null}` matches missing and null fields (both indexed as null) and undefined.
        Bson::Null => vec![Bson::Null, Bson::Undefined],
        other => vec![other.clone()],
    }
}

/// A value whose range an index bound can express (within its canonical type).
fn range_ok(v: &Bson) -> bool {
    !matches!(
        v,
        Bson::Array(_)
            | Bson::Document(_)
            | Bson::RegularExpression(_)
            | Bson::Null
            | Bson::Undefined
            | Bson::MinKey
            | Bson::MaxKey
    ) && !matches!(v, Bson::Double(d) if d.is_nan())
}

fn field_pred(v: &Bson) -> Option<FieldPred> {
    let Bson::Document(d) = v else {
        return point_ok(v).then(|| FieldPred::Points(points_of(v)));
    };
    if !d.keys().any(|k| k.starts_with('$')) {
        return Some(FieldPred::Points(vec![v.clone()]));
    }
    let (mut lo, mut hi, mut points) = (None, None, None);
    for (op, arg) in d {
        match op.as_str() {
            "$eq" if point_ok(arg) => points = Some(points_of(arg)),
            "$in" => {
                if let Bson::Array(items) = arg
                    && items.iter().all(point_ok)
                    && points.is_none()
                {
                    points = Some(items.iter().flat_map(points_of).collect());
                }
            }
            "$gt" | "$gte" if range_ok(arg) && lo.is_none() => {
                lo = Some(Box::new((arg.clone(), op == "$gte")));
            }
            "$lt" | "$lte" if range_ok(arg) && hi.is_none() => {
                hi = Some(Box::new((arg.clone(), op == "$lte")));
            }
            _ => {}
        }
    }
    if let Some(p) = points {
        return Some(FieldPred::Points(p));
    }
    (lo.is_some() || hi.is_some()).then_some(FieldPred::Range { lo, hi })
}

/// The canonical-type class of a value's KeyString: `[first byte of the class, first byte
/// after it)`.
fn class_of(v: &Bson) -> (u8, u8) {
    use resume::keystring::ctype as c;
    const STARTS: [u8; 17] = [
        c::MIN_KEY,
        c::UNDEFINED,
        c::NULLISH,
        c::NUMERIC,
        c::STRING_LIKE,
        c::OBJECT,
        c::ARRAY,
        c::BIN_DATA,
        c::OID,
        c::BOOL,
        c::DATE,
        c::TIMESTAMP,
        c::REGEX,
        c::DBREF,
        c::CODE,
        c::CODE_WITH_SCOPE,
        c::MAX_KEY,
    ];
    let first = resume::keystring::key_bytes(v)
        .first()
        .copied()
        .unwrap_or(0);
    let i = STARTS.iter().rposition(|s| *s <= first).unwrap_or(0);
    (STARTS[i], STARTS.get(i + 1).copied().unwrap_or(255))
}

/// One side of a field's interval in its key bytes: all keys starting with these bytes are
/// inside (`inclusive`) or outside.
type Side = (Vec<u8>, bool);

struct Built {
    intervals: Vec<KeyRange>,
    bounds: Document,
    /// Leading fields bound by equality.
    eq_fields: usize,
    /// Point combinations over those fields.
    points: usize,
    score: i64,
}

fn succ(key: &[u8]) -> Bound<Vec<u8>> {
    KeyRange::prefix(key).end
}

fn show(v: &Bson) -> String {
    match v {
        Bson::String(s) => format!("\"{s}\""),
        Bson::Double(d) if d.is_infinite() => {
            if *d > 0.0 {
                "inf.0".into()
            } else {
                "-inf.0".into()
            }
        }
        other => other.to_string(),
    }
}

/// The intervals of one index (or the `_id` order) for the predicates.
fn build(
    prefix: &[u8],
    preds: &[(String, FieldPred)],
    fields: &[(&str, Direction)],
    multikey: bool,
) -> Built {
    let pred = |f: &str| preds.iter().find(|(g, _)| g == f).map(|(_, p)| p);
    let mut prefixes: Vec<Vec<u8>> = vec![prefix.to_vec()];
    let mut bounds = Document::new();
    let mut eq_fields = 0;
    let mut score = 0;
    let mut range: Option<(Side, Side)> = None;
    let mut i = 0;
    while i < fields.len() {
        let (f, dir) = fields[i];
        match pred(f) {
            Some(FieldPred::Points(values)) if prefixes.len() * values.len() <= MAX_POINTS => {
                let mut keys: Vec<Vec<u8>> = values
                    .iter()
                    .map(|v| {
                        let mut k = Vec::new();
                        append_key(&mut k, dir, v);
                        k
                    })
                    .collect();
                keys.sort();
                keys.dedup();
                prefixes = prefixes
                    .iter()
                    .flat_map(|p| keys.iter().map(move |k| [p.as_slice(), k].concat()))
                    .collect();
                let mut shown: Vec<(Vec<u8>, String)> = values
                    .iter()
                    .map(|v| {
                        let mut k = Vec::new();
                        append_key(&mut k, dir, v);
                        let s = if dir == Direction::Hashed {
                            let h = pipeline::value::hash::hash_value(v);
                            format!("[{h}, {h}]")
                        } else {
                            format!("[{0}, {0}]", show(v))
                        };
                        (k, s)
                    })
                    .collect();
                shown.sort();
                shown.dedup();
                bounds.insert(f, shown.into_iter().map(|(_, s)| s).collect::<Vec<_>>());
                eq_fields += 1;
                score += 2;
                i += 1;
            }
            Some(FieldPred::Range { lo, hi }) if dir != Direction::Hashed => {
                // A multikey field keeps one side only (the lower when there is one).
                let (lo, hi) = if multikey && lo.is_some() {
                    (lo.as_deref().cloned(), None)
                } else {
                    (lo.as_deref().cloned(), hi.as_deref().cloned())
                };
                let anchor = lo.as_ref().or(hi.as_ref()).map(|(v, _)| v.clone());
                let (cs, nc) = anchor.as_ref().map(class_of).unwrap_or((0, 255));
                // Both sides must lie in one type class, else the upper one is dropped.
                let hi = hi.filter(|(v, _)| class_of(v) == (cs, nc));
                let lo_side: Side = match &lo {
                    Some((v, incl)) => (resume::keystring::key_bytes(v), *incl),
                    None => (vec![cs], true),
                };
                let hi_side: Side = match &hi {
                    Some((v, incl)) => (resume::keystring::key_bytes(v), *incl),
                    None => (vec![nc], false),
                };
                let side = |s: &Option<(Bson, bool)>, open: bool| match s {
                    Some((v, incl)) => {
                        let (l, r) = if *incl { ("[", "]") } else { ("(", ")") };
                        if open {
                            format!("{l}{}", show(v))
                        } else {
                            format!("{}{r}", show(v))
                        }
                    }
                    None if open => "[MinKey".to_string(),
                    None => "MaxKey]".to_string(),
                };
                let (lo_side, hi_side, shown) = if dir == Direction::Descending {
                    let inv = |s: &Side| (s.0.iter().map(|b| !b).collect::<Vec<u8>>(), s.1);
                    let left = match &hi {
                        Some(_) => side(&hi, true),
                        None => "[MaxKey".to_string(),
                    };
                    let right = match &lo {
                        Some(_) => side(&lo, false),
                        None => "MinKey]".to_string(),
                    };
                    (inv(&hi_side), inv(&lo_side), format!("{left}, {right}"))
                } else {
                    (
                        lo_side,
                        hi_side,
                        format!("{}, {}", side(&lo, true), side(&hi, false)),
                    )
                };
                bounds.insert(f, vec![shown]);
                range = Some((lo_side, hi_side));
                score += 1;
                i += 1;
                break;
            }
            _ => break,
        }
    }
    for (f, dir) in &fields[i..] {
        let all = if *dir == Direction::Descending {
            "[MaxKey, MinKey]"
        } else {
            "[MinKey, MaxKey]"
        };
        bounds.insert(*f, vec![all]);
    }
    let points = prefixes.len();
    let intervals = prefixes
        .iter()
        .map(|p| match &range {
            None => KeyRange::prefix(p),
            Some(((lo, lo_incl), (hi, hi_incl))) => {
                let lo_key = [p.as_slice(), lo].concat();
                let hi_key = [p.as_slice(), hi].concat();
                KeyRange {
                    start: if *lo_incl {
                        Bound::Included(lo_key)
                    } else {
                        match succ(&lo_key) {
                            Bound::Excluded(k) => Bound::Included(k),
                            other => other,
                        }
                    },
                    end: if *hi_incl {
                        succ(&hi_key)
                    } else {
                        Bound::Excluded(hi_key)
                    },
                }
            }
        })
        .collect();
    Built {
        intervals,
        bounds,
        eq_fields,
        points,
        score,
    }
}

#[cfg(test)]
mod tests;
