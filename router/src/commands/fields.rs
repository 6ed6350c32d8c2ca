//! Unknown command fields. The commands MongoDB parses strictly (its IDL's `strict: true`)
//! refuse a top-level field they do not know with 40415 `BSON field '<command>.<field>' is an
//! unknown field.`, as mongos does; a misspelt option (`filer`, `upsret`) then fails loudly
//! instead of being ignored. Commands not listed here ignore unknown fields, as MongoDB's
//! non-strict commands do.
//!
//! Invariant: every field a driver, mongosh or a shell helper may send for a listed command
//! is known: the command's own fields as of MongoDB 7.0 (and the newer ones drivers send to
//! newer servers), internal ones included, plus the generic arguments every command takes.

use bson::{Bson, Document};
use wire::{ErrorCode, MongoError, Result};

use crate::command::Command;

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

/// The top-level fields a command knows, beyond the generic ones.
enum Known {
    /// Parsed strictly: any other field is refused.
    Strict(&'static [&'static str]),
    /// A write command, parsed strictly: these and [`WRITE_BASE`].
    StrictWrite(&'static [&'static str]),
    /// Fields it does not know are ignored.
    Lenient,
}

/// How `command` parses its top-level fields (every command classified: see `crate::command`).
fn known(command: Command) -> Known {
    use Command::*;
    Known::Strict(match command {
        Find => &[
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
        Aggregate => &[
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
        Count => &[
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
        Distinct => &[
            "key",
            "query",
            "collation",
            "hint",
            "sampleId",
            "mirrored",
            "includeQueryStatsMetrics",
        ],
        GetMore => &[
            "collection",
            "batchSize",
            "term",
            "lastKnownCommittedOpTime",
            "includeQueryStatsMetrics",
        ],
        FindAndModify => &[
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
        Create => &[
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
        CreateIndexes => &[
            "indexes",
            "commitQuorum",
            "ignoreUnknownIndexOptions",
            "isTimeseriesNamespace",
            "collectionUUID",
        ],
        Drop => &["collectionUUID", "isTimeseriesNamespace"],
        DropIndexes => &["index", "collectionUUID", "isTimeseriesNamespace"],
        ListCollections => &[
            "filter",
            "nameOnly",
            "authorizedCollections",
            "cursor",
            "includePendingDrops",
        ],
        ListIndexes => &[
            "cursor",
            "includeBuildUUIDs",
            "includeIndexBuildInfo",
            "isTimeseriesNamespace",
            "collectionUUID",
        ],
        CreateSubscription => &[
            "collection",
            "pipeline",
            "changeStream",
            "start",
            "ackTimeoutSecs",
            "maxDeliveries",
            "retryBackoffMS",
            "maxInFlight",
            "maxLagBytes",
            "maxLagSecs",
            "consumerIdleTimeoutSecs",
            "selectors",
        ],
        ChangeStreamBounds => &["allChangesForCluster"],
        CreateHttpToken => &["expiresAfterSecs"],
        SnapshotCursor => &[],
        ReadSubscription => &["consumer", "max", "waitMS", "ackThrough", "forwardedBy"],
        AckSubscription => &[
            "consumer",
            "deliveryIds",
            "through",
            "inProgress",
            "waitDurable",
            "forwardedBy",
        ],
        NackSubscription => &[
            "consumer",
            "deliveryIds",
            "retryInMS",
            "deadLetter",
            "forwardedBy",
        ],
        AlterSubscription => &[
            "consumer",
            "pause",
            "resume",
            "reset",
            "dropConsumer",
            "redrive",
            "ackTimeoutSecs",
            "maxDeliveries",
            "retryBackoffMS",
            "maxInFlight",
            "forwardedBy",
        ],
        ListSubscriptions => &["filter", "cursor"],
        DropSubscription => &[],
        CollMod => &[
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
        KillCursors => &["cursors"],
        Insert => return Known::StrictWrite(&["documents"]),
        Update => return Known::StrictWrite(&["updates", "let", "runtimeConstants", "sampleId"]),
        Delete => return Known::StrictWrite(&["deletes", "let", "sampleId"]),
        AbortTransaction
        | BuildInfo
        | CollStats
        | CommitTransaction
        | ConfigureFailPoint
        | ConnectionStatus
        | CreateRole
        | CreateUser
        | CurrentOp
        | DbStats
        | DropDatabase
        | DropRole
        | DropUser
        | EnableSharding
        | EndSessions
        | Explain
        | GetClusterParameter
        | GetCmdLineOpts
        | GetLog
        | GetParameter
        | GrantPrivilegesToRole
        | GrantRolesToRole
        | GrantRolesToUser
        | Hello
        | HostInfo
        | KillAllSessions
        | KillOp
        | KillSessions
        | ListCommands
        | ListDatabases
        | ListShards
        | Logout
        | Ping
        | RefreshSessions
        | RenameCollection
        | RevokePrivilegesFromRole
        | RevokeRolesFromRole
        | RevokeRolesFromUser
        | RolesInfo
        | SaslContinue
        | SaslStart
        | ServerStatus
        | TributaryStatus
        | SetClusterParameter
        | SetParameter
        | ShardCollection
        | StartSession
        | UpdateRole
        | UpdateUser
        | UsersInfo
        | Validate
        | WhatsMyUri => return Known::Lenient,
    })
}

/// The top-level fields `command` itself knows (none listed for a lenient one), generic ones
/// aside.
pub fn own(command: Command) -> &'static [&'static str] {
    match known(command) {
        Known::Strict(own) | Known::StrictWrite(own) => own,
        Known::Lenient => &[],
    }
}

/// Refuses the first top-level field of `cmd` that its command (`name`, its first field)
/// does not know, when that command is parsed strictly.
pub fn check(command: Command, name: &str, cmd: &Document) -> Result<()> {
    write_concern(cmd)?;
    let (own, write) = match known(command) {
        Known::Strict(own) => (own, false),
        Known::StrictWrite(own) => (own, true),
        Known::Lenient => return Ok(()),
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

/// The fields of a write concern (MongoDB's `WriteConcernIdl`, which is strict); the last three
/// are accepted and ignored.
const WRITE_CONCERN: &[&str] = &[
    "w",
    "j",
    "wtimeout",
    "fsync",
    "provenance",
    "wElectionId",
    "wOpTime",
    "getLastError",
];

/// Checks a command's `writeConcern` as MongoDB 7.0 parses it: an unknown field is 40415; `j`
/// and `fsync` are booleans or numbers (14); `w` is a number, a string or an object (9); a
/// numeric `wtimeout` fits 32 bits (9), any other is ignored; `j` and `fsync` are not both
/// true (9).
pub fn write_concern(cmd: &Document) -> Result<()> {
    let Some(Bson::Document(wc)) = cmd.get("writeConcern") else {
        return Ok(());
    };
    if let Some(field) = wc.keys().find(|f| !WRITE_CONCERN.contains(&f.as_str())) {
        return Err(MongoError::with_code(
            UNKNOWN_FIELD,
            format!("BSON field 'WriteConcernOptions.{field}' is an unknown field."),
        ));
    }
    let number = |v: &Bson| {
        matches!(
            v,
            Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_)
        )
    };
    let truthy = |v: Option<&Bson>| match v {
        Some(Bson::Boolean(b)) => *b,
        Some(v) => pipeline::value::as_f64(v).is_some_and(|n| n != 0.0),
        None => false,
    };
    for field in ["j", "fsync"] {
        match wc.get(field) {
            None | Some(Bson::Boolean(_)) => {}
            Some(v) if number(v) => {}
            Some(v) => {
                return Err(MongoError::type_mismatch(format!(
                    "BSON field 'WriteConcernOptions.{field}' is the wrong type '{}', expected \
                     types '[bool, long, int, decimal, double]'",
                    pipeline::value::type_name(v)
                )));
            }
        }
    }
    match wc.get("w") {
        None | Some(Bson::Null | Bson::Undefined | Bson::String(_) | Bson::Document(_)) => {}
        Some(v) if number(v) => {}
        Some(v) => {
            return Err(MongoError::failed_to_parse(format!(
                "w has to be a number, string, or object; found: {}",
                pipeline::value::type_name(v)
            )));
        }
    }
    if let Some(v) = wc.get("wtimeout").filter(|v| number(v))
        && pipeline::value::as_f64(v).is_some_and(|n| n > f64::from(i32::MAX))
    {
        return Err(MongoError::failed_to_parse(
            "wtimeout must be a 32-bit integer",
        ));
    }
    if truthy(wc.get("j")) && truthy(wc.get("fsync")) {
        return Err(MongoError::new(
            ErrorCode::FAILED_TO_PARSE,
            "fsync and j options cannot be used together",
        ));
    }
    Ok(())
}

/// A checked write concern as the router forwards it: what MongoDB's parse keeps (`w`, `j`,
/// `fsync`, a numeric `wtimeout`, `provenance`), without the fields it ignores, so that an
/// ignored value, however large, is not copied to every shard.
pub fn forwarded_write_concern(wc: &Document) -> Document {
    wc.iter()
        .filter(|(k, v)| match k.as_str() {
            "w" | "j" | "fsync" | "provenance" => true,
            "wtimeout" => matches!(
                v,
                Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_)
            ),
            _ => false,
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn a_write_concern_is_parsed_as_mongodb_parses_it() {
        let wc = |wc: Document| write_concern(&doc! {"insert": "c", "writeConcern": wc});
        for ok in [
            doc! {"w": 1, "j": true, "wtimeout": 5000},
            doc! {"w": "majority", "fsync": 0},
            doc! {"w": {"dc": 2}, "wElectionId": 1, "wOpTime": 2, "getLastError": 1},
            doc! {"wtimeout": [1, 2, 3]},
            doc! {},
        ] {
            assert!(wc(ok.clone()).is_ok(), "{ok}");
        }
        let code = |d: Document| wc(d).expect_err("refused").code;
        assert_eq!(code(doc! {"w": 1, "x": 1}), 40415);
        assert_eq!(code(doc! {"j": "yes"}), 14);
        assert_eq!(code(doc! {"w": [1]}), 9);
        assert_eq!(code(doc! {"wtimeout": 3_000_000_000_i64}), 9);
        assert_eq!(code(doc! {"j": true, "fsync": true}), 9);
        let e = wc(doc! {"w": 1, "$$[]": 1}).expect_err("unknown");
        assert_eq!(
            e.errmsg,
            "BSON field 'WriteConcernOptions.$$[]' is an unknown field."
        );
    }

    #[test]
    fn a_forwarded_write_concern_keeps_what_the_parse_keeps() {
        let many: Vec<bson::Bson> = (0..1000).map(bson::Bson::Int32).collect();
        let wc = doc! {"w": 1, "j": false, "wtimeout": many, "wOpTime": 5, "fsync": false};
        assert_eq!(
            forwarded_write_concern(&wc),
            doc! {"w": 1, "j": false, "fsync": false}
        );
        assert_eq!(
            forwarded_write_concern(&doc! {"w": "majority", "wtimeout": 100}),
            doc! {"w": "majority", "wtimeout": 100}
        );
    }

    fn check_named(name: &str, cmd: &Document) -> Result<()> {
        check(Command::named(name).expect("a command"), name, cmd)
    }

    #[test]
    fn strict_commands_refuse_an_unknown_field_with_40415() {
        let e = check_named("find", &doc! {"find": "c", "filer": {}}).expect_err("a typo");
        assert_eq!(e.code, 40415);
        assert_eq!(e.errmsg, "BSON field 'find.filer' is an unknown field.");
        let e = check_named(
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
        assert!(check_named("find", &find).is_ok());
        let insert = doc! {
            "insert": "c", "documents": [], "ordered": false, "txnNumber": 1_i64,
            "bypassDocumentValidation": true, "writeConcern": {"w": 1},
        };
        assert!(check_named("insert", &insert).is_ok());
        assert!(check_named("ping", &doc! {"ping": 1, "anything": 1}).is_ok());
    }
}
