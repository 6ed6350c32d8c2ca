//! Custom roles: `createRole`, `updateRole`, `dropRole`, `rolesInfo`, `grantPrivilegesToRole`,
//! `revokePrivilegesFromRole`, `grantRolesToRole`, `revokeRolesFromRole`, and what a user's
//! roles grant once custom roles are expanded.
//!
//! Owns: the role documents (`admin.system.roles` on the config shard, as MongoDB keeps them:
//! `_id: "<db>.<role>"`, `role`, `db`, `privileges`, `roles`), and the expansion of a list of
//! roles into built-in roles plus privileges ([`resolve`]).
//!
//! Invariants: a role is a built-in one or a document here, never a name taken on trust (a
//! missing one is 31 `RoleNotFound`); a custom role never takes a built-in role's name; the
//! roles a role inherits never form a cycle (checked on every change, and the expansion stops
//! at a role it has seen); what a connection may do is fixed when it authenticates, as the
//! roles stood then.

use std::collections::HashSet;

use bson::{Bson, Document, doc};
use shard::sharding::ShardId;
use wire::{MongoError, Result};

use super::roles::{self, Privilege};
use super::{ADMIN_ONLY_ROLES, AuthCx, BUILT_IN_ROLES, USERS_DB, insert_new, write_users};
use crate::kernel::transport::Shards;

const ROLES_COLL: &str = "system.roles";

/// What a list of roles grants: the built-in roles among them and those they inherit, and the
/// custom roles' privileges.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    pub roles: Vec<(String, String)>,
    pub privileges: Vec<Privilege>,
}

impl Grants {
    /// Whether these grants allow `name` on `db`.
    pub fn allow(&self, name: &str, db: &str, cmd: &Document) -> bool {
        roles::allows(&self.roles, &roles::need(name, db, cmd))
            || match roles::actions(name, db, cmd) {
                Some(required) => roles::privileges_allow(&self.privileges, &required),
                None => roles::privileges_allow_anything(&self.privileges),
            }
    }

    pub fn extend(&mut self, other: Grants) {
        self.roles.extend(other.roles);
        self.privileges.extend(other.privileges);
    }
}

fn is_built_in(role: &str, db: &str) -> bool {
    BUILT_IN_ROLES.contains(&role) && (db == "admin" || !ADMIN_ONLY_ROLES.contains(&role))
}

fn role_not_found(role: &str, db: &str) -> MongoError {
    MongoError::with_code(31, format!("Could not find role: {role}@{db}"))
}

async fn find_roles(cx: &AuthCx<'_>, filter: Document) -> Result<Vec<Document>> {
    let reply = cx
        .transport
        .command(
            ShardId::CONFIG,
            USERS_DB,
            doc! {"find": ROLES_COLL, "filter": filter, "batchSize": i32::MAX},
        )
        .await?;
    Ok(reply
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .map(|b| b.iter().filter_map(Bson::as_document).cloned().collect())
        .unwrap_or_default())
}

async fn find_role(cx: &AuthCx<'_>, role: &str, db: &str) -> Result<Option<Document>> {
    Ok(find_roles(cx, doc! {"_id": format!("{db}.{role}")})
        .await?
        .into_iter()
        .next())
}

/// `[(role, db)]` of a document's `roles` array.
pub(super) fn pairs(d: &Document) -> Vec<(String, String)> {
    d.get_array("roles")
        .map(|list| {
            list.iter()
                .filter_map(Bson::as_document)
                .filter_map(|r| {
                    Some((r.get_str("role").ok()?.into(), r.get_str("db").ok()?.into()))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn privileges_of(d: &Document) -> Vec<Privilege> {
    d.get_array("privileges")
        .map(|list| {
            list.iter()
                .filter_map(Bson::as_document)
                .filter_map(|p| roles::parse_privilege(p).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Expands `roles`: built-in ones are kept, custom ones give their privileges and what they
/// inherit. A role that no longer exists grants nothing.
pub async fn resolve(cx: &AuthCx<'_>, roles: Vec<(String, String)>) -> Result<Grants> {
    let mut grants = Grants::default();
    let mut seen = HashSet::new();
    let mut todo = roles;
    while let Some((role, db)) = todo.pop() {
        if !seen.insert((role.clone(), db.clone())) {
            continue;
        }
        if is_built_in(&role, &db) {
            grants.roles.push((role, db));
        } else if let Some(d) = find_role(cx, &role, &db).await? {
            grants.privileges.extend(privileges_of(&d));
            todo.extend(pairs(&d));
        }
    }
    Ok(grants)
}

/// `[{role, db}]` from a command's `roles` (a name alone means a role on `db`); each must be a
/// built-in role or an existing custom one.
pub async fn parse_roles(cx: &AuthCx<'_>, v: Option<&Bson>, db: &str) -> Result<Vec<Bson>> {
    let Some(Bson::Array(list)) = v else {
        return Err(MongoError::failed_to_parse("roles must be an array"));
    };
    let mut out = Vec::new();
    for r in list {
        let (role, role_db) = match r {
            Bson::String(s) => (s.clone(), db.to_string()),
            Bson::Document(d) => match (d.get_str("role"), d.get_str("db")) {
                (Ok(role), Ok(rdb)) => (role.to_string(), rdb.to_string()),
                _ => {
                    return Err(MongoError::failed_to_parse(
                        "a role must be a name or {role, db}",
                    ));
                }
            },
            _ => {
                return Err(MongoError::failed_to_parse(
                    "a role must be a name or {role, db}",
                ));
            }
        };
        if !is_built_in(&role, &role_db) && find_role(cx, &role, &role_db).await?.is_none() {
            return Err(role_not_found(&role, &role_db));
        }
        out.push(Bson::Document(doc! {"role": role, "db": role_db}));
    }
    Ok(out)
}

fn parse_privileges(v: Option<&Bson>) -> Result<Vec<Bson>> {
    let Some(Bson::Array(list)) = v else {
        return Err(MongoError::failed_to_parse("privileges must be an array"));
    };
    list.iter()
        .map(|p| {
            let d = p
                .as_document()
                .ok_or_else(|| MongoError::failed_to_parse("a privilege is a document"))?;
            let parsed = roles::parse_privilege(d).map_err(MongoError::bad_value)?;
            Ok(Bson::Document(roles::privilege_document(&parsed)))
        })
        .collect()
}

fn role_name(cmd: &Document, field: &str) -> Result<String> {
    match cmd.get(field) {
        Some(Bson::String(s)) if !s.is_empty() => Ok(s.clone()),
        _ => Err(MongoError::bad_value(format!(
            "{field} must be a non-empty string"
        ))),
    }
}

/// Refuses inheriting `inherits` into `role@db` when that makes a cycle.
async fn refuse_cycle(cx: &AuthCx<'_>, role: &str, db: &str, inherits: &[Bson]) -> Result<()> {
    let target = (role.to_string(), db.to_string());
    let mut seen = HashSet::new();
    let mut todo: Vec<(String, String)> = inherits
        .iter()
        .filter_map(Bson::as_document)
        .filter_map(|r| Some((r.get_str("role").ok()?.into(), r.get_str("db").ok()?.into())))
        .collect();
    while let Some(next) = todo.pop() {
        if next == target {
            return Err(MongoError::with_code(
                4,
                format!("Granting roles to {role}@{db} would introduce a cycle"),
            ));
        }
        if seen.insert(next.clone())
            && !is_built_in(&next.0, &next.1)
            && let Some(d) = find_role(cx, &next.0, &next.1).await?
        {
            todo.extend(pairs(&d));
        }
    }
    Ok(())
}

/// `createRole`.
pub async fn create_role(cx: &AuthCx<'_>, db: &str, cmd: &Document) -> Result<Document> {
    let role = role_name(cmd, "createRole")?;
    if BUILT_IN_ROLES.contains(&role.as_str()) {
        return Err(MongoError::bad_value(
            "Cannot create roles with the same name as a built-in role",
        ));
    }
    let privileges = parse_privileges(cmd.get("privileges"))?;
    let inherits = parse_roles(cx, cmd.get("roles"), db).await?;
    refuse_cycle(cx, &role, db, &inherits).await?;
    let doc = doc! {
        "_id": format!("{db}.{role}"),
        "role": &role,
        "db": db,
        "privileges": privileges,
        "roles": inherits,
    };
    insert_new(
        cx,
        ROLES_COLL,
        doc,
        MongoError::with_code(51002, format!("Role \"{role}@{db}\" already exists")),
    )
    .await?;
    Ok(doc! {"ok": 1.0})
}

async fn update_role_doc(cx: &AuthCx<'_>, role: &str, db: &str, update: Document) -> Result<()> {
    let reply = write_users(cx, doc! {"update": ROLES_COLL, "updates": [{"q": {"_id": format!("{db}.{role}")}, "u": update}]},
    )
    .await?;
    if reply.get_i32("n").unwrap_or(0) == 0 {
        return Err(role_not_found(role, db));
    }
    Ok(())
}

/// `updateRole`: replaces its privileges and/or the roles it inherits.
pub async fn update_role(cx: &AuthCx<'_>, db: &str, cmd: &Document) -> Result<Document> {
    let role = role_name(cmd, "updateRole")?;
    let mut set = Document::new();
    if cmd.contains_key("privileges") {
        set.insert("privileges", parse_privileges(cmd.get("privileges"))?);
    }
    if cmd.contains_key("roles") {
        let inherits = parse_roles(cx, cmd.get("roles"), db).await?;
        refuse_cycle(cx, &role, db, &inherits).await?;
        set.insert("roles", inherits);
    }
    if set.is_empty() {
        return Err(MongoError::bad_value(
            "Must specify at least one field to update in updateRole",
        ));
    }
    update_role_doc(cx, &role, db, doc! {"$set": set}).await?;
    Ok(doc! {"ok": 1.0})
}

/// `grantPrivilegesToRole` and `revokePrivilegesFromRole`.
pub async fn change_privileges(
    cx: &AuthCx<'_>,
    db: &str,
    cmd: &Document,
    grant: bool,
) -> Result<Document> {
    let field = if grant {
        "grantPrivilegesToRole"
    } else {
        "revokePrivilegesFromRole"
    };
    let role = role_name(cmd, field)?;
    let privileges = parse_privileges(cmd.get("privileges"))?;
    let update = super::add_or_pull("privileges", privileges, grant);
    update_role_doc(cx, &role, db, update).await?;
    Ok(doc! {"ok": 1.0})
}

/// `grantRolesToRole` and `revokeRolesFromRole`.
pub async fn change_inherited(
    cx: &AuthCx<'_>,
    db: &str,
    cmd: &Document,
    grant: bool,
) -> Result<Document> {
    let field = if grant {
        "grantRolesToRole"
    } else {
        "revokeRolesFromRole"
    };
    let role = role_name(cmd, field)?;
    let inherits = parse_roles(cx, cmd.get("roles"), db).await?;
    if grant {
        refuse_cycle(cx, &role, db, &inherits).await?;
    }
    let update = super::add_or_pull("roles", inherits, grant);
    update_role_doc(cx, &role, db, update).await?;
    Ok(doc! {"ok": 1.0})
}

/// `dropRole`: also taken from every user and role that had it, as MongoDB does.
pub async fn drop_role(cx: &AuthCx<'_>, db: &str, cmd: &Document) -> Result<Document> {
    let role = role_name(cmd, "dropRole")?;
    let reply = write_users(cx, doc! {"delete": ROLES_COLL, "deletes": [{"q": {"_id": format!("{db}.{role}")}, "limit": 1}]},
    )
    .await?;
    if reply.get_i32("n").unwrap_or(0) == 0 {
        return Err(role_not_found(&role, db));
    }
    let held = doc! {"role": &role, "db": db};
    for coll in [super::USERS_COLL, ROLES_COLL] {
        write_users(cx, doc! {"update": coll, "updates": [{"q": {"roles": &held}, "u": {"$pull": {"roles": &held}}, "multi": true}]},
        )
        .await?;
    }
    Ok(doc! {"ok": 1.0})
}

/// Every role a custom role inherits (custom and built-in, each once, the built-ins' own
/// sub-roles included) and every privilege it holds, its own and inherited, merged by
/// resource: what `rolesInfo` shows as `inheritedRoles` and `inheritedPrivileges`.
async fn inheritance(
    cx: &AuthCx<'_>,
    role: &Document,
) -> Result<(Vec<(String, String)>, Vec<Privilege>)> {
    let mut by_resource = std::collections::BTreeMap::new();
    let mut grant = |privileges: Vec<Privilege>| {
        for p in privileges {
            by_resource
                .entry(super::builtin::ResourceKey::of(&p.resource))
                .or_insert_with(Vec::new)
                .extend(p.actions);
        }
    };
    grant(privileges_of(role));
    let mut reached: Vec<(String, String)> = Vec::new();
    let mut todo = pairs(role);
    while let Some(pair) = todo.pop() {
        if reached.contains(&pair) {
            continue;
        }
        let (name, db) = &pair;
        if is_built_in(name, db) {
            grant(super::builtin::privileges(name, db));
            for sub in super::builtin::sub_roles(name, db, false) {
                if !reached.contains(&sub) {
                    reached.push(sub);
                }
            }
        } else if let Some(d) = find_role(cx, name, db).await? {
            grant(privileges_of(&d));
            todo.extend(pairs(&d));
        }
        reached.push(pair);
    }
    Ok((reached, super::builtin::merged(by_resource)))
}

/// `rolesInfo`: `1` (every custom role of `db`), a name, `{role, db}`, or a list of those;
/// with `showPrivileges`, each role's privileges and those it inherits, and
/// `showBuiltinRoles` adds the built-in ones.
pub async fn roles_info(cx: &AuthCx<'_>, db: &str, cmd: &Document) -> Result<Document> {
    let one = |v: &Bson| -> Result<(String, String)> {
        match v {
            Bson::String(r) => Ok((r.clone(), db.to_string())),
            Bson::Document(d) => match (d.get_str("role"), d.get_str("db")) {
                (Ok(r), Ok(d)) => Ok((r.to_string(), d.to_string())),
                _ => Err(MongoError::bad_value("rolesInfo needs {role, db}")),
            },
            _ => Err(MongoError::bad_value(
                "rolesInfo: a role is a name or {role, db}",
            )),
        }
    };
    let (named, all) = match cmd.get("rolesInfo") {
        Some(Bson::Int32(1)) | Some(Bson::Int64(1)) | Some(Bson::Double(1.0)) => (Vec::new(), true),
        Some(Bson::Array(list)) => (list.iter().map(one).collect::<Result<Vec<_>>>()?, false),
        Some(v) => (vec![one(v)?], false),
        None => return Err(MongoError::bad_value("rolesInfo needs a value")),
    };
    let show_privileges = matches!(cmd.get("showPrivileges"), Some(Bson::Boolean(true)));
    let mut found = if all {
        find_roles(cx, doc! {"db": db}).await?
    } else {
        let ids: Vec<String> = named.iter().map(|(r, d)| format!("{d}.{r}")).collect();
        find_roles(cx, doc! {"_id": {"$in": ids}}).await?
    };
    let mut out = Vec::new();
    let built_in: Vec<(String, String)> = if all {
        if cmd.get_bool("showBuiltinRoles").unwrap_or(false) {
            BUILT_IN_ROLES
                .iter()
                .filter(|r| is_built_in(r, db))
                .map(|r| (r.to_string(), db.to_string()))
                .collect()
        } else {
            Vec::new()
        }
    } else {
        named
            .iter()
            .filter(|(r, d)| is_built_in(r, d))
            .cloned()
            .collect()
    };
    for (role, role_db) in built_in {
        let role_list = |directly: bool| -> Vec<Bson> {
            super::builtin::sub_roles(&role, &role_db, directly)
                .into_iter()
                .map(|(r, d)| Bson::Document(doc! {"role": r, "db": d}))
                .collect()
        };
        let mut shown = doc! {
            "role": &role, "db": &role_db, "isBuiltin": true,
            "roles": role_list(true), "inheritedRoles": role_list(false),
        };
        if show_privileges {
            let listed = |privileges: Vec<Privilege>| -> Vec<Bson> {
                privileges
                    .iter()
                    .map(|p| Bson::Document(roles::privilege_document(p)))
                    .collect()
            };
            shown.insert(
                "privileges",
                listed(super::builtin::own_privileges(&role, &role_db)),
            );
            shown.insert(
                "inheritedPrivileges",
                listed(super::builtin::privileges(&role, &role_db)),
            );
        }
        out.push(Bson::Document(shown));
    }
    for d in found.drain(..) {
        let role = d.get_str("role").unwrap_or_default().to_string();
        let role_db = d.get_str("db").unwrap_or_default().to_string();
        let (inherited_roles, inherited_privileges) = inheritance(cx, &d).await?;
        let mut shown = doc! {
            "_id": format!("{role_db}.{role}"),
            "role": &role,
            "db": &role_db,
            "isBuiltin": false,
            "roles": d.get_array("roles").cloned().unwrap_or_default(),
            "inheritedRoles": inherited_roles
                .iter()
                .map(|(r, d)| Bson::Document(doc! {"role": r, "db": d}))
                .collect::<Vec<_>>(),
        };
        if show_privileges {
            let listed = |privileges: &[Privilege]| -> Vec<Bson> {
                privileges
                    .iter()
                    .map(|p| Bson::Document(roles::privilege_document(p)))
                    .collect()
            };
            shown.insert("privileges", listed(&privileges_of(&d)));
            shown.insert("inheritedPrivileges", listed(&inherited_privileges));
        }
        out.push(Bson::Document(shown));
    }
    Ok(doc! {"roles": out, "ok": 1.0})
}
