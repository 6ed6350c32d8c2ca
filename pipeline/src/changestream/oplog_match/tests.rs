use bson::{Document, doc};

use super::*;
use crate::changestream::test_util::*;

fn txn(ops: Vec<Document>, extra: Document) -> Document {
    let mut e = cmd("admin", 20, doc! {"applyOps": ops});
    e.remove("ui");
    e.insert("lsid", doc! {"id": uuid(9)});
    e.insert("txnNumber", 1_i64);
    e.insert("prevOpTime", doc! {"ts": ts(0, 0), "t": -1_i64});
    e.extend(extra);
    e
}

fn inner(ns: &str, id: i32) -> Document {
    doc! {"op": "i", "ns": ns, "ui": uuid(1), "o": {"_id": id}}
}

#[test]
fn namespace_rules_per_stream_level() {
    let c = coll_spec("db", "c");
    let d = db_spec("db");
    let k = cluster_spec();
    // (entry ns, collection stream, database stream, cluster stream)
    let cases = [
        ("db.c", true, true, true),
        ("db.other", false, true, true),
        ("db.c.sub", false, true, true),
        ("dbx.c", false, false, true),
        ("db.system.js", false, false, false),
        ("db.system.views", false, false, false),
        ("db.$special", false, false, false),
        ("admin.c", false, false, false),
        ("config.c", false, false, false),
        ("local.c", false, false, false),
        ("adminx.c", false, false, true),
        ("", false, false, false),
    ];
    for (ns, want_c, want_d, want_k) in cases {
        let e = insert(ns, 5, doc! {"_id": 1});
        assert_eq!(matches(&c, &e), want_c, "collection stream, {ns}");
        assert_eq!(matches(&d, &e), want_d, "database stream, {ns}");
        assert_eq!(matches(&k, &e), want_k, "cluster stream, {ns}");
    }
}

#[test]
fn system_events_widen_the_namespace() {
    let mut d = db_spec("db");
    d.options.show_system_events = true;
    for (ns, want) in [
        ("db.system.js", true),
        ("db.system.views", true),
        ("db.system.buckets.m", true),
        ("db.system.resharding.x", true),
        ("db.system.profile", false),
    ] {
        assert_eq!(matches(&d, &insert(ns, 5, doc! {"_id": 1})), want, "{ns}");
    }
}

#[test]
fn from_migrate_is_filtered_unless_asked_for() {
    let mut e = insert("db.c", 5, doc! {"_id": 1});
    e.insert("fromMigrate", true);
    assert!(!matches(&coll_spec("db", "c"), &e));
    let mut s = coll_spec("db", "c");
    s.options.show_migration_events = true;
    assert!(matches(&s, &e));
    // With showSystemEvents, migrated create/createIndexes pass, CRUD does not.
    let mut sys = db_spec("db");
    sys.options.show_system_events = true;
    let mut create = cmd("db", 5, doc! {"create": "c"});
    create.insert("fromMigrate", true);
    assert!(matches(&sys, &create));
    assert!(!matches(&sys, &e));
    // Inside applyOps too.
    let mut op = inner("db.c", 1);
    op.insert("fromMigrate", true);
    assert!(!matches(&coll_spec("db", "c"), &txn(vec![op], doc! {})));
}

#[test]
fn commands_per_stream_level() {
    let c = coll_spec("db", "c");
    let d = db_spec("db");
    let k = cluster_spec();
    let cases: Vec<(&str, Document, bool, bool, bool)> = vec![
        (
            "drop watched",
            cmd("db", 5, doc! {"drop": "c"}),
            true,
            true,
            true,
        ),
        (
            "drop other",
            cmd("db", 5, doc! {"drop": "x"}),
            false,
            true,
            true,
        ),
        (
            "drop system",
            cmd("db", 5, doc! {"drop": "system.js"}),
            false,
            false,
            false,
        ),
        (
            "drop in other db",
            cmd("o", 5, doc! {"drop": "c"}),
            false,
            false,
            true,
        ),
        (
            "rename from",
            cmd("db", 5, doc! {"renameCollection": "db.c", "to": "db.x"}),
            true,
            true,
            true,
        ),
        (
            "rename to",
            cmd("db", 5, doc! {"renameCollection": "db.x", "to": "db.c"}),
            true,
            true,
            true,
        ),
        (
            "rename cross-db into",
            cmd("o", 5, doc! {"renameCollection": "o.x", "to": "db.c"}),
            true,
            true,
            true,
        ),
        (
            "rename unrelated",
            cmd("db", 5, doc! {"renameCollection": "db.x", "to": "db.y"}),
            false,
            true,
            true,
        ),
        (
            "dropDatabase",
            cmd("db", 5, doc! {"dropDatabase": 1}),
            false,
            true,
            true,
        ),
        (
            "dropDatabase other",
            cmd("o", 5, doc! {"dropDatabase": 1}),
            false,
            false,
            true,
        ),
        (
            "dropDatabase admin",
            cmd("admin", 5, doc! {"dropDatabase": 1}),
            false,
            false,
            false,
        ),
        (
            "create",
            cmd("db", 5, doc! {"create": "c"}),
            true,
            true,
            true,
        ),
        (
            "createIndexes",
            cmd(
                "db",
                5,
                doc! {"createIndexes": "c", "v": 2, "key": {"a": 1}, "name": "a_1"},
            ),
            true,
            true,
            true,
        ),
        (
            "commitIndexBuild",
            cmd("db", 5, doc! {"commitIndexBuild": "c", "indexes": []}),
            true,
            true,
            true,
        ),
        (
            "dropIndexes",
            cmd("db", 5, doc! {"dropIndexes": "c", "index": "a_1"}),
            true,
            true,
            true,
        ),
        (
            "collMod",
            cmd("db", 5, doc! {"collMod": "c"}),
            true,
            true,
            true,
        ),
        (
            "startIndexBuild",
            cmd("db", 5, doc! {"startIndexBuild": "c"}),
            false,
            false,
            false,
        ),
        (
            "abortTransaction",
            cmd("admin", 5, doc! {"abortTransaction": 1}),
            false,
            false,
            false,
        ),
    ];
    for (name, e, want_c, want_d, want_k) in cases {
        assert_eq!(matches(&c, &e), want_c, "collection stream, {name}");
        assert_eq!(matches(&d, &e), want_d, "database stream, {name}");
        assert_eq!(matches(&k, &e), want_k, "cluster stream, {name}");
    }
}

#[test]
fn transaction_entries() {
    let c = coll_spec("db", "c");
    let cases: Vec<(&str, Document, bool)> = vec![
        (
            "touches watched",
            txn(vec![inner("db.x", 1), inner("db.c", 2)], doc! {}),
            true,
        ),
        (
            "touches nothing",
            txn(vec![inner("db.x", 1)], doc! {}),
            false,
        ),
        (
            "ends a chain",
            txn(
                vec![inner("db.x", 1)],
                doc! {"prevOpTime": {"ts": ts(19, 1), "t": 1_i64}},
            ),
            true,
        ),
        (
            "partial",
            {
                let mut e = txn(vec![inner("db.c", 1)], doc! {});
                e.get_document_mut("o").unwrap().insert("partialTxn", true);
                e
            },
            false,
        ),
        (
            "prepare",
            {
                let mut e = txn(vec![inner("db.c", 1)], doc! {});
                e.get_document_mut("o").unwrap().insert("prepare", true);
                e
            },
            false,
        ),
        (
            "commit",
            cmd(
                "admin",
                30,
                doc! {"commitTransaction": 1, "commitTimestamp": ts(25, 1)},
            ),
            true,
        ),
        (
            "applyOps not on admin",
            {
                let mut e = txn(vec![inner("db.c", 1)], doc! {});
                e.insert("ns", "db.$cmd");
                e
            },
            false,
        ),
    ];
    for (name, e, want) in cases {
        assert_eq!(matches(&c, &e), want, "{name}");
    }
}

#[test]
fn view_definitions_match_database_and_cluster_streams_with_expanded_events() {
    let e = insert(
        "db.system.views",
        5,
        doc! {"_id": "db.v", "viewOn": "c", "pipeline": []},
    );
    assert!(matches(&expanded(db_spec("db")), &e));
    assert!(matches(&expanded(cluster_spec()), &e));
    assert!(!matches(&db_spec("db"), &e));
    assert!(!matches(&expanded(db_spec("other")), &e));
    // A (system-namespace) collection stream on it sees plain CRUD by exact name.
    assert!(matches(&coll_spec("db", "system.views"), &e));
    let admin = insert(
        "admin.system.views",
        5,
        doc! {"_id": "admin.v", "viewOn": "c"},
    );
    assert!(!matches(&expanded(cluster_spec()), &admin));
}

#[test]
fn marker_noops() {
    let noop = |ns: &str, o2: Document| {
        doc! {"ts": ts(5, 1), "t": 1_i64, "op": "n", "ns": ns, "ui": uuid(1), "o": {"msg": "x"}, "o2": o2}
    };
    let c = coll_spec("db", "c");
    assert!(matches(
        &c,
        &noop("db.c", doc! {"shardCollection": "db.c", "key": {"a": 1}})
    ));
    assert!(!matches(
        &c,
        &noop("db.x", doc! {"shardCollection": "db.x"})
    ));
    assert!(matches(
        &c,
        &noop("db.c", doc! {"reshardCollection": "db.c"})
    ));
    assert!(!matches(
        &c,
        &noop("db.c", doc! {"migrateLastChunkFromShard": "db.c"})
    ));
    let mut sys = coll_spec("db", "c");
    sys.options.show_system_events = true;
    assert!(matches(
        &sys,
        &noop("db.c", doc! {"migrateLastChunkFromShard": "db.c"})
    ));
    // Heartbeats never match.
    let hb = doc! {"ts": ts(5, 1), "t": 1_i64, "op": "n", "ns": "", "o": {"msg": "periodic noop"}};
    assert!(!matches(&cluster_spec(), &hb));
}
