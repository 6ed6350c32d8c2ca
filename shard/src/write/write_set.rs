//! A write set: the physical redo record of one write transaction, what each key was set to or
//! that it was removed, in the order written. It is kept as the bytes the write-ahead log
//! stores, appended op by op as the transaction writes.
//!
//! The encoding, op after op with nothing between them and no count (lengths little-endian):
//!
//! ```text
//! op = table: u8, kind: u8, key_len: u32, key, [value_len: u32, value]   value iff kind = PUT
//! kind: PUT = 1, REMOVE = 0
//! ```
//!
//! `table` is the storage's number for the table (`storage::Table::index`): this module is a
//! leaf (house.md §3) and does not interpret it. A set is one buffer, optionally behind a
//! prefix its owner fills in (the log's frame), so recording a transaction costs one growing
//! allocation and no copy, and its record goes to disk in one write.
//!
//! Invariants:
//! * Ops are kept, and yielded, in the order they were pushed.
//! * A set's bytes always decode: a push appends a whole op or, refused, nothing.
//! * Decoding is total and bounded: any bytes decode or give a [`DecodeError`], never a panic;
//!   every length is checked against the bytes left before anything is taken, and a decoded
//!   set allocates exactly its input's length.
//! * What decodes encodes back to the same bytes.
//! * An encoding cut inside an op is refused; one cut between ops decodes as the ops before the
//!   cut (the encoding has no count: the log's frame length and checksum find a short record).

use std::fmt;

const PUT: u8 = 1;
const REMOVE: u8 = 0;

/// One write of a set, borrowing its key and value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op<'a> {
    /// The storage's number for the table.
    pub table: u8,
    pub key: &'a [u8],
    /// What the key was set to; `None`: it was removed.
    pub value: Option<&'a [u8]>,
}

/// The writes of one transaction, in order, encoded (see the module header).
#[derive(Clone, Default)]
pub struct WriteSet {
    /// The prefix, then the encoded ops.
    buf: Vec<u8>,
    /// The prefix's length.
    prefix: usize,
}

/// A key or value longer than its 32-bit length can say.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a key or value of {0} bytes is over the write set's 4 GiB limit")]
pub struct TooLarge(pub usize);

/// Bytes that are not an encoding of ops: where, and what was expected there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("write set does not decode at byte {at}: {expected}")]
pub struct DecodeError {
    pub at: usize,
    pub expected: &'static str,
}

impl WriteSet {
    /// An empty set whose buffer starts with `prefix` zero bytes for its owner to fill in (the
    /// log's frame), with room for `capacity` bytes in all before it grows.
    pub fn with_prefix(prefix: usize, capacity: usize) -> WriteSet {
        let mut buf = Vec::with_capacity(capacity.max(prefix));
        buf.resize(prefix, 0);
        WriteSet { buf, prefix }
    }

    /// Appends `op`; refuses (appending nothing) a key or value over 4 GiB.
    pub fn push(&mut self, op: Op<'_>) -> Result<(), TooLarge> {
        let len = |b: &[u8]| {
            u32::try_from(b.len())
                .map(u32::to_le_bytes)
                .map_err(|_| TooLarge(b.len()))
        };
        let key_len = len(op.key)?;
        let value = match op.value {
            Some(value) => Some((len(value)?, value)),
            None => None,
        };
        let kind = if value.is_some() { PUT } else { REMOVE };
        self.buf.extend_from_slice(&[op.table, kind]);
        self.buf.extend_from_slice(&key_len);
        self.buf.extend_from_slice(op.key);
        if let Some((value_len, value)) = value {
            self.buf.extend_from_slice(&value_len);
            self.buf.extend_from_slice(value);
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.buf.len() == self.prefix
    }

    /// The ops, in order.
    pub fn ops(&self) -> Ops<'_> {
        Ops(Decoder {
            rest: self.encoded(),
            at: 0,
        })
    }

    /// The encoding of the ops (without the prefix).
    pub fn encoded(&self) -> &[u8] {
        &self.buf[self.prefix..]
    }

    /// The prefix, for its owner to fill in.
    pub fn prefix_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.prefix]
    }

    /// The prefix followed by the encoding of the ops.
    pub fn prefixed(&self) -> &[u8] {
        &self.buf
    }

    /// The set `bytes` encode (without a prefix).
    pub fn decode(bytes: &[u8]) -> Result<WriteSet, DecodeError> {
        WriteSet::from_vec(bytes.to_vec())
    }

    /// [`WriteSet::decode`] taking the bytes as they are, without a copy.
    pub fn from_vec(bytes: Vec<u8>) -> Result<WriteSet, DecodeError> {
        let mut decoder = Decoder {
            rest: &bytes,
            at: 0,
        };
        while !decoder.rest.is_empty() {
            decoder.op()?;
        }
        Ok(WriteSet {
            buf: bytes,
            prefix: 0,
        })
    }
}

impl PartialEq for WriteSet {
    /// The same ops in the same order (prefixes aside).
    fn eq(&self, other: &WriteSet) -> bool {
        self.encoded() == other.encoded()
    }
}

impl Eq for WriteSet {}

impl fmt::Debug for WriteSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.ops()).finish()
    }
}

impl<'a> IntoIterator for &'a WriteSet {
    type Item = Op<'a>;
    type IntoIter = Ops<'a>;

    fn into_iter(self) -> Ops<'a> {
        self.ops()
    }
}

/// The ops of a [`WriteSet`], in order, borrowed from its bytes.
pub struct Ops<'a>(Decoder<'a>);

impl<'a> Iterator for Ops<'a> {
    type Item = Op<'a>;

    fn next(&mut self) -> Option<Op<'a>> {
        if self.0.rest.is_empty() {
            return None;
        }
        // A set's bytes always decode (a push appends a whole op): no error to meet here.
        self.0.op().ok()
    }
}

/// Reads ops off the front of an encoding.
struct Decoder<'a> {
    rest: &'a [u8],
    /// Where `rest` starts in the encoding.
    at: usize,
}

impl<'a> Decoder<'a> {
    /// The next op; an error when the bytes left do not start with a whole one.
    fn op(&mut self) -> Result<Op<'a>, DecodeError> {
        let [table, kind] = *self.take_array::<2>("an op's table and kind")?;
        let put = match kind {
            PUT => true,
            REMOVE => false,
            _ => {
                return Err(DecodeError {
                    at: self.at - 1,
                    expected: "an op's kind: put (1) or remove (0)",
                });
            }
        };
        let key_len = self.take_len("a key's length")?;
        let key = self.take(key_len, "a key")?;
        let value = if put {
            let value_len = self.take_len("a value's length")?;
            Some(self.take(value_len, "a value")?)
        } else {
            None
        };
        Ok(Op { table, key, value })
    }

    fn take(&mut self, n: usize, expected: &'static str) -> Result<&'a [u8], DecodeError> {
        let Some((head, rest)) = self.rest.split_at_checked(n) else {
            return Err(DecodeError {
                at: self.at,
                expected,
            });
        };
        self.rest = rest;
        self.at += n;
        Ok(head)
    }

    fn take_array<const N: usize>(
        &mut self,
        expected: &'static str,
    ) -> Result<&'a [u8; N], DecodeError> {
        let Some((head, rest)) = self.rest.split_first_chunk::<N>() else {
            return Err(DecodeError {
                at: self.at,
                expected,
            });
        };
        self.rest = rest;
        self.at += N;
        Ok(head)
    }

    fn take_len(&mut self, expected: &'static str) -> Result<usize, DecodeError> {
        let len = u32::from_le_bytes(*self.take_array::<4>(expected)?);
        // A length past the bytes left fails the take that follows, before anything is
        // allocated; a u32 always fits a usize where this runs.
        Ok(len as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;

    /// An op that owns its key and value.
    type Owned = (u8, Vec<u8>, Option<Vec<u8>>);

    fn set_of(ops: &[Owned]) -> WriteSet {
        let mut set = WriteSet::default();
        for (table, key, value) in ops {
            set.push(Op {
                table: *table,
                key,
                value: value.as_deref(),
            })
            .unwrap();
        }
        set
    }

    fn owned(set: &WriteSet) -> Vec<Owned> {
        set.ops()
            .map(|op| (op.table, op.key.to_vec(), op.value.map(<[u8]>::to_vec)))
            .collect()
    }

    /// The write-ahead log's format, written out from its description, apart from `push`.
    fn reference_encoding(ops: &[Owned]) -> Vec<u8> {
        let mut out = Vec::new();
        for (table, key, value) in ops {
            out.push(*table);
            out.push(if value.is_some() { 1 } else { 0 });
            out.extend_from_slice(&(key.len() as u32).to_le_bytes());
            out.extend_from_slice(key);
            if let Some(value) = value {
                out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                out.extend_from_slice(value);
            }
        }
        out
    }

    fn an_op() -> impl Strategy<Value = Owned> {
        (
            any::<u8>(),
            vec(any::<u8>(), 0..12),
            proptest::option::of(vec(any::<u8>(), 0..24)),
        )
    }

    fn ops() -> impl Strategy<Value = Vec<Owned>> {
        vec(an_op(), 0..12)
    }

    /// What decodes encodes back to the same bytes.
    fn assert_decodes_back_to_itself(bytes: &[u8]) {
        if let Ok(set) = WriteSet::decode(bytes) {
            assert_eq!(set.encoded(), bytes);
            assert_eq!(
                set_of(&owned(&set)).encoded(),
                bytes,
                "pushed again: {set:?}"
            );
        }
    }

    #[test]
    fn the_encoding_of_a_small_set_is_the_logs_byte_format() {
        let set = set_of(&[
            (1, b"ab".to_vec(), Some(b"xyz".to_vec())),
            (7, b"k".to_vec(), None),
            (0, Vec::new(), Some(Vec::new())),
        ]);
        let golden: &[u8] = &[
            1, 1, 2, 0, 0, 0, b'a', b'b', 3, 0, 0, 0, b'x', b'y', b'z', // put 1 "ab" "xyz"
            7, 0, 1, 0, 0, 0, b'k', // remove 7 "k"
            0, 1, 0, 0, 0, 0, 0, 0, 0, 0, // put 0 "" ""
        ];
        assert_eq!(set.encoded(), golden);
        assert_eq!(WriteSet::decode(golden).unwrap(), set);
        assert_eq!(
            set.ops().collect::<Vec<_>>(),
            vec![
                Op {
                    table: 1,
                    key: b"ab",
                    value: Some(b"xyz")
                },
                Op {
                    table: 7,
                    key: b"k",
                    value: None
                },
                Op {
                    table: 0,
                    key: b"",
                    value: Some(b"")
                },
            ]
        );
    }

    #[test]
    fn the_prefix_is_its_owners_and_stays_out_of_the_ops() {
        let mut set = WriteSet::with_prefix(8, 64);
        assert!(set.is_empty());
        assert_eq!(set.prefixed(), &[0; 8]);
        set.push(Op {
            table: 2,
            key: b"k",
            value: Some(b"v"),
        })
        .unwrap();
        set.prefix_mut().copy_from_slice(&[0xff; 8]);
        assert!(!set.is_empty());
        assert_eq!(set.encoded(), &[2, 1, 1, 0, 0, 0, b'k', 1, 0, 0, 0, b'v']);
        assert_eq!(&set.prefixed()[..8], &[0xff; 8]);
        assert_eq!(&set.prefixed()[8..], set.encoded());
        assert_eq!(set, WriteSet::decode(set.encoded()).unwrap());
    }

    #[test]
    fn decode_errors_say_where_and_what_was_expected() {
        let refused = |bytes: &[u8]| WriteSet::decode(bytes).unwrap_err();
        assert_eq!(WriteSet::decode(&[]).unwrap(), WriteSet::default());
        assert_eq!(refused(&[3]).at, 0);
        assert_eq!(
            refused(&[3, 2, 0, 0, 0, 0]),
            DecodeError {
                at: 1,
                expected: "an op's kind: put (1) or remove (0)"
            }
        );
        // A length past the end is refused, not allocated.
        assert_eq!(
            refused(&[3, 0, 0xff, 0xff, 0xff, 0xff, b'k']),
            DecodeError {
                at: 6,
                expected: "a key"
            }
        );
        assert_eq!(
            refused(&[3, 1, 1, 0, 0, 0, b'k', 0xff, 0xff, 0xff, 0xff]),
            DecodeError {
                at: 11,
                expected: "a value"
            }
        );
        assert_eq!(refused(&[3, 1, 1, 0, 0, 0, b'k', 1, 0]).at, 7);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Ops come back in the order pushed, through the encoding and through a decode, and
        /// the encoding is the log's format.
        #[test]
        fn ops_come_back_in_order_through_encode_and_decode(ops in ops()) {
            let set = set_of(&ops);
            prop_assert_eq!(set.is_empty(), ops.is_empty());
            let reference = reference_encoding(&ops);
            prop_assert_eq!(set.encoded(), reference.as_slice());
            prop_assert_eq!(owned(&set), ops.clone());
            let decoded = WriteSet::decode(set.encoded()).unwrap();
            prop_assert_eq!(owned(&decoded), ops);
            prop_assert_eq!(decoded, set);
        }

        /// Arbitrary bytes decode or are refused, never panic, and what decodes encodes back
        /// to the same bytes.
        #[test]
        fn any_bytes_decode_or_are_refused_and_what_decodes_encodes_back(
            bytes in vec(any::<u8>(), 0..128),
        ) {
            assert_decodes_back_to_itself(&bytes);
        }

        /// The same, from encodings with one byte changed (random bytes rarely decode).
        #[test]
        fn a_changed_byte_decodes_or_is_refused_and_what_decodes_encodes_back(
            ops in ops(),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let mut bytes = reference_encoding(&ops);
            if !bytes.is_empty() {
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
            assert_decodes_back_to_itself(&bytes);
        }

        /// An encoding cut inside an op is refused; one cut between ops decodes as the ops
        /// before the cut.
        #[test]
        fn a_cut_inside_an_op_is_refused_and_a_cut_between_ops_is_a_prefix(ops in ops()) {
            let bytes = reference_encoding(&ops);
            // Where each op ends, and how many ops come before each end.
            let ends: Vec<usize> = (0..=ops.len())
                .map(|n| reference_encoding(&ops[..n]).len())
                .collect();
            for cut in 0..=bytes.len() {
                let decoded = WriteSet::decode(&bytes[..cut]);
                match ends.iter().position(|end| *end == cut) {
                    Some(n) => prop_assert_eq!(owned(&decoded.unwrap()), ops[..n].to_vec()),
                    None => prop_assert!(decoded.is_err(), "cut at {}", cut),
                }
            }
        }
    }
}
