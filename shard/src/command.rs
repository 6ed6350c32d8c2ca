//! The command registry: every command a shard runs, as one value of [`Command`], with its
//! names and the facts the layers before dispatch read (may it run in a multi-document
//! transaction; does it carry the router's `shardVersion`). How each runs is the exhaustive
//! `match` in `commands::dispatch`, so a command added here fails to compile until it runs.
//!
//! Invariants: pure; every name denotes one command.

wire::command_registry! {
    Hello: "hello", "isMaster" / "ismaster";
    Ping: "ping";
    BuildInfo: "buildInfo" / "buildinfo";
    EndSessions: "endSessions";
    KillAllSessions: "killAllSessions";
    KillSessions: "killSessions";
    RefreshSessions: "refreshSessions";
    GetParameter: "getParameter";
    SetParameter: "setParameter";
    ServerStatus: "serverStatus";
    Lineage: "_shardsvrLineage";
    MarkLineageLost: "_shardsvrMarkLineageLost";
    GetClusterParameter: "getClusterParameter";
    SetClusterParameter: "_shardsvrSetClusterParameter";
    CommitTransaction: "commitTransaction";
    AbortTransaction: "abortTransaction";
    PrepareTransaction: "prepareTransaction";
    CoordinateCommitTransaction: "coordinateCommitTransaction";
    ConfigureFailPoint: "configureFailPoint";
    Insert: "insert";
    Update: "update";
    Delete: "delete";
    ReserveInsert: "_shardsvrReserveInsert";
    CommitReservation: "_shardsvrCommitReservation";
    FindAndModify: "findAndModify" / "findandmodify";
    Find: "find";
    GetMore: "getMore";
    KillCursors: "killCursors";
    KillOperations: "_killOperations";
    NudgeChangeStream: "_tributaryNudgeChangeStream";
    Explain: "explain";
    Count: "count";
    Distinct: "distinct";
    Aggregate: "aggregate";
    Create: "create";
    Drop: "drop";
    DropDatabase: "dropDatabase";
    RenameCollection: "renameCollection";
    ListCollections: "listCollections";
    ListDatabases: "listDatabases";
    CollStats: "collStats";
    Validate: "validate";
    DbStats: "dbStats";
    CreateIndexes: "createIndexes";
    DropIndexes: "dropIndexes" / "deleteIndexes";
    ListIndexes: "listIndexes";
    CollMod: "collMod";
    ShardCollection: "_shardsvrShardCollection";
}

impl Command {
    /// Whether it may be a statement of a multi-document transaction (MongoDB's
    /// `txnCmdAllowlist`); any other is refused there with 263.
    pub fn in_transaction(self) -> bool {
        use Command::*;
        match self {
            Insert
            | Update
            | Delete
            | FindAndModify
            | Find
            | GetMore
            | Distinct
            | Aggregate
            | KillCursors
            | CommitTransaction
            | AbortTransaction
            | PrepareTransaction
            | CoordinateCommitTransaction
            | Create
            | CreateIndexes => true,
            Hello | Ping | BuildInfo | EndSessions | KillAllSessions | KillSessions
            | RefreshSessions | GetParameter | SetParameter | ServerStatus | Lineage
            | MarkLineageLost | GetClusterParameter | SetClusterParameter | ConfigureFailPoint
            | ReserveInsert | CommitReservation | KillOperations | NudgeChangeStream | Explain
            | Count | Drop | DropDatabase | RenameCollection | ListCollections | ListDatabases
            | CollStats | Validate | DbStats | DropIndexes | ListIndexes | CollMod
            | ShardCollection => false,
        }
    }

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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_denotes_its_command() {
        for command in Command::ALL {
            for name in command.listed_names() {
                assert_eq!(Command::named(name), Some(*command), "{name}");
            }
        }
        assert_eq!(
            Command::named("findandmodify"),
            Some(Command::FindAndModify)
        );
        assert_eq!(Command::named("nosuchcommand"), None);
    }
}
