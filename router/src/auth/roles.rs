//! Authorization: what each command needs, which of MongoDB's built-in roles grant it, and
//! which privileges (resource + actions, as custom roles list them) grant it.
//!
//! Owns: the command → need table and the built-in role → need table, in MongoDB's terms
//! (`read`, `readWrite`, `dbAdmin`, `userAdmin`, `dbOwner` on a database; `clusterMonitor`,
//! `clusterAdmin`, `readAnyDatabase`, `readWriteAnyDatabase`, `dbAdminAnyDatabase`,
//! `userAdminAnyDatabase`, `root` on `admin`); the command → actions table and the matching of
//! a privilege's resource (`{db, collection}`, `{cluster: true}`, `{anyResource: true}`).
//!
//! Invariants: pure; both command tables match exhaustively on the registry's
//! `crate::command::Command`, so a command added there fails to compile until it is
//! classified here, never allowed by accident; a name the router does not run needs `root`
//! (only `anyAction` on `anyResource` grants it by privilege); watching a collection or a database needs `read`
//! there (`find` + `changeStream`), watching the whole cluster a role that reads every
//! database; an empty `db` or `collection` in a resource means any, but never a `system.`
//! collection, as in MongoDB.

use bson::{Bson, Document, doc};

use crate::command::Command;

/// What a command needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// Any authenticated user (handshake, session and cursor bookkeeping, own status).
    Nothing,
    Read(String),
    Write(String),
    /// A write with `bypassDocumentValidation: true`: `Write` plus the
    /// `bypassDocumentValidation` action, which `dbAdmin` and `restore` grant.
    WriteBypassingValidation(String),
    DbAdmin(String),
    UserAdmin(String),
    /// Reading every database (a cluster-wide change stream).
    ReadAll,
    ClusterMonitor,
    ClusterAdmin,
    /// Only `root`.
    Root,
}

/// Whether a write command asks to skip document validation.
fn bypasses_validation(name: &str, cmd: &Document) -> bool {
    matches!(
        name,
        "insert" | "update" | "findAndModify" | "findandmodify" | "aggregate"
    ) && cmd.get_bool("bypassDocumentValidation").unwrap_or(false)
}

/// What `name` on database `db` needs.
pub fn need(name: &str, db: &str, cmd: &Document) -> Need {
    match need_ignoring_bypass(name, db, cmd) {
        Need::Write(db) if bypasses_validation(name, cmd) => Need::WriteBypassingValidation(db),
        other => other,
    }
}

fn need_ignoring_bypass(name: &str, db: &str, cmd: &Document) -> Need {
    use Command::*;
    let on = |f: fn(String) -> Need| f(db.to_string());
    // A name the router does not run needs `root`: only it learns so (59, not 13).
    let Some(command) = Command::named(name) else {
        return Need::Root;
    };
    match command {
        Hello | SaslStart | SaslContinue | Ping | BuildInfo | EndSessions | Logout
        | ConnectionStatus | WhatsMyUri | ListCommands | StartSession | RefreshSessions
        | KillSessions | CommitTransaction | AbortTransaction | GetMore | KillCursors
        | ListDatabases | CreateHttpToken => Need::Nothing,
        Find | Count | Distinct | ListCollections | ListIndexes | CollStats | DbStats
        | SnapshotCursor => on(Need::Read),
        Aggregate => aggregate_need(db, cmd),
        // Bounding a stream needs what watching it does.
        ChangeStreamBounds => aggregate_need(db, &watch_of_bounds(cmd)),
        // Reading a subscription needs what watching its stream does; managing one, the right
        // to change the database.
        ReadSubscription | AckSubscription | NackSubscription | ListSubscriptions => {
            if db == "admin" {
                Need::ReadAll
            } else {
                on(Need::Read)
            }
        }
        CreateSubscription | AlterSubscription | DropSubscription => on(Need::Write),
        Insert | Update | Delete | FindAndModify | Create | Drop | CreateIndexes | DropIndexes => {
            on(Need::Write)
        }
        RenameCollection => {
            // Run on admin, naming its source: it writes there (and at the target).
            let source = cmd
                .get_str("renameCollection")
                .ok()
                .and_then(|ns| ns.split_once('.'))
                .map_or(db, |(d, _)| d);
            Need::Write(source.to_string())
        }
        Explain => match cmd.get_document("explain") {
            Ok(inner) => match inner.keys().next() {
                Some(inner_name) if inner_name != "explain" => need(inner_name, db, inner),
                _ => Need::Root,
            },
            Err(_) => Need::Root,
        },
        CollMod | DropDatabase | Validate => on(Need::DbAdmin),
        CreateUser
        | UpdateUser
        | DropUser
        | UsersInfo
        | GrantRolesToUser
        | RevokeRolesFromUser
        | CreateRole
        | UpdateRole
        | DropRole
        | RolesInfo
        | GrantPrivilegesToRole
        | RevokePrivilegesFromRole
        | GrantRolesToRole
        | RevokeRolesFromRole => on(Need::UserAdmin),
        ServerStatus | TributaryStatus | CurrentOp | ListShards | GetCmdLineOpts | GetLog
        | HostInfo | GetParameter | GetClusterParameter => Need::ClusterMonitor,
        ShardCollection | EnableSharding | SetClusterParameter | SetParameter | KillOp => {
            Need::ClusterAdmin
        }
        KillAllSessions | ConfigureFailPoint => Need::Root,
    }
}

/// An aggregate's stages.
fn stages_of(cmd: &Document) -> Vec<&Document> {
    cmd.get_array("pipeline")
        .map(|p| p.iter().filter_map(Bson::as_document).collect())
        .unwrap_or_default()
}

/// The `aggregate` whose change stream a `changeStreamBounds` command bounds: on a collection
/// (`changeStreamBounds: "<coll>"`), a database (`changeStreamBounds: 1`) or, on `admin` with
/// `allChangesForCluster: true`, the cluster. Authorisation asks what watching it needs.
pub(crate) fn watch_of_bounds(cmd: &Document) -> Document {
    let target = match cmd.get("changeStreamBounds") {
        Some(Bson::String(coll)) => Bson::String(coll.clone()),
        _ => Bson::Int32(1),
    };
    let mut spec = Document::new();
    if cmd.get_bool("allChangesForCluster").unwrap_or(false) {
        spec.insert("allChangesForCluster", true);
    }
    doc! {"aggregate": target, "pipeline": [{"$changeStream": spec}], "cursor": {"batchSize": 0}}
}

fn aggregate_need(db: &str, cmd: &Document) -> Need {
    let stages = stages_of(cmd);
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
    // Listing other users' sessions is `listSessions` on the cluster (clusterMonitor).
    if let Some(Ok(spec)) = first.map(|s| s.get_document("$listLocalSessions"))
        && (spec.get_bool("allUsers").unwrap_or(false) || spec.contains_key("users"))
    {
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

/// The collections `$lookup`, `$graphLookup` and `$unionWith` stages name, nested pipelines
/// (theirs and `$facet`'s) included.
fn foreign_reads(stages: &[&Document], out: &mut Vec<String>) {
    let nested = |v: Option<&Bson>, out: &mut Vec<String>| {
        if let Some(Bson::Array(p)) = v {
            let inner: Vec<&Document> = p.iter().filter_map(Bson::as_document).collect();
            foreign_reads(&inner, out);
        }
    };
    for stage in stages {
        for (name, spec) in stage.iter() {
            match (name.as_str(), spec) {
                ("$unionWith", Bson::String(c)) => out.push(c.clone()),
                ("$lookup" | "$graphLookup" | "$unionWith", Bson::Document(d)) => {
                    for field in ["from", "coll"] {
                        if let Ok(c) = d.get_str(field) {
                            out.push(c.to_string());
                        }
                    }
                    nested(d.get("pipeline"), out);
                }
                ("$facet", Bson::Document(d)) => {
                    for (_, p) in d {
                        nested(Some(p), out);
                    }
                }
                _ => {}
            }
        }
    }
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
        Need::WriteBypassingValidation(db) => {
            allows(roles, &Need::Write(db.clone()))
                && (allows(roles, &Need::DbAdmin(db.clone())) || any("restore"))
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

/// What a privilege applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    /// `{db, collection}`; an empty string means any.
    Namespace { db: String, collection: String },
    /// `{cluster: true}`.
    Cluster,
    /// `{anyResource: true}`.
    Any,
}

/// A custom role's grant: `actions` on `resource`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Privilege {
    pub resource: Resource,
    pub actions: Vec<String>,
}

/// The action names a privilege may list (MongoDB's, those Tributary's commands check).
pub const ACTIONS: &[&str] = &[
    "anyAction",
    "bypassDocumentValidation",
    "changeStream",
    "collMod",
    "collStats",
    "createCollection",
    "createIndex",
    "createRole",
    "createUser",
    "dbStats",
    "dropCollection",
    "dropDatabase",
    "dropIndex",
    "dropRole",
    "dropUser",
    "enableSharding",
    "find",
    "getCmdLineOpts",
    "getLog",
    "getParameter",
    "grantRole",
    "hostInfo",
    "inprog",
    "insert",
    "killop",
    "listCollections",
    "listDatabases",
    "listIndexes",
    "listShards",
    "remove",
    "renameCollectionSameDB",
    "revokeRole",
    "serverStatus",
    "setParameter",
    "update",
    "validate",
    "viewRole",
    "viewUser",
    "changePassword",
    "changeCustomData",
    "getClusterParameter",
    "setClusterParameter",
];

/// What a command needs as actions on resources; `None`: only `anyAction` on `anyResource`.
/// A write with `bypassDocumentValidation: true` also needs that action where it inserts or
/// updates.
pub fn actions(name: &str, db: &str, cmd: &Document) -> Option<Vec<(&'static str, Resource)>> {
    let mut required = actions_ignoring_bypass(name, db, cmd)?;
    if bypasses_validation(name, cmd) {
        let written: Vec<Resource> = required
            .iter()
            .filter(|(a, _)| matches!(*a, "insert" | "update"))
            .map(|(_, r)| r.clone())
            .collect();
        for r in written {
            if !required
                .iter()
                .any(|(a, x)| *a == "bypassDocumentValidation" && *x == r)
            {
                required.push(("bypassDocumentValidation", r));
            }
        }
    }
    Some(required)
}

fn actions_ignoring_bypass(
    name: &str,
    db: &str,
    cmd: &Document,
) -> Option<Vec<(&'static str, Resource)>> {
    use Command::*;
    let coll = cmd.get_str(name).unwrap_or("").to_string();
    let ns = |c: &str| Resource::Namespace {
        db: db.to_string(),
        collection: c.to_string(),
    };
    let on_ns = |list: &[&'static str]| Some(list.iter().map(|a| (*a, ns(&coll))).collect());
    let on_db = |list: &[&'static str]| Some(list.iter().map(|a| (*a, ns(""))).collect());
    let on_cluster = |a: &'static str| Some(vec![(a, Resource::Cluster)]);
    match need(name, db, cmd) {
        Need::Nothing => return Some(Vec::new()),
        Need::Root => return None,
        _ => {}
    }
    match Command::named(name)? {
        Explain => {
            let inner = cmd.get_document("explain").ok()?;
            let inner_name = inner.keys().next()?;
            actions(inner_name, db, inner)
        }
        Find | Count | Distinct => on_ns(&["find"]),
        ReadSubscription | AckSubscription | NackSubscription | ListSubscriptions => {
            on_db(&["changeStream", "find"])
        }
        CreateSubscription | AlterSubscription | DropSubscription => {
            on_db(&["changeStream", "find", "insert", "update", "remove"])
        }
        ListCollections => on_db(&["listCollections"]),
        ListIndexes => on_ns(&["listIndexes"]),
        CollStats => on_ns(&["collStats"]),
        DbStats => on_db(&["dbStats"]),
        Validate => on_ns(&["validate"]),
        Insert => on_ns(&["insert"]),
        Update => {
            let upsert = cmd.get_array("updates").is_ok_and(|u| {
                u.iter()
                    .filter_map(Bson::as_document)
                    .any(|u| u.get_bool("upsert").unwrap_or(false))
            });
            on_ns(if upsert {
                &["update", "insert"]
            } else {
                &["update"]
            })
        }
        Delete => on_ns(&["remove"]),
        FindAndModify => {
            if cmd.get_bool("remove").unwrap_or(false) {
                on_ns(&["find", "remove"])
            } else if cmd.get_bool("upsert").unwrap_or(false) {
                on_ns(&["find", "update", "insert"])
            } else {
                on_ns(&["find", "update"])
            }
        }
        Create => on_ns(&["createCollection"]),
        Drop => on_ns(&["dropCollection"]),
        CreateIndexes => on_ns(&["createIndex"]),
        DropIndexes => on_ns(&["dropIndex"]),
        CollMod => on_ns(&["collMod"]),
        DropDatabase => on_db(&["dropDatabase"]),
        RenameCollection => {
            let source = cmd.get_str("renameCollection").unwrap_or("");
            let (sdb, scoll) = source.split_once('.').unwrap_or((db, source));
            Some(vec![(
                "renameCollectionSameDB",
                Resource::Namespace {
                    db: sdb.to_string(),
                    collection: scoll.to_string(),
                },
            )])
        }
        CreateUser => on_db(&["createUser"]),
        DropUser => on_db(&["dropUser"]),
        UpdateUser => on_db(&[
            "changePassword",
            "changeCustomData",
            "grantRole",
            "revokeRole",
        ]),
        UsersInfo => on_db(&["viewUser"]),
        GrantRolesToUser | GrantRolesToRole | GrantPrivilegesToRole => on_db(&["grantRole"]),
        RevokeRolesFromUser | RevokeRolesFromRole | RevokePrivilegesFromRole => {
            on_db(&["revokeRole"])
        }
        CreateRole => on_db(&["createRole"]),
        UpdateRole => on_db(&["createRole", "dropRole", "grantRole", "revokeRole"]),
        DropRole => on_db(&["dropRole"]),
        RolesInfo => on_db(&["viewRole"]),
        ServerStatus | TributaryStatus => on_cluster("serverStatus"),
        CurrentOp => on_cluster("inprog"),
        KillOp => on_cluster("killop"),
        ListShards => on_cluster("listShards"),
        GetCmdLineOpts => on_cluster("getCmdLineOpts"),
        GetLog => on_cluster("getLog"),
        HostInfo => on_cluster("hostInfo"),
        GetParameter => on_cluster("getParameter"),
        SetParameter => on_cluster("setParameter"),
        GetClusterParameter => on_cluster("getClusterParameter"),
        SetClusterParameter => on_cluster("setClusterParameter"),
        EnableSharding => on_db(&["enableSharding"]),
        ShardCollection => {
            let target = cmd.get_str(name).unwrap_or("");
            let (tdb, tcoll) = target.split_once('.').unwrap_or((db, target));
            Some(vec![(
                "enableSharding",
                Resource::Namespace {
                    db: tdb.to_string(),
                    collection: tcoll.to_string(),
                },
            )])
        }
        Aggregate => aggregate_actions(db, cmd),
        ChangeStreamBounds => aggregate_actions(db, &watch_of_bounds(cmd)),
        // The snapshot is read, and the stream after it watched, with their own checks.
        SnapshotCursor => on_db(&["find"]),
        // What their need says (above): nothing, or `root`.
        Hello | CreateHttpToken | SaslStart | SaslContinue | Ping | BuildInfo | EndSessions
        | Logout | ConnectionStatus | WhatsMyUri | ListCommands | StartSession
        | RefreshSessions | KillSessions | CommitTransaction | AbortTransaction | GetMore
        | KillCursors | ListDatabases => Some(Vec::new()),
        KillAllSessions | ConfigureFailPoint => None,
    }
}

fn aggregate_actions(db: &str, cmd: &Document) -> Option<Vec<(&'static str, Resource)>> {
    let coll = cmd.get_str("aggregate").unwrap_or("").to_string();
    let ns = |db: &str, c: &str| Resource::Namespace {
        db: db.to_string(),
        collection: c.to_string(),
    };
    let stages = stages_of(cmd);
    let first = stages.first();
    if let Some(cs) = first.and_then(|s| s.get_document("$changeStream").ok()) {
        let target = if cs.get_bool("allChangesForCluster").unwrap_or(false) {
            ns("", "")
        } else {
            ns(db, &coll)
        };
        return Some(vec![("changeStream", target.clone()), ("find", target)]);
    }
    if first.is_some_and(|s| s.contains_key("$currentOp")) {
        return Some(vec![("inprog", Resource::Cluster)]);
    }
    let mut out = vec![("find", ns(db, &coll))];
    // $lookup, $graphLookup and $unionWith read other collections of the database.
    let mut foreign = Vec::new();
    foreign_reads(&stages, &mut foreign);
    out.extend(foreign.into_iter().map(|c| ("find", ns(db, &c))));
    for stage in &stages {
        let target = match (stage.get("$out"), stage.get("$merge")) {
            (Some(Bson::String(c)), _) => Some(ns(db, c)),
            (_, Some(Bson::String(c))) => Some(ns(db, c)),
            (Some(Bson::Document(d)), _) | (_, Some(Bson::Document(d))) => {
                let into = d.get("into").unwrap_or(&Bson::Null);
                let (tdb, tcoll) = match (d.get_str("db"), d.get_str("coll"), into) {
                    (Ok(tdb), Ok(tcoll), _) => (tdb, tcoll),
                    (_, _, Bson::String(c)) => (db, c.as_str()),
                    (_, _, Bson::Document(i)) => (
                        i.get_str("db").unwrap_or(db),
                        i.get_str("coll").unwrap_or(""),
                    ),
                    _ => (db, ""),
                };
                Some(ns(tdb, tcoll))
            }
            _ => None,
        };
        if let Some(target) = target {
            out.extend([
                ("insert", target.clone()),
                ("remove", target.clone()),
                ("update", target),
            ]);
        }
    }
    Some(out)
}

impl Resource {
    /// Whether this resource (a privilege's) covers `wanted` (a command's).
    fn covers(&self, wanted: &Resource) -> bool {
        match (self, wanted) {
            (Resource::Any, _) => true,
            (Resource::Cluster, Resource::Cluster) => true,
            (
                Resource::Namespace { db, collection },
                Resource::Namespace {
                    db: wdb,
                    collection: wcoll,
                },
            ) => {
                // An empty db: any database (and what asks for every one); an empty
                // collection: any non-system collection, and the database itself.
                let db_ok = db.is_empty() || db == wdb;
                let coll_ok = if collection.is_empty() {
                    !wcoll.starts_with("system.")
                } else {
                    collection == wcoll
                };
                db_ok && coll_ok
            }
            _ => false,
        }
    }
}

/// Whether `privileges` grant every action `required` lists.
pub fn privileges_allow(privileges: &[Privilege], required: &[(&str, Resource)]) -> bool {
    required.iter().all(|(action, resource)| {
        privileges.iter().any(|p| {
            p.resource.covers(resource) && p.actions.iter().any(|a| a == action || a == "anyAction")
        })
    })
}

/// Whether privileges grant a command that only `root` may run.
pub fn privileges_allow_anything(privileges: &[Privilege]) -> bool {
    privileges
        .iter()
        .any(|p| p.resource == Resource::Any && p.actions.iter().any(|a| a == "anyAction"))
}

/// A privilege document (`{resource: {...}, actions: [...]}`), checked as MongoDB checks it.
pub fn parse_privilege(d: &Document) -> Result<Privilege, String> {
    let resource = d
        .get_document("resource")
        .map_err(|_| "a privilege needs a resource document".to_string())?;
    let resource = if resource.get_bool("anyResource").unwrap_or(false) {
        Resource::Any
    } else if resource.get_bool("cluster").unwrap_or(false) {
        Resource::Cluster
    } else {
        match (resource.get_str("db"), resource.get_str("collection")) {
            (Ok(db), Ok(collection)) if resource.len() == 2 => Resource::Namespace {
                db: db.to_string(),
                collection: collection.to_string(),
            },
            _ => {
                return Err(
                    "a resource is {db, collection}, {cluster: true} or {anyResource: true}"
                        .to_string(),
                );
            }
        }
    };
    let actions = d
        .get_array("actions")
        .map_err(|_| "a privilege needs an array of actions".to_string())?;
    let mut names = Vec::new();
    for a in actions {
        match a.as_str() {
            Some(name) if ACTIONS.contains(&name) => names.push(name.to_string()),
            Some(name) => return Err(format!("Unrecognized action privilege string: {name}")),
            None => return Err("an action is a string".to_string()),
        }
    }
    if names.is_empty() {
        return Err("a privilege needs at least one action".to_string());
    }
    Ok(Privilege {
        resource,
        actions: names,
    })
}

/// The document form of a privilege (as `rolesInfo` shows it).
pub fn privilege_document(p: &Privilege) -> Document {
    let resource = match &p.resource {
        Resource::Any => bson::doc! {"anyResource": true},
        Resource::Cluster => bson::doc! {"cluster": true},
        Resource::Namespace { db, collection } => bson::doc! {"db": db, "collection": collection},
    };
    bson::doc! {"resource": resource, "actions": p.actions.clone()}
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
        let all_sessions =
            doc! {"aggregate": 1, "pipeline": [{"$listLocalSessions": {"allUsers": true}}]};
        assert!(!may(&[("read", "app")], "aggregate", "app", all_sessions));
        let out = doc! {"aggregate": "c", "pipeline": [{"$match": {}}, {"$out": "x"}]};
        assert!(!may(&[("read", "app")], "aggregate", "app", out));
    }

    #[test]
    fn reading_a_subscription_needs_what_watching_does_and_managing_one_needs_write() {
        let read = doc! {"readSubscription": "s", "consumer": "c"};
        let create = doc! {"createSubscription": "s"};
        assert!(may(
            &[("read", "app")],
            "readSubscription",
            "app",
            read.clone()
        ));
        assert!(may(&[("read", "app")], "ackSubscription", "app", doc! {}));
        assert!(!may(
            &[("read", "app")],
            "readSubscription",
            "other",
            read.clone()
        ));
        assert!(!may(
            &[("read", "app")],
            "createSubscription",
            "app",
            create.clone()
        ));
        assert!(may(
            &[("readWrite", "app")],
            "createSubscription",
            "app",
            create
        ));
        assert!(!may(
            &[("readWrite", "app")],
            "dropSubscription",
            "other",
            doc! {}
        ));
        // A cluster subscription lives on admin: reading it needs a role that reads every
        // database, as watching the cluster does.
        assert!(!may(
            &[("read", "admin")],
            "readSubscription",
            "admin",
            read.clone()
        ));
        assert!(may(
            &[("readAnyDatabase", "admin")],
            "readSubscription",
            "admin",
            read
        ));
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

    fn privilege(resource: Document, actions: &[&str]) -> Privilege {
        parse_privilege(&doc! {"resource": resource, "actions": actions}).expect("privilege")
    }

    fn granted(privileges: &[Privilege], name: &str, db: &str, cmd: Document) -> bool {
        match actions(name, db, &cmd) {
            Some(required) => privileges_allow(privileges, &required),
            None => privileges_allow_anything(privileges),
        }
    }

    #[test]
    fn bypassing_validation_needs_the_bypass_action_beside_the_write() {
        let roles = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(r, d)| (r.to_string(), d.to_string()))
                .collect()
        };
        let bypass = doc! {"insert": "c", "documents": [], "bypassDocumentValidation": true};
        let need_of = need("insert", "app", &bypass);
        assert_eq!(need_of, Need::WriteBypassingValidation("app".into()));
        assert!(!allows(&roles(&[("readWrite", "app")]), &need_of));
        assert!(!allows(&roles(&[("dbAdmin", "app")]), &need_of));
        assert!(allows(
            &roles(&[("readWrite", "app"), ("dbAdmin", "app")]),
            &need_of
        ));
        assert!(allows(&roles(&[("dbOwner", "app")]), &need_of));
        assert!(allows(
            &roles(&[("readWrite", "app"), ("restore", "admin")]),
            &need_of
        ));
        let plain = doc! {"insert": "c", "documents": [], "bypassDocumentValidation": false};
        assert_eq!(need("insert", "app", &plain), Need::Write("app".into()));

        let writer = [privilege(
            doc! {"db": "app", "collection": "c"},
            &["insert"],
        )];
        assert!(!granted(&writer, "insert", "app", bypass.clone()));
        let bypasser = [privilege(
            doc! {"db": "app", "collection": "c"},
            &["insert", "bypassDocumentValidation"],
        )];
        assert!(granted(&bypasser, "insert", "app", bypass));
        let out =
            doc! {"aggregate": "c", "pipeline": [{"$out": "d"}], "bypassDocumentValidation": true};
        let reader_writer = [privilege(
            doc! {"db": "app", "collection": ""},
            &["find", "insert", "remove", "update"],
        )];
        assert!(!granted(&reader_writer, "aggregate", "app", out.clone()));
        let all = [privilege(
            doc! {"db": "app", "collection": ""},
            &[
                "find",
                "insert",
                "remove",
                "update",
                "bypassDocumentValidation",
            ],
        )];
        assert!(granted(&all, "aggregate", "app", out));
    }

    #[test]
    fn privileges_grant_exactly_their_actions_on_their_resources() {
        let reader = [privilege(doc! {"db": "app", "collection": "c"}, &["find"])];
        assert!(granted(&reader, "find", "app", doc! {"find": "c"}));
        assert!(!granted(&reader, "find", "app", doc! {"find": "d"}));
        assert!(!granted(&reader, "find", "other", doc! {"find": "c"}));
        assert!(!granted(&reader, "insert", "app", doc! {"insert": "c"}));
        // Reading another collection through $lookup (even nested) needs find on it too.
        let join = |from: &str| {
            doc! {"aggregate": "c", "pipeline": [{"$unionWith": {"coll": "c", "pipeline": [
                {"$lookup": {"from": from, "localField": "a", "foreignField": "b", "as": "x"}},
            ]}}]}
        };
        assert!(granted(&reader, "aggregate", "app", join("c")));
        assert!(!granted(&reader, "aggregate", "app", join("secret")));
        let watch = doc! {"aggregate": "c", "pipeline": [{"$changeStream": {}}]};
        assert!(
            !granted(&reader, "aggregate", "app", watch.clone()),
            "watching needs changeStream too"
        );
        let watcher = [privilege(
            doc! {"db": "app", "collection": ""},
            &["find", "changeStream"],
        )];
        assert!(granted(&watcher, "aggregate", "app", watch.clone()));
        let db_watch = doc! {"aggregate": 1, "pipeline": [{"$changeStream": {}}]};
        assert!(granted(&watcher, "aggregate", "app", db_watch));
        assert!(!granted(
            &watcher,
            "find",
            "app",
            doc! {"find": "system.users"}
        ));
        let cluster_watch =
            doc! {"aggregate": 1, "pipeline": [{"$changeStream": {"allChangesForCluster": true}}]};
        assert!(!granted(
            &watcher,
            "aggregate",
            "admin",
            cluster_watch.clone()
        ));
        let everywhere = [privilege(
            doc! {"db": "", "collection": ""},
            &["find", "changeStream"],
        )];
        assert!(granted(&everywhere, "aggregate", "admin", cluster_watch));
        let upsert = doc! {"update": "c", "updates": [{"q": {}, "u": {}, "upsert": true}]};
        let updater = [privilege(
            doc! {"db": "app", "collection": "c"},
            &["update"],
        )];
        assert!(granted(
            &updater,
            "update",
            "app",
            doc! {"update": "c", "updates": []}
        ));
        assert!(
            !granted(&updater, "update", "app", upsert),
            "an upsert inserts"
        );
        let monitor = [privilege(doc! {"cluster": true}, &["serverStatus"])];
        assert!(granted(&monitor, "serverStatus", "admin", doc! {}));
        assert!(!granted(&monitor, "currentOp", "admin", doc! {}));
        assert!(!granted(&monitor, "someNewCommand", "admin", doc! {}));
        let all = [privilege(doc! {"anyResource": true}, &["anyAction"])];
        assert!(granted(&all, "someNewCommand", "admin", doc! {}));
    }

    #[test]
    fn bad_privileges_are_refused() {
        for bad in [
            doc! {"resource": {"db": "a"}, "actions": ["find"]},
            doc! {"resource": {"db": "a", "collection": "c"}, "actions": ["fly"]},
            doc! {"resource": {"db": "a", "collection": "c"}, "actions": []},
            doc! {"actions": ["find"]},
            doc! {"resource": {"db": "a", "collection": "c"}, "actions": [1]},
        ] {
            assert!(parse_privilege(&bad).is_err(), "{bad}");
        }
    }
}
