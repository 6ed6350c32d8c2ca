//! Table-driven tests of update semantics (results, field order, error codes) and property
//! tests of the diff invariants.

use bson::{Bson, DateTime, Document, Timestamp, bson, doc};

use super::values::doc_binary_eq;
use super::*;

const NOW_MS: i64 = 1_700_000_000_000;
const NOW_TS: Timestamp = Timestamp {
    time: 1_700_000_000,
    increment: 7,
};

fn ctx() -> UpdateContext {
    UpdateContext::new(DateTime::from_millis(NOW_MS), NOW_TS)
}

fn upsert_ctx() -> UpdateContext {
    UpdateContext {
        is_upsert_insert: true,
        ..ctx()
    }
}

enum Expect {
    Doc(Document),
    Code(i32),
}

struct Case {
    name: &'static str,
    doc: Document,
    update: Bson,
    filters: Vec<Bson>,
    query: Option<Document>,
    ctx: UpdateContext,
    expect: Expect,
}

fn case(name: &'static str, doc: Document, update: Bson, expect: Expect) -> Case {
    Case {
        name,
        doc,
        update,
        filters: Vec::new(),
        query: None,
        ctx: ctx(),
        expect,
    }
}

fn ok(name: &'static str, doc: Document, update: Bson, out: Document) -> Case {
    case(name, doc, update, Expect::Doc(out))
}

fn fails(name: &'static str, doc: Document, update: Bson, code: i32) -> Case {
    case(name, doc, update, Expect::Code(code))
}

fn run_case(c: &Case) -> Result<(Document, DiffOutcome)> {
    let spec = UpdateSpec::parse(&c.update, Some(&c.filters))?;
    spec.apply_logged(&c.doc, &c.ctx, c.query.as_ref())
}

/// Runs a table: every case's result (byte-for-byte, field order included) or error code, and
/// for successes the logging invariants: `Unchanged` exactly when nothing changed, and the
/// logged diff (and the calculated diff) reproduce the new document from the old one.
fn check(cases: Vec<Case>) {
    for c in &cases {
        let before = c.doc.clone();
        let got = run_case(c);
        assert!(
            doc_binary_eq(&before, &c.doc),
            "{}: input was mutated",
            c.name
        );
        match (&c.expect, got) {
            (Expect::Doc(want), Ok((new, outcome))) => {
                assert!(
                    doc_binary_eq(&new, want),
                    "{}:\n  got  {new}\n  want {want}",
                    c.name
                );
                check_logging(c.name, &c.doc, &new, &outcome);
            }
            (Expect::Code(code), Err(e)) => {
                assert_eq!(e.code, *code, "{}: wrong error {e}", c.name);
            }
            (Expect::Doc(want), Err(e)) => panic!("{}: want {want}, got error {e}", c.name),
            (Expect::Code(code), Ok((new, _))) => {
                panic!("{}: want error {code}, got {new}", c.name)
            }
        }
    }
}

fn check_logging(name: &str, old: &Document, new: &Document, outcome: &DiffOutcome) {
    match outcome {
        DiffOutcome::Unchanged => {
            assert!(
                doc_binary_eq(old, new),
                "{name}: Unchanged but the document changed"
            )
        }
        DiffOutcome::Diff(d) => {
            assert!(
                !doc_binary_eq(old, new),
                "{name}: a diff for a no-op update"
            );
            let replayed = apply_diff(old, d).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(
                doc_binary_eq(&replayed, new),
                "{name}: logged diff {d} replays to {replayed}, not {new}"
            );
        }
        DiffOutcome::Replacement => {
            assert!(
                !doc_binary_eq(old, new),
                "{name}: a replacement for a no-op"
            )
        }
    }
    if let Some(d) = diff(old, new) {
        let replayed = apply_diff(old, &d).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(doc_binary_eq(&replayed, new), "{name}: calculated diff {d}");
    }
}

fn logged(doc: Document, update: Bson) -> DiffOutcome {
    let spec = UpdateSpec::parse(&update, None).unwrap();
    spec.apply_logged(&doc, &ctx(), None).unwrap().1
}

#[test]
fn set_and_unset_semantics_and_field_order() {
    check(vec![
        ok(
            "set keeps an existing field's position",
            doc! {"_id": 1, "a": 1, "b": 2},
            bson!({"$set": {"a": 5}}),
            doc! {"_id": 1, "a": 5, "b": 2},
        ),
        ok(
            "set appends a new field",
            doc! {"_id": 1, "a": 1},
            bson!({"$set": {"c": 3}}),
            doc! {"_id": 1, "a": 1, "c": 3},
        ),
        ok(
            "new siblings are created in name order, numbers numerically",
            doc! {"_id": 1},
            bson!({"$set": {"z": 1, "a": 2, "10": 3, "9": 4}}),
            doc! {"_id": 1, "9": 4, "10": 3, "a": 2, "z": 1},
        ),
        ok(
            "order holds across operators",
            doc! {"_id": 1},
            bson!({"$set": {"b": 1}, "$inc": {"a": 1}}),
            doc! {"_id": 1, "a": 1, "b": 1},
        ),
        ok(
            "dotted path creates documents",
            doc! {"_id": 1},
            bson!({"$set": {"a.b.c": 1}}),
            doc! {"_id": 1, "a": {"b": {"c": 1}}},
        ),
        ok(
            "dotted siblings share the created parent",
            doc! {"_id": 1},
            bson!({"$set": {"a.z": 1, "a.b": 2}}),
            doc! {"_id": 1, "a": {"b": 2, "z": 1}},
        ),
        ok(
            "numeric component indexes an array",
            doc! {"_id": 1, "a": [1, 2, 3]},
            bson!({"$set": {"a.1": 9}}),
            doc! {"_id": 1, "a": [1, 9, 3]},
        ),
        ok(
            "setting past the end pads with nulls",
            doc! {"_id": 1, "a": [1]},
            bson!({"$set": {"a.3": 4}}),
            doc! {"_id": 1, "a": [1, null, null, 4]},
        ),
        ok(
            "numeric component is a field name in a document",
            doc! {"_id": 1, "a": {}},
            bson!({"$set": {"a.0": 1}}),
            doc! {"_id": 1, "a": {"0": 1}},
        ),
        ok(
            "numeric components under a created parent are fields",
            doc! {"_id": 1},
            bson!({"$set": {"a.0.b": 1}}),
            doc! {"_id": 1, "a": {"0": {"b": 1}}},
        ),
        ok(
            "set into an array element document",
            doc! {"_id": 1, "a": [{"x": 1}]},
            bson!({"$set": {"a.0.y": 2}}),
            doc! {"_id": 1, "a": [{"x": 1, "y": 2}]},
        ),
        ok(
            "set to the same value is a no-op",
            doc! {"_id": 1, "a": 1},
            bson!({"$set": {"a": 1}}),
            doc! {"_id": 1, "a": 1},
        ),
        ok(
            "int to double of equal value is a change",
            doc! {"_id": 1, "a": 1},
            bson!({"$set": {"a": 1.0}}),
            doc! {"_id": 1, "a": 1.0},
        ),
        ok(
            "empty operator document is a no-op",
            doc! {"_id": 1, "a": 1},
            bson!({"$set": {}}),
            doc! {"_id": 1, "a": 1},
        ),
        ok(
            "set _id to the same value is allowed",
            doc! {"_id": 1, "a": 1},
            bson!({"$set": {"_id": 1}}),
            doc! {"_id": 1, "a": 1},
        ),
        ok(
            "nested $-prefixed fields are allowed",
            doc! {"_id": 1},
            bson!({"$set": {"a.$b": 1}}),
            doc! {"_id": 1, "a": {"$b": 1}},
        ),
        fails(
            "path through a scalar",
            doc! {"_id": 1, "a": 5},
            bson!({"$set": {"a.b": 1}}),
            28,
        ),
        fails(
            "non-numeric field of an array",
            doc! {"_id": 1, "a": [1]},
            bson!({"$set": {"a.b": 1}}),
            28,
        ),
        fails(
            "changing _id",
            doc! {"_id": 1},
            bson!({"$set": {"_id": 2}}),
            66,
        ),
        fails(
            "changing a field of _id",
            doc! {"_id": {"x": 1}},
            bson!({"$set": {"_id.x": 2}}),
            66,
        ),
        fails(
            "unsetting _id",
            doc! {"_id": 1},
            bson!({"$unset": {"_id": 1}}),
            66,
        ),
        fails(
            "top-level $-field on an existing document",
            doc! {"_id": 1},
            bson!({"$set": {"$x": 1}}),
            52,
        ),
        fails("empty path", doc! {"_id": 1}, bson!({"$set": {"": 1}}), 56),
        fails(
            "empty path component",
            doc! {"_id": 1},
            bson!({"$set": {"a..b": 1}}),
            56,
        ),
        ok(
            "unset removes",
            doc! {"_id": 1, "a": 1, "b": 2},
            bson!({"$unset": {"a": ""}}),
            doc! {"_id": 1, "b": 2},
        ),
        ok(
            "unset of a missing field is a no-op",
            doc! {"_id": 1},
            bson!({"$unset": {"a.b": 1}}),
            doc! {"_id": 1},
        ),
        ok(
            "unset through a scalar is a no-op",
            doc! {"_id": 1, "a": 5},
            bson!({"$unset": {"a.b": 1}}),
            doc! {"_id": 1, "a": 5},
        ),
        ok(
            "unset of an array element sets null",
            doc! {"_id": 1, "a": [1, 2]},
            bson!({"$unset": {"a.0": 1}}),
            doc! {"_id": 1, "a": [null, 2]},
        ),
        ok(
            "unset nested",
            doc! {"_id": 1, "a": {"b": 1, "c": 2}},
            bson!({"$unset": {"a.b": 1}}),
            doc! {"_id": 1, "a": {"c": 2}},
        ),
    ]);
}

#[test]
fn parse_errors_and_conflicts() {
    check(vec![
        fails(
            "unknown modifier",
            doc! {"_id": 1},
            bson!({"$foo": {"a": 1}}),
            9,
        ),
        fails(
            "non-operator after an operator",
            doc! {"_id": 1},
            bson!({"$set": {"a": 1}, "b": 1}),
            9,
        ),
        fails(
            "operator argument not a document",
            doc! {"_id": 1},
            bson!({"$set": 1}),
            9,
        ),
        fails(
            "same path twice",
            doc! {"_id": 1},
            bson!({"$set": {"a": 1}, "$inc": {"a": 1}}),
            40,
        ),
        fails(
            "path below another",
            doc! {"_id": 1},
            bson!({"$set": {"a": 1, "a.b": 1}}),
            40,
        ),
        fails(
            "path above another",
            doc! {"_id": 1},
            bson!({"$set": {"a.b": 1}, "$unset": {"a": 1}}),
            40,
        ),
        fails(
            "setOnInsert conflicts even when not inserting",
            doc! {"_id": 1},
            bson!({"$set": {"a": 1}, "$setOnInsert": {"a": 1}}),
            40,
        ),
        fails(
            "update of the wrong type",
            doc! {"_id": 1},
            Bson::Int32(1),
            14,
        ),
        fails(
            "positional first",
            doc! {"_id": 1},
            bson!({"$set": {"$": 1}}),
            2,
        ),
        fails(
            "array filter and field on one array",
            doc! {"_id": 1, "a": [1]},
            bson!({"$set": {"a.$[]": 1, "a.0": 2}}),
            40,
        ),
    ]);
    let e = UpdateSpec::parse(&bson!({"$set": {"a": 1, "a.b": 2}}), None).unwrap_err();
    assert_eq!(
        e.errmsg,
        "Updating the path 'a.b' would create a conflict at 'a'"
    );
    let e = UpdateSpec::parse(&bson!({"$foo": {"a": 1}}), None).unwrap_err();
    assert!(
        e.errmsg.starts_with("Unknown modifier: $foo"),
        "{}",
        e.errmsg
    );
}

#[test]
fn arithmetic_operators() {
    check(vec![
        ok(
            "inc an int",
            doc! {"_id": 1, "a": 1},
            bson!({"$inc": {"a": 2}}),
            doc! {"_id": 1, "a": 3},
        ),
        ok(
            "inc overflowing int32 becomes int64",
            doc! {"_id": 1, "a": i32::MAX},
            bson!({"$inc": {"a": 1}}),
            doc! {"_id": 1, "a": 2_147_483_648_i64},
        ),
        ok(
            "inc int by double is double",
            doc! {"_id": 1, "a": 1},
            bson!({"$inc": {"a": 0.5}}),
            doc! {"_id": 1, "a": 1.5},
        ),
        ok(
            "inc creates a missing field",
            doc! {"_id": 1},
            bson!({"$inc": {"a.b": 5_i64}}),
            doc! {"_id": 1, "a": {"b": 5_i64}},
        ),
        ok(
            "inc by zero is a no-op",
            doc! {"_id": 1, "a": 1},
            bson!({"$inc": {"a": 0}}),
            doc! {"_id": 1, "a": 1},
        ),
        fails(
            "inc of a string",
            doc! {"_id": 1, "a": "x"},
            bson!({"$inc": {"a": 1}}),
            14,
        ),
        fails(
            "inc by a string",
            doc! {"_id": 1, "a": 1},
            bson!({"$inc": {"a": "x"}}),
            14,
        ),
        fails(
            "int64 overflow",
            doc! {"_id": 1, "a": i64::MAX},
            bson!({"$inc": {"a": 1}}),
            2,
        ),
        ok(
            "mul",
            doc! {"_id": 1, "a": 3},
            bson!({"$mul": {"a": 2}}),
            doc! {"_id": 1, "a": 6},
        ),
        ok(
            "mul of a missing field makes a zero of the multiplier's type",
            doc! {"_id": 1},
            bson!({"$mul": {"a": 2.5, "b": 3_i64, "c": 4}}),
            doc! {"_id": 1, "a": 0.0, "b": 0_i64, "c": 0},
        ),
        fails(
            "mul of a string",
            doc! {"_id": 1, "a": "x"},
            bson!({"$mul": {"a": 2}}),
            14,
        ),
        ok(
            "min lowers",
            doc! {"_id": 1, "a": 5},
            bson!({"$min": {"a": 3}}),
            doc! {"_id": 1, "a": 3},
        ),
        ok(
            "min keeps a lower value",
            doc! {"_id": 1, "a": 5},
            bson!({"$min": {"a": 7}}),
            doc! {"_id": 1, "a": 5},
        ),
        ok(
            "min of equal numbers of other types keeps the value",
            doc! {"_id": 1, "a": 5},
            bson!({"$min": {"a": 5.0}}),
            doc! {"_id": 1, "a": 5},
        ),
        ok(
            "min compares across types",
            doc! {"_id": 1, "a": "x"},
            bson!({"$min": {"a": 1}}),
            doc! {"_id": 1, "a": 1},
        ),
        ok(
            "max raises",
            doc! {"_id": 1, "a": 5},
            bson!({"$max": {"a": 7}}),
            doc! {"_id": 1, "a": 7},
        ),
        ok(
            "max creates",
            doc! {"_id": 1},
            bson!({"$max": {"a": 7}}),
            doc! {"_id": 1, "a": 7},
        ),
        ok(
            "bit and/or/xor",
            doc! {"_id": 1, "a": 0b1100, "b": 0b1100_i64},
            bson!({"$bit": {"a": {"and": 0b1010, "or": 1}, "b": {"xor": 0b0110}}}),
            doc! {"_id": 1, "a": 0b1001, "b": 0b1010_i64},
        ),
        fails(
            "bit of a double",
            doc! {"_id": 1, "a": 1.0},
            bson!({"$bit": {"a": {"and": 1}}}),
            2,
        ),
    ]);
}

#[test]
fn current_date_set_on_insert_and_rename() {
    let now = Bson::DateTime(DateTime::from_millis(NOW_MS));
    let mut upsert = ok(
        "setOnInsert applies when inserting",
        doc! {"_id": 1},
        bson!({"$setOnInsert": {"a": 1}, "$set": {"b": 2}}),
        doc! {"_id": 1, "a": 1, "b": 2},
    );
    upsert.ctx = upsert_ctx();
    let mut dollar = ok(
        "top-level $-field allowed when inserting",
        doc! {},
        bson!({"$set": {"$x": 1}}),
        doc! {"$x": 1},
    );
    dollar.ctx = upsert_ctx();
    check(vec![
        ok(
            "currentDate true",
            doc! {"_id": 1},
            bson!({"$currentDate": {"a": true}}),
            doc! {"_id": 1, "a": now.clone()},
        ),
        ok(
            "currentDate date type",
            doc! {"_id": 1, "a": 1},
            bson!({"$currentDate": {"a": {"$type": "date"}}}),
            doc! {"_id": 1, "a": now},
        ),
        ok(
            "currentDate timestamp",
            doc! {"_id": 1},
            bson!({"$currentDate": {"a": {"$type": "timestamp"}}}),
            doc! {"_id": 1, "a": NOW_TS},
        ),
        fails(
            "currentDate bad type",
            doc! {"_id": 1},
            bson!({"$currentDate": {"a": {"$type": "x"}}}),
            2,
        ),
        fails(
            "currentDate bad value",
            doc! {"_id": 1},
            bson!({"$currentDate": {"a": 1}}),
            2,
        ),
        ok(
            "setOnInsert is ignored on update",
            doc! {"_id": 1},
            bson!({"$setOnInsert": {"a": 1}}),
            doc! {"_id": 1},
        ),
        upsert,
        dollar,
        ok(
            "rename appends the new name",
            doc! {"_id": 1, "a": 1, "b": 2},
            bson!({"$rename": {"a": "c"}}),
            doc! {"_id": 1, "b": 2, "c": 1},
        ),
        ok(
            "rename onto an existing field writes it in place",
            doc! {"_id": 1, "a": 1, "b": 2, "c": 3},
            bson!({"$rename": {"c": "a"}}),
            doc! {"_id": 1, "a": 3, "b": 2},
        ),
        ok(
            "rename of a missing field is a no-op",
            doc! {"_id": 1},
            bson!({"$rename": {"a": "b"}}),
            doc! {"_id": 1},
        ),
        ok(
            "rename nested to top level",
            doc! {"_id": 1, "x": {"y": 1, "z": 2}},
            bson!({"$rename": {"x.y": "w"}}),
            doc! {"_id": 1, "x": {"z": 2}, "w": 1},
        ),
        ok(
            "rename into a new nested path",
            doc! {"_id": 1, "a": 1},
            bson!({"$rename": {"a": "b.c"}}),
            doc! {"_id": 1, "b": {"c": 1}},
        ),
        fails(
            "rename target not a string",
            doc! {"_id": 1, "a": 1},
            bson!({"$rename": {"a": 1}}),
            2,
        ),
        fails(
            "rename to itself",
            doc! {"_id": 1, "a": 1},
            bson!({"$rename": {"a": "a"}}),
            2,
        ),
        fails(
            "rename onto its own path",
            doc! {"_id": 1, "a": 1},
            bson!({"$rename": {"a": "a.b"}}),
            2,
        ),
        fails(
            "rename through an array",
            doc! {"_id": 1, "a": [{"b": 1}]},
            bson!({"$rename": {"a.0.b": "c"}}),
            2,
        ),
        fails(
            "rename into an array",
            doc! {"_id": 1, "a": 1, "c": [{}]},
            bson!({"$rename": {"a": "c.0.x"}}),
            2,
        ),
        fails(
            "rename of _id",
            doc! {"_id": 1},
            bson!({"$rename": {"_id": "x"}}),
            66,
        ),
        fails(
            "rename to _id",
            doc! {"_id": 1, "a": 2},
            bson!({"$rename": {"a": "_id"}}),
            66,
        ),
        fails(
            "rename conflicts with a set of the source",
            doc! {"_id": 1},
            bson!({"$rename": {"a": "b"}, "$set": {"a": 1}}),
            40,
        ),
        fails(
            "rename through a scalar",
            doc! {"_id": 1, "a": 5},
            bson!({"$rename": {"a.b": "c"}}),
            28,
        ),
    ]);
}

#[test]
fn array_operators() {
    check(vec![
        ok(
            "push appends",
            doc! {"_id": 1, "a": [1]},
            bson!({"$push": {"a": 2}}),
            doc! {"_id": 1, "a": [1, 2]},
        ),
        ok(
            "push creates the array",
            doc! {"_id": 1},
            bson!({"$push": {"a": {"x": 1}}}),
            doc! {"_id": 1, "a": [{"x": 1}]},
        ),
        ok(
            "push each",
            doc! {"_id": 1, "a": [1]},
            bson!({"$push": {"a": {"$each": [2, 3]}}}),
            doc! {"_id": 1, "a": [1, 2, 3]},
        ),
        ok(
            "push empty each creates an empty array",
            doc! {"_id": 1},
            bson!({"$push": {"a": {"$each": []}}}),
            doc! {"_id": 1, "a": []},
        ),
        ok(
            "push at position 0",
            doc! {"_id": 1, "a": [1, 2]},
            bson!({"$push": {"a": {"$each": [0], "$position": 0}}}),
            doc! {"_id": 1, "a": [0, 1, 2]},
        ),
        ok(
            "push at a negative position",
            doc! {"_id": 1, "a": [1, 2, 3]},
            bson!({"$push": {"a": {"$each": [9], "$position": -1}}}),
            doc! {"_id": 1, "a": [1, 2, 9, 3]},
        ),
        ok(
            "push with a negative slice keeps the tail",
            doc! {"_id": 1, "a": [1, 2, 3]},
            bson!({"$push": {"a": {"$each": [4], "$slice": -2}}}),
            doc! {"_id": 1, "a": [3, 4]},
        ),
        ok(
            "push with slice 0 empties",
            doc! {"_id": 1, "a": [1]},
            bson!({"$push": {"a": {"$each": [2], "$slice": 0}}}),
            doc! {"_id": 1, "a": []},
        ),
        ok(
            "push with sort",
            doc! {"_id": 1, "a": [3, 1]},
            bson!({"$push": {"a": {"$each": [2], "$sort": 1}}}),
            doc! {"_id": 1, "a": [1, 2, 3]},
        ),
        ok(
            "push sorting by a field, descending, then slicing",
            doc! {"_id": 1, "a": [{"s": 1}, {"s": 5}]},
            bson!({"$push": {"a": {"$each": [{"s": 3}], "$sort": {"s": -1}, "$slice": 2}}}),
            doc! {"_id": 1, "a": [{"s": 5}, {"s": 3}]},
        ),
        ok(
            "push a document holding $slice without $each pushes it",
            doc! {"_id": 1, "a": []},
            bson!({"$push": {"a": {"x": 1, "$slice": 1}}}),
            doc! {"_id": 1, "a": [{"x": 1, "$slice": 1}]},
        ),
        fails(
            "push to a non-array",
            doc! {"_id": 1, "a": 1},
            bson!({"$push": {"a": 2}}),
            2,
        ),
        fails(
            "push each of a non-array",
            doc! {"_id": 1},
            bson!({"$push": {"a": {"$each": 1}}}),
            2,
        ),
        fails(
            "push unknown clause",
            doc! {"_id": 1},
            bson!({"$push": {"a": {"$each": [1], "$foo": 1}}}),
            2,
        ),
        fails(
            "push invalid sort",
            doc! {"_id": 1},
            bson!({"$push": {"a": {"$each": [1], "$sort": 2}}}),
            2,
        ),
        fails(
            "push fractional slice",
            doc! {"_id": 1},
            bson!({"$push": {"a": {"$each": [1], "$slice": 1.5}}}),
            2,
        ),
        ok(
            "addToSet adds a new value",
            doc! {"_id": 1, "a": [1]},
            bson!({"$addToSet": {"a": 2}}),
            doc! {"_id": 1, "a": [1, 2]},
        ),
        ok(
            "addToSet skips an equal value",
            doc! {"_id": 1, "a": [1]},
            bson!({"$addToSet": {"a": 1.0}}),
            doc! {"_id": 1, "a": [1]},
        ),
        ok(
            "addToSet each dedups",
            doc! {"_id": 1, "a": [1]},
            bson!({"$addToSet": {"a": {"$each": [1, 2, 2, 3]}}}),
            doc! {"_id": 1, "a": [1, 2, 3]},
        ),
        ok(
            "addToSet creates",
            doc! {"_id": 1},
            bson!({"$addToSet": {"a": {"$each": [1, 1]}}}),
            doc! {"_id": 1, "a": [1]},
        ),
        fails(
            "addToSet to a non-array",
            doc! {"_id": 1, "a": 1},
            bson!({"$addToSet": {"a": 2}}),
            2,
        ),
        ok(
            "pop last",
            doc! {"_id": 1, "a": [1, 2, 3]},
            bson!({"$pop": {"a": 1}}),
            doc! {"_id": 1, "a": [1, 2]},
        ),
        ok(
            "pop first",
            doc! {"_id": 1, "a": [1, 2, 3]},
            bson!({"$pop": {"a": -1}}),
            doc! {"_id": 1, "a": [2, 3]},
        ),
        ok(
            "pop of an empty array is a no-op",
            doc! {"_id": 1, "a": []},
            bson!({"$pop": {"a": 1}}),
            doc! {"_id": 1, "a": []},
        ),
        ok(
            "pop of a missing field is a no-op",
            doc! {"_id": 1},
            bson!({"$pop": {"a": 1}}),
            doc! {"_id": 1},
        ),
        fails(
            "pop of a non-array",
            doc! {"_id": 1, "a": 1},
            bson!({"$pop": {"a": 1}}),
            14,
        ),
        fails(
            "pop by 2",
            doc! {"_id": 1, "a": [1]},
            bson!({"$pop": {"a": 2}}),
            9,
        ),
        ok(
            "pull by value, numerically",
            doc! {"_id": 1, "a": [1, 2, 1.0, 3]},
            bson!({"$pull": {"a": 1}}),
            doc! {"_id": 1, "a": [2, 3]},
        ),
        ok(
            "pull by condition",
            doc! {"_id": 1, "a": [5, 6, 7, 1]},
            bson!({"$pull": {"a": {"$gte": 6}}}),
            doc! {"_id": 1, "a": [5, 1]},
        ),
        ok(
            "pull documents by a query on their fields",
            doc! {"_id": 1, "a": [{"x": 1, "y": 2}, {"x": 2}, 1]},
            bson!({"$pull": {"a": {"x": 1}}}),
            doc! {"_id": 1, "a": [{"x": 2}, 1]},
        ),
        ok(
            "pull of a missing field is a no-op",
            doc! {"_id": 1},
            bson!({"$pull": {"a": 1}}),
            doc! {"_id": 1},
        ),
        fails(
            "pull from a non-array",
            doc! {"_id": 1, "a": 1},
            bson!({"$pull": {"a": 1}}),
            2,
        ),
        ok(
            "pullAll",
            doc! {"_id": 1, "a": [1, 2, 3, 2]},
            bson!({"$pullAll": {"a": [2, 3]}}),
            doc! {"_id": 1, "a": [1]},
        ),
        fails(
            "pullAll of a non-array argument",
            doc! {"_id": 1, "a": [1]},
            bson!({"$pullAll": {"a": 1}}),
            2,
        ),
    ]);
}

#[test]
fn positional_and_array_filters() {
    let mut positional = ok(
        "positional $ updates the element the query matched",
        doc! {"_id": 1, "a": [{"x": 1}, {"x": 2}, {"x": 2}]},
        bson!({"$set": {"a.$.y": 5}}),
        doc! {"_id": 1, "a": [{"x": 1}, {"x": 2, "y": 5}, {"x": 2}]},
    );
    positional.query = Some(doc! {"_id": 1, "a.x": 2});
    let mut positional_scalar = ok(
        "positional $ on scalar elements",
        doc! {"_id": 1, "a": [3, 4, 5]},
        bson!({"$inc": {"a.$": 10}}),
        doc! {"_id": 1, "a": [3, 14, 5]},
    );
    positional_scalar.query = Some(doc! {"a": {"$gt": 3}});
    let mut elem_match = ok(
        "positional $ with $elemMatch",
        doc! {"_id": 1, "a": [{"x": 1, "y": 1}, {"x": 1, "y": 2}]},
        bson!({"$set": {"a.$.z": true}}),
        doc! {"_id": 1, "a": [{"x": 1, "y": 1}, {"x": 1, "y": 2, "z": true}]},
    );
    elem_match.query = Some(doc! {"a": {"$elemMatch": {"x": 1, "y": 2}}});
    let no_query = fails(
        "positional $ without a matching query",
        doc! {"_id": 1, "a": [1]},
        bson!({"$set": {"a.$": 2}}),
        2,
    );
    let mut filtered = ok(
        "$[id] updates the elements its filter matches",
        doc! {"_id": 1, "a": [1, 2, 3]},
        bson!({"$set": {"a.$[x]": 0}}),
        doc! {"_id": 1, "a": [1, 0, 0]},
    );
    filtered.filters = vec![bson!({"x": {"$gte": 2}})];
    let mut nested = ok(
        "$[] and $[id] nested",
        doc! {"_id": 1, "a": [{"b": [1, 5]}, {"b": [6]}]},
        bson!({"$inc": {"a.$[].b.$[big]": 100}}),
        doc! {"_id": 1, "a": [{"b": [1, 105]}, {"b": [106]}]},
    );
    nested.filters = vec![bson!({"big": {"$gt": 4}})];
    let mut by_field = ok(
        "$[id] filtering on element fields",
        doc! {"_id": 1, "a": [{"k": "x", "v": 1}, {"k": "y", "v": 2}]},
        bson!({"$set": {"a.$[e].v": 9}}),
        doc! {"_id": 1, "a": [{"k": "x", "v": 9}, {"k": "y", "v": 2}]},
    );
    by_field.filters = vec![bson!({"e.k": "x"})];
    let mut unused = fails(
        "unused array filter",
        doc! {"_id": 1},
        bson!({"$set": {"a": 1}}),
        9,
    );
    unused.filters = vec![bson!({"x": 1})];
    let mut missing_filter = fails(
        "identifier without a filter",
        doc! {"_id": 1, "a": [1]},
        bson!({"$set": {"a.$[y]": 1}}),
        2,
    );
    missing_filter.filters = vec![];
    let mut bad_id = fails(
        "identifier must start with a lowercase letter",
        doc! {"_id": 1},
        bson!({"$set": {"a.$[X]": 1}}),
        2,
    );
    bad_id.filters = vec![bson!({"X": 1})];
    let mut dup = fails(
        "two filters for one identifier",
        doc! {"_id": 1},
        bson!({"$set": {"a.$[x]": 1}}),
        9,
    );
    dup.filters = vec![bson!({"x": 1}), bson!({"x": 2})];
    let mut overlap = fails(
        "$[] and $[x] landing on the same element",
        doc! {"_id": 1, "a": [1, 2]},
        bson!({"$set": {"a.$[]": 0, "a.$[x]": 1}}),
        40,
    );
    overlap.filters = vec![bson!({"x": 2})];
    let mut merged = ok(
        "$[] and $[x] on different fields of one element merge",
        doc! {"_id": 1, "a": [{"k": 1}, {"k": 2}]},
        bson!({"$set": {"a.$[].z": 0, "a.$[x].b": 1}}),
        doc! {"_id": 1, "a": [{"k": 1, "z": 0}, {"k": 2, "b": 1, "z": 0}]},
    );
    merged.filters = vec![bson!({"x.k": 2})];
    check(vec![
        positional,
        positional_scalar,
        elem_match,
        no_query,
        ok(
            "$[] updates every element",
            doc! {"_id": 1, "a": [1, 2, 3]},
            bson!({"$inc": {"a.$[]": 10}}),
            doc! {"_id": 1, "a": [11, 12, 13]},
        ),
        ok(
            "$[] over an empty array is a no-op",
            doc! {"_id": 1, "a": []},
            bson!({"$inc": {"a.$[]": 10}}),
            doc! {"_id": 1, "a": []},
        ),
        fails(
            "$[] on a missing array",
            doc! {"_id": 1},
            bson!({"$set": {"a.$[]": 1}}),
            2,
        ),
        fails(
            "$[] on a non-array",
            doc! {"_id": 1, "a": 1},
            bson!({"$set": {"a.$[]": 1}}),
            2,
        ),
        fails(
            "$[] into scalar elements",
            doc! {"_id": 1, "a": [1]},
            bson!({"$set": {"a.$[].b": 1}}),
            28,
        ),
        filtered,
        nested,
        by_field,
        unused,
        missing_filter,
        bad_id,
        dup,
        overlap,
        merged,
    ]);
}

#[test]
fn replacement_semantics() {
    let mut shard_key = fails(
        "replacement changing a shard key field",
        doc! {"_id": 1, "sk": 1},
        bson!({"sk": 2}),
        66,
    );
    shard_key.ctx.immutable_paths = vec!["sk".into()];
    let mut shard_key_set = fails(
        "operator changing a shard key field",
        doc! {"_id": 1, "sk": {"a": 1}},
        bson!({"$set": {"sk.a": 2}}),
        66,
    );
    shard_key_set.ctx.immutable_paths = vec!["sk.a".into()];
    check(vec![
        ok(
            "replacement keeps _id",
            doc! {"_id": 1, "a": 1},
            bson!({"b": 2}),
            doc! {"_id": 1, "b": 2},
        ),
        ok(
            "replacement puts _id first",
            doc! {"_id": 1, "a": 1},
            bson!({"b": 2, "_id": 1}),
            doc! {"_id": 1, "b": 2},
        ),
        ok(
            "empty replacement",
            doc! {"_id": 1, "a": 1},
            bson!({}),
            doc! {"_id": 1},
        ),
        ok(
            "identical replacement",
            doc! {"_id": 1, "a": 1},
            bson!({"a": 1}),
            doc! {"_id": 1, "a": 1},
        ),
        fails(
            "replacement with another _id",
            doc! {"_id": 1},
            bson!({"_id": 2}),
            66,
        ),
        fails(
            "replacement with a $-field",
            doc! {"_id": 1},
            bson!({"a": 1, "$set": {"b": 1}}),
            52,
        ),
        shard_key,
        shard_key_set,
        fails(
            "pipeline with a forbidden stage",
            doc! {"_id": 1},
            bson!([{"$match": {}}]),
            72,
        ),
        fails(
            "pipeline stage not a document",
            doc! {"_id": 1},
            bson!([1]),
            14,
        ),
    ]);
    assert!(
        UpdateSpec::parse(&bson!({"a": 1}), None)
            .unwrap()
            .is_replacement()
    );
    assert!(
        !UpdateSpec::parse(&bson!({"$set": {"a": 1}}), None)
            .unwrap()
            .is_replacement()
    );
    let e = UpdateSpec::parse(&bson!({"$set": {"a": 1}}), None)
        .unwrap()
        .apply(&doc! {"_id": 1}, &ctx())
        .map(|d| d.len());
    assert_eq!(e, Ok(2));
    let e = UpdateSpec::parse(&bson!({"_id": 2}), None)
        .unwrap()
        .apply(&doc! {"_id": 1}, &ctx())
        .unwrap_err();
    assert_eq!(
        e.errmsg,
        "After applying the update, the (immutable) field '_id' was found to have been altered to _id: 2"
    );
    let e = UpdateSpec::parse(&bson!({"$set": {"_id": 2}}), None)
        .unwrap()
        .apply(&doc! {"_id": 1}, &ctx())
        .unwrap_err();
    assert_eq!(
        e.errmsg,
        "Performing an update on the path '_id' would modify the immutable field '_id'"
    );
}

#[test]
fn pipeline_updates() {
    check(
        vec![
            ok(
                "$set with an expression",
                doc! {"_id": 1, "a": 1},
                bson!([{"$set": {"b": {"$add": ["$a", 1]}}}]),
                doc! {"_id": 1, "a": 1, "b": 2},
            ),
            ok(
                "$addFields then $unset",
                doc! {"_id": 1, "a": 1, "c": 3},
                bson!([{"$addFields": {"b": "$c"}}, {"$unset": "c"}]),
                doc! {"_id": 1, "a": 1, "b": 3},
            ),
            ok(
                "$project keeps _id",
                doc! {"_id": 1, "a": 1, "b": 2},
                bson!([{"$project": {"b": 1}}]),
                doc! {"_id": 1, "b": 2},
            ),
            ok(
                "$project excluding _id keeps it anyway",
                doc! {"_id": 1, "a": 1, "b": 2},
                bson!([{"$project": {"_id": 0, "b": 1}}]),
                doc! {"_id": 1, "b": 2},
            ),
            ok(
                "$replaceWith keeps _id first",
                doc! {"_id": 1, "a": {"x": 1}},
                bson!([{"$replaceWith": "$a"}]),
                doc! {"_id": 1, "x": 1},
            ),
            ok(
                "$replaceRoot",
                doc! {"_id": 1, "a": {"x": 1}},
                bson!([{"$replaceRoot": {"newRoot": {"y": "$a.x"}}}]),
                doc! {"_id": 1, "y": 1},
            ),
            ok(
                "a no-op pipeline",
                doc! {"_id": 1, "a": 1},
                bson!([{"$set": {"a": 1}}]),
                doc! {"_id": 1, "a": 1},
            ),
            fails(
                "$replaceWith changing _id",
                doc! {"_id": 1},
                bson!([{"$replaceWith": {"_id": 2}}]),
                66,
            ),
            fails(
                "pipeline with arrayFilters",
                doc! {"_id": 1},
                bson!([{"$set": {"a": 1}}]),
                9,
            ),
        ]
        .into_iter()
        .map(|mut c| {
            if c.name == "pipeline with arrayFilters" {
                c.filters = vec![bson!({"x": 1})];
            }
            c
        })
        .collect(),
    );
    let old =
        doc! {"_id": 1, "big": "a fairly long string value to make the diff worth it", "n": 1};
    let spec = UpdateSpec::parse(&bson!([{"$set": {"n": 2}}]), None).unwrap();
    let (_, outcome) = spec.apply_logged(&old, &ctx(), None).unwrap();
    assert_eq!(outcome, DiffOutcome::Diff(doc! {"u": {"n": 2}}));
    let (_, outcome) = UpdateSpec::parse(&bson!([{"$replaceWith": {"z": 1}}]), None)
        .unwrap()
        .apply_logged(&old, &ctx(), None)
        .unwrap();
    assert_eq!(outcome, DiffOutcome::Replacement);
}

#[test]
fn operator_updates_log_mongodb_shaped_diffs() {
    let cases: Vec<(Document, Bson, Document)> = vec![
        (
            doc! {"_id": 1, "a": 1},
            bson!({"$set": {"a": 2}}),
            doc! {"u": {"a": 2}},
        ),
        (
            doc! {"_id": 1},
            bson!({"$set": {"b": 2}}),
            doc! {"i": {"b": 2}},
        ),
        // A $set of a whole sub-document logs the whole value, not a nested diff.
        (
            doc! {"_id": 1, "a": {"x": 1, "y": 1}},
            bson!({"$set": {"a": {"x": 1, "y": 2}}}),
            doc! {"u": {"a": {"x": 1, "y": 2}}},
        ),
        (
            doc! {"_id": 1, "a": {"x": 1}},
            bson!({"$set": {"a.x": 2, "a.y": 3}}),
            doc! {"sa": {"u": {"x": 2}, "i": {"y": 3}}},
        ),
        (
            doc! {"_id": 1},
            bson!({"$set": {"a.b.c": 1}}),
            doc! {"i": {"a": {"b": {"c": 1}}}},
        ),
        (
            doc! {"_id": 1, "a": 1, "b": 2},
            bson!({"$unset": {"a": 1}}),
            doc! {"d": {"a": false}},
        ),
        (
            doc! {"_id": 1, "a": [1, 2]},
            bson!({"$push": {"a": 3}}),
            doc! {"sa": {"a": true, "u2": 3}},
        ),
        (
            doc! {"_id": 1, "a": []},
            bson!({"$push": {"a": 3}}),
            doc! {"u": {"a": [3]}},
        ),
        (
            doc! {"_id": 1, "a": [3, 1]},
            bson!({"$push": {"a": {"$each": [2], "$sort": 1}}}),
            doc! {"u": {"a": [1, 2, 3]}},
        ),
        (
            doc! {"_id": 1, "a": [1]},
            bson!({"$addToSet": {"a": {"$each": [2, 3]}}}),
            doc! {"sa": {"a": true, "u1": 2, "u2": 3}},
        ),
        (
            doc! {"_id": 1, "a": [1, 2, 3]},
            bson!({"$pull": {"a": 2}}),
            doc! {"u": {"a": [1, 3]}},
        ),
        (
            doc! {"_id": 1, "a": [1, 2, 3]},
            bson!({"$pop": {"a": 1}}),
            doc! {"u": {"a": [1, 2]}},
        ),
        (
            doc! {"_id": 1, "a": [1, 2]},
            bson!({"$unset": {"a.1": 1}}),
            doc! {"sa": {"a": true, "u1": null}},
        ),
        (
            doc! {"_id": 1, "a": [1]},
            bson!({"$set": {"a.3": 4}}),
            doc! {"sa": {"a": true, "u3": 4}},
        ),
        (
            doc! {"_id": 1, "a": [{"b": 1}]},
            bson!({"$inc": {"a.0.b": 1}}),
            doc! {"sa": {"a": true, "s0": {"u": {"b": 2}}}},
        ),
        (
            doc! {"_id": 1, "a": 1, "b": 2},
            bson!({"$rename": {"a": "c"}}),
            doc! {"d": {"a": false}, "i": {"c": 1}},
        ),
        (
            doc! {"_id": 1, "a": 1},
            bson!({"$set": {"b": 1}, "$unset": {"a": 1}, "$inc": {"c.d": 1}}),
            doc! {"d": {"a": false}, "i": {"b": 1, "c": {"d": 1}}},
        ),
    ];
    for (doc, update, want) in cases {
        match logged(doc.clone(), update.clone()) {
            DiffOutcome::Diff(d) => {
                assert!(doc_binary_eq(&d, &want), "{update}: got {d}, want {want}")
            }
            other => panic!("{update}: got {other:?}"),
        }
    }
    assert_eq!(
        logged(doc! {"_id": 1, "a": 1}, bson!({"$set": {"a": 1}})),
        DiffOutcome::Unchanged
    );
    assert_eq!(
        logged(doc! {"_id": 1, "a": 1}, bson!({"b": 1})),
        DiffOutcome::Replacement
    );
}

#[test]
fn calculated_diffs_have_mongodb_shape() {
    let old = doc! {"_id": 1, "a": 1, "b": {"c": 1, "d": 2, "pad": "xxxxxxxxxxxxxxxxxxxxxxxx"}, "arr": [1, 2, 3, "yyyyyyyyyyyyyyyyyyy"], "gone": true};
    let new = doc! {"_id": 1, "a": "one", "b": {"c": 1, "d": 3, "pad": "xxxxxxxxxxxxxxxxxxxxxxxx"}, "arr": [1, 2], "e": 5};
    let d = diff(&old, &new).unwrap();
    let want = doc! {
        "d": {"gone": false},
        "u": {"a": "one"},
        "i": {"e": 5},
        "sb": {"u": {"d": 3}},
        "sarr": {"a": true, "l": 2},
    };
    assert!(doc_binary_eq(&d, &want), "got {d}");
    assert!(doc_binary_eq(&apply_diff(&old, &d).unwrap(), &new));
    assert_eq!(diff_or_replacement(&old, &new), DiffOutcome::Diff(want));
    assert_eq!(diff(&old, &old), None);
    assert_eq!(diff_or_replacement(&old, &old), DiffOutcome::Unchanged);
    // Everything changed: the diff is bigger than the document.
    assert_eq!(
        diff_or_replacement(&doc! {"a": 1}, &doc! {"b": 2}),
        DiffOutcome::Replacement
    );
}

#[test]
fn reordered_fields_are_reinserted() {
    let old = doc! {"a": 1, "b": 2, "c": 3};
    let new = doc! {"c": 3, "b": 2, "a": 1};
    let d = diff(&old, &new).unwrap();
    assert!(doc_binary_eq(&d, &doc! {"i": {"b": 2, "a": 1}}), "got {d}");
    assert!(doc_binary_eq(&apply_diff(&old, &d).unwrap(), &new));
}

#[test]
fn apply_diff_follows_oplog_application_rules() {
    let old = doc! {"a": 1, "b": [1, 2], "c": {"x": 1}, "d": 4};
    // An insert of an existing field moves it to the end; a sub-diff on the wrong type gives
    // null; an array diff pads with nulls; a `u` of a missing field appends it.
    let d = doc! {
        "u": {"z": 0},
        "i": {"a": 10},
        "sb": {"a": true, "u4": 5},
        "sd": {"u": {"y": 1}},
        "sc": {"a": true, "l": 0},
    };
    let got = apply_diff(&old, &d).unwrap();
    let want = doc! {"b": [1, 2, null, null, 5], "c": null, "d": null, "z": 0, "a": 10};
    assert!(doc_binary_eq(&got, &want), "got {got}");
    let got = apply_diff(
        &doc! {"b": [1, 2, 3]},
        &doc! {"sb": {"a": true, "l": 5, "u1": 9}},
    )
    .unwrap();
    assert!(
        doc_binary_eq(&got, &doc! {"b": [1, 9, 3, null, null]}),
        "got {got}"
    );
}

#[test]
fn malformed_diffs_are_errors() {
    let old = doc! {"a": 1};
    for bad in [
        doc! {"x": 1},
        doc! {"u": 1},
        doc! {"u": {"a": 1}, "d": {"a": false}},
        doc! {"sa": 1},
        doc! {"sa": {"a": true, "q1": 1}},
        doc! {"sa": {"a": true, "l": -1}},
        doc! {"b": {}},
    ] {
        let old_arr = doc! {"a": [1]};
        let r1 = apply_diff(&old, &bad);
        let r2 = apply_diff(&old_arr, &bad);
        assert!(r1.is_err() || r2.is_err(), "{bad} was accepted");
    }
    let huge = doc! {"sa": {"a": true, "u999999999": 1}};
    assert!(apply_diff(&doc! {"a": []}, &huge).is_err());
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    const KEYS: &[&str] = &["a", "b", "c", "0", "1"];

    fn leaf() -> impl Strategy<Value = Bson> {
        prop_oneof![
            (0..3i32).prop_map(Bson::Int32),
            (0..3i64).prop_map(Bson::Int64),
            prop_oneof![Just(1.0), Just(0.5)].prop_map(Bson::Double),
            prop_oneof![Just("x"), Just("y")].prop_map(|s| Bson::String(s.into())),
            any::<bool>().prop_map(Bson::Boolean),
            Just(Bson::Null),
        ]
    }

    fn value() -> impl Strategy<Value = Bson> {
        leaf().prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Bson::Array),
                prop::collection::vec((prop::sample::select(KEYS), inner), 0..4).prop_map(
                    |fields| {
                        let mut d = Document::new();
                        for (k, v) in fields {
                            d.insert(k, v);
                        }
                        Bson::Document(d)
                    }
                ),
            ]
        })
    }

    fn document() -> impl Strategy<Value = Document> {
        prop::collection::vec((prop::sample::select(KEYS), value()), 0..5).prop_map(|fields| {
            let mut d = Document::new();
            d.insert("_id", 1);
            for (k, v) in fields {
                d.insert(k, v);
            }
            d
        })
    }

    const PATHS: &[&str] = &[
        "a", "b", "c", "a.b", "a.0", "a.1", "b.c", "b.0.a", "c.1", "a.$[]", "b.$[]", "a.b.c",
    ];

    fn operator_update() -> impl Strategy<Value = Bson> {
        let op = prop::sample::select(
            &[
                "$set",
                "$unset",
                "$inc",
                "$mul",
                "$min",
                "$max",
                "$push",
                "$addToSet",
                "$pop",
                "$pull",
                "$rename",
                "$currentDate",
            ][..],
        );
        prop::collection::vec((op, prop::sample::select(PATHS), value()), 1..4).prop_map(|ops| {
            let mut u = Document::new();
            for (op, path, v) in ops {
                let v = match op {
                    "$inc" | "$mul" => Bson::Int32(2),
                    "$pop" => Bson::Int32(-1),
                    "$currentDate" => Bson::Boolean(true),
                    "$rename" => {
                        Bson::String(if path.starts_with('a') { "c" } else { "a" }.to_string())
                    }
                    _ => v,
                };
                let entry = u
                    .entry(op.to_string())
                    .or_insert_with(|| Document::new().into());
                if let Bson::Document(d) = entry {
                    d.insert(path, v);
                }
            }
            Bson::Document(u)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn diff_of_identical_documents_is_none(x in document()) {
            prop_assert_eq!(diff(&x, &x.clone()), None);
            prop_assert_eq!(diff_or_replacement(&x, &x.clone()), DiffOutcome::Unchanged);
        }

        #[test]
        fn applying_the_diff_reproduces_the_new_document(old in document(), new in document()) {
            match diff(&old, &new) {
                None => prop_assert!(doc_binary_eq(&old, &new)),
                Some(d) => {
                    let replayed = apply_diff(&old, &d).unwrap();
                    prop_assert!(doc_binary_eq(&replayed, &new), "diff {} gave {} not {}", d, replayed, new);
                }
            }
            if let DiffOutcome::Diff(d) = diff_or_replacement(&old, &new) {
                let replayed = apply_diff(&old, &d).unwrap();
                prop_assert!(doc_binary_eq(&replayed, &new));
            }
        }

        #[test]
        fn operator_updates_replay_through_both_diffs(old in document(), u in operator_update()) {
            let Ok(spec) = UpdateSpec::parse(&u, None) else { return Ok(()) };
            let Ok((new, outcome)) = spec.apply_logged(&old, &ctx(), None) else { return Ok(()) };
            if let Some(d) = diff(&old, &new) {
                let replayed = apply_diff(&old, &d).unwrap();
                prop_assert!(doc_binary_eq(&replayed, &new), "calculated diff {} for {}", d, u);
            }
            match outcome {
                DiffOutcome::Unchanged => prop_assert!(doc_binary_eq(&old, &new), "{} said unchanged", u),
                DiffOutcome::Diff(d) => {
                    prop_assert!(!doc_binary_eq(&old, &new), "{} logged {} for a no-op", u, d);
                    let replayed = apply_diff(&old, &d).unwrap();
                    prop_assert!(doc_binary_eq(&replayed, &new), "logged diff {} for {} on {} gave {} not {}", d, u, old, replayed, new);
                }
                DiffOutcome::Replacement => prop_assert!(false, "operator update logged as a replacement"),
            }
        }
    }
}
