//! The raw mutator: valid frames from the structured generator, then broken at the byte level
//! (bit flips, truncation, wrong `messageLength`, bad section kinds, kind-1 sequences with bad
//! sizes, bad checksums, unknown flag bits and opcodes, OP_COMPRESSED with bad payloads, legacy
//! OP_QUERY, corrupt BSON inside the body, frames back to back, garbage).
//!
//! Invariants: pure and seeded (the bytes are a function of the RNG state and the base
//! request); a mutated frame is never longer than the message size limit plus a few bytes, and
//! never claims more than it carries by more than `i32::MAX` (the server must not trust it).

use bson::doc;
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use wire::message::{Compressor, Message, MsgFlags, Op, OpQuery, opcode};

use super::frame;
use super::generate::Request;
use super::value::EncodeContext;

/// One raw case: the bytes to send (in pieces) and how they were made.
#[derive(Debug, Clone, PartialEq)]
pub struct RawCase {
    /// The structured request the bytes started from.
    pub base: Request,
    pub mutation: String,
    pub bytes: Vec<u8>,
    /// Offsets at which the bytes are split into separate writes (ascending).
    pub splits: Vec<usize>,
}

const HEADER: usize = 16;
/// Where an OP_MSG's first section kind byte and its body start.
const KIND0: usize = HEADER + 4;
const BODY: usize = KIND0 + 1;

/// A mutated frame derived from `base`.
pub fn mutate(rng: &mut StdRng, base: &Request, request_id: i32) -> RawCase {
    let cx = EncodeContext::default();
    let valid =
        frame::command_frame(base, request_id, cx).unwrap_or_else(|_| ping_frame(request_id));
    let (mut bytes, mut mutation) = match rng.random_range(0..16) {
        0 => flip_bits(rng, valid),
        1 => truncate(rng, valid),
        2 => wrong_length(rng, valid),
        3 => bad_section_kind(rng, valid),
        4 => bad_sequence(rng, valid),
        5 => checksum(rng, base, request_id),
        6 => flag_bits(rng, valid),
        7 => unknown_opcode(rng, valid),
        8 => bad_compressed(rng, base, request_id),
        9 => legacy_query(rng, base, request_id),
        10..=12 => corrupt_bson(rng, valid),
        13 => back_to_back(rng, valid, request_id),
        14 => garbage(rng),
        _ => empty_sections(rng, request_id),
    };
    if rng.random_bool(0.1) {
        // A second mutation on top.
        let (b, m) = flip_bits(rng, bytes);
        bytes = b;
        mutation = format!("{mutation}, then {m}");
    }
    let splits = if rng.random_bool(0.2) && bytes.len() > 2 {
        let mut s: Vec<usize> = (0..rng.random_range(1..4))
            .map(|_| rng.random_range(1..bytes.len()))
            .collect();
        s.sort_unstable();
        s.dedup();
        s
    } else {
        Vec::new()
    };
    RawCase {
        base: base.clone(),
        mutation,
        bytes,
        splits,
    }
}

fn ping_frame(request_id: i32) -> Vec<u8> {
    frame::plain_frame(&doc! {"ping": 1, "$db": "admin"}, request_id).unwrap_or_default()
}

fn put_i32(bytes: &mut [u8], at: usize, v: i32) {
    if let Some(dst) = bytes.get_mut(at..at + 4) {
        dst.copy_from_slice(&v.to_le_bytes());
    }
}

fn get_i32(bytes: &[u8], at: usize) -> Option<i32> {
    let b = bytes.get(at..at + 4)?;
    Some(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Rewrites `messageLength` to the frame's real length.
fn fix_length(bytes: &mut [u8]) {
    let len = bytes.len() as i32;
    put_i32(bytes, 0, len);
}

fn awkward_i32(rng: &mut StdRng, near: i32) -> i32 {
    *[
        0,
        -1,
        1,
        4,
        5,
        15,
        16,
        17,
        i32::MIN,
        i32::MAX,
        near.wrapping_sub(1),
        near.wrapping_add(1),
        near.wrapping_mul(2),
        48_000_000,
        48_000_001,
        16 * 1024 * 1024 + 1,
        rng.random(),
    ]
    .choose(rng)
    .unwrap_or(&0)
}

fn flip_bits(rng: &mut StdRng, mut bytes: Vec<u8>) -> (Vec<u8>, String) {
    if bytes.is_empty() {
        return (bytes, "nothing to flip".into());
    }
    let n = rng.random_range(1..=8);
    let mut at = Vec::new();
    for _ in 0..n {
        // Mostly in the first bytes, where the structure is.
        let limit = if rng.random_bool(0.7) {
            bytes.len().min(64)
        } else {
            bytes.len()
        };
        let i = rng.random_range(0..limit);
        bytes[i] ^= 1 << rng.random_range(0..8);
        at.push(i);
    }
    (bytes, format!("flipped bits at {at:?}"))
}

fn truncate(rng: &mut StdRng, mut bytes: Vec<u8>) -> (Vec<u8>, String) {
    let keep = rng.random_range(0..bytes.len().max(1));
    bytes.truncate(keep);
    let fixed = rng.random_bool(0.5);
    if fixed && bytes.len() >= 4 {
        fix_length(&mut bytes);
    }
    (
        bytes,
        format!("truncated to {keep} bytes (messageLength fixed: {fixed})"),
    )
}

fn wrong_length(rng: &mut StdRng, mut bytes: Vec<u8>) -> (Vec<u8>, String) {
    let len = bytes.len() as i32;
    let v = awkward_i32(rng, len);
    put_i32(&mut bytes, 0, v);
    (bytes, format!("messageLength {v} (real {len})"))
}

fn bad_section_kind(rng: &mut StdRng, mut bytes: Vec<u8>) -> (Vec<u8>, String) {
    if rng.random_bool(0.5) && bytes.len() > KIND0 {
        let kind = *[2u8, 3, 0x7f, 0x80, 0xff, 1].choose(rng).unwrap_or(&2);
        bytes[KIND0] = kind;
        (bytes, format!("first section kind {kind}"))
    } else {
        // A trailing section: another body (two kind-0 sections), or an unknown kind.
        let kind = *[0u8, 2, 9, 0xff].choose(rng).unwrap_or(&0);
        bytes.push(kind);
        bytes.extend_from_slice(&[5, 0, 0, 0, 0]);
        fix_length(&mut bytes);
        (bytes, format!("trailing section of kind {kind}"))
    }
}

fn bad_sequence(rng: &mut StdRng, mut bytes: Vec<u8>) -> (Vec<u8>, String) {
    let doc = [5u8, 0, 0, 0, 0];
    let real = 4 + "documents\0".len() + doc.len();
    let (size, what) = match rng.random_range(0..7) {
        0 => (0, "size 0"),
        1 => (3, "size 3"),
        2 => (-5, "negative size"),
        3 => (i32::MAX, "size i32::MAX"),
        4 => (real as i32 + 100, "size past the message"),
        5 => (real as i32 - 3, "size cutting a document"),
        _ => (4, "size 4 (no identifier)"),
    };
    bytes.push(1);
    bytes.extend_from_slice(&size.to_le_bytes());
    if rng.random_bool(0.8) {
        bytes.extend_from_slice(b"documents\0");
    } else {
        bytes.extend_from_slice(b"documents-without-nul");
    }
    bytes.extend_from_slice(&doc);
    if rng.random_bool(0.3) {
        // A document in the sequence whose own length is wrong.
        bytes.extend_from_slice(&[0xff, 0xff, 0, 0, 0]);
    }
    fix_length(&mut bytes);
    (bytes, format!("kind-1 sequence with {what}"))
}

fn checksum(rng: &mut StdRng, base: &Request, request_id: i32) -> (Vec<u8>, String) {
    let msg = frame::message(
        base,
        request_id,
        EncodeContext::default(),
        MsgFlags::CHECKSUM_PRESENT,
        None,
    );
    let Ok(mut bytes) = wire::frame::encode_to_vec(&msg) else {
        return (
            ping_frame(request_id),
            "checksum (base too large: ping)".into(),
        );
    };
    match rng.random_range(0..4) {
        0 => {
            let n = bytes.len();
            bytes[n - 1] ^= 0x55;
            (bytes, "checksum flag with a wrong checksum".into())
        }
        1 => {
            if bytes.len() > BODY + 5 {
                let i = rng.random_range(BODY + 4..bytes.len() - 4);
                bytes[i] ^= 1;
            }
            (
                bytes,
                "checksum flag, body changed after checksumming".into(),
            )
        }
        2 => {
            bytes.truncate(bytes.len() - 4);
            fix_length(&mut bytes);
            (bytes, "checksum flag without a checksum".into())
        }
        _ => (bytes, "valid checksum".into()),
    }
}

fn flag_bits(rng: &mut StdRng, mut bytes: Vec<u8>) -> (Vec<u8>, String) {
    let flags: u32 = *[
        MsgFlags::MORE_TO_COME,
        MsgFlags::EXHAUST_ALLOWED,
        MsgFlags::MORE_TO_COME | MsgFlags::EXHAUST_ALLOWED,
        1 << 2,
        1 << 15,
        1 << 31,
        u32::MAX,
        rng.random(),
    ]
    .choose(rng)
    .unwrap_or(&0);
    if let Some(dst) = bytes.get_mut(HEADER..HEADER + 4) {
        dst.copy_from_slice(&flags.to_le_bytes());
    }
    (bytes, format!("flagBits {flags:#x}"))
}

fn unknown_opcode(rng: &mut StdRng, mut bytes: Vec<u8>) -> (Vec<u8>, String) {
    let op = *[
        0,
        -1,
        opcode::OP_REPLY,
        1000,
        2001,
        2002,
        2005,
        2006,
        2007,
        2010,
        2011,
        2014,
        i32::MAX,
        rng.random(),
    ]
    .choose(rng)
    .unwrap_or(&0);
    put_i32(&mut bytes, 12, op);
    (bytes, format!("opCode {op}"))
}

fn bad_compressed(rng: &mut StdRng, base: &Request, request_id: i32) -> (Vec<u8>, String) {
    let compressor = *[
        Compressor::Noop,
        Compressor::Snappy,
        Compressor::Zlib,
        Compressor::Zstd,
    ]
    .choose(rng)
    .unwrap_or(&Compressor::Noop);
    let msg = frame::message(
        base,
        request_id,
        EncodeContext::default(),
        0,
        Some(compressor),
    );
    let Ok(mut bytes) = wire::frame::encode_to_vec(&msg) else {
        return (
            ping_frame(request_id),
            "compressed (base too large: ping)".into(),
        );
    };
    // OP_COMPRESSED: header, originalOpcode (16), uncompressedSize (20), compressorId (24),
    // then the payload (25).
    let what = match rng.random_range(0..8) {
        0 => {
            let real = get_i32(&bytes, 20).unwrap_or(0);
            let v = awkward_i32(rng, real);
            put_i32(&mut bytes, 20, v);
            format!("uncompressedSize {v} (real {real})")
        }
        1 => {
            let id = *[4u8, 5, 0x80, 0xff].choose(rng).unwrap_or(&4);
            if let Some(b) = bytes.get_mut(24) {
                *b = id;
            }
            format!("compressorId {id}")
        }
        2 => {
            for b in bytes.iter_mut().skip(25) {
                *b = rng.random();
            }
            "random payload".into()
        }
        3 => {
            let keep = rng.random_range(25..bytes.len().max(26));
            bytes.truncate(keep);
            fix_length(&mut bytes);
            format!("payload cut to {} bytes", keep.saturating_sub(25))
        }
        4 => {
            let op = *[opcode::OP_COMPRESSED, opcode::OP_REPLY, 0, 2010, -1]
                .choose(rng)
                .unwrap_or(&0);
            put_i32(&mut bytes, 16, op);
            format!("originalOpcode {op}")
        }
        5 => {
            // A bomb: a small payload claiming to inflate to almost the limit.
            let zeros = vec![0u8; 1 << 20];
            let packed = wire::compression::compress(Compressor::Zlib, &zeros).unwrap_or_default();
            bytes.truncate(16);
            bytes.extend_from_slice(&opcode::OP_MSG.to_le_bytes());
            bytes.extend_from_slice(&(47_999_000i32).to_le_bytes());
            bytes.push(Compressor::Zlib.id());
            bytes.extend_from_slice(&packed);
            fix_length(&mut bytes);
            "zlib payload inflating to 1 MB of zeros, claiming 48 MB".into()
        }
        6 => {
            let (b, m) = flip_bits(rng, bytes);
            bytes = b;
            format!("compressed frame, {m}")
        }
        _ => format!("valid {} frame", compressor.name()),
    };
    (bytes, format!("OP_COMPRESSED: {what}"))
}

fn legacy_query(rng: &mut StdRng, base: &Request, request_id: i32) -> (Vec<u8>, String) {
    let query = frame::document(&base.body, EncodeContext::default());
    let (name, query, what) = match rng.random_range(0..5) {
        0 => (
            "admin.$cmd".to_string(),
            bson::RawDocumentBuf::try_from(&doc! {"isMaster": 1}).unwrap_or_default(),
            "OP_QUERY isMaster",
        ),
        1 => ("fuzz.$cmd".to_string(), query, "OP_QUERY of the command"),
        2 => ("fuzz.c".to_string(), query, "OP_QUERY on a collection"),
        3 => (
            "admin.$cmd".to_string(),
            bson::RawDocumentBuf::try_from(
                &doc! {"$query": {"hello": 1}, "$readPreference": {"mode": "primary"}},
            )
            .unwrap_or_default(),
            "OP_QUERY with $query",
        ),
        _ => (String::new(), query, "OP_QUERY with an empty namespace"),
    };
    let msg = Message {
        request_id,
        response_to: 0,
        compressor: None,
        op: Op::Query(OpQuery {
            flags: if rng.random_bool(0.8) {
                0
            } else {
                rng.random()
            },
            full_collection_name: name,
            number_to_skip: if rng.random_bool(0.8) {
                0
            } else {
                rng.random()
            },
            number_to_return: *[-1, 0, 1, i32::MIN].choose(rng).unwrap_or(&-1),
            query,
            return_fields_selector: None,
        }),
    };
    let mut bytes = wire::frame::encode_to_vec(&msg).unwrap_or_else(|_| ping_frame(request_id));
    let mut what = what.to_string();
    match rng.random_range(0..4) {
        0 => {
            bytes.extend_from_slice(&[1, 2, 3]);
            fix_length(&mut bytes);
            what.push_str(", trailing bytes");
        }
        1 => {
            // The namespace's NUL removed: the C string runs into the numbers.
            if let Some(i) = bytes.iter().skip(20).position(|b| *b == 0) {
                bytes[20 + i] = b'x';
            }
            what.push_str(", namespace without NUL");
        }
        _ => {}
    }
    (bytes, what)
}

/// Offsets of BSON elements in `doc` (walked with a stack, at most 10,000): the type byte's
/// position, the value's position, and the type.
fn elements(doc: &[u8]) -> Vec<(usize, usize, u8)> {
    let mut out = Vec::new();
    // (position of the next element, end of the enclosing document)
    let mut stack = vec![(4usize, doc.len().saturating_sub(1))];
    while let Some((pos, end)) = stack.pop() {
        if pos >= end || out.len() >= 10_000 {
            continue;
        }
        let ty = doc[pos];
        let Some(key_len) = doc[pos + 1..].iter().position(|b| *b == 0) else {
            continue;
        };
        let value = pos + 1 + key_len + 1;
        let len_at = |at: usize| get_i32(doc, at).map(|n| n.max(0) as usize);
        let size = match ty {
            0x01 | 0x09 | 0x11 | 0x12 => Some(8),
            0x02 | 0x0D | 0x0E => len_at(value).map(|n| 4 + n),
            0x03 | 0x04 | 0x0F => len_at(value),
            0x05 => len_at(value).map(|n| 5 + n),
            0x06 | 0x0A | 0x7F | 0xFF => Some(0),
            0x07 => Some(12),
            0x08 => Some(1),
            0x0B => doc[value..].iter().position(|b| *b == 0).and_then(|a| {
                doc[value + a + 1..]
                    .iter()
                    .position(|b| *b == 0)
                    .map(|b| a + b + 2)
            }),
            0x0C => len_at(value).map(|n| 4 + n + 12),
            0x10 => Some(4),
            0x13 => Some(16),
            _ => None,
        };
        let Some(size) = size else { continue };
        out.push((pos, value, ty));
        let next = value + size;
        if next <= end {
            stack.push((next, end));
        }
        if matches!(ty, 0x03 | 0x04) && value + size <= doc.len() {
            stack.push((value + 4, value + size - 1));
        }
    }
    out
}

fn corrupt_bson(rng: &mut StdRng, mut bytes: Vec<u8>) -> (Vec<u8>, String) {
    let Some(body_len) = get_i32(&bytes, BODY).map(|n| n.max(0) as usize) else {
        return (bytes, "no body to corrupt".into());
    };
    let body_end = (BODY + body_len).min(bytes.len());
    let elems = elements(&bytes[BODY..body_end]);
    let Some(&(type_at, value_at, ty)) = elems.choose(rng) else {
        return (bytes, "no element to corrupt".into());
    };
    let (t, v) = (BODY + type_at, BODY + value_at);
    let what = match rng.random_range(0..7) {
        0 => {
            let nt = *[0x00u8, 0x14, 0x15, 0x20, 0x80, 0xfe, 0x02, 0x03, 0x10]
                .choose(rng)
                .unwrap_or(&0);
            bytes[t] = nt;
            format!("element type {ty:#x} → {nt:#x}")
        }
        1 if matches!(ty, 0x02 | 0x03 | 0x04 | 0x05 | 0x0D | 0x0E | 0x0F) => {
            let real = get_i32(&bytes, v).unwrap_or(0);
            let nv = awkward_i32(rng, real);
            put_i32(&mut bytes, v, nv);
            format!("length {nv} (real {real}) of a {ty:#x} value")
        }
        2 => {
            // The key's NUL removed.
            if let Some(b) = bytes.get_mut(v - 1) {
                *b = b'k';
            }
            "key without its NUL".into()
        }
        3 if ty == 0x02 => {
            if let Some(b) = bytes.get_mut(v + 4) {
                *b = *[0xffu8, 0xc0, 0x80, 0xed].choose(rng).unwrap_or(&0xff);
            }
            "invalid UTF-8 in a string".into()
        }
        4 if ty == 0x08 => {
            bytes[v] = 2;
            "boolean byte 2".into()
        }
        5 => {
            let real = body_len as i32;
            let nv = awkward_i32(rng, real);
            put_i32(&mut bytes, BODY, nv);
            format!("body length {nv} (real {real})")
        }
        _ => {
            // Invalid UTF-8 in a key.
            if let Some(b) = bytes.get_mut(t + 1)
                && *b != 0
            {
                *b = 0xff;
            }
            "invalid UTF-8 in a key".into()
        }
    };
    (bytes, format!("BSON: {what}"))
}

fn back_to_back(rng: &mut StdRng, valid: Vec<u8>, request_id: i32) -> (Vec<u8>, String) {
    let mut bytes = valid.clone();
    if rng.random_bool(0.5) {
        bytes.extend_from_slice(&ping_frame(request_id.wrapping_add(1)));
        (bytes, "two frames back to back".into())
    } else {
        let n = rng.random_range(1..64);
        bytes.extend((0..n).map(|_| rng.random::<u8>()));
        (bytes, format!("a frame then {n} garbage bytes"))
    }
}

fn garbage(rng: &mut StdRng) -> (Vec<u8>, String) {
    let n = rng.random_range(0..256);
    let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
    (bytes, format!("{n} random bytes"))
}

fn empty_sections(rng: &mut StdRng, request_id: i32) -> (Vec<u8>, String) {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&0i32.to_le_bytes());
    bytes.extend_from_slice(&request_id.to_le_bytes());
    bytes.extend_from_slice(&0i32.to_le_bytes());
    bytes.extend_from_slice(&opcode::OP_MSG.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    let what = match rng.random_range(0..4) {
        0 => "OP_MSG without sections",
        1 => {
            bytes.push(0);
            bytes.extend_from_slice(&[5, 0, 0, 0, 0]);
            "OP_MSG with an empty body"
        }
        2 => {
            bytes.push(1);
            bytes.extend_from_slice(&14i32.to_le_bytes());
            bytes.extend_from_slice(b"documents\0");
            "OP_MSG with only a kind-1 sequence"
        }
        _ => {
            bytes.extend_from_slice(&[0, 0, 0]);
            "OP_MSG with 3 bytes of flags"
        }
    };
    fix_length(&mut bytes);
    (bytes, what.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzz::generate::{Case, Generator};

    #[test]
    fn the_element_walker_finds_nested_elements() {
        let d = bson::RawDocumentBuf::try_from(
            &doc! {"a": 1, "b": {"c": "x", "d": [true, null]}, "e": 2.5},
        )
        .unwrap();
        let types: Vec<u8> = elements(d.as_bytes()).iter().map(|e| e.2).collect();
        let mut sorted = types.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![0x01, 0x02, 0x03, 0x04, 0x08, 0x0A, 0x10]);
    }

    #[test]
    fn raw_cases_are_deterministic_and_bounded() {
        let cmds = ["find", "insert", "aggregate", "hello"].map(String::from);
        let a = Generator::new(5, &cmds);
        let b = Generator::new(5, &cmds);
        let mut raw = 0;
        for i in 0..400 {
            let (x, y) = (a.case(i), b.case(i));
            if let (Case::Raw(x), Case::Raw(y)) = (&x, &y) {
                assert!(x.bytes == y.bytes, "iteration {i}");
            }
            if let Case::Raw(r) = x {
                raw += 1;
                assert!(r.bytes.len() <= wire::MAX_MESSAGE_SIZE + 1024);
            }
        }
        assert!(raw > 20, "{raw} raw cases in 400");
    }
}
