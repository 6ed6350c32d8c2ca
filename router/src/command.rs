//! The command registry: every command the router runs, as one value of [`Command`].
//!
//! Owns each command's names (as `listCommands` shows them, then the aliases MongoDB also
//! accepts) and whether it may run inside a multi-document transaction. The rest of what a
//! command is lives beside the code that uses it, each an exhaustive `match` on [`Command`]:
//! how it runs (`commands::dispatch`), how it parses (`commands::fields`, the top-level fields
//! it knows) and the privileges it needs (`auth::roles`). So a command added here fails to
//! compile until every one of them has classified it: none can be dispatched yet missing from
//! `listCommands`, or listed yet unclassified for authorisation.
//!
//! Invariants: pure (no I/O, no state); every name denotes one command; the names `listCommands`
//! shows are each command's listed names, in sorted order.

use wire::{ErrorCode, MongoError};

wire::command_registry! {
    AbortTransaction: "abortTransaction";
    Aggregate: "aggregate";
    BuildInfo: "buildInfo" / "buildinfo";
    CollMod: "collMod";
    CollStats: "collStats" / "collstats";
    CommitTransaction: "commitTransaction";
    ConfigureFailPoint: / "configureFailPoint";
    ConnectionStatus: "connectionStatus";
    Count: "count";
    Create: "create";
    CreateIndexes: "createIndexes";
    CreateRole: "createRole";
    CreateUser: "createUser";
    CurrentOp: "currentOp";
    DbStats: "dbStats" / "dbstats";
    Delete: "delete";
    Distinct: "distinct";
    Drop: "drop";
    DropDatabase: "dropDatabase";
    DropIndexes: "dropIndexes" / "deleteIndexes";
    DropRole: "dropRole";
    DropUser: "dropUser";
    EnableSharding: "enableSharding" / "enablesharding";
    EndSessions: "endSessions";
    Explain: "explain";
    Find: "find";
    FindAndModify: "findAndModify" / "findandmodify";
    GetClusterParameter: "getClusterParameter";
    GetCmdLineOpts: "getCmdLineOpts";
    GetLog: "getLog";
    GetMore: "getMore";
    GetParameter: "getParameter";
    GrantPrivilegesToRole: "grantPrivilegesToRole";
    GrantRolesToRole: "grantRolesToRole";
    GrantRolesToUser: "grantRolesToUser";
    Hello: "hello", "isMaster" / "ismaster";
    HostInfo: "hostInfo";
    Insert: "insert";
    KillAllSessions: "killAllSessions";
    KillCursors: "killCursors";
    KillOp: "killOp";
    KillSessions: "killSessions";
    ListCollections: "listCollections";
    ListCommands: "listCommands";
    ListDatabases: "listDatabases";
    ListIndexes: "listIndexes";
    ListShards: "listShards";
    Logout: "logout";
    Ping: "ping";
    RefreshSessions: "refreshSessions";
    RenameCollection: "renameCollection";
    RevokePrivilegesFromRole: "revokePrivilegesFromRole";
    RevokeRolesFromRole: "revokeRolesFromRole";
    RevokeRolesFromUser: "revokeRolesFromUser";
    RolesInfo: "rolesInfo";
    SaslContinue: "saslContinue";
    SaslStart: "saslStart";
    ServerStatus: "serverStatus";
    SetClusterParameter: "setClusterParameter";
    SetParameter: "setParameter";
    ShardCollection: "shardCollection" / "shardcollection";
    StartSession: "startSession";
    Update: "update";
    UpdateRole: "updateRole";
    UpdateUser: "updateUser";
    UsersInfo: "usersInfo";
    Validate: "validate";
    WhatsMyUri: "whatsmyuri";
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

    /// How it may meet a transaction.
    pub fn in_transaction(self) -> InTransaction {
        use Command::*;
        match self {
            AbortTransaction | Aggregate | CommitTransaction | Create | CreateIndexes | Delete
            | Distinct | Find | FindAndModify | GetMore | Insert | KillCursors | Update => {
                InTransaction::Statement
            }
            BuildInfo | ConnectionStatus | Hello | Logout | Ping => InTransaction::Beside,
            CollMod
            | CollStats
            | ConfigureFailPoint
            | Count
            | CreateRole
            | CreateUser
            | CurrentOp
            | DbStats
            | Drop
            | DropDatabase
            | DropIndexes
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
            | HostInfo
            | KillAllSessions
            | KillOp
            | KillSessions
            | ListCollections
            | ListCommands
            | ListDatabases
            | ListIndexes
            | ListShards
            | RefreshSessions
            | RenameCollection
            | RevokePrivilegesFromRole
            | RevokeRolesFromRole
            | RevokeRolesFromUser
            | RolesInfo
            | SaslContinue
            | SaslStart
            | ServerStatus
            | SetClusterParameter
            | SetParameter
            | ShardCollection
            | StartSession
            | UpdateRole
            | UpdateUser
            | UsersInfo
            | Validate
            | WhatsMyUri => InTransaction::Refused,
        }
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
    fn every_name_denotes_its_command() {
        for command in Command::ALL {
            for name in command.listed_names() {
                assert_eq!(Command::named(name), Some(*command), "{name}");
            }
        }
        assert_eq!(Command::named("ismaster"), Some(Command::Hello));
        assert_eq!(
            Command::named("configureFailPoint"),
            Some(Command::ConfigureFailPoint)
        );
        assert_eq!(Command::named("nosuchcommand"), None);
    }

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
