//! Authorization: what each command needs, and which of MongoDB's built-in roles grant it.
//!
//! Owns: the command → privilege table and the role → privilege table, in MongoDB's terms
//! (`read`, `readWrite`, `dbAdmin`, `userAdmin`, `dbOwner` on a database; `clusterMonitor`,
//! `clusterAdmin`, `readAnyDatabase`, `readWriteAnyDatabase`, `dbAdminAnyDatabase`,
//! `userAdminAnyDatabase`, `root` on `admin`).
//!
//! Invariants: pure; a command not in the table needs `root` (a command added later is refused
//! until it is classified, never allowed by accident); watching a collection or a database
//! needs `read` there (`find` + `changeStream`), watching the whole cluster a role that reads
//! every database.

use bson::{Bson, Document};

/// What a command needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// Any authenticated user (handshake, session and cursor bookkeeping, own status).
    Nothing,
    Read(String),
    Write(String),
    DbAdmin(String),
    UserAdmin(String),
    /// Reading every database (a cluster-wide change stream).
    ReadAll,
    ClusterMonitor,
    ClusterAdmin,
    /// Only `root`.
    Root,
}

/// What `name` on database `db` needs.
pub fn need(name: &str, db: &str, cmd: &Document) -> Need {
    let on = |f: fn(String) -> Need| f(db.to_string());
    match name {
        "hello" | "isMaster" | "ismaster" | "saslStart" | "saslContinue" | "ping" | "buildInfo"
        | "buildinfo" | "getnonce" | "endSessions" | "logout" | "connectionStatus"
        | "whatsmyuri" | "listCommands" | "startSession" | "refreshSessions" | "killSessions"
        | "commitTransaction" | "abortTransaction" | "getMore" | "killCursors"
        | "listDatabases" => Need::Nothing,
        "find" | "count" | "distinct" | "listCollections" | "listIndexes" | "collStats"
        | "collstats" | "dbStats" | "dbstats" => on(Need::Read),
        "aggregate" => aggregate_need(db, cmd),
        "insert" | "update" | "delete" | "findAndModify" | "findandmodify" | "create" | "drop"
        | "createIndexes" | "dropIndexes" | "deleteIndexes" => on(Need::Write),
        "renameCollection" => {
            // Run on admin, naming its source: it writes there (and at the target).
            let source = cmd
                .get_str("renameCollection")
                .ok()
                .and_then(|ns| ns.split_once('.'))
                .map_or(db, |(d, _)| d);
            Need::Write(source.to_string())
        }
        "collMod" | "dropDatabase" => on(Need::DbAdmin),
        "createUser"
        | "updateUser"
        | "dropUser"
        | "usersInfo"
        | "grantRolesToUser"
        | "revokeRolesFromUser" => on(Need::UserAdmin),
        "serverStatus"
        | "currentOp"
        | "listShards"
        | "getCmdLineOpts"
        | "getLog"
        | "hostInfo"
        | "getParameter"
        | "getClusterParameter" => Need::ClusterMonitor,
        "shardCollection"
        | "shardcollection"
        | "enableSharding"
        | "enablesharding"
        | "setClusterParameter"
        | "killOp" => Need::ClusterAdmin,
        _ => Need::Root,
    }
}

fn aggregate_need(db: &str, cmd: &Document) -> Need {
    let stages: Vec<&Document> = cmd
        .get_array("pipeline")
        .map(|p| p.iter().filter_map(Bson::as_document).collect())
        .unwrap_or_default();
    let first = stages.first();
    if let Some(cs) = first.and_then(|s| s.get_document("$changeStream").ok()) {
        if cs.get_bool("allChangesForCluster").unwrap_or(false) {
            return Need::ReadAll;
        }
        return Need::Read(db.to_string());
    }
    if first.is_some_and(|s| s.contains_key("$currentOp")) {
        return Need::ClusterMonitor;
    }
    if stages
        .iter()
        .any(|s| s.contains_key("$out") || s.contains_key("$merge"))
    {
        return Need::Write(db.to_string());
    }
    Need::Read(db.to_string())
}

/// Whether `roles` (`(role, db)` pairs) grant `need`.
pub fn allows(roles: &[(String, String)], need: &Need) -> bool {
    let has = |role: &str, on: &str| roles.iter().any(|(r, d)| r == role && d == on);
    let any = |role: &str| has(role, "admin");
    if any("root") {
        return true;
    }
    match need {
        Need::Nothing => true,
        Need::Read(db) => {
            ["read", "readWrite", "dbOwner"].iter().any(|r| has(r, db))
                || any("readAnyDatabase")
                || any("readWriteAnyDatabase")
        }
        Need::Write(db) => {
            ["readWrite", "dbOwner"].iter().any(|r| has(r, db)) || any("readWriteAnyDatabase")
        }
        Need::DbAdmin(db) => {
            ["dbAdmin", "dbOwner"].iter().any(|r| has(r, db)) || any("dbAdminAnyDatabase")
        }
        Need::UserAdmin(db) => {
            ["userAdmin", "dbOwner"].iter().any(|r| has(r, db)) || any("userAdminAnyDatabase")
        }
        Need::ReadAll => any("readAnyDatabase") || any("readWriteAnyDatabase"),
        Need::ClusterMonitor => any("clusterMonitor") || any("clusterAdmin"),
        Need::ClusterAdmin => any("clusterAdmin"),
        Need::Root => false,
    }
}

#[cfg(test)]
mod tests {
    use bson::doc;

    use super::*;

    fn roles(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(r, d)| (r.to_string(), d.to_string()))
            .collect()
    }

    fn may(list: &[(&str, &str)], name: &str, db: &str, cmd: Document) -> bool {
        allows(&roles(list), &need(name, db, &cmd))
    }

    #[test]
    fn database_roles_stay_on_their_database() {
        let reader = [("read", "app")];
        assert!(may(&reader, "find", "app", doc! {}));
        assert!(!may(&reader, "find", "other", doc! {}));
        assert!(!may(&reader, "insert", "app", doc! {}));
        let writer = [("readWrite", "app")];
        assert!(may(&writer, "insert", "app", doc! {}));
        assert!(may(&writer, "createIndexes", "app", doc! {}));
        assert!(!may(&writer, "collMod", "app", doc! {}));
        assert!(!may(&writer, "createUser", "app", doc! {}));
        let admin = [("dbAdmin", "app")];
        assert!(may(&admin, "collMod", "app", doc! {}));
        assert!(
            !may(&admin, "find", "app", doc! {}),
            "dbAdmin reads no documents"
        );
        let owner = [("dbOwner", "app")];
        for name in ["find", "insert", "collMod", "createUser", "dropDatabase"] {
            assert!(may(&owner, name, "app", doc! {}), "{name}");
        }
    }

    #[test]
    fn watching_needs_read_where_the_stream_looks() {
        let watch = doc! {"aggregate": "c", "pipeline": [{"$changeStream": {}}]};
        let cluster =
            doc! {"aggregate": 1, "pipeline": [{"$changeStream": {"allChangesForCluster": true}}]};
        assert!(may(&[("read", "app")], "aggregate", "app", watch.clone()));
        assert!(!may(
            &[("read", "app")],
            "aggregate",
            "other",
            watch.clone()
        ));
        assert!(!may(
            &[("readWrite", "app")],
            "aggregate",
            "admin",
            cluster.clone()
        ));
        assert!(may(
            &[("readAnyDatabase", "admin")],
            "aggregate",
            "admin",
            cluster.clone()
        ));
        assert!(may(&[("root", "admin")], "aggregate", "admin", cluster));
        let out = doc! {"aggregate": "c", "pipeline": [{"$match": {}}, {"$out": "x"}]};
        assert!(!may(&[("read", "app")], "aggregate", "app", out));
    }

    #[test]
    fn cluster_roles_and_the_unknown() {
        assert!(may(
            &[("clusterMonitor", "admin")],
            "serverStatus",
            "admin",
            doc! {}
        ));
        assert!(
            !may(
                &[("clusterMonitor", "app")],
                "serverStatus",
                "admin",
                doc! {}
            ),
            "only on admin"
        );
        assert!(!may(
            &[("readWriteAnyDatabase", "admin")],
            "serverStatus",
            "admin",
            doc! {}
        ));
        assert!(may(
            &[("clusterAdmin", "admin")],
            "shardCollection",
            "admin",
            doc! {}
        ));
        assert!(!may(
            &[("clusterMonitor", "admin")],
            "shardCollection",
            "admin",
            doc! {}
        ));
        assert!(!may(
            &[("readWriteAnyDatabase", "admin")],
            "someNewCommand",
            "app",
            doc! {}
        ));
        assert!(may(&[("root", "admin")], "someNewCommand", "app", doc! {}));
        assert!(may(&[], "connectionStatus", "admin", doc! {}));
    }
}
