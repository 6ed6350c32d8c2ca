//! Interop: tokens encoded by this crate are decoded by the public npm package
//! `mongodb-resumetoken-decoder` (run through node, see `tests/interop/decode.js`), and every
//! field it reports must match what we encoded.
//!
//! The decoder ignores `_typeBits` (so int32/int64/double/decimal all come back as JS numbers,
//! decimals approximately) and stops before `fragmentNum`; everything else is compared exactly.
//! Skips loudly when node or the npm package is not installed; install it with
//! `npm --prefix resume/tests/interop install`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use bson::{Bson, Document};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use resume::{ClusterTime, ResumeTokenData, TokenVersion, event_identifier};
use serde_json::{Value, json};

fn interop_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("interop")
}

/// Returns the reason to skip, if node or the package is missing.
fn missing_prerequisite() -> Option<String> {
    match Command::new("node").arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => return Some("`node` is not installed".into()),
    }
    let pkg = interop_dir()
        .join("node_modules")
        .join("mongodb-resumetoken-decoder");
    if !pkg.exists() {
        return Some(format!(
            "the npm package is not installed at {} (run `npm --prefix resume/tests/interop install`)",
            pkg.display()
        ));
    }
    None
}

fn decode_with_node(hexes: &[String]) -> Vec<Value> {
    let mut child = Command::new("node")
        .arg(interop_dir().join("decode.js"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn node");
    let input = serde_json::to_vec(hexes).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "node failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("decoder output is JSON")
}

/// JS property order: array-index-like keys first (ascending), then the rest in insertion order.
fn js_key_order(d: &Document) -> Vec<(&String, &Bson)> {
    let index = |k: &str| -> Option<u64> {
        if k == "0"
            || (!k.starts_with('0') && !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
        {
            k.parse::<u64>().ok().filter(|n| *n < u64::from(u32::MAX))
        } else {
            None
        }
    };
    let mut ints: Vec<_> = d
        .iter()
        .filter_map(|(k, v)| index(k).map(|n| (n, (k, v))))
        .collect();
    ints.sort_by_key(|(n, _)| *n);
    let mut out: Vec<_> = ints.into_iter().map(|(_, kv)| kv).collect();
    out.extend(d.iter().filter(|(k, _)| index(k).is_none()));
    out
}

/// The decoder reads strings with a default `TextDecoder`, which drops one leading U+FEFF.
fn without_bom(s: &str) -> &str {
    s.strip_prefix('\u{feff}').unwrap_or(s)
}

fn js_number(v: &Value) -> Result<&str, String> {
    v.get("$number")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("expected a number, got {v}"))
}

fn check_number(js: &Value, mine: &Bson) -> Result<(), String> {
    let s = js_number(js)?;
    let exact_int = |n: i128| -> Result<(), String> {
        match s.parse::<i128>() {
            Ok(j) if j == n => Ok(()),
            _ if s.parse::<f64>().ok() == Some(n as f64) => Ok(()),
            _ => Err(format!("number {s} != {n}")),
        }
    };
    let js_f64 = || -> f64 {
        match s {
            "Infinity" => f64::INFINITY,
            "-Infinity" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            _ => s.parse::<f64>().unwrap_or(f64::NAN),
        }
    };
    match mine {
        Bson::Int32(i) => exact_int(i128::from(*i)),
        Bson::Int64(i) => exact_int(i128::from(*i)),
        Bson::Double(d) => {
            let j = js_f64();
            if (d.is_nan() && j.is_nan()) || j == *d {
                Ok(())
            } else {
                Err(format!("double {s} != {d:e}"))
            }
        }
        Bson::Decimal128(dec) => {
            // The decoder only sees the double stored in front of any decimal continuation.
            let x: f64 = dec.to_string().parse().unwrap_or(f64::NAN);
            let j = js_f64();
            let close = (x.is_nan() && j.is_nan())
                || (x.is_infinite() && j == x)
                || (x.abs() > f64::MAX * 0.999_999 && j.is_infinite() && j.signum() == x.signum())
                || (x.abs() < 1e-307 && (j - x).abs() < 1e-307)
                || (j - x).abs() <= x.abs() * 1e-14;
            if close {
                Ok(())
            } else {
                Err(format!("decimal {dec} decoded as {s}"))
            }
        }
        _ => Err(format!("{mine:?} is not a number")),
    }
}

fn check_value(js: &Value, mine: &Bson) -> Result<(), String> {
    let ok = |c: bool| {
        if c {
            Ok(())
        } else {
            Err(format!("{js} != {mine:?}"))
        }
    };
    match mine {
        Bson::Null => ok(js.is_null()),
        Bson::Undefined => ok(js == &json!({"$undefined": true})),
        Bson::Boolean(b) => ok(js == &json!(b)),
        Bson::String(s) | Bson::Symbol(s) => ok(js == &json!(without_bom(s))),
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
            check_number(js, mine)
        }
        Bson::ObjectId(o) => ok(js == &json!({"$oid": o.to_hex()})),
        Bson::Timestamp(t) => ok(js == &json!({"$timestamp": {"t": t.time, "i": t.increment}})),
        Bson::DateTime(d) => {
            let ms = d.timestamp_millis();
            if ms.unsigned_abs() > 8_640_000_000_000_000 {
                ok(js == &json!({"$date": null}))
            } else {
                ok(js == &json!({"$date": ms}))
            }
        }
        Bson::Binary(b) => {
            ok(js == &json!({"$binary": {"hex": hex::encode(&b.bytes), "sub": u8::from(b.subtype)}}))
        }
        Bson::MinKey => ok(js == &json!({"$minKey": 1})),
        Bson::MaxKey => ok(js == &json!({"$maxKey": 1})),
        Bson::RegularExpression(r) => {
            ok(js == &json!({"$regex": r.pattern.as_str(), "$options": r.options.as_str()}))
        }
        Bson::JavaScriptCode(c) => ok(js == &json!({"$code": c})),
        Bson::Array(a) => {
            let items = js
                .get("$array")
                .and_then(Value::as_array)
                .ok_or_else(|| format!("expected array, got {js}"))?;
            if items.len() != a.len() {
                return Err(format!("array length {} != {}", items.len(), a.len()));
            }
            items.iter().zip(a).try_for_each(|(j, m)| check_value(j, m))
        }
        Bson::Document(d) => check_document(js, d),
        other => Err(format!("unexpected value {other:?}")),
    }
}

fn check_document(js: &Value, d: &Document) -> Result<(), String> {
    let pairs = js
        .get("$doc")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("expected document, got {js}"))?;
    let mine = js_key_order(d);
    if pairs.len() != mine.len() {
        return Err(format!(
            "document {js} has {} fields, expected {d}",
            pairs.len()
        ));
    }
    for (pair, (k, v)) in pairs.iter().zip(mine) {
        let jk = pair.get(0).and_then(Value::as_str).unwrap_or_default();
        if jk != without_bom(k) {
            return Err(format!("field {jk:?} != {k:?}"));
        }
        check_value(pair.get(1).unwrap_or(&Value::Null), v).map_err(|e| format!("{k}: {e}"))?;
    }
    Ok(())
}

fn check_token(js: &Value, t: &ResumeTokenData) -> Result<(), String> {
    let js = js
        .get("ok")
        .ok_or_else(|| format!("decoder failed: {js}"))?;
    let field = |k: &str| js.get(k).cloned().unwrap_or(Value::Null);
    let ct = t.cluster_time();
    let eq = |name: &str, a: Value, b: Value| {
        if a == b {
            Ok(())
        } else {
            Err(format!("{name}: decoder says {a}, we encoded {b}"))
        }
    };
    eq(
        "timestamp",
        field("timestamp"),
        json!({"$timestamp": {"t": ct.secs, "i": ct.inc}}),
    )?;
    eq("version", field("version"), json!(t.version().as_i32()))?;
    eq("txnOpIndex", field("txnOpIndex"), json!(t.txn_op_index()))?;
    let uuid = t
        .uuid()
        .map(|u| json!(hex::encode(u.bytes())))
        .unwrap_or(Value::Null);
    eq("uuid", field("uuid"), uuid)?;
    if t.version() >= TokenVersion::V1 {
        eq(
            "tokenType",
            field("tokenType"),
            json!(t.token_type().as_i32()),
        )?;
        eq(
            "fromInvalidate",
            field("fromInvalidate"),
            json!(t.from_invalidate()),
        )?;
    } else {
        eq("tokenType", field("tokenType"), Value::Null)?;
    }
    let key = if t.version() == TokenVersion::V2 {
        "eventIdentifier"
    } else {
        "documentKey"
    };
    match t.event_identifier() {
        None => eq(key, field(key), json!({"$undefined": true})),
        Some(d) => check_document(&field(key), d).map_err(|e| format!("{key}: {e}")),
    }
}

fn sample_tokens() -> Vec<ResumeTokenData> {
    let ts = ClusterTime::new(1_700_000_000, 1);
    let uuid = bson::Uuid::from_bytes([0x5a; 16]);
    let mut out = vec![
        ResumeTokenData::high_water_mark(ts, TokenVersion::V2),
        ResumeTokenData::high_water_mark(ts, TokenVersion::V1),
        ResumeTokenData::event(
            ts,
            TokenVersion::V2,
            7,
            Some(uuid),
            Some(event_identifier(
                "insert",
                Some((
                    "documentKey",
                    bson::doc! {"_id": bson::oid::ObjectId::new()},
                )),
            )),
        )
        .unwrap(),
        ResumeTokenData::event(
            ts,
            TokenVersion::V1,
            0,
            Some(uuid),
            Some(bson::doc! {"_id": 1i64}),
        )
        .unwrap(),
        ResumeTokenData::event(
            ts,
            TokenVersion::V0,
            3,
            Some(uuid),
            Some(bson::doc! {"_id": "x"}),
        )
        .unwrap(),
    ];
    let mut runner = TestRunner::deterministic();
    let strategy = common::arb_token(false);
    for _ in 0..400 {
        out.push(strategy.new_tree(&mut runner).unwrap().current());
    }
    out
}

#[test]
fn npm_decoder_reads_every_field_of_our_tokens() {
    if let Some(why) = missing_prerequisite() {
        eprintln!();
        eprintln!(
            "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
        );
        eprintln!("!!! SKIPPING resume interop test: {why}");
        eprintln!(
            "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
        );
        eprintln!();
        return;
    }
    let tokens = sample_tokens();
    let hexes: Vec<String> = tokens.iter().map(|t| t.encode().data_hex()).collect();
    let decoded = decode_with_node(&hexes);
    assert_eq!(decoded.len(), tokens.len());
    let mut failures = Vec::new();
    for ((t, hex), js) in tokens.iter().zip(&hexes).zip(&decoded) {
        if let Err(e) = check_token(js, t) {
            failures.push(format!("{t}\n  _data {hex}\n  {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} tokens disagree:\n{}",
        failures.len(),
        tokens.len(),
        failures.join("\n")
    );
}

/// Tributary's cluster stamp on a high-water-mark token (`encode_stamped`): the public decoder
/// still reads it, as a high-water mark whose uuid is the cluster's id.
#[test]
fn npm_decoder_reads_a_stamped_high_water_mark() {
    if let Some(why) = missing_prerequisite() {
        eprintln!("!!! SKIPPING resume interop test: {why}");
        return;
    }
    let hwm =
        ResumeTokenData::high_water_mark(ClusterTime::new(1_700_000_000, 7), TokenVersion::V2);
    let cluster = bson::Uuid::from_bytes([0xab; 16]);
    let stamped = hwm.encode_stamped(cluster);
    let decoded = decode_with_node(&[stamped.data_hex()]);
    let js = decoded[0]
        .get("ok")
        .unwrap_or_else(|| panic!("decoder failed: {}", decoded[0]));
    assert_eq!(
        js.get("timestamp"),
        Some(&json!({"$timestamp": {"t": 1_700_000_000u32, "i": 7}}))
    );
    assert_eq!(js.get("tokenType"), Some(&json!(0)));
    assert_eq!(js.get("uuid"), Some(&json!(hex::encode([0xab; 16]))));
    let (plain, stamp) = stamped.unstamp().expect("a stamped token");
    assert_eq!(stamp, cluster);
    assert_eq!(plain.decode().expect("MongoDB's token"), hwm);
}
