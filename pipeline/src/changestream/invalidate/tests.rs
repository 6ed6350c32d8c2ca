use bson::doc;

use super::*;
use crate::changestream::test_util::*;
use crate::changestream::transform::Transformer;

fn ev(spec: &ChangeStreamSpec, entry: &bson::Document) -> ChangeEvent {
    Transformer::new(spec).transform(entry).unwrap().unwrap()
}

#[test]
fn invalidating_types_per_level() {
    use StreamLevel::*;
    let cases = [
        ("drop", true, false, false),
        ("rename", true, false, false),
        ("dropDatabase", true, true, false),
        ("insert", false, false, false),
        ("create", false, false, false),
    ];
    for (t, coll, db, cluster) in cases {
        assert_eq!(is_invalidating(Collection, t), coll, "collection {t}");
        assert_eq!(is_invalidating(Database, t), db, "database {t}");
        assert_eq!(is_invalidating(Cluster, t), cluster, "cluster {t}");
    }
}

#[test]
fn invalidate_follows_its_trigger_with_the_same_token_from_invalidate() {
    let s = coll_spec("db", "c");
    let drop = ev(&s, &cmd("db", 9, doc! {"drop": "c"}));
    let mut check = CheckInvalidate::new(&s);
    let (trigger, inv) = check.process(drop.clone()).unwrap();
    let inv = inv.unwrap();
    assert_eq!(trigger.token, drop.token);
    assert!(inv.data.from_invalidate());
    assert_eq!(inv.data, drop.data.clone().with_from_invalidate(true));
    assert!(
        inv.token > drop.token,
        "an invalidate sorts right after its trigger"
    );
    assert_eq!(
        inv.doc,
        doc! {"_id": inv.token.to_document(), "operationType": "invalidate",
        "clusterTime": ts(9, 1), "wallTime": wall(9000)}
    );
    assert_eq!(check.invalidated(), Some(&inv.token));
}

#[test]
fn non_invalidating_events_pass_alone() {
    let s = db_spec("db");
    let mut check = CheckInvalidate::new(&s);
    let (_, inv) = check
        .process(ev(&s, &cmd("db", 9, doc! {"drop": "c"})))
        .unwrap();
    assert!(
        inv.is_none(),
        "a drop does not invalidate a database stream"
    );
    let (_, inv) = check
        .process(ev(&s, &cmd("db", 10, doc! {"dropDatabase": 1})))
        .unwrap();
    assert!(inv.is_some(), "dropDatabase does");
    let k = cluster_spec();
    let mut check = CheckInvalidate::new(&k);
    let (_, inv) = check
        .process(ev(&k, &cmd("db", 10, doc! {"dropDatabase": 1})))
        .unwrap();
    assert!(
        inv.is_none() && check.invalidated().is_none(),
        "cluster streams never invalidate"
    );
}

#[test]
fn start_after_an_invalidate_swallows_only_the_first_invalidation() {
    let s = coll_spec("db", "c");
    let old_drop = ev(&s, &cmd("db", 9, doc! {"drop": "c"}));
    let client = old_drop.data.clone().with_from_invalidate(true);
    let mut spec = s.clone();
    spec.start = StartPoint::StartAfter(client);

    // The first event is the drop whose invalidate is the client's token: the invalidate is
    // re-generated (for the resume check to find) but does not close the stream.
    let mut check = CheckInvalidate::new(&spec);
    let (_, inv) = check.process(old_drop.clone()).unwrap();
    assert!(inv.is_some());
    assert!(check.invalidated().is_none());
    // A later drop (after a recreate) invalidates normally.
    let (_, inv) = check
        .process(ev(&s, &cmd("db", 20, doc! {"drop": "c"})))
        .unwrap();
    assert!(inv.is_some());
    assert!(check.invalidated().is_some());

    // On a shard whose first event is some other invalidating event: it passes, no invalidate.
    let mut check = CheckInvalidate::new(&spec);
    let (e, inv) = check
        .process(ev(&s, &cmd("db", 12, doc! {"drop": "c"})))
        .unwrap();
    assert_eq!(e.operation_type(), "drop");
    assert!(inv.is_none() && check.invalidated().is_none());

    // Only the first event is special, whatever it is.
    let mut check = CheckInvalidate::new(&spec);
    check
        .process(ev(&s, &insert("db.c", 10, doc! {"_id": 1})))
        .unwrap();
    let (_, inv) = check
        .process(ev(&s, &cmd("db", 12, doc! {"drop": "c"})))
        .unwrap();
    assert!(inv.is_some() && check.invalidated().is_some());
}
