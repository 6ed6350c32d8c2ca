//! The shard-side oplog filter (`$_internalChangeStreamOplogMatch`, reference §4.2): which oplog
//! entries can produce an event for a stream.
//!
//! Owns: the namespace rules per stream level, the `fromMigrate` rule, which `c` commands and
//! which `n` markers are consumed, and which transaction entries reach the unwind stage. The
//! `ts >= start` bound is the tailer's seek, not this filter.
//!
//! Invariants:
//! * collection streams match by exact name (so they survive a drop and recreate), never
//!   `dropDatabase`; database streams hide `system.*` and `$`-prefixed collections; cluster
//!   streams also hide the `admin`, `config` and `local` databases;
//! * `fromMigrate: true` entries never match unless `showMigrationEvents` (or, with
//!   `showSystemEvents`, a migrated `create` / `createIndexes`);
//! * partial, prepare and abort transaction entries never match; a terminal `applyOps` matches
//!   when an inner op would match or when it ends a chain (non-null `prevOpTime`), and every
//!   `commitTransaction` matches (its ops are only known after the unwind);
//! * with `showExpandedEvents`, database and cluster streams also match CRUD on
//!   `<db>.system.views`, which the transform turns into view DDL events;
//! * expanded-event DDL matches here whatever `showExpandedEvents` says: the classic-types filter
//!   after the resume check drops it, so a token of such an event still resumes
//!   ([`crate::changestream::transform::is_classic_type`]).
//!
//! User `$match` pushdown: we do not split the user's predicates into an oplog-level part.
//! Instead the shard runs the user's whole stage list on each transformed event
//! ([`crate::changestream::shard::ShardStream`]), which filters before the network exactly as
//! MongoDB's pushdown does, with one code path and no rewrite to get wrong. The cost is building
//! events that the user filter then drops.

use bson::{Bson, Document};

use super::spec::{ChangeStreamSpec, StreamLevel};

/// `o2` marker keys of `n` entries that become events, with whether they need
/// `showSystemEvents`.
pub(crate) const MARKERS: &[(&str, bool)] = &[
    ("shardCollection", false),
    ("refineCollectionShardKey", false),
    ("reshardCollection", false),
    ("migrateLastChunkFromShard", true),
    ("reshardBegin", true),
    ("reshardDoneCatchUp", true),
    ("reshardBlockingWrites", true),
];

/// The commands on `<db>.$cmd` whose value names the target collection.
const COLLECTION_COMMANDS: &[&str] = &[
    "drop",
    "create",
    "createIndexes",
    "commitIndexBuild",
    "dropIndexes",
    "collMod",
];

/// Whether `entry` (a top-level oplog entry) may produce an event for `spec`.
pub fn matches(spec: &ChangeStreamSpec, entry: &Document) -> bool {
    if is_from_migrate(entry) && !migrated_entry_allowed(spec, entry) {
        return false;
    }
    match entry.get_str("op").unwrap_or("") {
        "c" => {
            let Ok(o) = entry.get_document("o") else {
                return false;
            };
            if o.contains_key("applyOps") {
                return terminal_apply_ops_matches(spec, entry, o);
            }
            if o.contains_key("commitTransaction") {
                return entry.get_str("ns").ok() == Some("admin.$cmd");
            }
            command_matches(spec, entry, o)
        }
        "n" => marker_of(spec, entry).is_some(),
        _ => op_matches(spec, entry),
    }
}

/// Whether one operation (a top-level CRUD/command entry or an op inside `applyOps`) matches on
/// its own; used by the unwind stage for inner ops. Transactions and noops never match here.
pub fn op_matches(spec: &ChangeStreamSpec, op: &Document) -> bool {
    if is_from_migrate(op) && !migrated_entry_allowed(spec, op) {
        return false;
    }
    match op.get_str("op").unwrap_or("") {
        "i" | "u" | "d" => op
            .get_str("ns")
            .is_ok_and(|ns| ns_matches(spec, ns) || view_definition_matches(spec, ns)),
        "c" => match op.get_document("o") {
            Ok(o) if !o.contains_key("applyOps") && !o.contains_key("commitTransaction") => {
                command_matches(spec, op, o)
            }
            _ => false,
        },
        _ => false,
    }
}

fn is_from_migrate(entry: &Document) -> bool {
    matches!(entry.get("fromMigrate"), Some(Bson::Boolean(true)))
}

fn migrated_entry_allowed(spec: &ChangeStreamSpec, entry: &Document) -> bool {
    if spec.options.show_migration_events {
        return true;
    }
    spec.options.show_system_events
        && entry.get_str("op").ok() == Some("c")
        && entry
            .get_document("o")
            .is_ok_and(|o| o.contains_key("create") || o.contains_key("createIndexes"))
}

/// A non-transaction command on `<db>.$cmd`.
fn command_matches(spec: &ChangeStreamSpec, entry: &Document, o: &Document) -> bool {
    if let Ok(from) = o.get_str("renameCollection") {
        // The entry lives on the source database; a cross-database rename into a watched
        // namespace must still match, so only the two names count.
        return ns_matches(spec, from) || o.get_str("to").is_ok_and(|to| ns_matches(spec, to));
    }
    let Some(db) = entry
        .get_str("ns")
        .ok()
        .and_then(|ns| ns.strip_suffix(".$cmd"))
    else {
        return false;
    };
    if o.contains_key("dropDatabase") {
        return match spec.level {
            StreamLevel::Collection => false,
            StreamLevel::Database => db == spec.db,
            StreamLevel::Cluster => db_visible_to_cluster(db),
        };
    }
    COLLECTION_COMMANDS.iter().any(|cmd| {
        o.get_str(cmd)
            .is_ok_and(|coll| ns_matches_parts(spec, db, coll))
    })
}

/// A terminal `applyOps` (not partial, not prepare) that touches the stream or ends a chain.
fn terminal_apply_ops_matches(spec: &ChangeStreamSpec, entry: &Document, o: &Document) -> bool {
    if entry.get_str("ns").ok() != Some("admin.$cmd")
        || matches!(o.get("prepare"), Some(Bson::Boolean(true)))
        || matches!(o.get("partialTxn"), Some(Bson::Boolean(true)))
    {
        return false;
    }
    if has_prev_op_time(entry) {
        return true;
    }
    o.get_array("applyOps").is_ok_and(|ops| {
        ops.iter().any(|op| match op {
            Bson::Document(op) => op_matches(spec, op),
            _ => false,
        })
    })
}

/// `prevOpTime` present and not the null OpTime `{ts: Timestamp(0, 0), t: -1}`.
pub fn has_prev_op_time(entry: &Document) -> bool {
    match entry.get_document("prevOpTime") {
        Ok(p) => match p.get("ts") {
            Some(Bson::Timestamp(ts)) => ts.time != 0 || ts.increment != 0,
            _ => false,
        },
        Err(_) => false,
    }
}

/// The marker key of a matching `n` entry (`o2.shardCollection`, ...).
pub fn marker_of(spec: &ChangeStreamSpec, entry: &Document) -> Option<&'static str> {
    let o2 = entry.get_document("o2").ok()?;
    let ns = entry.get_str("ns").ok()?;
    let (marker, system) = MARKERS.iter().find(|(m, _)| o2.contains_key(m))?;
    let visible = !*system || spec.options.show_system_events;
    (visible && ns_matches(spec, ns)).then_some(*marker)
}

/// CRUD on `<db>.system.views` of a watched database: view DDL events, for database and
/// cluster streams with `showExpandedEvents`.
pub(crate) fn view_definition_matches(spec: &ChangeStreamSpec, ns: &str) -> bool {
    if !spec.options.show_expanded_events {
        return false;
    }
    match ns.strip_suffix(".system.views") {
        Some(db) => match spec.level {
            StreamLevel::Collection => false,
            StreamLevel::Database => db == spec.db,
            StreamLevel::Cluster => db_visible_to_cluster(db) && !db.contains('.'),
        },
        None => false,
    }
}

/// Whether the full namespace `db.coll` is watched.
pub fn ns_matches(spec: &ChangeStreamSpec, ns: &str) -> bool {
    match ns.split_once('.') {
        Some((db, coll)) => ns_matches_parts(spec, db, coll),
        None => false,
    }
}

fn ns_matches_parts(spec: &ChangeStreamSpec, db: &str, coll: &str) -> bool {
    match spec.level {
        StreamLevel::Collection => db == spec.db && spec.coll.as_deref() == Some(coll),
        StreamLevel::Database => db == spec.db && coll_visible(spec, coll),
        StreamLevel::Cluster => db_visible_to_cluster(db) && coll_visible(spec, coll),
    }
}

fn db_visible_to_cluster(db: &str) -> bool {
    !db.is_empty() && !matches!(db, "admin" | "config" | "local")
}

/// The collection lookahead of database and cluster streams.
fn coll_visible(spec: &ChangeStreamSpec, coll: &str) -> bool {
    if coll.is_empty() || coll.starts_with('$') {
        return false;
    }
    match coll.strip_prefix("system.") {
        None => true,
        Some(rest) => {
            spec.options.show_system_events
                && (rest == "js"
                    || rest == "views"
                    || rest.starts_with("resharding.")
                    || rest.starts_with("buckets."))
        }
    }
}

#[cfg(test)]
mod tests;
