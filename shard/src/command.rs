//! The command registry: every command a shard runs, as one value of [`Command`], with its
//! names and the facts the layers before dispatch read (may it run in a multi-document
//! transaction; does it carry the router's `shardVersion`). How each runs is the exhaustive
//! `match` in `commands::execute`, so a command added here fails to compile until it runs.
//!
//! Invariants: pure; every name denotes one command.

wire::command_registry! {
    // `=> true`: it may be a statement of a multi-document transaction (MongoDB's
    // `txnCmdAllowlist`); any other is refused there with 263.
    in_transaction: bool;
    Hello: "hello", "isMaster" / "ismaster" => false;
    Ping: "ping" => false;
    BuildInfo: "buildInfo" / "buildinfo" => false;
    EndSessions: "endSessions" => false;
    KillAllSessions: "killAllSessions" => false;
    KillSessions: "killSessions" => false;
    RefreshSessions: "refreshSessions" => false;
    GetParameter: "getParameter" => false;
    SetParameter: "setParameter" => false;
    ServerStatus: "serverStatus" => false;
    Lineage: "_shardsvrLineage" => false;
    MarkLineageLost: "_shardsvrMarkLineageLost" => false;
    RetentionPins: "_shardsvrRetentionPins" => false;
    OplogBytesSince: "_shardsvrOplogBytesSince" => false;
    GetClusterParameter: "getClusterParameter" => false;
    SetClusterParameter: "_shardsvrSetClusterParameter" => false;
    CommitTransaction: "commitTransaction" => true;
    AbortTransaction: "abortTransaction" => true;
    PrepareTransaction: "prepareTransaction" => true;
    CoordinateCommitTransaction: "coordinateCommitTransaction" => true;
    ConfigureFailPoint: "configureFailPoint" => false;
    Insert: "insert" => true;
    Update: "update" => true;
    Delete: "delete" => true;
    ReserveInsert: "_shardsvrReserveInsert" => false;
    CommitReservation: "_shardsvrCommitReservation" => false;
    FindAndModify: "findAndModify" / "findandmodify" => true;
    Find: "find" => true;
    GetMore: "getMore" => true;
    KillCursors: "killCursors" => true;
    KillOperations: "_killOperations" => false;
    NudgeChangeStream: "_tributaryNudgeChangeStream" => false;
    Explain: "explain" => false;
    Count: "count" => false;
    Distinct: "distinct" => true;
    Aggregate: "aggregate" => true;
    Create: "create" => true;
    Drop: "drop" => false;
    DropDatabase: "dropDatabase" => false;
    RenameCollection: "renameCollection" => false;
    ListCollections: "listCollections" => false;
    ListDatabases: "listDatabases" => false;
    CollStats: "collStats" => false;
    Validate: "validate" => false;
    DbStats: "dbStats" => false;
    CreateIndexes: "createIndexes" => true;
    DropIndexes: "dropIndexes" / "deleteIndexes" => false;
    ListIndexes: "listIndexes" => false;
    CollMod: "collMod" => false;
    ShardCollection: "_shardsvrShardCollection" => false;
}

impl Command {
    /// Whether the router sends it with the collection's `shardVersion`, which the shard
    /// checks before it runs (`commands::routing`).
    pub fn checks_shard_version(self) -> bool {
        use Command::*;
        match self {
            Insert | ReserveInsert | Update | Delete | FindAndModify | Find | Count | Distinct
            | Aggregate => true,
            Hello
            | Ping
            | BuildInfo
            | EndSessions
            | KillAllSessions
            | KillSessions
            | RefreshSessions
            | GetParameter
            | SetParameter
            | ServerStatus
            | Lineage
            | RetentionPins
            | OplogBytesSince
            | MarkLineageLost
            | GetClusterParameter
            | SetClusterParameter
            | CommitTransaction
            | AbortTransaction
            | PrepareTransaction
            | CoordinateCommitTransaction
            | ConfigureFailPoint
            | CommitReservation
            | GetMore
            | KillCursors
            | KillOperations
            | NudgeChangeStream
            | Explain
            | Create
            | Drop
            | DropDatabase
            | RenameCollection
            | ListCollections
            | ListDatabases
            | CollStats
            | Validate
            | DbStats
            | CreateIndexes
            | DropIndexes
            | ListIndexes
            | CollMod
            | ShardCollection => false,
        }
    }

    /// Whether a replica-set member that does not lead runs it (on its read-only follower),
    /// as MongoDB's secondaries do.
    pub fn on_secondary(self) -> OnSecondary {
        use Command::*;
        match self {
            // Facts about the server, and what belongs to a cursor or an operation already
            // running there.
            Hello | Ping | BuildInfo | EndSessions | GetParameter | ServerStatus | Lineage
            | GetClusterParameter | GetMore | KillCursors | KillOperations | NudgeChangeStream => {
                OnSecondary::Always
            }
            // Reads: only for a client that accepts a secondary's answer.
            Find | Count | Distinct | Aggregate | Explain | ListCollections | ListDatabases
            | CollStats | Validate | DbStats | ListIndexes => OnSecondary::SecondaryOk,
            // Writes, transactions and whatever changes this server's state: the primary's.
            Insert
            | ReserveInsert
            | Update
            | Delete
            | FindAndModify
            | KillAllSessions
            | KillSessions
            | RefreshSessions
            | SetParameter
            | MarkLineageLost
            | RetentionPins
            | OplogBytesSince
            | SetClusterParameter
            | CommitTransaction
            | AbortTransaction
            | PrepareTransaction
            | CoordinateCommitTransaction
            | ConfigureFailPoint
            | CommitReservation
            | Create
            | Drop
            | DropDatabase
            | RenameCollection
            | CreateIndexes
            | DropIndexes
            | CollMod
            | ShardCollection => OnSecondary::Never,
        }
    }
}

/// Where a command may run in a replica set ([`Command::on_secondary`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnSecondary {
    /// On any member.
    Always,
    /// On a secondary when the client allows it (`$readPreference` other than `primary`).
    SecondaryOk,
    /// Only on the primary (10107 elsewhere).
    Never,
}
