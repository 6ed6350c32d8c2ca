//! Unknown command fields. The commands MongoDB parses strictly (its IDL's `strict: true`)
//! refuse a top-level field they do not know with 40415 `BSON field '<command>.<field>' is an
//! unknown field.`, as mongos does; a misspelt option (`filer`, `upsret`) then fails loudly
//! instead of being ignored. Commands not listed here ignore unknown fields, as MongoDB's
//! non-strict commands do.
//!
//! Invariant: every field a driver, mongosh or a shell helper may send for a listed command
//! is known: the command's own fields as of MongoDB 7.0 (and the newer ones drivers send to
//! newer servers), internal ones included, plus the generic arguments every command takes.

use bson::Document;
use wire::{MongoError, Result};

/// `BSON field ... is an unknown field`.
const UNKNOWN_FIELD: i32 = 40415;

/// The generic arguments: fields any command may carry (MongoDB's `generic_argument.idl`).
const GENERIC: &[&str] = &[
    "$audit",
    "$client",
    "$clusterTime",
    "$configServerState",
    "$configTime",
    "$db",
    "$gleStats",
    "$oplogQueryData",
    "$queryOptions",
    "$readPreference",
    "$replData",
    "$topologyTime",
    "allowImplicitCollectionCreation",
    "apiDeprecationErrors",
    "apiStrict",
    "apiVersion",
    "autocommit",
    "clientOperationKey",
    "comment",
    "databaseVersion",
    "expectPrefix",
    "help",
    "lsid",
    "maxTimeMS",
    "maxTimeMSOpOnly",
    "mayBypassWriteBlocking",
    "operationTime",
    "rawData",
    "readConcern",
    "shardVersion",
    "startTransaction",
    "stmtId",
    "txnNumber",
    "txnRetryCounter",
    "usesDefaultMaxTimeMS",
    "versionContext",
    "writeConcern",
];

/// Fields of every write command (`WriteCommandRequestBase`).
const WRITE_BASE: &[&str] = &[
    "bypassDocumentValidation",
    "ordered",
    "stmtIds",
    "isTimeseriesNamespace",
    "collectionUUID",
    "encryptionInformation",
    "bypassEmptyTsReplacement",
];

/// The fields of a strictly parsed command, beyond the generic ones; `None` for a command
/// that ignores what it does not know.
fn fields_of(command: &str) -> Option<&'static [&'static str]> {
    Some(match command {
        "find" => &[
            "filter",
            "projection",
            "sort",
            "hint",
            "skip",
            "limit",
            "batchSize",
            "ntoreturn",
            "singleBatch",
            "let",
            "max",
            "min",
            "returnKey",
            "showRecordId",
            "tailable",
            "oplogReplay",
            "noCursorTimeout",
            "awaitData",
            "allowPartialResults",
            "collation",
            "allowDiskUse",
            "readOnce",
            "allowSpeculativeMajorityRead",
            "$_requestResumeToken",
            "$_resumeAfter",
            "$_startAt",
            "requestResumeToken",
            "resumeAfter",
            "term",
            "encryptionInformation",
            "isTimeseriesNamespace",
            "includeQueryStatsMetrics",
            "querySettings",
            "runtimeConstants",
        ],
        "aggregate" => &[
            "pipeline",
            "explain",
            "allowDiskUse",
            "cursor",
            "bypassDocumentValidation",
            "collation",
            "hint",
            "let",
            "exchange",
            "fromMongos",
            "fromRouter",
            "needsMerge",
            "needsSortedMerge",
            "mergeByPBRT",
            "$_generateV2ResumeTokens",
            "isMapReduceCommand",
            "collectionUUID",
            "encryptionInformation",
            "$_requestReshardingResumeToken",
            "$_passthroughToShard",
            "passthroughToShard",
            "$_isClusterQueryWithoutShardKeyCmd",
            "isClusterQueryWithoutShardKeyCmd",
            "use44SortKeys",
            "useNewUpsert",
            "runtimeConstants",
            "includeQueryStatsMetrics",
            "querySettings",
            "$_requestResumeToken",
            "$_resumeAfter",
            "$_startAt",
        ],
        "count" => &[
            "query",
            "limit",
            "skip",
            "hint",
            "collation",
            "fields",
            "sampleId",
            "mirrored",
            "encryptionInformation",
            "includeQueryStatsMetrics",
        ],
        "distinct" => &[
            "key",
            "query",
            "collation",
            "hint",
            "sampleId",
            "mirrored",
            "includeQueryStatsMetrics",
        ],
        "getMore" => &[
            "collection",
            "batchSize",
            "term",
            "lastKnownCommittedOpTime",
            "includeQueryStatsMetrics",
        ],
        "findAndModify" | "findandmodify" => &[
            "query",
            "fields",
            "sort",
            "hint",
            "batchSize",
            "new",
            "remove",
            "update",
            "upsert",
            "bypassDocumentValidation",
            "collation",
            "arrayFilters",
            "let",
            "runtimeConstants",
            "encryptionInformation",
            "sampleId",
            "isTimeseriesNamespace",
        ],
        "create" => &[
            "capped",
            "autoIndexId",
            "idIndex",
            "size",
            "max",
            "storageEngine",
            "validator",
            "validationLevel",
            "validationAction",
            "indexOptionDefaults",
            "viewOn",
            "pipeline",
            "collation",
            "changeStreamPreAndPostImages",
            "timeseries",
            "clusteredIndex",
            "recordPreImages",
            "temp",
            "flags",
            "expireAfterSeconds",
            "encryptedFields",
        ],
        "createIndexes" => &[
            "indexes",
            "commitQuorum",
            "ignoreUnknownIndexOptions",
            "isTimeseriesNamespace",
            "collectionUUID",
        ],
        "drop" => &["collectionUUID", "isTimeseriesNamespace"],
        "dropIndexes" | "deleteIndexes" => &["index", "collectionUUID", "isTimeseriesNamespace"],
        "listCollections" => &[
            "filter",
            "nameOnly",
            "authorizedCollections",
            "cursor",
            "includePendingDrops",
        ],
        "listIndexes" => &[
            "cursor",
            "includeBuildUUIDs",
            "includeIndexBuildInfo",
            "isTimeseriesNamespace",
            "collectionUUID",
        ],
        "collMod" => &[
            "index",
            "validator",
            "validationLevel",
            "validationAction",
            "viewOn",
            "pipeline",
            "recordPreImages",
            "changeStreamPreAndPostImages",
            "expireAfterSeconds",
            "timeseries",
            "timeseriesBucketsMayHaveMixedSchemaData",
            "dryRun",
            "cappedSize",
            "cappedMax",
            "collectionUUID",
            "isTimeseriesNamespace",
            "noPadding",
            "usePowerOf2Sizes",
            "clusteredIndex",
            "flags",
        ],
        "killCursors" => &["cursors"],
        _ => return None,
    })
}

/// The command-specific fields of the write commands, beyond [`WRITE_BASE`].
fn write_fields_of(command: &str) -> Option<&'static [&'static str]> {
    Some(match command {
        "insert" => &["documents"],
        "update" => &["updates", "let", "runtimeConstants", "sampleId"],
        "delete" => &["deletes", "let", "sampleId"],
        _ => return None,
    })
}

/// Refuses the first top-level field of `cmd` that its command (`name`, its first field)
/// does not know, when that command is parsed strictly.
pub fn check(name: &str, cmd: &Document) -> Result<()> {
    let (own, write) = match (fields_of(name), write_fields_of(name)) {
        (Some(own), _) => (own, false),
        (None, Some(own)) => (own, true),
        (None, None) => return Ok(()),
    };
    let known =
        |f: &str| GENERIC.contains(&f) || own.contains(&f) || write && WRITE_BASE.contains(&f);
    match cmd.keys().skip(1).find(|f| !known(f)) {
        Some(field) => Err(MongoError::with_code(
            UNKNOWN_FIELD,
            format!("BSON field '{name}.{field}' is an unknown field."),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn strict_commands_refuse_an_unknown_field_with_40415() {
        let e = check("find", &doc! {"find": "c", "filer": {}}).expect_err("a typo");
        assert_eq!(e.code, 40415);
        assert_eq!(e.errmsg, "BSON field 'find.filer' is an unknown field.");
        let e = check(
            "update",
            &doc! {"update": "c", "updates": [], "upsret": true},
        )
        .expect_err("a typo");
        assert_eq!(e.errmsg, "BSON field 'update.upsret' is an unknown field.");
    }

    #[test]
    fn generic_and_own_fields_pass_and_lenient_commands_ignore_the_rest() {
        let find = doc! {
            "find": "c", "filter": {}, "sort": {"a": 1}, "lsid": {"id": 1},
            "$clusterTime": {}, "$db": "d", "readConcern": {}, "maxTimeMS": 5,
            "comment": "x", "apiVersion": "1",
        };
        assert!(check("find", &find).is_ok());
        let insert = doc! {
            "insert": "c", "documents": [], "ordered": false, "txnNumber": 1_i64,
            "bypassDocumentValidation": true, "writeConcern": {"w": 1},
        };
        assert!(check("insert", &insert).is_ok());
        assert!(check("ping", &doc! {"ping": 1, "anything": 1}).is_ok());
    }
}
