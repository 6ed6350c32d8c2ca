use bson::{Document, doc};
use wire::Result;

use super::*;

/// The encoded `updateDescription` of a diff's bytes.
fn from_bytes(diff: &Document, expanded: bool, buffers: &mut DiffBuffers) -> Result<Vec<u8>> {
    let bytes = RawDocumentBuf::try_from(diff).unwrap();
    let mut out = vec![7]; // written after what the buffer holds
    write_raw_update_description(&bytes, expanded, buffers, &mut out)?;
    assert_eq!(out.remove(0), 7);
    Ok(out)
}

/// Parses `diff` both ways, decoded and from its bytes, and checks they agree byte for byte.
fn parse(diff: Document, expanded: bool) -> Document {
    let decoded = parse_diff(&diff).unwrap().into_document(expanded);
    let raw = from_bytes(&diff, expanded, &mut DiffBuffers::default()).unwrap();
    assert_eq!(raw, decoded.to_vec().unwrap(), "{diff}");
    decoded
}

fn raw_diff_fails(diff: &Document) -> bool {
    from_bytes(diff, true, &mut DiffBuffers::default()).is_err()
}

#[test]
fn diff_to_update_description_table() {
    let cases: Vec<(&str, Document, Document)> = vec![
        (
            "set and unset",
            doc! {"d": {"x": false}, "u": {"a": 1}, "i": {"b": 2}},
            doc! {"updatedFields": {"a": 1, "b": 2}, "removedFields": ["x"], "truncatedArrays": []},
        ),
        (
            "u then i then b regardless of key order",
            doc! {"i": {"b": 2}, "b": {"bin": {"o": 0}}, "u": {"a": 1}},
            doc! {"updatedFields": {"a": 1, "b": 2, "bin": {"o": 0}}, "removedFields": [], "truncatedArrays": []},
        ),
        (
            "nested document",
            doc! {"u": {"top": 1}, "sa": {"u": {"b": 1}, "d": {"c": false}, "sd": {"i": {"e": 5}}}},
            doc! {"updatedFields": {"top": 1, "a.b": 1, "a.d.e": 5}, "removedFields": ["a.c"], "truncatedArrays": []},
        ),
        (
            "array truncate",
            doc! {"sarr": {"a": true, "l": 2}},
            doc! {"updatedFields": {}, "removedFields": [], "truncatedArrays": [{"field": "arr", "newSize": 2}]},
        ),
        (
            "array set and nested",
            doc! {"sarr": {"a": true, "u1": 10, "s2": {"u": {"x": 1}}, "u5": {"n": 1}}},
            doc! {"updatedFields": {"arr.1": 10, "arr.2.x": 1, "arr.5": {"n": 1}}, "removedFields": [], "truncatedArrays": []},
        ),
        (
            "array in array",
            doc! {"sm": {"a": true, "s0": {"a": true, "l": 1, "u0": 7}}},
            doc! {"updatedFields": {"m.0.0": 7}, "removedFields": [], "truncatedArrays": [{"field": "m.0", "newSize": 1}]},
        ),
        (
            "empty diff",
            doc! {},
            doc! {"updatedFields": {}, "removedFields": [], "truncatedArrays": []},
        ),
    ];
    for (name, diff, want) in cases {
        assert_eq!(parse(diff, false), want, "{name}");
    }
}

#[test]
fn disambiguated_paths_only_with_expanded_events_and_then_always() {
    let d = parse(doc! {"u": {"a": 1}}, true);
    assert_eq!(d.get_document("disambiguatedPaths").unwrap(), &doc! {});
    assert!(!parse(doc! {"u": {"a": 1}}, false).contains_key("disambiguatedPaths"));
}

#[test]
fn ambiguity_rules() {
    let cases: Vec<(&str, Document, Document)> = vec![
        (
            "numeric first component is not ambiguous",
            doc! {"u": {"0": 1}},
            doc! {},
        ),
        (
            "array index alone is not ambiguous",
            doc! {"sarr": {"a": true, "u3": 1}},
            doc! {},
        ),
        (
            "numeric field below the top is ambiguous",
            doc! {"sa": {"u": {"1": true}}},
            doc! {"a.1": ["a", "1"]},
        ),
        (
            "dotted field name",
            doc! {"u": {"a.b": 1}},
            doc! {"a.b": ["a.b"]},
        ),
        (
            "dotted removed field",
            doc! {"d": {"x.y": false}},
            doc! {"x.y": ["x.y"]},
        ),
        (
            "leading zero is not strictly numeric",
            doc! {"sa": {"u": {"01": 1}}},
            doc! {},
        ),
        (
            "ambiguity sticks to deeper components, indexes as ints",
            doc! {"sa.b": {"sarr": {"a": true, "l": 1, "u0": 5}}},
            doc! {"a.b.arr": ["a.b", "arr"], "a.b.arr.0": ["a.b", "arr", 0]},
        ),
        (
            "index before an ambiguous field",
            doc! {"sarr": {"a": true, "s2": {"u": {"3": 1}}}},
            doc! {"arr.2.3": ["arr", 2, "3"]},
        ),
    ];
    for (name, diff, want) in cases {
        let d = parse(diff, true);
        assert_eq!(
            d.get_document("disambiguatedPaths").unwrap(),
            &want,
            "{name}"
        );
    }
}

#[test]
fn malformed_diffs_are_errors() {
    for diff in [
        doc! {"x": 1},
        doc! {"u": 1},
        doc! {"d": []},
        doc! {"sa": 5},
        doc! {"sa": {"a": true, "l": -1}},
        doc! {"sa": {"a": true, "ux": 1}},
        doc! {"sa": {"a": true, "q1": 1}},
        doc! {"sa": {"a": true, "l": "2"}},
        doc! {"sa": {"a": true, "é1": 1}},
        doc! {"sa": {"a": true, "é": 1}},
    ] {
        assert!(parse_diff(&diff).is_err(), "{diff}");
        assert!(raw_diff_fails(&diff), "{diff} from its bytes");
    }
}

#[test]
fn deep_diffs_do_not_overflow() {
    let mut d = doc! {"u": {"x": 1}};
    for _ in 0..500 {
        d = doc! {"sa": d};
    }
    assert!(parse_diff(&d).is_err());
    assert!(raw_diff_fails(&d));
}

/// One set of buffers serves diff after diff, failed ones included.
#[test]
fn reused_buffers_give_the_same_bytes() {
    let diffs = [
        doc! {"u": {"a": 1}, "d": {"x": false}, "sarr": {"a": true, "l": 2, "u0": 1}},
        doc! {"sa.b": {"sarr": {"a": true, "l": 1, "u0": 5}}, "d": {"1.2": false}},
        doc! {"sa": {"a": true, "ux": 1}},
        doc! {"i": {"n": {"deep": [1, 2]}}},
        doc! {},
    ];
    let mut buffers = DiffBuffers::default();
    for _ in 0..2 {
        for d in &diffs {
            for expanded in [false, true] {
                let fresh = from_bytes(d, expanded, &mut DiffBuffers::default());
                let reused = from_bytes(d, expanded, &mut buffers);
                match (fresh, reused) {
                    (Ok(f), Ok(r)) => assert_eq!(f, r, "{d}"),
                    (Err(f), Err(r)) => assert_eq!(f.to_string(), r.to_string(), "{d}"),
                    (f, r) => panic!("{d}: {f:?} vs {r:?}"),
                }
            }
        }
    }
}

/// A diff damaged anywhere (into bytes that decode to themselves) fails from its bytes where its
/// decoded form fails, with the same error, and otherwise gives what its decoded form gives;
/// never a panic.
#[test]
fn damaged_diffs_fail_or_agree_with_their_decoded_form() {
    let diff = doc! {
        "u": {"a": 1, "s": "str"}, "d": {"x": false},
        "sarr": {"a": true, "l": 2, "u0": {"n": 1}, "s1": {"u": {"1": true}}},
        "sdoc": {"i": {"k": [1, 2]}},
    };
    let bytes = RawDocumentBuf::try_from(&diff).unwrap().into_bytes();
    let mut buffers = DiffBuffers::default();
    let (mut agreed, mut failed) = (0, 0);
    for at in 4..bytes.len() - 1 {
        for value in [0x00, 0x01, 0x02, 0x03, 0x04, 0x08, 0x10, 0x7F, 0xFF] {
            let mut damaged = bytes.clone();
            damaged[at] = value;
            let Ok(raw) = RawDocument::from_bytes(&damaged) else {
                continue;
            };
            let mut out = Vec::new();
            let got = write_raw_update_description(raw, true, &mut buffers, &mut out);
            // Updated values are copied as they are, not read: compare only where decoding
            // keeps the bytes (damage inside a value, or array keys out of order, show only
            // once decoded).
            let Ok(decoded) = Document::try_from(raw) else {
                continue;
            };
            if decoded.to_vec().unwrap() != damaged {
                continue;
            }
            match (got, parse_diff(&decoded)) {
                (Ok(()), Ok(want)) => {
                    assert_eq!(
                        out,
                        want.into_document(true).to_vec().unwrap(),
                        "{damaged:?}"
                    );
                    agreed += 1;
                }
                (Err(got), Err(want)) => {
                    assert_eq!(got.to_string(), want.to_string());
                    failed += 1;
                }
                (got, want) => panic!("{damaged:?}: {got:?} vs {want:?}"),
            }
        }
    }
    assert!(agreed > 0 && failed > 0, "the damage reaches both outcomes");
}
