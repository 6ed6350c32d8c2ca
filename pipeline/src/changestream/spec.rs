//! Parsing and validation of `$changeStream` and of the pipeline that follows it
//! (reference §3.1–§3.4).
//!
//! Owns: the option table (names, types, enum values), the stream level derived from the
//! request's namespace, the start point, and the allow-list of following stages.
//!
//! Invariants:
//! * checks run in MongoDB's order: pipeline shape and stage names (40323/40324), `$changeStream`
//!   first (40602), the stage argument (50808, then option types 14 / values 2 / unknown fields
//!   40415 in field order), then `assertIsLegalSpecification` (40573, 72, 73, 31123, 50865,
//!   40674, 260), then the following stages (20, 7182800, 7182802);
//! * a returned [`ChangeStreamSpec`] is legal: its level matches its namespace, at most one start
//!   option is set, and a `resumeAfter` token is never an invalidate token.

use bson::{Bson, Document};
use resume::ClusterTime;
use resume::token::{ResumeToken, ResumeTokenData, TokenVersion};
use wire::{ErrorCode, MongoError, Result};

use crate::Matcher;

/// What a stream watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamLevel {
    /// `aggregate: "<coll>"`: one namespace, matched by name.
    Collection,
    /// `aggregate: 1` on a database other than `admin`.
    Database,
    /// `aggregate: 1` on `admin` with `allChangesForCluster: true`.
    Cluster,
}

/// `fullDocument`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FullDocument {
    #[default]
    Default,
    UpdateLookup,
    WhenAvailable,
    Required,
}

/// `fullDocumentBeforeChange`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FullDocumentBeforeChange {
    #[default]
    Off,
    WhenAvailable,
    Required,
}

/// The boolean and enum options of the stage (the start options live in [`StartPoint`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeStreamOptions {
    pub full_document: FullDocument,
    pub full_document_before_change: FullDocumentBeforeChange,
    pub all_changes_for_cluster: bool,
    pub show_expanded_events: bool,
    pub show_system_events: bool,
    pub show_migration_events: bool,
    pub allow_to_run_on_config_db: bool,
    pub allow_to_run_on_system_ns: bool,
    pub show_raw_update_description: bool,
    pub match_collection_uuid_for_update_lookup: bool,
    pub show_commit_timestamp: bool,
    /// Tributary's: every event carries `commitMetadata` (who wrote it, from which
    /// application, with which comment, when, in which transaction), as the oplog recorded it
    /// at write time.
    pub show_commit_metadata: bool,
    /// Tributary's: a transaction's events folded per document into its net change
    /// ([`crate::changestream::net_effect`]).
    pub transaction_net_effect: bool,
}

/// Whether Tributary's `$changeStream` options (`showCommitMetadata`, `transactionNetEffect`)
/// are taken; when not, they are unknown fields (40415), as on MongoDB. On unless the
/// `changeStreamExtensions` parameter turns them off.
static EXTENSIONS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// The `$changeStream` stage's argument of an `aggregate` command, if its pipeline opens with
/// one.
pub fn stage_of(cmd: &Document) -> Option<&Document> {
    cmd.get_array("pipeline")
        .ok()?
        .first()?
        .as_document()?
        .get_document("$changeStream")
        .ok()
}

pub fn extensions_enabled() -> bool {
    EXTENSIONS.load(std::sync::atomic::Ordering::Relaxed)
}

pub fn set_extensions_enabled(on: bool) {
    EXTENSIONS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Where the stream starts.
#[derive(Debug, Clone, PartialEq)]
pub enum StartPoint {
    /// No start option: the caller picks "now + 1 tick".
    None,
    /// `startAtOperationTime: T` (inclusive).
    StartAtOperationTime(ClusterTime),
    /// `resumeAfter: token` (never an invalidate token).
    ResumeAfter(ResumeTokenData),
    /// `startAfter: token` (may be an invalidate token).
    StartAfter(ResumeTokenData),
}

impl StartPoint {
    /// The client's token, for `resumeAfter` / `startAfter`.
    pub fn client_token(&self) -> Option<&ResumeTokenData> {
        match self {
            StartPoint::ResumeAfter(t) | StartPoint::StartAfter(t) => Some(t),
            _ => None,
        }
    }
}

/// A legal `$changeStream` specification.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangeStreamSpec {
    pub level: StreamLevel,
    /// The request's database (`admin` for cluster streams).
    pub db: String,
    /// The watched collection, for collection streams.
    pub coll: Option<String>,
    pub options: ChangeStreamOptions,
    pub start: StartPoint,
}

impl ChangeStreamSpec {
    /// A spec built directly (tests, internal cursors); no validation.
    pub fn new(level: StreamLevel, db: &str, coll: Option<&str>) -> ChangeStreamSpec {
        ChangeStreamSpec {
            level,
            db: db.to_string(),
            coll: coll.map(str::to_string),
            options: ChangeStreamOptions::default(),
            start: StartPoint::None,
        }
    }

    /// The first oplog timestamp to scan (`ts >= start`), given the time the caller picked for
    /// a stream with no start option ("now + 1 tick").
    pub fn scan_start(&self, default_start: ClusterTime) -> ClusterTime {
        match &self.start {
            StartPoint::None => default_start,
            StartPoint::StartAtOperationTime(t) => *t,
            StartPoint::ResumeAfter(t) | StartPoint::StartAfter(t) => t.cluster_time(),
        }
    }

    /// The post-batch resume token before any event (§5.9): the client's token, else a
    /// high-water mark at the start time.
    pub fn initial_post_batch_resume_token(&self, default_start: ClusterTime) -> ResumeToken {
        match self.start.client_token() {
            Some(t) => t.encode(),
            None => ResumeTokenData::high_water_mark(
                self.scan_start(default_start),
                TokenVersion::default(),
            )
            .encode(),
        }
    }
}

/// The request around the stage: its database, the `aggregate` target, and where it runs.
#[derive(Debug, Clone, Copy)]
pub struct RequestContext<'a> {
    pub db: &'a str,
    /// `Some(coll)` for `aggregate: "<coll>"`, `None` for `aggregate: 1`.
    pub coll: Option<&'a str>,
    /// The request came through the router (mongos).
    pub through_router: bool,
    /// The node is neither a router nor a replica-set member.
    pub standalone: bool,
}

/// A stage the user wrote after `$changeStream`.
#[derive(Debug, Clone)]
pub enum UserStage {
    /// `$match`, parsed once.
    Match(Matcher),
    /// A single-document transform (`$project`, `$addFields`/`$set`, `$unset`,
    /// `$replaceRoot`/`$replaceWith`, `$redact`), parsed once by [`crate::agg`].
    Transform(crate::agg::Stage),
}

/// A parsed change-stream pipeline.
#[derive(Debug, Clone)]
pub struct ChangeStreamPipeline {
    pub spec: ChangeStreamSpec,
    pub user_stages: Vec<UserStage>,
    /// `$changeStreamSplitLargeEvent: {}` ends the pipeline.
    pub split_large_event: bool,
}

/// Whether an `aggregate` pipeline is a change stream (has a `$changeStream` stage anywhere;
/// [`parse_pipeline`] then insists it is first).
pub fn is_change_stream(pipeline: &[Bson]) -> bool {
    pipeline.iter().any(|s| match s {
        Bson::Document(d) => d.contains_key("$changeStream"),
        _ => false,
    })
}

/// Stages `$changeStream` may be followed by (`ChangeStreamRequirement::kAllowlist`).
const ALLOWED: &[&str] = &[
    "$match",
    "$project",
    "$addFields",
    "$set",
    "$unset",
    "$replaceRoot",
    "$replaceWith",
    "$redact",
];

const SPLIT: &str = "$changeStreamSplitLargeEvent";

/// Every aggregation stage name MongoDB 7.0 knows; others are 40324.
const KNOWN: &[&str] = &[
    "$addFields",
    "$bucket",
    "$bucketAuto",
    "$changeStream",
    "$changeStreamSplitLargeEvent",
    "$collStats",
    "$count",
    "$currentOp",
    "$densify",
    "$documents",
    "$facet",
    "$fill",
    "$geoNear",
    "$graphLookup",
    "$group",
    "$indexStats",
    "$limit",
    "$listCatalog",
    "$listLocalSessions",
    "$listSampledQueries",
    "$listSearchIndexes",
    "$listSessions",
    "$lookup",
    "$match",
    "$merge",
    "$out",
    "$planCacheStats",
    "$project",
    "$redact",
    "$replaceRoot",
    "$replaceWith",
    "$sample",
    "$search",
    "$searchMeta",
    "$set",
    "$setWindowFields",
    "$shardedDataDistribution",
    "$skip",
    "$sort",
    "$sortByCount",
    "$unionWith",
    "$unset",
    "$unwind",
    "$vectorSearch",
];

/// An `aggregate` command whose pipeline starts with `$changeStream`, parsed.
#[derive(Debug)]
pub struct ChangeStreamCommand<'a> {
    /// `Some(coll)` for `aggregate: "<coll>"`, `None` for `aggregate: 1`.
    pub coll: Option<&'a str>,
    /// The pipeline as sent.
    pub stages: &'a [Bson],
    pub pipeline: ChangeStreamPipeline,
    /// `cursor.batchSize` (101 when absent).
    pub batch_size: usize,
}

/// Parses a change-stream `aggregate` on database `db`, as the router (`through_router`) or a
/// shard receives it.
pub fn parse_command<'a>(
    db: &str,
    cmd: &'a Document,
    through_router: bool,
) -> Result<ChangeStreamCommand<'a>> {
    let coll = match cmd.get("aggregate") {
        Some(Bson::String(c)) => Some(c.as_str()),
        Some(Bson::Int32(1)) | Some(Bson::Int64(1)) => None,
        Some(Bson::Double(d)) if *d == 1.0 => None,
        _ => {
            return Err(MongoError::failed_to_parse(
                "aggregate requires a collection name or 1",
            ));
        }
    };
    let stages = cmd.get_array("pipeline").map_err(|_| {
        MongoError::type_mismatch("'pipeline' option must be specified as an array")
    })?;
    let ctx = RequestContext {
        db,
        coll,
        through_router,
        standalone: false,
    };
    let pipeline = parse_pipeline(stages, &ctx)?;
    check_read_concern(cmd)?;
    let batch_size = match cmd
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get("batchSize"))
    {
        None => 101,
        Some(Bson::Int32(n)) if *n >= 0 => *n as usize,
        Some(Bson::Int64(n)) if *n >= 0 => *n as usize,
        Some(Bson::Double(n)) if *n >= 0.0 => *n as usize,
        Some(_) => {
            return Err(MongoError::bad_value(
                "batchSize must be a non-negative integer",
            ));
        }
    };
    Ok(ChangeStreamCommand {
        coll,
        stages,
        pipeline,
        batch_size,
    })
}

/// A change stream reads majority-committed data: an explicit `readConcern` level other than
/// `majority` is refused, as MongoDB 7.0 refuses it (InvalidOptions); none is the same as
/// `majority`.
fn check_read_concern(cmd: &Document) -> Result<()> {
    let level = match cmd.get("readConcern") {
        None => return Ok(()),
        Some(Bson::Document(rc)) => match rc.get("level") {
            None => return Ok(()),
            Some(Bson::String(level)) => level.as_str(),
            Some(_) => {
                return Err(MongoError::type_mismatch(
                    "BSON field 'readConcern.level' is the wrong type, expected type 'string'",
                ));
            }
        },
        Some(_) => {
            return Err(MongoError::type_mismatch(
                "BSON field 'readConcern' is the wrong type, expected type 'object'",
            ));
        }
    };
    if level == "majority" {
        return Ok(());
    }
    Err(MongoError::new(
        ErrorCode::INVALID_OPTIONS,
        format!(
            "Aggregation stage $changeStream cannot run with a readConcern other than \
             'majority'. Current readConcern: {level}"
        ),
    ))
}

/// Parses `pipeline` (the `aggregate` command's array) whose first stage is `$changeStream`.
pub fn parse_pipeline(pipeline: &[Bson], ctx: &RequestContext<'_>) -> Result<ChangeStreamPipeline> {
    // Shape and names of every stage first, as the lite parse does.
    let mut stages: Vec<(&str, &Bson, &Document)> = Vec::with_capacity(pipeline.len());
    for s in pipeline {
        let Bson::Document(d) = s else {
            return Err(MongoError::type_mismatch(
                "Each element of the 'pipeline' array must be an object",
            ));
        };
        let mut it = d.iter();
        let (Some((name, arg)), None) = (it.next(), it.next()) else {
            return Err(MongoError::with_code(
                40323,
                "A pipeline stage specification object must contain exactly one field.",
            ));
        };
        if !KNOWN.contains(&name.as_str()) {
            return Err(MongoError::with_code(
                40324,
                format!("Unrecognized pipeline stage name: '{name}'"),
            ));
        }
        stages.push((name.as_str(), arg, d));
    }
    let change_streams = stages
        .iter()
        .filter(|(n, _, _)| *n == "$changeStream")
        .count();
    let first = stages.first().filter(|(n, _, _)| *n == "$changeStream");
    let (Some((_, first_arg, _)), 1) = (first, change_streams) else {
        return Err(MongoError::with_code(
            40602,
            "$changeStream is only valid as the first stage in a pipeline",
        ));
    };
    let spec = parse_stage(first_arg, ctx)?;

    let rest = stages.get(1..).unwrap_or_default();
    let mut user_stages = Vec::with_capacity(rest.len());
    let mut split_large_event = false;
    for (i, (name, arg, whole)) in rest.iter().enumerate() {
        if *name == SPLIT {
            if !matches!(arg, Bson::Document(d) if d.is_empty()) {
                return Err(MongoError::with_code(
                    7182800,
                    "$changeStreamSplitLargeEvent spec must be an empty document",
                ));
            }
            if i + 1 != rest.len() {
                return Err(MongoError::with_code(
                    7182802,
                    "$changeStreamSplitLargeEvent must be the last stage in the pipeline",
                ));
            }
            split_large_event = true;
            continue;
        }
        if !ALLOWED.contains(name) {
            return Err(MongoError::new(
                ErrorCode::ILLEGAL_OPERATION,
                format!("{name} is not permitted in a $changeStream pipeline"),
            ));
        }
        if *name == "$match" {
            let Bson::Document(filter) = arg else {
                return Err(MongoError::with_code(
                    15959,
                    "the match filter must be an expression in an object",
                ));
            };
            user_stages.push(UserStage::Match(Matcher::parse(filter)?));
        } else {
            user_stages.push(UserStage::Transform(crate::agg::Stage::parse(whole)?));
        }
    }
    // A fragment's token resumes only a stream that splits: without the split, the event it
    // belongs to would come whole, and the fragment could never be found.
    if !split_large_event
        && spec
            .start
            .client_token()
            .is_some_and(|t| t.fragment_num().is_some())
    {
        return Err(MongoError::new(
            ErrorCode::CHANGE_STREAM_FATAL_ERROR,
            "To resume from a split event, the $changeStream pipeline must include a \
             $changeStreamSplitLargeEvent stage",
        )
        .with_label("NonResumableChangeStreamError"));
    }
    Ok(ChangeStreamPipeline {
        spec,
        user_stages,
        split_large_event,
    })
}

/// Parses and validates the `$changeStream` stage argument.
pub fn parse_stage(arg: &Bson, ctx: &RequestContext<'_>) -> Result<ChangeStreamSpec> {
    let Bson::Document(arg) = arg else {
        return Err(MongoError::with_code(
            50808,
            format!(
                "$changeStream stage expects a document as argument, got {}",
                type_name(arg)
            ),
        ));
    };
    let mut o = ChangeStreamOptions::default();
    let mut resume_after: Option<ResumeTokenData> = None;
    let mut start_after: Option<ResumeTokenData> = None;
    let mut start_at: Option<ClusterTime> = None;
    for (k, v) in arg {
        match k.as_str() {
            "resumeAfter" => resume_after = Some(token(k, v)?),
            "startAfter" => start_after = Some(token(k, v)?),
            "startAtOperationTime" => match v {
                Bson::Timestamp(ts) => start_at = Some(ClusterTime::from(*ts)),
                _ => return Err(wrong_type(k, v, "timestamp")),
            },
            "fullDocument" => {
                o.full_document = match string(k, v)? {
                    "default" => FullDocument::Default,
                    "updateLookup" => FullDocument::UpdateLookup,
                    "whenAvailable" => FullDocument::WhenAvailable,
                    "required" => FullDocument::Required,
                    other => return Err(bad_enum(k, other, "FullDocumentMode")),
                }
            }
            "fullDocumentBeforeChange" => {
                o.full_document_before_change = match string(k, v)? {
                    "off" => FullDocumentBeforeChange::Off,
                    "whenAvailable" => FullDocumentBeforeChange::WhenAvailable,
                    "required" => FullDocumentBeforeChange::Required,
                    other => return Err(bad_enum(k, other, "FullDocumentBeforeChangeMode")),
                }
            }
            "allChangesForCluster" => o.all_changes_for_cluster = boolean(k, v)?,
            "showExpandedEvents" => o.show_expanded_events = boolean(k, v)?,
            "showSystemEvents" => o.show_system_events = boolean(k, v)?,
            "showMigrationEvents" => o.show_migration_events = boolean(k, v)?,
            "allowToRunOnConfigDB" => o.allow_to_run_on_config_db = boolean(k, v)?,
            "allowToRunOnSystemNS" => o.allow_to_run_on_system_ns = boolean(k, v)?,
            "showRawUpdateDescription" => o.show_raw_update_description = boolean(k, v)?,
            "matchCollectionUUIDForUpdateLookup" => {
                o.match_collection_uuid_for_update_lookup = boolean(k, v)?
            }
            "showCommitTimestamp" => o.show_commit_timestamp = boolean(k, v)?,
            "showCommitMetadata" if extensions_enabled() => o.show_commit_metadata = boolean(k, v)?,
            "transactionNetEffect" if extensions_enabled() => {
                o.transaction_net_effect = boolean(k, v)?
            }
            "ignoreRemovedShards" => {
                boolean(k, v)?;
            }
            "version" => {
                string(k, v)?;
            }
            other => {
                return Err(MongoError::with_code(
                    40415,
                    format!("BSON field '$changeStream.{other}' is an unknown field."),
                ));
            }
        }
    }

    if o.transaction_net_effect && o.show_raw_update_description {
        return Err(MongoError::bad_value(
            "transactionNetEffect combines update descriptions; it cannot be used with \
             showRawUpdateDescription",
        ));
    }
    // assertIsLegalSpecification, in order.
    if ctx.standalone {
        return Err(MongoError::with_code(
            40573,
            "The $changeStream stage is only supported on replica sets",
        ));
    }
    let admin_aggregate_one = ctx.db == "admin" && ctx.coll.is_none();
    if o.all_changes_for_cluster && !admin_aggregate_one {
        return Err(MongoError::new(
            ErrorCode::INVALID_OPTIONS,
            "A $changeStream with 'allChangesForCluster:true' may only be opened on the 'admin' \
             database, and with no collection name",
        ));
    }
    let ns_text = match ctx.coll {
        Some(c) => format!("{}.{c}", ctx.db),
        None => ctx.db.to_string(),
    };
    let invalid_ns = || {
        MongoError::new(
            ErrorCode::INVALID_NAMESPACE,
            format!("$changeStream may not be opened on the internal {ns_text} namespace"),
        )
    };
    if ctx.db == "local"
        || (ctx.db == "config" && !o.allow_to_run_on_config_db)
        || (ctx.db == "admin" && !o.all_changes_for_cluster)
    {
        return Err(invalid_ns());
    }
    if ctx.coll.is_some_and(|c| c.starts_with("system."))
        && (ctx.through_router || !o.allow_to_run_on_system_ns)
    {
        return Err(invalid_ns());
    }
    if o.show_migration_events && ctx.through_router {
        return Err(MongoError::with_code(
            31123,
            "Change streams on mongos do not support showMigrationEvents",
        ));
    }
    let level = match (ctx.coll, o.all_changes_for_cluster) {
        (Some(_), _) => StreamLevel::Collection,
        (None, true) => StreamLevel::Cluster,
        (None, false) => StreamLevel::Database,
    };
    let start = match (resume_after, start_after, start_at) {
        (Some(_), Some(_), _) => {
            return Err(MongoError::with_code(
                50865,
                "Do not specify both 'resumeAfter' and 'startAfter' in a $changeStream stage",
            ));
        }
        (Some(_), None, Some(_)) | (None, Some(_), Some(_)) => {
            return Err(MongoError::with_code(
                40674,
                "Only one type of resume option is allowed, but multiple were found.",
            ));
        }
        (Some(t), None, None) => {
            if t.from_invalidate() {
                return Err(MongoError::new(
                    ErrorCode::INVALID_RESUME_TOKEN,
                    "Attempting to resume a change stream using 'resumeAfter' is not allowed \
                     from an invalidate notification.",
                ));
            }
            StartPoint::ResumeAfter(t)
        }
        (None, Some(t), None) => StartPoint::StartAfter(t),
        (None, None, Some(ts)) => StartPoint::StartAtOperationTime(ts),
        (None, None, None) => StartPoint::None,
    };
    if let Some(t) = start.client_token()
        && level == StreamLevel::Collection
        && !t.is_high_water_mark()
        && t.uuid().is_none()
    {
        return Err(MongoError::new(
            ErrorCode::INVALID_RESUME_TOKEN,
            "Attempted to resume a single-collection stream, but the resume token does not \
             include a UUID.",
        ));
    }
    Ok(ChangeStreamSpec {
        level,
        db: ctx.db.to_string(),
        coll: ctx.coll.map(str::to_string),
        options: o,
        start,
    })
}

fn token(field: &str, v: &Bson) -> Result<ResumeTokenData> {
    match v {
        Bson::Document(d) => Ok(ResumeTokenData::from_document(d)?),
        _ => Err(wrong_type(field, v, "object")),
    }
}

fn string<'a>(field: &str, v: &'a Bson) -> Result<&'a str> {
    match v {
        Bson::String(s) => Ok(s),
        _ => Err(wrong_type(field, v, "string")),
    }
}

fn boolean(field: &str, v: &Bson) -> Result<bool> {
    match v {
        Bson::Boolean(b) => Ok(*b),
        _ => Err(wrong_type(field, v, "bool")),
    }
}

fn wrong_type(field: &str, v: &Bson, expected: &str) -> MongoError {
    MongoError::type_mismatch(format!(
        "BSON field '$changeStream.{field}' is the wrong type '{}', expected type '{expected}'",
        type_name(v)
    ))
}

fn bad_enum(field: &str, value: &str, enum_name: &str) -> MongoError {
    MongoError::bad_value(format!(
        "Enumeration value '{value}' for field '$changeStream.{field}' is not a valid value \
         ({enum_name})."
    ))
}

fn type_name(v: &Bson) -> &'static str {
    crate::value::type_name(v)
}

#[cfg(test)]
mod tests;
