//! What the built-in roles grant, as privileges: the lists `connectionStatus` shows with
//! `showPrivileges` (and `rolesInfo` would), after MongoDB 7.0's built-in role definitions.
//! Enforcement does not read these lists (`roles::allows` decides for built-in roles); they
//! say the same thing action by action, for clients that inspect them.
//!
//! Left out: grants on time-series buckets (`any_system_buckets`: Tributary has none) and on
//! replica-set collections of `local` that Tributary does not keep.
//!
//! Invariants: the table is static and acyclic (a role's sub-roles are listed above it), so
//! resolving a role is bounded; each resource appears once in a resolved list, with its
//! actions sorted and unique.

use std::collections::BTreeMap;

use super::roles::{Privilege, Resource};

const READ: &[&str] = &[
    "changeStream",
    "collStats",
    "dbHash",
    "dbStats",
    "find",
    "killCursors",
    "listCollections",
    "listIndexes",
    "listSearchIndexes",
    "planCacheRead",
];

const WRITE: &[&str] = &[
    "convertToCapped",
    "createCollection",
    "createIndex",
    "createSearchIndexes",
    "dropCollection",
    "dropIndex",
    "dropSearchIndex",
    "insert",
    "remove",
    "renameCollectionSameDB",
    "update",
    "updateSearchIndex",
];

const USER_ADMIN: &[&str] = &[
    "changeCustomData",
    "changePassword",
    "createRole",
    "createUser",
    "dropRole",
    "dropUser",
    "grantRole",
    "revokeRole",
    "setAuthenticationRestriction",
    "viewRole",
    "viewUser",
];

const DB_ADMIN: &[&str] = &[
    "analyze",
    "bypassDocumentValidation",
    "collMod",
    "collStats",
    "compact",
    "configureQueryAnalyzer",
    "convertToCapped",
    "createCollection",
    "createIndex",
    "createSearchIndexes",
    "dbStats",
    "dropCollection",
    "dropDatabase",
    "dropIndex",
    "dropSearchIndex",
    "enableProfiler",
    "listCollections",
    "listIndexes",
    "listSearchIndexes",
    "planCacheIndexFilter",
    "planCacheRead",
    "planCacheWrite",
    "reIndex",
    "renameCollectionSameDB",
    "storageDetails",
    "updateSearchIndex",
    "validate",
];

const MONITOR_CLUSTER: &[&str] = &[
    "connPoolStats",
    "getCmdLineOpts",
    "getDefaultRWConcern",
    "getLog",
    "getParameter",
    "getShardMap",
    "hostInfo",
    "inprog",
    "listDatabases",
    "listSessions",
    "listShards",
    "netstat",
    "replSetGetConfig",
    "replSetGetStatus",
    "serverStatus",
    "shardingState",
    "top",
    "useUUID",
];

const MONITOR_DB: &[&str] = &[
    "collStats",
    "dbStats",
    "getDatabaseVersion",
    "getShardVersion",
    "indexStats",
];

const HOST_CLUSTER: &[&str] = &[
    "applicationMessage",
    "connPoolSync",
    "dropConnections",
    "flushRouterConfig",
    "fsync",
    "invalidateUserCache",
    "killAnyCursor",
    "killAnySession",
    "killop",
    "logRotate",
    "setParameter",
    "shutdown",
    "touch",
    "unlock",
];

const MANAGER_CLUSTER: &[&str] = &[
    "addShard",
    "appendOplogNote",
    "applicationMessage",
    "cleanupOrphaned",
    "flushRouterConfig",
    "getClusterParameter",
    "getDefaultRWConcern",
    "listSessions",
    "listShards",
    "removeShard",
    "setClusterParameter",
    "setDefaultRWConcern",
    "setFeatureCompatibilityVersion",
];

const MANAGER_DB: &[&str] = &[
    "analyzeShardKey",
    "enableSharding",
    "moveChunk",
    "refineCollectionShardKey",
    "reshardCollection",
    "splitChunk",
    "splitVector",
];

/// Where a grant applies.
#[derive(Clone, Copy)]
enum On {
    /// The role's own database, every collection.
    Db,
    /// One collection of the role's own database.
    Collection(&'static str),
    /// A named database.
    Named(&'static str),
    /// Every database (the normal namespaces).
    AnyDb,
    /// A collection of that name in every database.
    AnyCollection(&'static str),
    Cluster,
    Any,
}

type Grant = (On, &'static [&'static [&'static str]]);

/// A built-in role: its sub-roles (`(role, db)`, `None` for the role's own database) and
/// grants.
struct Role {
    name: &'static str,
    roles: &'static [(&'static str, Option<&'static str>)],
    grants: &'static [Grant],
}

const ROLES: &[Role] = &[
    Role {
        name: "read",
        roles: &[],
        grants: &[(On::Db, &[READ]), (On::Collection("system.js"), &[READ])],
    },
    Role {
        name: "readWrite",
        roles: &[],
        grants: &[
            (On::Db, &[READ, WRITE]),
            (On::Collection("system.js"), &[READ, WRITE]),
        ],
    },
    Role {
        name: "userAdmin",
        roles: &[],
        grants: &[(On::Db, &[USER_ADMIN])],
    },
    Role {
        name: "dbAdmin",
        roles: &[],
        grants: &[
            (On::Db, &[DB_ADMIN]),
            (
                On::Collection("system.profile"),
                &[
                    READ,
                    &["convertToCapped", "createCollection", "dropCollection"],
                ],
            ),
        ],
    },
    Role {
        name: "dbOwner",
        roles: &[("readWrite", None), ("dbAdmin", None), ("userAdmin", None)],
        grants: &[],
    },
    Role {
        name: "readAnyDatabase",
        roles: &[],
        grants: &[
            (On::AnyDb, &[READ]),
            (On::Cluster, &[&["listDatabases"]]),
            (On::AnyCollection("system.js"), &[READ]),
        ],
    },
    Role {
        name: "readWriteAnyDatabase",
        roles: &[("readAnyDatabase", None)],
        grants: &[
            (On::AnyDb, &[READ, WRITE]),
            (On::AnyCollection("system.js"), &[READ, WRITE]),
        ],
    },
    Role {
        name: "userAdminAnyDatabase",
        roles: &[],
        grants: &[
            (On::AnyDb, &[USER_ADMIN, &["listCachedAndActiveUsers"]]),
            (On::Named("local"), &[USER_ADMIN]),
            (On::Named("config"), &[USER_ADMIN]),
            (
                On::Cluster,
                &[&[
                    "authSchemaUpgrade",
                    "invalidateUserCache",
                    "listDatabases",
                    "viewUser",
                ]],
            ),
            (On::AnyCollection("system.users"), &[READ]),
        ],
    },
    Role {
        name: "dbAdminAnyDatabase",
        roles: &[],
        grants: &[
            (On::Cluster, &[&["applyOps", "listDatabases"]]),
            (On::AnyDb, &[DB_ADMIN]),
            (
                On::AnyCollection("system.profile"),
                &[
                    READ,
                    &["convertToCapped", "createCollection", "dropCollection"],
                ],
            ),
        ],
    },
    Role {
        name: "clusterMonitor",
        roles: &[("read", Some("config")), ("read", Some("local"))],
        grants: &[
            (On::Cluster, &[MONITOR_CLUSTER]),
            (On::AnyDb, &[MONITOR_DB]),
            (On::Named("config"), &[MONITOR_DB]),
            (On::Named("local"), &[MONITOR_DB]),
            (On::AnyCollection("system.profile"), &[&["find"]]),
        ],
    },
    Role {
        name: "hostManager",
        roles: &[],
        grants: &[
            (On::Cluster, &[HOST_CLUSTER]),
            (On::AnyDb, &[&["killCursors"]]),
        ],
    },
    Role {
        name: "clusterManager",
        roles: &[("read", Some("config"))],
        grants: &[
            (On::Cluster, &[MANAGER_CLUSTER]),
            (On::AnyDb, &[MANAGER_DB]),
            (
                On::Named("config"),
                &[MANAGER_DB, &["insert", "remove", "update"]],
            ),
            (
                On::Named("local"),
                &[MANAGER_DB, &["insert", "remove", "update"]],
            ),
        ],
    },
    Role {
        name: "clusterAdmin",
        roles: &[
            ("clusterMonitor", None),
            ("hostManager", None),
            ("clusterManager", None),
        ],
        grants: &[(On::AnyDb, &[&["dropDatabase"]])],
    },
    Role {
        name: "root",
        roles: &[
            ("clusterAdmin", None),
            ("userAdminAnyDatabase", None),
            ("dbAdminAnyDatabase", None),
            ("readWriteAnyDatabase", None),
        ],
        grants: &[(On::Any, &[&["validate"]])],
    },
];

/// What built-in role `role` on `db` grants, its sub-roles' grants included, merged by
/// resource (empty for a name that is not a built-in role).
pub fn privileges(role: &str, db: &str) -> Vec<Privilege> {
    let mut by_resource = BTreeMap::new();
    add(role, db, true, &mut by_resource);
    merged(by_resource)
}

/// What built-in role `role` on `db` grants itself, without its sub-roles'.
pub fn own_privileges(role: &str, db: &str) -> Vec<Privilege> {
    let mut by_resource = BTreeMap::new();
    add(role, db, false, &mut by_resource);
    merged(by_resource)
}

/// The roles built-in role `role` on `db` names (`directly`), or every role it inherits.
pub fn sub_roles(role: &str, db: &str, directly: bool) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut stack = vec![(role.to_string(), db.to_string())];
    while let Some((role, db)) = stack.pop() {
        let Some(r) = ROLES.iter().find(|r| r.name == role) else {
            continue;
        };
        for (sub, sub_db) in r.roles {
            let pair = (sub.to_string(), sub_db.unwrap_or(&db).to_string());
            if !out.contains(&pair) {
                out.push(pair.clone());
                if !directly {
                    stack.push(pair);
                }
            }
        }
    }
    out
}

/// Privileges gathered by resource, as a list.
pub fn merged(by_resource: BTreeMap<ResourceKey, Vec<String>>) -> Vec<Privilege> {
    by_resource
        .into_iter()
        .map(|(key, mut actions)| {
            actions.sort_unstable();
            actions.dedup();
            Privilege {
                resource: key.resource(),
                actions,
            }
        })
        .collect()
}

/// A resource as a map key: `(kind, db, collection)`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ResourceKey(u8, String, String);

impl ResourceKey {
    pub fn of(resource: &Resource) -> ResourceKey {
        match resource {
            Resource::Namespace { db, collection } => {
                ResourceKey(0, db.clone(), collection.clone())
            }
            Resource::Cluster => ResourceKey(1, String::new(), String::new()),
            Resource::Any => ResourceKey(2, String::new(), String::new()),
        }
    }

    fn resource(self) -> Resource {
        match self.0 {
            0 => Resource::Namespace {
                db: self.1,
                collection: self.2,
            },
            1 => Resource::Cluster,
            _ => Resource::Any,
        }
    }
}

fn add(role: &str, db: &str, with_sub_roles: bool, out: &mut BTreeMap<ResourceKey, Vec<String>>) {
    let Some(r) = ROLES.iter().find(|r| r.name == role) else {
        return;
    };
    if with_sub_roles {
        for (sub, sub_db) in r.roles {
            add(sub, sub_db.unwrap_or(db), true, out);
        }
    }
    for (on, lists) in r.grants {
        let resource = match *on {
            On::Db => namespace(db, ""),
            On::Collection(c) => namespace(db, c),
            On::Named(d) => namespace(d, ""),
            On::AnyDb => namespace("", ""),
            On::AnyCollection(c) => namespace("", c),
            On::Cluster => Resource::Cluster,
            On::Any => Resource::Any,
        };
        out.entry(ResourceKey::of(&resource))
            .or_default()
            .extend(lists.iter().flat_map(|l| l.iter().map(|a| a.to_string())));
    }
}

fn namespace(db: &str, collection: &str) -> Resource {
    Resource::Namespace {
        db: db.to_string(),
        collection: collection.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on<'a>(privileges: &'a [Privilege], resource: &Resource) -> &'a [String] {
        privileges
            .iter()
            .find(|p| &p.resource == resource)
            .map_or(&[], |p| &p.actions)
    }

    #[test]
    fn every_built_in_role_has_privileges() {
        for role in super::super::BUILT_IN_ROLES {
            assert!(!privileges(role, "admin").is_empty(), "{role}");
        }
        assert!(privileges("noSuchRole", "app").is_empty());
    }

    #[test]
    fn read_and_read_write_grant_their_actions_on_their_database() {
        let read = privileges("read", "app");
        let db = namespace("app", "");
        assert!(on(&read, &db).iter().any(|a| a == "find"));
        assert!(!on(&read, &db).iter().any(|a| a == "insert"));
        let rw = privileges("readWrite", "app");
        assert!(on(&rw, &db).iter().any(|a| a == "insert"));
        assert!(
            on(&rw, &db).windows(2).all(|w| w[0] < w[1]),
            "sorted, unique"
        );
    }

    #[test]
    fn roles_include_their_sub_roles() {
        let owner = privileges("dbOwner", "app");
        let db = on(&owner, &namespace("app", ""));
        for action in ["find", "insert", "collMod", "createUser"] {
            assert!(db.iter().any(|a| a == action), "{action}");
        }
        let monitor = privileges("clusterMonitor", "admin");
        assert!(
            on(&monitor, &namespace("config", ""))
                .iter()
                .any(|a| a == "find")
        );
        assert!(own_privileges("dbOwner", "app").is_empty());
        assert_eq!(
            sub_roles("clusterAdmin", "admin", true).len(),
            3,
            "clusterMonitor, hostManager, clusterManager"
        );
        let inherited = sub_roles("root", "admin", false);
        assert!(inherited.contains(&("read".to_string(), "config".to_string())));
        assert!(inherited.contains(&("readAnyDatabase".to_string(), "admin".to_string())));
        let root = privileges("root", "admin");
        assert!(
            on(&root, &Resource::Cluster)
                .iter()
                .any(|a| a == "shutdown")
        );
        assert!(on(&root, &namespace("", "")).iter().any(|a| a == "insert"));
    }
}
