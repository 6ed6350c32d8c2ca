//! Client-visible errors: MongoDB's `{ok: 0, errmsg, code, codeName, errorLabels}` documents.
//!
//! One error type for the whole system, as in the MongoDB drivers: the code, its name and the
//! labels are data, not a variant per code. Every crate that can fail in a way a client sees
//! returns [`MongoError`]; the router and the shard turn it into a reply with
//! [`MongoError::to_document`]. Codes and names are those of MongoDB's `error_codes.yml`.

use bson::{Bson, Document, doc};

pub type Result<T, E = MongoError> = std::result::Result<T, E>;

/// A MongoDB error code and its `codeName`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorCode {
    pub code: i32,
    pub name: &'static str,
}

macro_rules! codes {
    ($($konst:ident = $code:literal, $name:literal;)*) => {
        impl ErrorCode {
            $(pub const $konst: ErrorCode = ErrorCode { code: $code, name: $name };)*

            /// The code with this number, if it is one this server knows.
            pub fn from_code(code: i32) -> Option<ErrorCode> {
                match code {
                    $($code => Some(ErrorCode::$konst),)*
                    _ => None,
                }
            }
        }
    };
}

codes! {
    INTERNAL_ERROR = 1, "InternalError";
    BAD_VALUE = 2, "BadValue";
    NO_SUCH_KEY = 4, "NoSuchKey";
    GRAPH_CONTAINS_CYCLE = 5, "GraphContainsCycle";
    HOST_UNREACHABLE = 6, "HostUnreachable";
    HOST_NOT_FOUND = 7, "HostNotFound";
    UNKNOWN_ERROR = 8, "UnknownError";
    FAILED_TO_PARSE = 9, "FailedToParse";
    CANNOT_MUTATE_OBJECT = 10, "CannotMutateObject";
    USER_NOT_FOUND = 11, "UserNotFound";
    UNSUPPORTED_FORMAT = 12, "UnsupportedFormat";
    UNAUTHORIZED = 13, "Unauthorized";
    TYPE_MISMATCH = 14, "TypeMismatch";
    OVERFLOW = 15, "Overflow";
    INVALID_LENGTH = 16, "InvalidLength";
    PROTOCOL_ERROR = 17, "ProtocolError";
    AUTHENTICATION_FAILED = 18, "AuthenticationFailed";
    ILLEGAL_OPERATION = 20, "IllegalOperation";
    EMPTY_ARRAY_OPERATION = 21, "EmptyArrayOperation";
    INVALID_BSON = 22, "InvalidBSON";
    LOCK_TIMEOUT = 24, "LockTimeout";
    NAMESPACE_NOT_FOUND = 26, "NamespaceNotFound";
    INDEX_NOT_FOUND = 27, "IndexNotFound";
    PATH_NOT_VIABLE = 28, "PathNotViable";
    NON_EXISTENT_PATH = 29, "NonExistentPath";
    INVALID_PATH = 30, "InvalidPath";
    ROLE_NOT_FOUND = 31, "RoleNotFound";
    CONFLICTING_UPDATE_OPERATORS = 40, "ConflictingUpdateOperators";
    CURSOR_NOT_FOUND = 43, "CursorNotFound";
    NAMESPACE_EXISTS = 48, "NamespaceExists";
    MAX_TIME_MS_EXPIRED = 50, "MaxTimeMSExpired";
    DOLLAR_PREFIXED_FIELD_NAME = 52, "DollarPrefixedFieldName";
    INVALID_ID_FIELD = 53, "InvalidIdField";
    NOT_SINGLE_VALUE_FIELD = 54, "NotSingleValueField";
    INVALID_DBREF = 55, "InvalidDBRef";
    EMPTY_FIELD_NAME = 56, "EmptyFieldName";
    DOTTED_FIELD_NAME = 57, "DottedFieldName";
    COMMAND_NOT_FOUND = 59, "CommandNotFound";
    SHARD_KEY_NOT_FOUND = 61, "ShardKeyNotFound";
    STALE_SHARD_VERSION = 63, "StaleShardVersion";
    STALE_CONFIG = 13388, "StaleConfig";
    WRITE_CONCERN_FAILED = 64, "WriteConcernFailed";
    MULTIPLE_ERRORS_OCCURRED = 65, "MultipleErrorsOccurred";
    IMMUTABLE_FIELD = 66, "ImmutableField";
    UNKNOWN_REPL_WRITE_CONCERN = 79, "UnknownReplWriteConcern";
    UNSATISFIABLE_WRITE_CONCERN = 100, "UnsatisfiableWriteConcern";
    CANNOT_CREATE_INDEX = 67, "CannotCreateIndex";
    INVALID_INDEX_SPECIFICATION_OPTION = 197, "InvalidIndexSpecificationOption";
    INDEX_ALREADY_EXISTS = 68, "IndexAlreadyExists";
    ALREADY_INITIALIZED = 23, "AlreadyInitialized";
    SHARD_NOT_FOUND = 70, "ShardNotFound";
    INVALID_OPTIONS = 72, "InvalidOptions";
    QUERY_EXCEEDED_MEMORY_LIMIT_NO_DISK_USE_ALLOWED = 292, "QueryExceededMemoryLimitNoDiskUseAllowed";
    CURSOR_IN_USE = 293, "CursorInUse";
    TRANSACTION_TOO_OLD = 225, "TransactionTooOld";
    INVALID_NAMESPACE = 73, "InvalidNamespace";
    INDEX_OPTIONS_CONFLICT = 85, "IndexOptionsConflict";
    INDEX_KEY_SPECS_CONFLICT = 86, "IndexKeySpecsConflict";
    NETWORK_TIMEOUT = 89, "NetworkTimeout";
    SHUTDOWN_IN_PROGRESS = 91, "ShutdownInProgress";
    WRITE_CONFLICT = 112, "WriteConflict";
    TIME_PROOF_MISMATCH = 204, "TimeProofMismatch";
    CLUSTER_TIME_FAILS_RATE_LIMITER = 205, "ClusterTimeFailsRateLimiter";
    COMMAND_NOT_SUPPORTED = 115, "CommandNotSupported";
    CONFLICTING_OPERATION_IN_PROGRESS = 117, "ConflictingOperationInProgress";
    NAMESPACE_NOT_SHARDED = 118, "NamespaceNotSharded";
    INVALID_SYNC_SOURCE = 119, "InvalidSyncSource";
    DOCUMENT_VALIDATION_FAILURE = 121, "DocumentValidationFailure";
    QUERY_FEATURE_NOT_ALLOWED = 224, "QueryFeatureNotAllowed";
    OPERATION_FAILED = 96, "OperationFailed";
    CAPPED_POSITION_LOST = 136, "CappedPositionLost";
    INCOMPATIBLE_SHARDING_METADATA = 137, "IncompatibleShardingMetadata";
    FAILED_TO_SATISFY_READ_PREFERENCE = 133, "FailedToSatisfyReadPreference";
    STALE_EPOCH = 150, "StaleEpoch";
    INCOMPATIBLE_COLLATION_VERSION = 161, "IncompatibleCollationVersion";
    COMMAND_NOT_SUPPORTED_ON_VIEW = 166, "CommandNotSupportedOnView";
    OPTION_NOT_SUPPORTED_ON_VIEW = 167, "OptionNotSupportedOnView";
    INVALID_PIPELINE_OPERATOR = 168, "InvalidPipelineOperator";
    CANNOT_IMPLICITLY_CREATE_COLLECTION = 227, "CannotImplicitlyCreateCollection";
    NOT_PRIMARY_OR_SECONDARY = 13436, "NotPrimaryOrSecondary";
    OUT_OF_DISK_SPACE = 14031, "OutOfDiskSpace";
    NOT_PRIMARY_NO_SECONDARY_OK = 13435, "NotPrimaryNoSecondaryOk";
    INTERRUPTED_DUE_TO_REPL_STATE_CHANGE = 11602, "InterruptedDueToReplStateChange";
    INTERRUPTED_AT_SHUTDOWN = 11600, "InterruptedAtShutdown";
    NOT_WRITABLE_PRIMARY = 10107, "NotWritablePrimary";
    PRIMARY_STEPPED_DOWN = 189, "PrimarySteppedDown";
    SOCKET_EXCEPTION = 9001, "SocketException";
    EXCEEDED_TIME_LIMIT = 262, "ExceededTimeLimit";
    ELECTION_IN_PROGRESS = 216, "ElectionInProgress";
    NODE_NOT_FOUND = 74, "NodeNotFound";
    NOT_SECONDARY = 95, "NotSecondary";
    INVALID_REPLICA_SET_CONFIG = 93, "InvalidReplicaSetConfig";
    NEW_REPLICA_SET_CONFIGURATION_INCOMPATIBLE = 103, "NewReplicaSetConfigurationIncompatible";
    CONFIGURATION_IN_PROGRESS = 109, "ConfigurationInProgress";
    CLOSE_CHANGE_STREAM = 222, "CloseChangeStream";
    NO_MATCHING_DOCUMENT = 47, "NoMatchingDocument";
    MAX_SUB_PIPELINE_DEPTH_EXCEEDED = 232, "MaxSubPipelineDepthExceeded";
    RETRY_CHANGE_STREAM = 234, "RetryChangeStream";
    CURSOR_KILLED = 237, "CursorKilled";
    NO_SUCH_TRANSACTION = 251, "NoSuchTransaction";
    SNAPSHOT_TOO_OLD = 239, "SnapshotTooOld";
    SNAPSHOT_UNAVAILABLE = 246, "SnapshotUnavailable";
    OPERATION_NOT_SUPPORTED_IN_TRANSACTION = 263, "OperationNotSupportedInTransaction";
    PREPARED_TRANSACTION_IN_PROGRESS = 267, "PreparedTransactionInProgress";
    INTERRUPTED = 11601, "Interrupted";
    TRANSACTION_COMMITTED = 256, "TransactionCommitted";
    TRANSACTION_TOO_LARGE = 257, "TransactionTooLarge";
    INVALID_RESUME_TOKEN = 260, "InvalidResumeToken";
    CHANGE_STREAM_FATAL_ERROR = 280, "ChangeStreamFatalError";
    CHANGE_STREAM_HISTORY_LOST = 286, "ChangeStreamHistoryLost";
    CHANGE_STREAM_INVALIDATED = 346, "ChangeStreamInvalidated";
    CHANGE_STREAM_TOPOLOGY_CHANGE = 348, "ChangeStreamTopologyChange";
    CHANGE_STREAM_START_AFTER_INVALIDATE = 351, "ChangeStreamStartAfterInvalidate";
    API_STRICT_ERROR = 323, "APIStrictError";
    DUPLICATE_KEY = 11000, "DuplicateKey";
    BSON_OBJECT_TOO_LARGE = 10334, "BSONObjectTooLarge";
    ILLEGAL_OP_MSG_FLAG = 223, "IllegalOpMsgFlag";
    CHECKSUM_MISMATCH = 288, "ChecksumMismatch";
    UNSUPPORTED_OP_QUERY_COMMAND = 352, "UnsupportedOpQueryCommand";
    EXCEEDED_MEMORY_LIMIT = 146, "ExceededMemoryLimit";
    NOT_IMPLEMENTED = 238, "NotImplemented";
    // Tributary's own, for subscriptions (router/src/subscriptions/errors.rs).
    SUBSCRIPTION_NOT_FOUND = 9100, "SubscriptionNotFound";
    CONSUMER_NOT_FOUND = 9101, "ConsumerNotFound";
    SUBSCRIPTION_EXISTS = 9102, "SubscriptionExists";
    SUBSCRIPTION_EXPIRED = 9103, "SubscriptionExpired";
    SUBSCRIPTION_RESET_REQUIRED = 9104, "SubscriptionResetRequired";
    RESERVED_NAMESPACE = 9105, "ReservedNamespace";
    CONSUMER_LEASE_MOVED = 9106, "ConsumerLeaseMoved";
}

impl ErrorCode {
    /// A code this server does not know by name (e.g. one a fail point was told to return):
    /// MongoDB reports those as `Location<code>`.
    pub fn named(code: i32) -> ErrorCode {
        ErrorCode::from_code(code).unwrap_or(ErrorCode {
            code,
            name: "UnknownError",
        })
    }
}

/// A client-visible MongoDB error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code_name} ({code}): {errmsg}")]
#[non_exhaustive]
pub struct MongoError {
    pub code: i32,
    pub code_name: String,
    pub errmsg: String,
    pub labels: Vec<String>,
    /// Extra fields for the reply (e.g. `writeErrors`, `keyPattern`, `errInfo`).
    pub extra: Option<Document>,
}

impl MongoError {
    pub fn new(code: ErrorCode, errmsg: impl Into<String>) -> Self {
        MongoError {
            code: code.code,
            code_name: code.name.to_string(),
            errmsg: errmsg.into(),
            labels: Vec::new(),
            extra: None,
        }
    }

    /// An error with a numeric code only, named as MongoDB would (`Location<code>` when unknown).
    pub fn with_code(code: i32, errmsg: impl Into<String>) -> Self {
        let name = match ErrorCode::from_code(code) {
            Some(c) => c.name.to_string(),
            None => format!("Location{code}"),
        };
        MongoError {
            code,
            code_name: name,
            errmsg: errmsg.into(),
            labels: Vec::new(),
            extra: None,
        }
    }

    pub fn bad_value(errmsg: impl Into<String>) -> Self {
        MongoError::new(ErrorCode::BAD_VALUE, errmsg)
    }

    pub fn failed_to_parse(errmsg: impl Into<String>) -> Self {
        MongoError::new(ErrorCode::FAILED_TO_PARSE, errmsg)
    }

    pub fn type_mismatch(errmsg: impl Into<String>) -> Self {
        MongoError::new(ErrorCode::TYPE_MISMATCH, errmsg)
    }

    pub fn internal(errmsg: impl Into<String>) -> Self {
        MongoError::new(ErrorCode::INTERNAL_ERROR, errmsg)
    }

    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        let label = label.into();
        if !self.labels.contains(&label) {
            self.labels.push(label);
        }
        self
    }

    pub fn with_extra(mut self, extra: Document) -> Self {
        self.extra = Some(extra);
        self
    }

    pub fn has_label(&self, label: &str) -> bool {
        self.labels.iter().any(|l| l == label)
    }

    /// The reply document: `{ok: 0, errmsg, code, codeName, errorLabels?, ...extra}`.
    pub fn to_document(&self) -> Document {
        let mut d = doc! {
            "ok": 0.0,
            "errmsg": &self.errmsg,
            "code": self.code,
            "codeName": &self.code_name,
        };
        if !self.labels.is_empty() {
            d.insert(
                "errorLabels",
                self.labels
                    .iter()
                    .map(|l| Bson::String(l.clone()))
                    .collect::<Vec<_>>(),
            );
        }
        if let Some(extra) = &self.extra {
            for (k, v) in extra {
                d.insert(k.clone(), v.clone());
            }
        }
        d
    }

    /// Reads an error back from a reply document (`ok: 0`); `None` when the reply is `ok: 1`.
    pub fn from_reply(reply: &Document) -> Option<MongoError> {
        if reply_ok(reply) {
            return None;
        }
        let code = match reply.get("code") {
            Some(Bson::Int32(c)) => *c,
            Some(Bson::Int64(c)) => *c as i32,
            Some(Bson::Double(c)) => *c as i32,
            _ => ErrorCode::UNKNOWN_ERROR.code,
        };
        let code_name = reply
            .get_str("codeName")
            .map(str::to_string)
            .unwrap_or_else(|_| ErrorCode::named(code).name.to_string());
        let errmsg = reply.get_str("errmsg").unwrap_or("").to_string();
        let labels = match reply.get_array("errorLabels") {
            Ok(a) => a
                .iter()
                .filter_map(|l| l.as_str().map(str::to_string))
                .collect(),
            Err(_) => Vec::new(),
        };
        let mut extra = Document::new();
        for (k, v) in reply {
            if !matches!(
                k.as_str(),
                "ok" | "code"
                    | "codeName"
                    | "errmsg"
                    | "errorLabels"
                    | "$clusterTime"
                    | "operationTime"
            ) {
                extra.insert(k.clone(), v.clone());
            }
        }
        Some(MongoError {
            code,
            code_name,
            errmsg,
            labels,
            extra: (!extra.is_empty()).then_some(extra),
        })
    }
}

/// Whether a reply document says `ok: 1` (any numeric or boolean truthy value).
pub fn reply_ok(reply: &Document) -> bool {
    match reply.get("ok") {
        Some(Bson::Double(v)) => *v != 0.0,
        Some(Bson::Int32(v)) => *v != 0,
        Some(Bson::Int64(v)) => *v != 0,
        Some(Bson::Boolean(v)) => *v,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_document_round_trips_through_a_reply() {
        let e = MongoError::new(ErrorCode::CHANGE_STREAM_FATAL_ERROR, "token not found")
            .with_label("NonResumableChangeStreamError");
        let d = e.to_document();
        assert_eq!(d.get_i32("code").unwrap(), 280);
        assert_eq!(d.get_str("codeName").unwrap(), "ChangeStreamFatalError");
        assert_eq!(MongoError::from_reply(&d), Some(e));
    }

    #[test]
    fn unknown_codes_are_named_like_mongodb() {
        assert_eq!(MongoError::with_code(12345, "x").code_name, "Location12345");
        assert_eq!(MongoError::with_code(11000, "x").code_name, "DuplicateKey");
    }
}
