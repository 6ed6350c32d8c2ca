//! Running a pipeline over a stream instead of a batch: documents pushed one at a time by a
//! scan ([`PushRun`]), then pulled one at a time by a cursor ([`Docs`]).
//!
//! Owns: which stages stream and which consume their whole input, and the sinks the consuming
//! ones fill: `$sort`, `$group`, `$bucket`, `$sortByCount`, `$bucketAuto` and
//! `$setWindowFields` through a [`Sorter`] (bounded memory, spilling to disk under
//! `allowDiskUse`; a window stage then holds one partition at a time, up to the limit),
//! `$densify` through a sort too (then it generates as it is read, holding a partition table),
//! `$count` through a counter, `$fill` through a run of the stages it stands for, `$facet`
//! through a run of each sub-pipeline (each bounded as its stages are, the output up to
//! 100 MiB), `$sample` through a reservoir of its size (under `allowDiskUse`, a sort on random
//! keys that keeps its size, spilling), `$lookup` and `$graphLookup` (inside a
//! `$facet` the router runs, the foreign documents given) a chunk at a time into a spool,
//! `$unionWith` through a spool, and what is left (a `$densify` whose order cannot be made,
//! which fails) through a batch in memory (up to the sort limit without `allowDiskUse`).
//!
//! Invariants:
//! * Same results as [`Pipeline::run_in`] over the same input, group order aside: a `$group`
//!   that spilled outputs its groups in key order (MongoDB's order is unspecified too; one
//!   that fit in memory keeps first appearance).
//! * Single-document stages, `$unwind`, `$limit` and `$skip` hold nothing; a `$sort` holds at
//!   most its limit (only its first `n` before a `$limit: n`), a `$group` its groups, up to its
//!   limit (292 past it without `allowDiskUse`, spilled runs with it).
//! * A `$limit` that has all it needs says so ([`PushRun::push`] answers `false`), so the scan
//!   feeding it stops.

use std::sync::Arc;

use bson::{Bson, Document};

use super::bucket_auto::BucketAutoSink;
use super::lookup;
use super::sample::Reservoir;
use super::spill::{Purpose, Sorted, Sorter, Spool};
use super::window::WindowSink;
use super::{
    AccState, Bucket, Group, GroupKey, Pipeline, Stage, Table, accumulate, count_document,
};
use crate::expr::Env;
use crate::sort::SortSpec;
use crate::value::compare;
use crate::{MongoError, Result};

/// Documents flowing out of a stage, pulled one at a time.
pub type Docs = Box<dyn Iterator<Item = Result<Document>> + Send>;

/// Whether a stage passes documents on as they come (holding nothing across them).
fn streams(stage: &Stage) -> bool {
    stage.is_single_document_transform()
        || matches!(stage, Stage::Limit(_) | Stage::Skip(_) | Stage::Unwind(_))
}

impl Pipeline {
    /// Starts a run whose input is pushed one document at a time (see [`PushRun`]).
    pub fn push_run(&self, env: &Env) -> PushRun {
        let blocking = self
            .stages
            .iter()
            .position(|s| !streams(s))
            .unwrap_or(self.stages.len());
        let prefix = self.stages[..blocking]
            .iter()
            .map(|s| (s.clone(), 0))
            .collect();
        let sink = Sink::new(
            self.stages.get(blocking),
            self.stages.get(blocking + 1),
            env,
        );
        PushRun {
            prefix,
            sink,
            rest: Pipeline {
                stages: self.stages.get(blocking + 1..).unwrap_or_default().to_vec(),
            },
            env: env.clone(),
            full: false,
        }
    }

    /// Runs the pipeline over a stream: streaming stages stay lazy, each blocking stage
    /// consumes what reaches it when this is called.
    pub fn stream(&self, input: Docs, env: &Env) -> Result<Docs> {
        let mut docs = input;
        for (i, stage) in self.stages.iter().enumerate() {
            docs = stream_stage(stage, self.stages.get(i + 1), docs, env)?;
        }
        Ok(docs)
    }
}

fn stream_stage(stage: &Stage, next: Option<&Stage>, input: Docs, env: &Env) -> Result<Docs> {
    Ok(match stage {
        Stage::Limit(n) => Box::new(input.take(usize::try_from(*n).unwrap_or(usize::MAX))),
        Stage::Skip(n) => {
            let mut left = *n;
            Box::new(input.filter(move |d| {
                if d.is_ok() && left > 0 {
                    left -= 1;
                    return false;
                }
                true
            }))
        }
        Stage::Unwind(u) => {
            let u = u.clone();
            Box::new(input.flat_map(move |d| {
                let mut out = Vec::new();
                match d {
                    Ok(d) => {
                        u.apply(d, &mut out);
                        out.into_iter().map(Ok).collect::<Vec<_>>()
                    }
                    Err(e) => vec![Err(e)],
                }
            }))
        }
        s if s.is_single_document_transform() => {
            let (s, env) = (s.clone(), env.clone());
            Box::new(input.filter_map(move |d| match d {
                Ok(d) => s.apply_one_in(d, &env).transpose(),
                Err(e) => Some(Err(e)),
            }))
        }
        _ => {
            let mut sink = Sink::new(Some(stage), next, env);
            for d in input {
                sink.push(d?)?;
            }
            sink.finish(env)?
        }
    })
}

/// A pipeline run fed one document at a time: the streaming stages before the first blocking
/// one apply to each document as it comes, the blocking stage's sink takes what they pass,
/// and [`PushRun::finish`] turns the sink into the stream the later stages run over.
pub struct PushRun {
    /// The streaming stages before the sink, each with how many documents it has passed
    /// (`$limit`) or dropped (`$skip`).
    prefix: Vec<(Stage, u64)>,
    sink: Sink,
    rest: Pipeline,
    env: Env,
    /// A `$limit` in the prefix has passed all it will.
    full: bool,
}

impl PushRun {
    /// Feeds one input document; `false` once no later document can reach the output.
    pub fn push(&mut self, doc: Document) -> Result<bool> {
        self.feed(0, doc)?;
        Ok(!self.full)
    }

    fn feed(&mut self, at: usize, doc: Document) -> Result<()> {
        let Some((stage, count)) = self.prefix.get_mut(at) else {
            return self.sink.push(doc);
        };
        match stage {
            Stage::Limit(n) => {
                if *count >= *n {
                    self.full = true;
                    return Ok(());
                }
                *count += 1;
                if *count == *n {
                    // Later stages may still take this document, but no other.
                    self.full = true;
                }
                self.feed(at + 1, doc)
            }
            Stage::Skip(n) => {
                if *count < *n {
                    *count += 1;
                    return Ok(());
                }
                self.feed(at + 1, doc)
            }
            Stage::Unwind(u) => {
                let mut out = Vec::new();
                u.apply(doc, &mut out);
                for d in out {
                    self.feed(at + 1, d)?;
                }
                Ok(())
            }
            stage => match stage.apply_one_in(doc, &self.env)? {
                Some(d) => self.feed(at + 1, d),
                None => Ok(()),
            },
        }
    }

    /// Whether the run holds nothing across documents: every stage streams, so what the
    /// pushes pass is ready at once ([`PushRun::take_ready`]).
    pub fn streams_through(&self) -> bool {
        matches!(self.sink, Sink::Output(_))
    }

    /// The output so far of a run with no blocking stage (what its streaming stages passed),
    /// taken so the run holds none of it; always empty while a blocking stage collects, and
    /// once a run whose output was not taken has spilled it ([`PushRun::finish`] has it).
    pub fn take_ready(&mut self) -> Vec<Document> {
        match &mut self.sink {
            Sink::Output(docs) => docs.take_unspilled(),
            _ => Vec::new(),
        }
    }

    /// The pipeline's output, pulled lazily from here on.
    pub fn finish(self) -> Result<Docs> {
        let docs = self.sink.finish(&self.env)?;
        self.rest.stream(docs, &self.env)
    }
}

/// Where a blocking stage collects its input.
enum Sink {
    /// No blocking stage: the output itself, in a spool that goes to disk past the sort limit
    /// whatever the command's `allowDiskUse` (holding a result is no blocking stage's memory),
    /// for the callers that push their whole input before reading (a transaction's read).
    Output(Spool),
    Sort(Sorter),
    Group(GroupSink),
    /// `$sortByCount`: a group, whose groups then go through a sort by count.
    SortByCount(GroupSink),
    /// `$count`: the field and how many documents came.
    Count(String, u64),
    /// `$densify`: its input through a sort in the order it needs, then generated lazily.
    Densify(Box<super::densify::Densify>, Sorter),
    /// `$fill`: the stages it stands for (a `$setWindowFields`, then a `$set`), run as a
    /// pipeline of their own, so the window stage holds and spills as anywhere.
    Stages(Box<PushRun>),
    BucketAuto(Box<BucketAutoSink>),
    Facet(FacetSink),
    Window(Box<WindowSink>),
    /// `$lookup` and `$graphLookup` (in a `$facet` on the router, with the foreign
    /// documents in the environment): each chunk of input joined as it fills, the output
    /// spooled. `$unionWith`: the input spooled, then what the stage adds.
    Join {
        stage: Box<Stage>,
        chunk: Vec<Document>,
        /// What `chunk` takes.
        bytes: usize,
        out: Spool,
        env: Box<Env>,
    },
    /// Any other blocking stage, run over its whole input at the end.
    Batch {
        stage: Box<Stage>,
        docs: Vec<Document>,
        /// What `docs` take.
        bytes: usize,
        disk: bool,
    },
    /// `$sample`: at most its size (and, without `allowDiskUse`, the sort limit).
    Sample(Reservoir, bool),
    /// `$sample` under `allowDiskUse`: each document under a random key (`{r, d}`), through a
    /// sort that keeps the first `size` keys, spilling past its limit: a uniformly random
    /// subset in random order, as a reservoir gives, but held within the sort's memory.
    RandomTop(Sorter),
}

impl Sink {
    fn new(stage: Option<&Stage>, next: Option<&Stage>, env: &Env) -> Sink {
        match stage {
            None => Sink::output(),
            Some(Stage::Sort(spec)) if !spec.is_empty() => {
                let spec = spec.clone().with_collation(env.collation.clone());
                let sorter = Sorter::new(
                    Arc::new(move |a: &Document, b: &Document| spec.compare(a, b)),
                    Purpose::Sort,
                    env.allow_disk_use,
                );
                Sink::Sort(match next {
                    Some(Stage::Limit(n)) => {
                        sorter.keep_top(usize::try_from(*n).unwrap_or(usize::MAX))
                    }
                    _ => sorter,
                })
            }
            Some(Stage::Group(g)) => Sink::Group(GroupSink::new(g.clone(), None, env)),
            Some(Stage::SortByCount(g)) => Sink::SortByCount(GroupSink::new(g.clone(), None, env)),
            Some(Stage::Count(field)) => Sink::Count(field.clone(), 0),
            Some(Stage::Densify(d)) => match d.input_order() {
                Ok(order) => Sink::Densify(
                    d.clone(),
                    Sorter::new(
                        Arc::new(move |a: &Document, b: &Document| order.compare(a, b)),
                        Purpose::Sort,
                        env.allow_disk_use,
                    ),
                ),
                Err(_) => Sink::batch(stage, env),
            },
            Some(Stage::Fill(stages)) => Sink::Stages(Box::new(
                Pipeline {
                    stages: stages.clone(),
                }
                .push_run(env),
            )),
            Some(Stage::Bucket(b)) => Sink::Group(GroupSink::new(
                b.group.clone(),
                Some(Box::new(b.clone())),
                env,
            )),
            Some(Stage::BucketAuto(b)) => Sink::BucketAuto(Box::new(BucketAutoSink::new(b, env))),
            Some(Stage::Facet(facets)) => Sink::Facet(FacetSink::new(facets, env)),
            Some(Stage::SetWindowFields(w)) => Sink::Window(Box::new(WindowSink::new(w, env))),
            Some(Stage::Sample(n)) if env.allow_disk_use => {
                let by_key = Arc::new(|a: &Document, b: &Document| {
                    a.get_i64("r")
                        .unwrap_or(0)
                        .cmp(&b.get_i64("r").unwrap_or(0))
                });
                let sorter = Sorter::new(by_key, Purpose::Sort, true);
                Sink::RandomTop(sorter.keep_top(usize::try_from(*n).unwrap_or(usize::MAX)))
            }
            Some(Stage::Sample(n)) => Sink::Sample(Reservoir::new(*n), false),
            Some(stage @ (Stage::Lookup(_) | Stage::GraphLookup(_) | Stage::UnionWith(_))) => {
                Sink::Join {
                    stage: Box::new(stage.clone()),
                    chunk: Vec::new(),
                    bytes: 0,
                    out: Spool::new(stage.name(), env.allow_disk_use),
                    env: Box::new(env.clone()),
                }
            }
            Some(stage) => Sink::batch(Some(stage), env),
        }
    }

    /// A batch in memory for `stage` (an output sink for none).
    fn batch(stage: Option<&Stage>, env: &Env) -> Sink {
        match stage {
            Some(stage) => Sink::Batch {
                stage: Box::new(stage.clone()),
                docs: Vec::new(),
                bytes: 0,
                disk: env.allow_disk_use,
            },
            None => Sink::output(),
        }
    }

    fn output() -> Sink {
        Sink::Output(Spool::new("A pipeline's output", true))
    }

    fn push(&mut self, doc: Document) -> Result<()> {
        match self {
            Sink::Output(docs) => docs.push(doc),
            Sink::Batch {
                stage,
                docs,
                bytes,
                disk,
            } => {
                crate::interrupt::check()?;
                *bytes += crate::changestream::split::document_size(&doc);
                docs.push(doc);
                check_held(stage.name(), *bytes, *disk)
            }
            Sink::Join { stage, out, .. } if matches!(**stage, Stage::UnionWith(_)) => {
                out.push(doc)
            }
            Sink::Join {
                stage,
                chunk,
                bytes,
                out,
                env,
            } => {
                *bytes += crate::changestream::split::document_size(&doc);
                chunk.push(doc);
                if chunk.len() >= lookup::CHUNK_DOCS || *bytes >= lookup::CHUNK_BYTES {
                    *bytes = 0;
                    join_into(stage, std::mem::take(chunk), env, out)?;
                }
                Ok(())
            }
            Sink::Sort(sorter) => sorter.push(doc),
            Sink::Group(g) | Sink::SortByCount(g) => g.push(doc),
            Sink::Count(_, n) => {
                crate::interrupt::check()?;
                *n += 1;
                Ok(())
            }
            Sink::Stages(run) => run.push(doc).map(drop),
            Sink::Densify(_, sorter) => sorter.push(doc),
            Sink::BucketAuto(b) => b.push(doc),
            Sink::Facet(f) => f.push(doc),
            Sink::Window(w) => w.push(doc),
            Sink::RandomTop(sorter) => {
                let key: i64 = rand::Rng::random(&mut rand::rng());
                sorter.push(bson::doc! {"r": key, "d": doc})
            }
            Sink::Sample(r, disk) => {
                crate::interrupt::check()?;
                r.offer(doc, &mut rand::rng());
                check_held("$sample", r.bytes(), *disk)
            }
        }
    }

    fn finish(self, env: &Env) -> Result<Docs> {
        Ok(match self {
            Sink::Output(docs) => Box::new(docs.finish()?),
            Sink::Sort(sorter) => Box::new(sorter.finish()?),
            Sink::Group(g) => g.finish()?,
            Sink::SortByCount(g) => {
                let spec = SortSpec::parse(&bson::doc! {"count": -1})?;
                let mut sorter = Sorter::new(
                    Arc::new(move |a: &Document, b: &Document| spec.compare(a, b)),
                    Purpose::Sort,
                    env.allow_disk_use,
                );
                for group in g.finish()? {
                    sorter.push(group?)?;
                }
                Box::new(sorter.finish()?)
            }
            Sink::Count(field, n) => Box::new(count_document(&field, n).into_iter().map(Ok)),
            Sink::Stages(run) => run.finish()?,
            Sink::Densify(d, sorter) => Box::new(d.over_sorted(sorter.finish()?)),
            Sink::BucketAuto(b) => Box::new(b.finish()?.into_iter().map(Ok)),
            Sink::Facet(f) => Box::new(std::iter::once(f.finish())),
            Sink::Window(w) => w.finish()?,
            Sink::Sample(r, _) => Box::new(r.finish(&mut rand::rng()).into_iter().map(Ok)),
            Sink::RandomTop(sorter) => Box::new(sorter.finish()?.map(|keyed| {
                keyed.and_then(|mut k| match k.remove("d") {
                    Some(Bson::Document(d)) => Ok(d),
                    _ => Err(MongoError::internal("a sampled document lost its place")),
                })
            })),
            Sink::Join {
                stage,
                chunk,
                mut out,
                env,
                ..
            } => {
                if matches!(*stage, Stage::UnionWith(_)) {
                    out.extend(stage.run_in(Vec::new(), &env)?.into_iter().map(Ok))?;
                } else {
                    join_into(&stage, chunk, &env, &mut out)?;
                }
                Box::new(out.finish()?)
            }
            Sink::Batch { stage, docs, .. } => {
                Box::new(stage.run_in(docs, env)?.into_iter().map(Ok))
            }
        })
    }
}

/// `stage` (a `$lookup` or `$graphLookup`) over `chunk`, into `out`.
fn join_into(stage: &Stage, chunk: Vec<Document>, env: &Env, out: &mut Spool) -> Result<()> {
    match lookup::join_each(stage, chunk, env)? {
        Some(joined) => out.extend(joined),
        None => Err(MongoError::internal(format!(
            "{} is no join of a chunk",
            stage.name()
        ))),
    }
}

/// What a stage holding its input may hold: past the sort limit it is 292 unless the command
/// allows disk use (the stages that cannot spill then hold it in memory).
fn check_held(stage: &str, bytes: usize, disk: bool) -> Result<()> {
    let limit = super::spill::sort_limit();
    if disk || bytes <= limit {
        return Ok(());
    }
    Err(super::over_memory_limit(format!(
        "{stage} exceeded memory limit of {limit} bytes, but did not opt in to external \
         sorting. Pass allowDiskUse:true to opt in."
    )))
}

/// A `$facet` fed one document at a time: each document goes to every sub-pipeline's own run
/// (which holds what its stages hold, spilling like any), and what each has put out so far is
/// kept in the [`FacetOutput`].
pub(super) struct FacetSink {
    /// Each sub-pipeline's run; `None` once its `$limit` has had all it takes.
    runs: Vec<Option<PushRun>>,
    output: FacetOutput,
}

/// The largest document a `$facet` may make, as MongoDB's
/// `internalQueryFacetMaxOutputDocSizeBytes`.
pub const FACET_MAX_OUTPUT_BYTES: usize = 100 * 1024 * 1024;

/// The one document a `$facet` makes: each sub-pipeline's output as an array under its name,
/// up to [`FACET_MAX_OUTPUT_BYTES`] together (4031700 past it).
pub struct FacetOutput {
    facets: Vec<(String, Vec<Bson>)>,
    /// The size of every facet's output so far.
    bytes: usize,
}

impl FacetOutput {
    /// An empty output for sub-pipelines named `names`, in order.
    pub fn new(names: impl IntoIterator<Item = String>) -> FacetOutput {
        FacetOutput {
            facets: names.into_iter().map(|n| (n, Vec::new())).collect(),
            bytes: 0,
        }
    }

    /// Adds documents to facet `i`'s output, within the output limit.
    pub fn keep(&mut self, i: usize, docs: impl IntoIterator<Item = Document>) -> Result<()> {
        for d in docs {
            self.bytes += crate::changestream::split::document_size(&d);
            if self.bytes > FACET_MAX_OUTPUT_BYTES {
                return Err(MongoError::with_code(
                    4031700,
                    format!(
                        "document constructed by $facet is {} bytes, which exceeds the limit of \
                         {FACET_MAX_OUTPUT_BYTES} bytes",
                        self.bytes
                    ),
                ));
            }
            if let Some((_, out)) = self.facets.get_mut(i) {
                out.push(Bson::Document(d));
            }
        }
        Ok(())
    }

    /// The document: every facet's array under its name.
    pub fn finish(self) -> Document {
        self.facets
            .into_iter()
            .map(|(name, out)| (name, Bson::Array(out)))
            .collect()
    }
}

impl FacetSink {
    fn new(facets: &[(String, Pipeline)], env: &Env) -> FacetSink {
        FacetSink {
            runs: facets.iter().map(|(_, p)| Some(p.push_run(env))).collect(),
            output: FacetOutput::new(facets.iter().map(|(name, _)| name.clone())),
        }
    }

    pub(super) fn run(
        facets: &[(String, Pipeline)],
        docs: Vec<Document>,
        env: &Env,
    ) -> Result<Document> {
        let mut sink = FacetSink::new(facets, env);
        for d in docs {
            sink.push(d)?;
        }
        sink.finish()
    }

    fn push(&mut self, doc: Document) -> Result<()> {
        crate::interrupt::check()?;
        for (i, slot) in self.runs.iter_mut().enumerate() {
            let Some(run) = slot.as_mut() else {
                continue;
            };
            let more = run.push(doc.clone())?;
            self.output.keep(i, run.take_ready())?;
            if !more {
                *slot = None;
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Result<Document> {
        for (i, slot) in self.runs.iter_mut().enumerate() {
            if let Some(run) = slot.take() {
                let rest = run.finish()?.collect::<Result<Vec<_>>>()?;
                self.output.keep(i, rest)?;
            }
        }
        Ok(self.output.finish())
    }
}

/// A `$group` fed one document at a time. Without `allowDiskUse` its groups live in a table
/// up to the group limit. With it, each document's key and accumulator inputs go to a sorter
/// as a record (`k`: the key as groups compare it, `i`: the key, `v`: the inputs by index);
/// if the sorter never spilled, the records are grouped in memory, in input order; if it did,
/// they come back in key order and each group is accumulated from its run of records.
struct GroupSink {
    group: Group,
    /// A `$bucket`'s boundaries: the group key is then the bucket its value falls in, and the
    /// groups come out in key order.
    bucket: Option<Box<Bucket>>,
    env: Env,
    how: Grouping,
}

enum Grouping {
    Table(Table),
    Records(Sorter),
}

impl GroupSink {
    fn new(group: Group, bucket: Option<Box<Bucket>>, env: &Env) -> GroupSink {
        let how = if env.allow_disk_use {
            Grouping::Records(Sorter::new(
                Arc::new(|a: &Document, b: &Document| {
                    compare(
                        a.get("k").unwrap_or(&Bson::Null),
                        b.get("k").unwrap_or(&Bson::Null),
                    )
                }),
                Purpose::Group,
                true,
            ))
        } else {
            Grouping::Table(Table::default())
        };
        GroupSink {
            group,
            bucket,
            env: env.clone(),
            how,
        }
    }

    fn push(&mut self, doc: Document) -> Result<()> {
        crate::interrupt::check()?;
        let key = self
            .group
            .id
            .evaluate_in(&doc, &self.env)?
            .unwrap_or(Bson::Null);
        let key = match &self.bucket {
            Some(b) => b.slot(key, &self.env)?,
            None => key,
        };
        let inputs = self.group.inputs(&doc, &self.env)?;
        match &mut self.how {
            Grouping::Table(table) => table.add(
                &self.group,
                &self.env,
                Some(super::spill::group_limit()),
                key,
                inputs,
            ),
            Grouping::Records(sorter) => {
                let folded = GroupKey::new(key.clone(), self.env.collation.as_ref()).0;
                let mut v = Document::new();
                for (i, input) in inputs.into_iter().enumerate() {
                    if let Some(x) = input {
                        v.insert(i.to_string(), x);
                    }
                }
                sorter.push(bson::doc! {"k": folded, "i": key, "v": v})
            }
        }
    }

    fn finish(self) -> Result<Docs> {
        let GroupSink {
            group,
            bucket,
            env,
            how,
        } = self;
        // Groups held in memory: a bucket's come out by `_id`; a spilled run's come out in key
        // order anyway.
        let held = |mut groups: Vec<Document>| -> Result<Docs> {
            if bucket.is_some() {
                Bucket::sort(&mut groups, &env)?;
            }
            Ok(Box::new(groups.into_iter().map(Ok)))
        };
        let sorter = match how {
            Grouping::Table(table) => return held(table.finish(&group)),
            Grouping::Records(sorter) => sorter,
        };
        match sorter.into_unspilled() {
            Ok(records) => {
                let mut table = Table::default();
                for r in records {
                    let (_, key, inputs) = record_parts(&group, r)?;
                    table.add(&group, &env, None, key, inputs)?;
                }
                held(table.finish(&group))
            }
            Err(sorter) => Ok(Box::new(SortedGroups {
                group,
                env,
                records: sorter.finish()?,
                current: None,
                done: false,
            })),
        }
    }
}

/// A group record's compared key, key and accumulator inputs.
fn record_parts(group: &Group, mut r: Document) -> Result<(Bson, Bson, Vec<Option<Bson>>)> {
    let damaged = || MongoError::internal("a spilled $group record is damaged");
    let folded = r.remove("k").ok_or_else(damaged)?;
    let key = r.remove("i").ok_or_else(damaged)?;
    let Some(Bson::Document(mut v)) = r.remove("v") else {
        return Err(damaged());
    };
    let inputs = (0..group.accumulators.len())
        .map(|i| v.remove(i.to_string()))
        .collect();
    Ok((folded, key, inputs))
}

/// Groups accumulated from records in key order: one group in memory at a time.
struct SortedGroups {
    group: Group,
    env: Env,
    records: Sorted,
    /// The group being accumulated: its compared key, key and states.
    current: Option<(Bson, Bson, Vec<AccState>)>,
    done: bool,
}

impl SortedGroups {
    fn add(&mut self, record: Document) -> Result<Option<Document>> {
        let (folded, key, inputs) = record_parts(&self.group, record)?;
        let same = matches!(&self.current, Some((f, _, _)) if compare(f, &folded).is_eq());
        let finished = if same {
            None
        } else {
            let started = (folded, key, self.group.init());
            self.current
                .replace(started)
                .map(|(_, key, states)| self.group.output(key, states))
        };
        if let Some((_, _, states)) = &mut self.current {
            for (((_, kind, _), st), v) in self
                .group
                .accumulators
                .iter()
                .zip(states.iter_mut())
                .zip(inputs)
            {
                accumulate(*kind, st, v, !same, &self.env)?;
            }
        }
        Ok(finished)
    }
}

impl Iterator for SortedGroups {
    type Item = Result<Document>;

    fn next(&mut self) -> Option<Result<Document>> {
        while !self.done {
            match self.records.next() {
                Some(Ok(record)) => match self.add(record) {
                    Ok(Some(finished)) => return Some(Ok(finished)),
                    Ok(None) => {}
                    Err(e) => {
                        self.done = true;
                        return Some(Err(e));
                    }
                },
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(e));
                }
                None => self.done = true,
            }
        }
        self.current
            .take()
            .map(|(_, key, states)| Ok(self.group.output(key, states)))
    }
}
