//! The command registry: every command the router runs, as one value of [`Command`].
//!
//! Owns each command's names (as `listCommands` shows them, then the aliases MongoDB also
//! accepts) and whether it may run inside a multi-document transaction. The rest of what a
//! command is lives beside the code that uses it, each an exhaustive `match` on [`Command`]:
//! how it runs (`commands::run_command`), how it parses (`commands::fields`, the top-level fields
//! it knows) and the privileges it needs (`auth::roles`). So a command added here fails to
//! compile until every one of them has classified it: none can be dispatched yet missing from
//! `listCommands`, or listed yet unclassified for authorisation.
//!
//! Invariants: pure (no I/O, no state); every name denotes one command; the names `listCommands`
//! shows are each command's listed names, in sorted order.

use wire::{ErrorCode, MongoError};

wire::command_registry! {
    in_transaction: InTransaction;
    AbortTransaction: "abortTransaction" => InTransaction::Statement;
    AckSubscription: "ackSubscription" => InTransaction::Refused;
    Aggregate: "aggregate" => InTransaction::Statement;
    AlterSubscription: "alterSubscription" => InTransaction::Refused;
    BuildInfo: "buildInfo" / "buildinfo" => InTransaction::Beside;
    ChangeStreamBounds: "changeStreamBounds" => InTransaction::Refused;
    CollMod: "collMod" => InTransaction::Refused;
    CollStats: "collStats" / "collstats" => InTransaction::Refused;
    CommitTransaction: "commitTransaction" => InTransaction::Statement;
    ConfigureFailPoint: / "configureFailPoint" => InTransaction::Refused;
    ConnectionStatus: "connectionStatus" => InTransaction::Beside;
    Count: "count" => InTransaction::Refused;
    Create: "create" => InTransaction::Statement;
    CreateHttpToken: "createHttpToken" => InTransaction::Refused;
    CreateIndexes: "createIndexes" => InTransaction::Statement;
    CreateRole: "createRole" => InTransaction::Refused;
    CreateSubscription: "createSubscription" => InTransaction::Refused;
    CreateUser: "createUser" => InTransaction::Refused;
    CurrentOp: "currentOp" => InTransaction::Refused;
    DbStats: "dbStats" / "dbstats" => InTransaction::Refused;
    Delete: "delete" => InTransaction::Statement;
    Distinct: "distinct" => InTransaction::Statement;
    Drop: "drop" => InTransaction::Refused;
    DropDatabase: "dropDatabase" => InTransaction::Refused;
    DropIndexes: "dropIndexes" / "deleteIndexes" => InTransaction::Refused;
    DropRole: "dropRole" => InTransaction::Refused;
    DropSubscription: "dropSubscription" => InTransaction::Refused;
    DropUser: "dropUser" => InTransaction::Refused;
    EnableSharding: "enableSharding" / "enablesharding" => InTransaction::Refused;
    EndSessions: "endSessions" => InTransaction::Refused;
    Explain: "explain" => InTransaction::Refused;
    Find: "find" => InTransaction::Statement;
    FindAndModify: "findAndModify" / "findandmodify" => InTransaction::Statement;
    GetClusterParameter: "getClusterParameter" => InTransaction::Refused;
    GetCmdLineOpts: "getCmdLineOpts" => InTransaction::Refused;
    GetLog: "getLog" => InTransaction::Refused;
    GetMore: "getMore" => InTransaction::Statement;
    GetParameter: "getParameter" => InTransaction::Refused;
    GrantPrivilegesToRole: "grantPrivilegesToRole" => InTransaction::Refused;
    GrantRolesToRole: "grantRolesToRole" => InTransaction::Refused;
    GrantRolesToUser: "grantRolesToUser" => InTransaction::Refused;
    Hello: "hello", "isMaster" / "ismaster" => InTransaction::Beside;
    HostInfo: "hostInfo" => InTransaction::Refused;
    Insert: "insert" => InTransaction::Statement;
    KillAllSessions: "killAllSessions" => InTransaction::Refused;
    KillCursors: "killCursors" => InTransaction::Statement;
    KillOp: "killOp" => InTransaction::Refused;
    KillSessions: "killSessions" => InTransaction::Refused;
    ListCollections: "listCollections" => InTransaction::Refused;
    ListCommands: "listCommands" => InTransaction::Refused;
    ListDatabases: "listDatabases" => InTransaction::Refused;
    ListIndexes: "listIndexes" => InTransaction::Refused;
    ListShards: "listShards" => InTransaction::Refused;
    ListSubscriptions: "listSubscriptions" => InTransaction::Refused;
    Logout: "logout" => InTransaction::Beside;
    NackSubscription: "nackSubscription" => InTransaction::Refused;
    Ping: "ping" => InTransaction::Beside;
    ReadSubscription: "readSubscription" => InTransaction::Refused;
    RefreshSessions: "refreshSessions" => InTransaction::Refused;
    RenameCollection: "renameCollection" => InTransaction::Refused;
    RevokePrivilegesFromRole: "revokePrivilegesFromRole" => InTransaction::Refused;
    RevokeRolesFromRole: "revokeRolesFromRole" => InTransaction::Refused;
    RevokeRolesFromUser: "revokeRolesFromUser" => InTransaction::Refused;
    RolesInfo: "rolesInfo" => InTransaction::Refused;
    SaslContinue: "saslContinue" => InTransaction::Refused;
    SaslStart: "saslStart" => InTransaction::Refused;
    ServerStatus: "serverStatus" => InTransaction::Refused;
    SetClusterParameter: "setClusterParameter" => InTransaction::Refused;
    SetParameter: "setParameter" => InTransaction::Refused;
    ShardCollection: "shardCollection" / "shardcollection" => InTransaction::Refused;
    SnapshotCursor: "snapshotCursor" => InTransaction::Refused;
    StartSession: "startSession" => InTransaction::Refused;
    TributaryStatus: "tributaryStatus" => InTransaction::Refused;
    Update: "update" => InTransaction::Statement;
    UpdateRole: "updateRole" => InTransaction::Refused;
    UpdateUser: "updateUser" => InTransaction::Refused;
    UsersInfo: "usersInfo" => InTransaction::Refused;
    Validate: "validate" => InTransaction::Refused;
    WhatsMyUri: "whatsmyuri" => InTransaction::Refused;
}

/// How a command may meet a multi-document transaction (a command with `autocommit: false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InTransaction {
    /// It is one of the transaction's statements (MongoDB's `txnCmdAllowlist`).
    Statement,
    /// It runs, outside the transaction: the handshake and connection commands MongoDB allows
    /// there (`txnAdminCommands`).
    Beside,
    /// It is refused with 263 `OperationNotSupportedInTransaction`.
    Refused,
}

impl Command {
    /// Whether the router runs it only with `--enableTestCommands`.
    pub fn test_only(self) -> bool {
        matches!(self, Command::ConfigureFailPoint)
    }

    /// The handshake: answered without waiting for the config shard, never listed by
    /// `currentOp`.
    pub fn is_handshake(self) -> bool {
        matches!(self, Command::Hello)
    }

    /// Every name `listCommands` shows, sorted.
    pub fn listed() -> Vec<&'static str> {
        let mut names: Vec<_> = Command::ALL
            .iter()
            .flat_map(|c| c.listed_names().iter().copied())
            .collect();
        names.sort_unstable();
        names
    }

    /// 263 when the command may not run in a transaction, as MongoDB words it.
    pub fn check_transaction(self, name: &str) -> Result<(), MongoError> {
        match self.in_transaction() {
            InTransaction::Refused => Err(MongoError::new(
                ErrorCode::OPERATION_NOT_SUPPORTED_IN_TRANSACTION,
                format!("Cannot run '{name}' in a multi-document transaction."),
            )),
            InTransaction::Statement | InTransaction::Beside => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_commands_shows_each_listed_name_once_and_no_test_command() {
        let listed = Command::listed();
        let mut unique = listed.clone();
        unique.dedup();
        assert_eq!(unique, listed);
        assert!(!listed.contains(&"configureFailPoint"));
        assert!(listed.contains(&"isMaster") && listed.contains(&"hello"));
        assert!(!listed.contains(&"ismaster"));
    }

    #[test]
    fn the_transaction_rule_is_mongodbs() {
        assert_eq!(Command::Insert.in_transaction(), InTransaction::Statement);
        assert_eq!(Command::Ping.in_transaction(), InTransaction::Beside);
        let refused = Command::Count.check_transaction("count").unwrap_err();
        assert_eq!(refused.code, 263);
    }
}
