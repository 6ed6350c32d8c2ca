//! External sorting: how `$sort` and `$group` take more input than their memory limit when the
//! command allows disk use, and the limits themselves; and [`Spool`], the same for documents
//! that only wait their turn (kept in arrival order).
//!
//! Owns: the process's limits for blocking stages (`internalQueryMaxBlockingSortMemoryUsageBytes`
//! and `internalDocumentSourceGroupMaxMemoryBytes`, 100 MiB each as MongoDB's, settable at run
//! time), the spill counters `serverStatus` shows, and [`Sorter`]: it holds documents up to its
//! limit, writes each full buffer out as a sorted run to a temporary file, and merges the runs
//! back in order.
//!
//! Invariants:
//! * Memory: the limit counts documents' BSON sizes, as MongoDB's does (so what is refused with
//!   292 is what MongoDB refuses). A parsed document takes more than its BSON size (two to
//!   three times for small fields): with disk use, the buffer spills once either its BSON size
//!   or its [`footprint`] in memory passes the limit, so it holds at most the limit (plus one
//!   document) in memory too. A merge holds one document and one read buffer per run. Runs
//!   are merged [`FAN_IN`] at a time, each merge taking the last `FAN_IN` runs of one size
//!   class into one run of the next (as a log-structured merge does): a sort keeps fewer than
//!   `FAN_IN` runs of each class open and rewrites each document once per class, so a sort of
//!   `n` bytes writes `O(n log n)` bytes, not the `O(n²)` of merging everything again.
//! * Stability: documents that compare equal come out in input order (each run is sorted
//!   stably, runs are written in input order, and ties go to the earlier run).
//! * A spool holds at most the limit (under `allowDiskUse`, at most [`SPOOL_MEMORY`]) plus one
//!   document in memory, and one file on disk.
//! * Runs are unnamed temporary files (unlinked as they are created): nothing is left behind
//!   by a finished, failed or crashed operation.
//! * Without disk use, a buffer past its limit is `QueryExceededMemoryLimitNoDiskUseAllowed`
//!   (292); nothing is written.
//! * What a run gives back is checked as it is read: a length out of bounds or bytes that do
//!   not parse are an error, never a panic.

use std::cmp::Ordering;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering as AtomicOrdering};

use bson::Document;
use wire::{ErrorCode, MongoError, Result};

use crate::changestream::split::document_size;

/// The default limit of each blocking stage, as MongoDB's (100 MiB).
pub const DEFAULT_LIMIT: usize = 100 * 1024 * 1024;

/// How many runs of one size class a sort merges into one run of the next class.
pub const FAN_IN: usize = 16;

/// The largest document a run may hold back: larger than any a stage can make (intermediate
/// documents stop at 16 MiB plus what `$push` adds before the group's limit), so a longer
/// length in a run file means the file is damaged.
const MAX_RECORD: usize = 2 * DEFAULT_LIMIT;

/// What a [`Spool`] under `allowDiskUse` holds in memory before it writes to disk (its
/// documents' BSON size, or their [`footprint`] in memory, whichever is larger).
pub const SPOOL_MEMORY: usize = 16 * 1024 * 1024;

/// Each run's read and write buffer.
const IO_BUFFER: usize = 64 * 1024;

static SORT_LIMIT: AtomicUsize = AtomicUsize::new(DEFAULT_LIMIT);
static GROUP_LIMIT: AtomicUsize = AtomicUsize::new(DEFAULT_LIMIT);

/// What the blocking stages of this process have spilled (`serverStatus` `metrics.query`).
#[derive(Debug, Default)]
pub struct SpillCounters {
    /// Runs written by sorts (`metrics.query.sort.spillToDisk`).
    pub sort_spills: AtomicU64,
    /// Runs written by groups (`metrics.query.group.spills`).
    pub group_spills: AtomicU64,
    /// Bytes written to runs, both kinds.
    pub spilled_bytes: AtomicU64,
}

static COUNTERS: SpillCounters = SpillCounters {
    sort_spills: AtomicU64::new(0),
    group_spills: AtomicU64::new(0),
    spilled_bytes: AtomicU64::new(0),
};

/// The process's spill counters.
pub fn counters() -> &'static SpillCounters {
    &COUNTERS
}

impl SpillCounters {
    /// The counters as `serverStatus` `metrics.query` shows them.
    pub fn to_document(&self) -> Document {
        let n = |c: &AtomicU64| i64::try_from(c.load(AtomicOrdering::Relaxed)).unwrap_or(i64::MAX);
        bson::doc! {
            "sort": {"spillToDisk": n(&self.sort_spills)},
            "group": {"spills": n(&self.group_spills)},
            "spilledBytes": n(&self.spilled_bytes),
        }
    }
}

/// The memory a `$sort` (and `$bucketAuto`, `$setWindowFields`) may hold.
pub fn sort_limit() -> usize {
    #[cfg(test)]
    if let Some(limit) = TEST_LIMIT.get() {
        return limit;
    }
    SORT_LIMIT.load(AtomicOrdering::Relaxed)
}

/// The memory a `$group` may hold.
pub fn group_limit() -> usize {
    #[cfg(test)]
    if let Some(limit) = TEST_LIMIT.get() {
        return limit;
    }
    GROUP_LIMIT.load(AtomicOrdering::Relaxed)
}

#[cfg(test)]
thread_local! {
    /// Both limits for this test thread only (the process-wide ones are shared by every test).
    pub static TEST_LIMIT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Sets the sort limit (at least one byte); the old value.
pub fn set_sort_limit(bytes: usize) -> usize {
    SORT_LIMIT.swap(bytes.max(1), AtomicOrdering::Relaxed)
}

/// Sets the group limit (at least one byte); the old value.
pub fn set_group_limit(bytes: usize) -> usize {
    GROUP_LIMIT.swap(bytes.max(1), AtomicOrdering::Relaxed)
}

/// The `setParameter` names of the two limits, as MongoDB's.
pub const LIMIT_PARAMETERS: [&str; 2] = [
    "internalQueryMaxBlockingSortMemoryUsageBytes",
    "internalDocumentSourceGroupMaxMemoryBytes",
];

/// The value of a limit by its parameter name.
pub fn limit_parameter(name: &str) -> Option<usize> {
    match name {
        n if n == LIMIT_PARAMETERS[0] => Some(sort_limit()),
        n if n == LIMIT_PARAMETERS[1] => Some(group_limit()),
        _ => None,
    }
}

/// Sets a limit by its parameter name from a `setParameter` value (a positive integer); the
/// old value. `None` when `name` is not a limit.
pub fn set_limit_parameter(name: &str, value: &bson::Bson) -> Option<Result<usize>> {
    use bson::Bson;
    let set: fn(usize) -> usize = match name {
        n if n == LIMIT_PARAMETERS[0] => set_sort_limit,
        n if n == LIMIT_PARAMETERS[1] => set_group_limit,
        _ => return None,
    };
    let bytes = match value {
        Bson::Int32(i) => i64::from(*i),
        Bson::Int64(i) => *i,
        Bson::Double(f) if f.fract() == 0.0 && f.abs() < 9e15 => *f as i64,
        _ => 0,
    };
    Some(match usize::try_from(bytes) {
        Ok(bytes) if bytes > 0 => Ok(set(bytes)),
        _ => Err(MongoError::bad_value(format!(
            "{name} must be a positive integer"
        ))),
    })
}

/// How two documents order; ties keep input order.
pub type Compare = Arc<dyn Fn(&Document, &Document) -> Ordering + Send + Sync>;

/// Which stage a sorter serves: its limit, its counter and its refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Sort,
    Group,
}

/// What a parsed document takes in memory, estimated: each field's value as the `Bson` enum,
/// its name and its place in the map, and what strings, binaries and nested values hold on the
/// heap (recursion as deep as the document nests, as [`document_size`]'s).
pub fn footprint(doc: &Document) -> usize {
    /// A map entry: the value, the name's `String`, the hash, and about 1.5 index slots.
    const ENTRY: usize = std::mem::size_of::<bson::Bson>() + std::mem::size_of::<String>() + 20;
    std::mem::size_of::<Document>()
        + doc
            .iter()
            .map(|(k, v)| ENTRY + k.len() + value_heap(v))
            .sum::<usize>()
}

/// What a value holds on the heap beyond the `Bson` enum itself.
fn value_heap(v: &bson::Bson) -> usize {
    use bson::Bson;
    match v {
        Bson::String(s) | Bson::Symbol(s) | Bson::JavaScriptCode(s) => s.capacity(),
        Bson::Document(d) => footprint(d),
        Bson::Array(a) => {
            a.capacity() * std::mem::size_of::<Bson>() + a.iter().map(value_heap).sum::<usize>()
        }
        Bson::Binary(b) => b.bytes.capacity(),
        Bson::RegularExpression(r) => r.pattern.len() + r.options.len(),
        Bson::JavaScriptCodeWithScope(c) => c.code.capacity() + footprint(&c.scope),
        _ => 0,
    }
}

/// What a buffer of documents counts: their BSON size (the limit's measure) and, when the
/// buffer may spill, their footprint in memory (which it then keeps under the limit too).
#[derive(Debug, Default, Clone, Copy)]
struct Held {
    bytes: usize,
    memory: usize,
}

impl Held {
    fn add(&mut self, doc: &Document, disk: bool) {
        self.bytes += document_size(doc);
        if disk {
            self.memory += footprint(doc);
        }
    }

    fn of<'a>(docs: impl IntoIterator<Item = &'a Document>, disk: bool) -> Held {
        let mut held = Held::default();
        docs.into_iter().for_each(|d| held.add(d, disk));
        held
    }

    /// Past `limit`: by BSON size, or (when the buffer may spill) by footprint too.
    fn past(&self, limit: usize, disk: bool) -> bool {
        self.bytes > limit || (disk && self.memory > limit)
    }
}

/// A sort that holds at most its limit in memory, writing sorted runs to disk past it.
pub struct Sorter {
    cmp: Compare,
    purpose: Purpose,
    limit: usize,
    disk: bool,
    /// Only the first `top` documents are wanted (a `$sort` before a `$limit`).
    top: Option<usize>,
    buffer: Vec<Document>,
    held: Held,
    /// The runs in input order, each with its size class (how many merges made it): the
    /// classes never rise along the list.
    runs: Vec<(u32, Run)>,
}

impl Sorter {
    /// A sorter under the purpose's current limit; `disk` is the command's `allowDiskUse`.
    pub fn new(cmp: Compare, purpose: Purpose, disk: bool) -> Sorter {
        let limit = match purpose {
            Purpose::Sort => sort_limit(),
            Purpose::Group => group_limit(),
        };
        Sorter {
            cmp,
            purpose,
            limit,
            disk,
            top: None,
            buffer: Vec::new(),
            held: Held::default(),
            runs: Vec::new(),
        }
    }

    /// Keeps only the first `n` documents of the order.
    pub fn keep_top(mut self, n: usize) -> Sorter {
        self.top = Some(n);
        self
    }

    /// Whether any run went to disk.
    pub fn spilled(&self) -> bool {
        !self.runs.is_empty()
    }

    /// Adds a document; past the limit, writes the buffer out as a run (or fails without disk
    /// use).
    pub fn push(&mut self, doc: Document) -> Result<()> {
        crate::interrupt::check()?;
        self.held.add(&doc, self.disk);
        self.buffer.push(doc);
        // A top-k sort drops what it cannot keep when its buffer fills, or grows to twice k.
        if let Some(top) = self.top
            && (self.held.past(self.limit, self.disk)
                || self.buffer.len() > top.saturating_mul(2).max(1024))
        {
            self.sort_buffer();
            self.buffer.truncate(top);
            self.held = Held::of(&self.buffer, self.disk);
        }
        if self.held.past(self.limit, self.disk) {
            if !self.disk {
                return Err(self.over_limit());
            }
            self.spill()?;
        }
        Ok(())
    }

    /// The documents in order.
    pub fn finish(mut self) -> Result<Sorted> {
        self.sort_buffer();
        if let Some(top) = self.top {
            self.buffer.truncate(top);
        }
        if self.runs.is_empty() {
            return Ok(Sorted::Memory(self.buffer.into_iter()));
        }
        let mut sources: Vec<Source> = self
            .runs
            .into_iter()
            .map(|(_, run)| Source::Run(run))
            .collect();
        sources.push(Source::Memory(self.buffer.into_iter()));
        let mut merge = Merge::new(self.cmp, sources)?;
        // The runs were written before the top was known: the merge stops at it.
        merge.left = self.top.unwrap_or(usize::MAX);
        Ok(Sorted::Merge(merge))
    }

    /// The buffer unsorted, when nothing was spilled (a `$group` that fit runs in memory, in
    /// input order); the sorter itself otherwise.
    pub fn into_unspilled(self) -> std::result::Result<Vec<Document>, Sorter> {
        if self.runs.is_empty() {
            Ok(self.buffer)
        } else {
            Err(self)
        }
    }

    fn sort_buffer(&mut self) {
        let cmp = &self.cmp;
        self.buffer.sort_by(|a, b| cmp(a, b));
    }

    fn over_limit(&self) -> MongoError {
        let limit = self.limit;
        let msg = match self.purpose {
            Purpose::Sort => format!(
                "Sort exceeded memory limit of {limit} bytes, but did not opt in to external \
                 sorting."
            ),
            Purpose::Group => "Exceeded memory limit for $group, but didn't allow external \
                               sort. Pass allowDiskUse:true to opt in."
                .to_string(),
        };
        MongoError::new(
            ErrorCode::QUERY_EXCEEDED_MEMORY_LIMIT_NO_DISK_USE_ALLOWED,
            msg,
        )
    }

    /// Writes the buffer out as a sorted run of class 0; then, while the last [`FAN_IN`] runs
    /// are of one class, merges them into one run of the next. The runs merged are the last
    /// ones, so the list stays in input order (ties keep going to the earlier run).
    fn spill(&mut self) -> Result<()> {
        self.sort_buffer();
        let docs = std::mem::take(&mut self.buffer);
        self.held = Held::default();
        self.runs
            .push((0, Run::write(self.purpose, docs.into_iter().map(Ok))?));
        while let Some(class) = self.mergeable_class() {
            let tail = self.runs.split_off(self.runs.len() - FAN_IN);
            let sources = tail.into_iter().map(|(_, run)| Source::Run(run)).collect();
            let merged = Merge::new(self.cmp.clone(), sources)?;
            self.runs
                .push((class + 1, Run::write(self.purpose, merged)?));
        }
        Ok(())
    }

    /// The class of the last [`FAN_IN`] runs, when they are all of one.
    fn mergeable_class(&self) -> Option<u32> {
        let tail = self.runs.get(self.runs.len().checked_sub(FAN_IN)?..)?;
        let class = tail.first()?.0;
        tail.iter().all(|(c, _)| *c == class).then_some(class)
    }
}

/// A sorter's output.
pub enum Sorted {
    Memory(std::vec::IntoIter<Document>),
    Merge(Merge),
}

impl Iterator for Sorted {
    type Item = Result<Document>;

    fn next(&mut self) -> Option<Result<Document>> {
        match self {
            Sorted::Memory(docs) => docs.next().map(Ok),
            Sorted::Merge(m) => m.next(),
        }
    }
}

/// A sorted run on disk: documents one after another, each its own BSON bytes.
struct Run {
    reader: BufReader<At>,
}

/// A file read from a position of its own (`pread`), so several passes over one file do not
/// move each other's offset.
struct At {
    file: Arc<File>,
    pos: u64,
}

impl Read for At {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Run {
    fn write(purpose: Purpose, docs: impl Iterator<Item = Result<Document>>) -> Result<Run> {
        let mut out = BufWriter::with_capacity(IO_BUFFER, tempfile::tempfile().map_err(io_err)?);
        let mut bytes = 0_u64;
        for doc in docs {
            bytes += write_record(&mut out, &doc?)?;
        }
        let counter = match purpose {
            Purpose::Sort => &COUNTERS.sort_spills,
            Purpose::Group => &COUNTERS.group_spills,
        };
        counter.fetch_add(1, AtomicOrdering::Relaxed);
        COUNTERS
            .spilled_bytes
            .fetch_add(bytes, AtomicOrdering::Relaxed);
        Run::read_back(out)
    }

    /// The documents written through `out`, from the first.
    fn read_back(out: BufWriter<File>) -> Result<Run> {
        let file = out.into_inner().map_err(|e| io_err(e.into_error()))?;
        Ok(Run::from_start(Arc::new(file)))
    }

    fn from_start(file: Arc<File>) -> Run {
        Run {
            reader: BufReader::with_capacity(IO_BUFFER, At { file, pos: 0 }),
        }
    }

    /// The next document, `None` at the end of the run.
    fn next_doc(&mut self) -> Result<Option<Document>> {
        let mut len = [0_u8; 4];
        match self.reader.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(io_err(e)),
        }
        let n = usize::try_from(i32::from_le_bytes(len)).unwrap_or(0);
        if !(5..=MAX_RECORD).contains(&n) {
            return Err(MongoError::internal(format!(
                "a spilled run is damaged: a document length of {n} bytes"
            )));
        }
        let mut raw = vec![0_u8; n];
        raw[..4].copy_from_slice(&len);
        self.reader.read_exact(&mut raw[4..]).map_err(io_err)?;
        Document::from_reader(raw.as_slice())
            .map(Some)
            .map_err(|e| MongoError::internal(format!("a spilled run is damaged: {e}")))
    }
}

fn io_err(e: std::io::Error) -> MongoError {
    MongoError::internal(format!("spilling to disk: {e}"))
}

/// Appends `doc`'s BSON bytes to a run; how many.
fn write_record(out: &mut impl Write, doc: &Document) -> Result<u64> {
    let mut raw = Vec::new();
    doc.to_writer(&mut raw)
        .map_err(|e| MongoError::internal(format!("spilling a document: {e}")))?;
    if raw.len() > MAX_RECORD {
        return Err(MongoError::new(
            ErrorCode::BSON_OBJECT_TOO_LARGE,
            format!(
                "a document of {} bytes is too large to hold on disk",
                raw.len()
            ),
        ));
    }
    out.write_all(&raw).map_err(io_err)?;
    Ok(raw.len() as u64)
}

/// Documents kept in arrival order for a later pass (what the router gathers between the
/// stages that read other collections): in memory up to the sort limit; past it, with disk
/// use, each full buffer is appended to one unnamed temporary file, and they are read back in
/// the order they came. Without disk use, past the limit is 292 naming `what`.
pub struct Spool {
    what: &'static str,
    limit: usize,
    disk: bool,
    buffer: Vec<Document>,
    held: Held,
    file: Option<BufWriter<File>>,
}

impl Spool {
    /// An empty spool; `disk` is the command's `allowDiskUse`. Without it the spool holds up to
    /// the sort limit (292 past it); with it, up to [`SPOOL_MEMORY`] (or the sort limit, if
    /// lower) before it writes to disk: documents that only wait their turn need not take a
    /// blocking stage's memory.
    pub fn new(what: &'static str, disk: bool) -> Spool {
        let limit = sort_limit();
        Spool {
            what,
            limit: if disk { limit.min(SPOOL_MEMORY) } else { limit },
            disk,
            buffer: Vec::new(),
            held: Held::default(),
            file: None,
        }
    }

    /// Adds a document at the end.
    pub fn push(&mut self, doc: Document) -> Result<()> {
        crate::interrupt::check()?;
        self.held.add(&doc, self.disk);
        self.buffer.push(doc);
        if !self.held.past(self.limit, self.disk) {
            return Ok(());
        }
        if !self.disk {
            return Err(MongoError::new(
                ErrorCode::QUERY_EXCEEDED_MEMORY_LIMIT_NO_DISK_USE_ALLOWED,
                format!(
                    "{} exceeded the memory limit of {} bytes, but did not opt in to using \
                     the disk. Pass allowDiskUse:true to opt in.",
                    self.what, self.limit
                ),
            ));
        }
        let file = match &mut self.file {
            Some(file) => file,
            None => self.file.insert(BufWriter::with_capacity(
                IO_BUFFER,
                tempfile::tempfile().map_err(io_err)?,
            )),
        };
        let mut bytes = 0;
        for doc in self.buffer.drain(..) {
            bytes += write_record(file, &doc)?;
        }
        self.held = Held::default();
        COUNTERS.sort_spills.fetch_add(1, AtomicOrdering::Relaxed);
        COUNTERS
            .spilled_bytes
            .fetch_add(bytes, AtomicOrdering::Relaxed);
        Ok(())
    }

    /// Adds every document of `docs`.
    pub fn extend(&mut self, docs: impl IntoIterator<Item = Result<Document>>) -> Result<()> {
        docs.into_iter().try_for_each(|d| self.push(d?))
    }

    /// Whether any document went to disk.
    pub fn spilled(&self) -> bool {
        self.file.is_some()
    }

    /// Everything held, when nothing went to disk (so the spool is empty after); nothing once
    /// something did (the order is then the file's first, [`Spool::finish`] gives it all).
    pub fn take_unspilled(&mut self) -> Vec<Document> {
        if self.spilled() {
            return Vec::new();
        }
        self.held = Held::default();
        std::mem::take(&mut self.buffer)
    }

    /// The documents in the order they came.
    pub fn finish(self) -> Result<Spooled> {
        let run = self.file.map(Run::read_back).transpose()?;
        Ok(Spooled {
            run,
            memory: Memory::Owned(self.buffer.into_iter()),
            failed: false,
        })
    }

    /// The documents kept for several passes, each in the order they came (a `$facet`'s
    /// sub-pipelines each read all of them): what went to disk is read again from the file,
    /// what stayed in memory is copied one document at a time as a pass reaches it.
    pub fn replay(self) -> Result<Replay> {
        let file = match self.file {
            Some(out) => Some(Arc::new(
                out.into_inner().map_err(|e| io_err(e.into_error()))?,
            )),
            None => None,
        };
        Ok(Replay {
            file,
            memory: self.buffer.into(),
        })
    }
}

/// A spool kept for several passes (see [`Spool::replay`]).
pub struct Replay {
    file: Option<Arc<File>>,
    memory: Arc<[Document]>,
}

impl Replay {
    /// One more pass over every document, in the order they came.
    pub fn pass(&self) -> Spooled {
        Spooled {
            run: self.file.clone().map(Run::from_start),
            memory: Memory::Shared(self.memory.clone(), 0),
            failed: false,
        }
    }
}

/// A spool read back: what went to disk, then what stayed in memory.
pub struct Spooled {
    run: Option<Run>,
    memory: Memory,
    failed: bool,
}

/// What a spool kept in memory, given away ([`Spool::finish`]) or lent to each pass
/// ([`Spool::replay`]).
enum Memory {
    Owned(std::vec::IntoIter<Document>),
    Shared(Arc<[Document]>, usize),
}

impl Iterator for Spooled {
    type Item = Result<Document>;

    fn next(&mut self) -> Option<Result<Document>> {
        if self.failed {
            return None;
        }
        if let Some(run) = &mut self.run {
            match run.next_doc() {
                Ok(Some(doc)) => return Some(Ok(doc)),
                Ok(None) => self.run = None,
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
        }
        match &mut self.memory {
            Memory::Owned(docs) => docs.next().map(Ok),
            Memory::Shared(docs, next) => {
                let doc = docs.get(*next)?.clone();
                *next += 1;
                Some(Ok(doc))
            }
        }
    }
}

enum Source {
    Run(Run),
    Memory(std::vec::IntoIter<Document>),
}

impl Source {
    fn next_doc(&mut self) -> Result<Option<Document>> {
        match self {
            Source::Run(r) => r.next_doc(),
            Source::Memory(docs) => Ok(docs.next()),
        }
    }
}

/// The ordered merge of sorted sources; ties go to the earlier source.
pub struct Merge {
    cmp: Compare,
    sources: Vec<Source>,
    heads: Vec<Option<Document>>,
    failed: bool,
    /// How many more documents it gives at most.
    left: usize,
}

impl Merge {
    fn new(cmp: Compare, mut sources: Vec<Source>) -> Result<Merge> {
        let heads = sources
            .iter_mut()
            .map(Source::next_doc)
            .collect::<Result<_>>()?;
        Ok(Merge {
            cmp,
            sources,
            heads,
            failed: false,
            left: usize::MAX,
        })
    }
}

impl Iterator for Merge {
    type Item = Result<Document>;

    fn next(&mut self) -> Option<Result<Document>> {
        if self.failed || self.left == 0 {
            return None;
        }
        self.left -= 1;
        if let Err(e) = crate::interrupt::check() {
            self.failed = true;
            return Some(Err(e));
        }
        let mut best: Option<usize> = None;
        for (i, head) in self.heads.iter().enumerate() {
            let Some(d) = head else { continue };
            let better = match best.and_then(|b| self.heads[b].as_ref()) {
                None => true,
                Some(current) => (self.cmp)(d, current) == Ordering::Less,
            };
            if better {
                best = Some(i);
            }
        }
        let i = best?;
        let next = match self.sources[i].next_doc() {
            Ok(next) => next,
            Err(e) => {
                self.failed = true;
                return Some(Err(e));
            }
        };
        std::mem::replace(&mut self.heads[i], next).map(Ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{Bson, doc};

    fn by_k() -> Compare {
        Arc::new(|a: &Document, b: &Document| {
            crate::value::compare(
                a.get("k").unwrap_or(&Bson::Null),
                b.get("k").unwrap_or(&Bson::Null),
            )
        })
    }

    /// `field` of every document `docs` gives, in order.
    fn ints(docs: impl Iterator<Item = Result<Document>>, field: &str) -> Vec<i32> {
        docs.map(|d| d.unwrap().get_i32(field).unwrap()).collect()
    }

    fn sorter(limit: usize, disk: bool) -> Sorter {
        let mut s = Sorter::new(by_k(), Purpose::Sort, disk);
        s.limit = limit;
        s
    }

    #[test]
    fn a_sort_past_its_limit_spills_runs_and_merges_them_stably() {
        let mut s = sorter(2_000, true);
        // Keys repeat, so stability shows: `seq` must rise within each key.
        for seq in 0..5_000_i32 {
            s.push(doc! {"k": (seq * 7919) % 97, "seq": seq, "pad": "x".repeat(50)})
                .unwrap();
        }
        assert!(s.spilled());
        // 5,000 documents of ~90 bytes through a 2,000-byte buffer: ~250 runs, merged on the
        // way into runs of larger classes, fewer than FAN_IN of each.
        assert!(s.runs.iter().any(|(class, _)| *class >= 1));
        for class in 0..3 {
            assert!(s.runs.iter().filter(|(c, _)| *c == class).count() < FAN_IN);
        }
        let out: Vec<Document> = s.finish().unwrap().collect::<Result<_>>().unwrap();
        assert_eq!(out.len(), 5_000);
        for w in out.windows(2) {
            let (a, b) = (w[0].get_i32("k").unwrap(), w[1].get_i32("k").unwrap());
            assert!(a <= b, "{a} before {b}");
            if a == b {
                assert!(w[0].get_i32("seq").unwrap() < w[1].get_i32("seq").unwrap());
            }
        }
    }

    #[test]
    fn a_footprint_counts_what_a_parsed_document_takes() {
        let small = doc! {"a": 1, "b": 2, "c": [1, 2, 3], "d": {"e": true}};
        assert!(footprint(&small) > 3 * document_size(&small));
        // A long string is mostly its bytes in either form.
        let long = doc! {"s": "x".repeat(100_000)};
        assert!(footprint(&long) >= document_size(&long));
        assert!(footprint(&long) < document_size(&long) + 1_000);
    }

    #[test]
    fn with_disk_use_a_sort_spills_by_memory_and_without_refuses_by_bson_size() {
        // 100 documents of small fields: ~2,300 BSON bytes, several times that in memory.
        let docs = || (0..100).map(|i| doc! {"k": i, "a": 1, "b": 2, "c": 3});
        let bson: usize = docs().map(|d| document_size(&d)).sum();
        let memory: usize = docs().map(|d| footprint(&d)).sum();
        let limit = bson + 100;
        assert!(memory > 2 * limit, "{memory} vs {limit}");
        let mut with_disk = sorter(limit, true);
        docs().for_each(|d| with_disk.push(d).unwrap());
        assert!(with_disk.spilled());
        assert!(with_disk.held.memory <= limit + footprint(&doc! {"k": 0, "a": 1, "b": 2, "c": 3}));
        assert_eq!(
            ints(with_disk.finish().unwrap(), "k"),
            (0..100).collect::<Vec<_>>()
        );
        // Without disk use what is refused is what MongoDB refuses: past the BSON size limit.
        let mut without = sorter(limit, false);
        docs().for_each(|d| without.push(d).unwrap());
        assert!(!without.spilled());
        assert!(
            without
                .push(doc! {"k": 100, "pad": "x".repeat(200)})
                .is_err()
        );
    }

    #[test]
    fn without_disk_use_a_sort_past_its_limit_is_292() {
        let mut s = sorter(1_000, false);
        let err = (0..100)
            .map(|i| s.push(doc! {"k": i, "pad": "x".repeat(50)}))
            .find_map(Result::err)
            .unwrap();
        assert_eq!(err.code, 292);
        assert!(!s.spilled());
    }

    #[test]
    fn a_top_k_sort_holds_only_what_it_keeps() {
        let mut s = sorter(200_000, false).keep_top(3);
        for i in (0..100_000_i32).rev() {
            s.push(doc! {"k": i}).unwrap();
        }
        let out: Vec<i32> = ints(s.finish().unwrap(), "k");
        assert_eq!(out, vec![0, 1, 2]);
    }

    #[test]
    fn a_top_k_sort_that_spilled_gives_only_its_top() {
        let mut s = sorter(2_000, true).keep_top(500);
        for i in (0..5_000_i32).rev() {
            s.push(doc! {"k": i, "pad": "x".repeat(50)}).unwrap();
        }
        assert!(s.spilled());
        let out: Vec<i32> = ints(s.finish().unwrap(), "k");
        assert_eq!(out, (0..500).collect::<Vec<_>>());
    }

    #[test]
    fn a_spool_past_its_limit_goes_to_disk_and_keeps_arrival_order() {
        let mut s = Spool::new("test", true);
        s.limit = 2_000;
        for seq in 0..5_000_i32 {
            s.push(doc! {"seq": seq, "pad": "x".repeat(50)}).unwrap();
        }
        assert!(s.spilled());
        assert!(s.buffer.len() < 40, "memory holds {}", s.buffer.len());
        let seqs: Vec<i32> = ints(s.finish().unwrap(), "seq");
        assert_eq!(seqs, (0..5_000).collect::<Vec<_>>());
    }

    #[test]
    fn without_disk_use_a_spool_past_its_limit_is_292() {
        let mut s = Spool::new("The router's $lookup input", false);
        s.limit = 1_000;
        let err = (0..100)
            .map(|i| s.push(doc! {"k": i, "pad": "x".repeat(50)}))
            .find_map(Result::err)
            .unwrap();
        assert_eq!(err.code, 292);
        assert!(err.errmsg.contains("$lookup"), "{}", err.errmsg);
        assert!(!s.spilled());
    }

    #[test]
    fn a_replayed_spool_gives_every_pass_all_its_documents_in_order() {
        for disk in [true, false] {
            let mut s = Spool::new("a facet's input", disk);
            s.limit = if disk { 1_000 } else { usize::MAX };
            for i in 0..100 {
                s.push(doc! {"i": i, "pad": "x".repeat(50)}).unwrap();
            }
            assert_eq!(s.spilled(), disk);
            let replay = s.replay().unwrap();
            let (first, second) = (replay.pass(), replay.pass());
            // Passes read side by side do not move each other along.
            let both: Vec<(i32, i32)> = first
                .zip(second)
                .map(|(a, b)| {
                    (
                        a.unwrap().get_i32("i").unwrap(),
                        b.unwrap().get_i32("i").unwrap(),
                    )
                })
                .collect();
            assert_eq!(both, (0..100).map(|i| (i, i)).collect::<Vec<_>>());
            assert_eq!(ints(replay.pass(), "i"), (0..100).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_damaged_run_is_an_error_not_a_panic() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&[0xff, 0xff, 0xff, 0x7f, 1, 2, 3]).unwrap();
        let mut run = Run::from_start(Arc::new(file));
        let err = run.next_doc().unwrap_err();
        assert_eq!(err.code, 1);
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&[9, 0, 0, 0, 0x10, b'a', 0, 1, 0]).unwrap();
        let mut run = Run::from_start(Arc::new(file));
        assert!(run.next_doc().is_err());
    }
}
