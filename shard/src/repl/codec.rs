//! How the Raft log and the state machine store openraft's values.
//!
//! * An entry is a frame of its own: `term: u64, index: u64, kind: u8` (big-endian), then for
//!   a normal entry the proposal's term and promise (`u64` each) and its write set's bytes as they are, for a
//!   membership entry the membership as JSON, for a blank entry nothing. Write sets are most
//!   of the log's bytes, so they are stored without any re-encoding.
//! * Everything else (votes, log ids, memberships) is small: JSON, which keeps openraft's
//!   maps keyed by member id.
//!
//! Invariant: decoding is total: any bytes decode or give an I/O error (which stops the
//! member), never a panic.

use std::io;

use openraft::EntryPayload;
use openraft::alias::EntryOf;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Proposal, TypeConfig};

type Entry = EntryOf<TypeConfig>;

const BLANK: u8 = 0;
const NORMAL: u8 = 1;
const MEMBERSHIP: u8 = 2;

fn corrupt(what: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("a corrupt replication record: {what}"))
}

pub(super) fn encode<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(corrupt)
}

pub(super) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> io::Result<T> {
    serde_json::from_slice(bytes).map_err(corrupt)
}

pub(super) fn encode_entry(entry: &Entry) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(32);
    out.extend_from_slice(&entry.log_id.leader_id.term.to_be_bytes());
    out.extend_from_slice(&entry.log_id.index.to_be_bytes());
    match &entry.payload {
        EntryPayload::Blank => out.push(BLANK),
        EntryPayload::Normal(p) => {
            out.reserve(17 + p.ops.len());
            out.push(NORMAL);
            out.extend_from_slice(&p.term.to_be_bytes());
            out.extend_from_slice(&p.promise.to_be_bytes());
            out.extend_from_slice(&p.ops);
        }
        EntryPayload::Membership(m) => {
            out.push(MEMBERSHIP);
            out.extend_from_slice(&encode(m)?);
        }
    }
    Ok(out)
}

fn u64_at(bytes: &[u8], at: usize) -> io::Result<u64> {
    bytes
        .get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| corrupt("an entry cut short"))
}

pub(super) fn decode_entry(bytes: &[u8]) -> io::Result<Entry> {
    let term = u64_at(bytes, 0)?;
    let index = u64_at(bytes, 8)?;
    let kind = *bytes
        .get(16)
        .ok_or_else(|| corrupt("an entry without a kind"))?;
    let payload = match kind {
        BLANK => EntryPayload::Blank,
        NORMAL => EntryPayload::Normal(Proposal {
            term: u64_at(bytes, 17)?,
            promise: u64_at(bytes, 25)?,
            ops: bytes[33..].to_vec(),
        }),
        MEMBERSHIP => EntryPayload::Membership(decode(&bytes[17..])?),
        other => return Err(corrupt(format!("an entry of kind {other}"))),
    };
    Ok(openraft::Entry {
        log_id: openraft::LogId::new_term_index(term, index),
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_decode_to_what_was_encoded_and_garbage_is_an_error() {
        let normal = openraft::Entry {
            log_id: openraft::LogId::new_term_index(3, 17),
            payload: EntryPayload::Normal(Proposal {
                term: 3,
                promise: 42,
                ops: vec![1, 2, 3],
            }),
        };
        let bytes = encode_entry(&normal).expect("encode");
        assert_eq!(decode_entry(&bytes).expect("decode"), normal);
        for cut in 0..33 {
            assert!(decode_entry(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let blank: Entry = openraft::Entry {
            log_id: openraft::LogId::new_term_index(1, 1),
            payload: EntryPayload::Blank,
        };
        assert_eq!(
            decode_entry(&encode_entry(&blank).expect("encode")).expect("decode"),
            blank
        );
        let mut bad = bytes.clone();
        bad[16] = 9;
        assert!(decode_entry(&bad).is_err());
    }
}
