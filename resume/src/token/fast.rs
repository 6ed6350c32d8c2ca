//! The fixed-layout fast path of [`ResumeTokenData::decode`] for the tokens a change stream
//! sees on almost every event: version 2, no `_typeBits` (all type bits zero), and the layout
//!
//! ```text
//! 82 <ts:8>  2B 04  (00 | 2C 01 00)  <txnOpIndex>  (6E | 6F)  (14 | 5A 10 04 <uuid:16>)
//!    [46 <identifier object> 00  [<fragmentNum>]]  04
//! ```
//!
//! (clusterTime, version 2, tokenType 0 or 128, txnOpIndex, fromInvalidate, null or UUID,
//! then for events the identifier and an optional fragmentNum, then the end byte). It reads
//! the bytes once, validating as it slices, and allocates only the identifier's key.
//!
//! Invariant: [`decode_common`] returns `Some(x)` only when the general decoder would return
//! `Ok(x)` for the same input (same fields, same identifier bytes and type bits). It
//! accepts a subset: on anything it does not recognise — another version, non-empty
//! `_typeBits`, a non-canonical number, a non-ASCII name, an unusual value type, any
//! malformed or invalid token — it returns `None` and the general decoder decides, so errors
//! and their precedence come from one place only. A test checks the two agree on arbitrary
//! and mutated inputs.

use bson::Uuid;

use super::{Identifier, ResumeTokenData, TokenType, TokenVersion};
use crate::ClusterTime;
use crate::keystring::{TypeBits, ctype};

/// Nesting the fast path follows inside the identifier (far below `keystring::MAX_DEPTH`);
/// deeper identifiers take the general path.
const MAX_FAST_DEPTH: u32 = 16;

/// Decodes a common v2 token, or returns `None` to defer to the general decoder (see the
/// module invariant).
#[inline]
pub(super) fn decode_common(data: &[u8], type_bits: &[u8]) -> Option<ResumeTokenData> {
    // `[]` and `[0]` both serialize an all-zeros stream: every type bit reads as 0, so numbers
    // are int32 and strings are strings. The general decoder's reader of such a stream does
    // not advance, so the identifier keeps an empty `TypeBits`, here as there.
    if !matches!(type_bits, [] | [0]) {
        return None;
    }
    let mut c = Cursor { rest: data };

    c.expect(ctype::TIMESTAMP)?;
    let ts = u64::from_be_bytes(c.array()?);
    let cluster_time = ClusterTime::new((ts >> 32) as u32, ts as u32);

    // Version: int32 2, canonically `2B 04`.
    if c.array()? != [ctype::NUMERIC_POSITIVE_1_BYTE_INT, 4] {
        return None;
    }
    let token_type = match c.int32()? {
        0 => TokenType::HighWaterMark,
        128 => TokenType::Event,
        _ => return None,
    };
    let txn_op_index = u32::try_from(c.int32()?).ok()?;
    let from_invalidate = match c.u8()? {
        ctype::BOOL_FALSE => false,
        ctype::BOOL_TRUE => true,
        _ => return None,
    };
    let uuid = match c.u8()? {
        ctype::NULLISH => None,
        ctype::BIN_DATA => {
            // Length 16, subtype 4 (UUID).
            if c.array()? != [16, 4] {
                return None;
            }
            Some(Uuid::from_bytes(c.array()?))
        }
        _ => return None,
    };

    // An event's identifier (its byte range, CType included) and optional fragmentNum.
    let mut identifier = None;
    let mut fragment_num = None;
    if token_type == TokenType::Event {
        let start = c.rest;
        c.identifier()?;
        identifier = start.get(..start.len() - c.rest.len());
        if c.peek()? != ctype::END {
            fragment_num = Some(u32::try_from(c.int32()?).ok()?);
        }
    }
    c.expect(ctype::END)?;
    if !c.rest.is_empty() {
        return None;
    }
    // The one allocation: the identifier's key, which the result owns.
    let event_identifier =
        identifier.map(|key| Identifier::from_raw(key.to_vec(), TypeBits::new()));
    let out = ResumeTokenData {
        cluster_time,
        version: TokenVersion::V2,
        token_type,
        txn_op_index,
        from_invalidate,
        uuid,
        event_identifier,
        fragment_num,
    };
    out.validate().ok()?;
    Some(out)
}

/// `<generic CType> <name> 00 <CType>`: a field's encoding up to its value.
const fn field_head<const N: usize>(generic: u8, name: &[u8], ct: u8) -> [u8; N] {
    let mut out = [0; N];
    out[0] = generic;
    let mut i = 0;
    while i < name.len() {
        out[1 + i] = name[i];
        i += 1;
    }
    out[N - 1] = ct;
    out
}

/// `operationType: <string>` up to the string: how every v2 identifier begins.
const OPERATION_TYPE: [u8; 16] =
    field_head(ctype::STRING_LIKE, b"operationType", ctype::STRING_LIKE);
/// `documentKey: <object>` up to the object's body.
const DOCUMENT_KEY: [u8; 14] = field_head(ctype::OBJECT, b"documentKey", ctype::OBJECT);
/// `_id: <ObjectId>` up to its 12 bytes.
const ID_OID: [u8; 6] = field_head(ctype::OID, b"_id", ctype::OID);

/// A cursor over the token bytes: `rest` is what remains unread. Every read is
/// bounds-checked and `None` past the end.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl Cursor<'_> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.rest.first().copied()
    }

    #[inline]
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.rest.split_first()?;
        self.rest = rest;
        Some(b)
    }

    #[inline]
    fn expect(&mut self, b: u8) -> Option<()> {
        (self.u8()? == b).then_some(())
    }

    #[inline]
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (a, rest) = self.rest.split_first_chunk::<N>()?;
        self.rest = rest;
        Some(*a)
    }

    /// An int32 (type bits `00`), read as `keystring::fast_scalar` does
    /// with all-zero type bits: zero, or a 1–8 byte integer (magnitude shifted left by one,
    /// low bit clear, bytes inverted when negative) that fits an i32.
    fn int32(&mut self) -> Option<i32> {
        let ct = self.u8()?;
        self.int32_after(ct)
    }

    /// [`Cursor::int32`] once its CType byte `ct` has been read.
    fn int32_after(&mut self, ct: u8) -> Option<i32> {
        let (negative, n) = match ct {
            ctype::NUMERIC_ZERO => return Some(0),
            ctype::NUMERIC_NEGATIVE_8_BYTE_INT..=ctype::NUMERIC_NEGATIVE_1_BYTE_INT => (
                true,
                usize::from(ctype::NUMERIC_NEGATIVE_1_BYTE_INT - ct) + 1,
            ),
            ctype::NUMERIC_POSITIVE_1_BYTE_INT..=ctype::NUMERIC_POSITIVE_8_BYTE_INT => (
                false,
                usize::from(ct - ctype::NUMERIC_POSITIVE_1_BYTE_INT) + 1,
            ),
            _ => return None,
        };
        let (bytes, rest) = self.rest.split_at_checked(n)?;
        let enc = bytes.iter().fold(0u64, |acc, &x| {
            (acc << 8) | u64::from(if negative { !x } else { x })
        });
        if enc & 1 == 1 {
            return None; // fractional
        }
        let mag = (enc >> 1) as i64;
        let v = i32::try_from(if negative { -mag } else { mag }).ok()?;
        self.rest = rest;
        Some(v)
    }

    /// A NUL-terminated run of ASCII bytes (a field name or string segment), NUL consumed.
    fn ascii_cstr(&mut self) -> Option<()> {
        const LO: u64 = 0x0101_0101_0101_0101;
        const HI: u64 = 0x8080_8080_8080_8080;
        let mut i = 0;
        // Eight bytes at a time: a byte is flagged when it is NUL (`b - 1` wraps to 0xFF) or
        // not ASCII (`b >= 0x80`). No borrow reaches the lowest flagged byte (every byte
        // below it is in 1..=0x7F), so that flag is exact.
        while let Some(word) = self.rest.get(i..).and_then(|r| r.first_chunk::<8>()) {
            let v = u64::from_le_bytes(*word);
            let flags = (v.wrapping_sub(LO) | v) & HI;
            if flags != 0 {
                return self.end_cstr(i + (flags.trailing_zeros() / 8) as usize);
            }
            i += 8;
        }
        let rest = self.rest.get(i..)?;
        self.end_cstr(i + rest.iter().position(|&b| b == 0 || b >= 0x80)?)
    }

    /// Ends a C string at `rest[at]`, the first byte that is NUL or not ASCII.
    #[inline]
    fn end_cstr(&mut self, at: usize) -> Option<()> {
        match self.rest.split_at_checked(at)?.1 {
            [0, rest @ ..] => {
                self.rest = rest;
                Some(())
            }
            _ => None, // not ASCII: the general decoder validates UTF-8
        }
    }

    /// An event identifier, CType included. The usual openings (`operationType`, then
    /// `documentKey: {_id: ObjectId`) are compared whole against their known bytes, which
    /// consumes exactly what the field loop would; the loop reads everything else.
    fn identifier(&mut self) -> Option<()> {
        self.expect(ctype::OBJECT)?;
        if self.skip(&OPERATION_TYPE) {
            self.string()?;
            if self.skip(&DOCUMENT_KEY) {
                if self.skip(&ID_OID) {
                    self.array::<12>()?;
                }
                self.object_body(2)?; // the rest of the document key
            }
        }
        self.object_body(1) // the rest of the identifier
    }

    /// Consumes `head` if the unread bytes start with it.
    #[inline]
    fn skip<const N: usize>(&mut self, head: &[u8; N]) -> bool {
        match self.rest.split_first_chunk::<N>() {
            Some((h, rest)) if h == head => {
                self.rest = rest;
                true
            }
            _ => false,
        }
    }

    /// A string value's body: ASCII segments joined by `00 FF` (an escaped NUL), then `00`.
    #[inline]
    fn string(&mut self) -> Option<()> {
        self.ascii_cstr()?;
        while self.peek() == Some(0xff) {
            self.u8()?;
            self.ascii_cstr()?;
        }
        Some(())
    }

    /// An object body after its `46`: `(<generic ctype> <name> 00 <value>)* 00`, as
    /// `keystring::skip_value` validates it, for the value types common in identifiers.
    fn object_body(&mut self, depth: u32) -> Option<()> {
        loop {
            if self.u8()? == 0 {
                return Some(());
            }
            self.ascii_cstr()?;
            let ct = self.u8()?;
            self.value(ct, depth)?;
        }
    }

    fn value(&mut self, ct: u8, depth: u32) -> Option<()> {
        match ct {
            ctype::OID => {
                self.array::<12>()?;
            }
            ctype::STRING_LIKE => self.string()?,
            ctype::OBJECT if depth < MAX_FAST_DEPTH => self.object_body(depth + 1)?,
            ctype::NUMERIC_ZERO
            | ctype::NUMERIC_NEGATIVE_8_BYTE_INT..=ctype::NUMERIC_NEGATIVE_1_BYTE_INT
            | ctype::NUMERIC_POSITIVE_1_BYTE_INT..=ctype::NUMERIC_POSITIVE_8_BYTE_INT => {
                self.int32_after(ct)?;
            }
            ctype::MIN_KEY
            | ctype::MAX_KEY
            | ctype::NULLISH
            | ctype::UNDEFINED
            | ctype::BOOL_TRUE
            | ctype::BOOL_FALSE => {}
            ctype::DATE => {
                self.array::<8>()?;
            }
            _ => return None,
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

    use bson::oid::ObjectId;
    use bson::{Bson, Document, doc};
    use proptest::prelude::*;

    use super::*;
    use crate::token::event_identifier;

    /// Values found in document keys, including ones the fast path leaves to the general
    /// decoder (non-ASCII and NUL-bearing strings, int64, doubles, arrays, binary).
    fn arb_value() -> impl Strategy<Value = Bson> {
        let leaf = prop_oneof![
            any::<[u8; 12]>().prop_map(|b| Bson::ObjectId(ObjectId::from_bytes(b))),
            any::<i32>().prop_map(Bson::Int32),
            any::<i64>().prop_map(Bson::Int64),
            any::<f64>().prop_map(Bson::Double),
            "[a-z\u{0}\u{e9}]{0,6}".prop_map(Bson::String),
            any::<bool>().prop_map(Bson::Boolean),
            Just(Bson::Null),
            Just(Bson::MinKey),
            Just(Bson::MaxKey),
            any::<i64>().prop_map(|m| Bson::DateTime(bson::DateTime::from_millis(m))),
            prop::collection::vec(any::<u8>(), 0..4).prop_map(|bytes| Bson::Binary(bson::Binary {
                subtype: bson::spec::BinarySubtype::Generic,
                bytes
            })),
        ];
        leaf.prop_recursive(3, 12, 3, |inner| {
            prop_oneof![
                prop::collection::vec(("[a-z_\u{e9}]{1,4}", inner.clone()), 0..3)
                    .prop_map(|kv| Bson::Document(kv.into_iter().collect::<Document>())),
                prop::collection::vec(inner, 0..3).prop_map(Bson::Array),
            ]
        })
    }

    fn arb_token() -> impl Strategy<Value = ResumeTokenData> {
        (
            any::<(u32, u32)>(),
            prop_oneof![Just(TokenVersion::V1), Just(TokenVersion::V2)],
            0..=crate::token::MAX_TXN_OP_INDEX,
            prop::option::of(any::<[u8; 16]>().prop_map(Uuid::from_bytes)),
            prop::option::of(prop::collection::vec(("[a-z_]{1,4}", arb_value()), 0..3)),
            any::<bool>(),
            prop::option::of(0..=i32::MAX as u32),
            any::<bool>(),
        )
            .prop_map(|((s, i), version, txn, uuid, key, inv, frag, hwm)| {
                let ct = ClusterTime::new(s, i);
                if hwm {
                    return ResumeTokenData::high_water_mark(ct, version);
                }
                let key: Option<Document> = key.map(|kv| kv.into_iter().collect());
                let id = if version == TokenVersion::V2 {
                    Some(event_identifier("insert", key.map(|k| ("documentKey", k))))
                } else {
                    key.filter(|_| uuid.is_some())
                };
                let t = ResumeTokenData::event(ct, version, txn, uuid, id)
                    .unwrap()
                    .with_from_invalidate(inv);
                if version == TokenVersion::V2 {
                    t.with_fragment_num(frag).unwrap()
                } else {
                    t
                }
            })
    }

    /// The fast path's answer, when it gives one, is exactly the general decoder's: same
    /// fields, same identifier bytes and the same identifier type bits.
    fn agrees(data: &[u8], bits: &[u8]) -> Result<bool, TestCaseError> {
        let Some(fast) = decode_common(data, bits) else {
            return Ok(false);
        };
        let general = ResumeTokenData::decode_general(data, bits);
        prop_assert_eq!(Ok(&fast), general.as_ref());
        let id_bits = |t: &ResumeTokenData| t.event_identifier.as_ref().map(|i| i.bits.clone());
        prop_assert_eq!(id_bits(&fast), general.ok().as_ref().and_then(id_bits));
        Ok(true)
    }

    #[test]
    fn common_v2_tokens_take_the_fast_path() {
        let ct = ClusterTime::new(1_700_000_000, 42);
        let uuid = Some(Uuid::from_bytes([9; 16]));
        let keys = [
            doc! {"_id": ObjectId::from_bytes([7; 12])},
            doc! {"_id": 5, "shard": "a\u{0}b"},
            doc! {"_id": {"a": -1, "b": true}},
        ];
        for key in keys {
            let id = event_identifier("insert", Some(("documentKey", key)));
            let t = ResumeTokenData::event(ct, TokenVersion::V2, 3, uuid, Some(id)).unwrap();
            for t in [t.clone(), t.with_fragment_num(Some(2)).unwrap()] {
                let wire = t.encode();
                assert_eq!(decode_common(wire.data(), &[]), Some(t.clone()));
                assert!(agrees(wire.data(), &[]).unwrap());
            }
        }
        let drop = event_identifier("drop", None);
        let t = ResumeTokenData::event(ct, TokenVersion::V2, 0, None, Some(drop)).unwrap();
        assert_eq!(decode_common(t.encode().data(), &[]), Some(t));
        let hwm = ResumeTokenData::high_water_mark(ct, TokenVersion::V2);
        assert_eq!(decode_common(hwm.encode().data(), &[]), Some(hwm));
    }

    #[test]
    fn other_tokens_are_left_to_the_general_decoder() {
        let ct = ClusterTime::new(1, 1);
        let v1 = ResumeTokenData::high_water_mark(ct, TokenVersion::V1).encode();
        assert_eq!(decode_common(v1.data(), &[]), None);
        let key = doc! {"_id": 1.5};
        let id = event_identifier("insert", Some(("documentKey", key)));
        let t = ResumeTokenData::event(ct, TokenVersion::V2, 0, None, Some(id)).unwrap();
        let wire = t.encode();
        assert!(wire.type_bits().is_some());
        let bits = wire.type_bits().unwrap_or(&[]);
        assert_eq!(decode_common(wire.data(), bits), None);
        assert_eq!(decode_common(&[], &[]), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn fast_path_agrees_with_the_general_decoder_on_encoded_tokens(t in arb_token()) {
            let wire = t.encode();
            let bits = wire.type_bits().unwrap_or(&[]).to_vec();
            agrees(wire.data(), &bits)?;
        }

        #[test]
        fn fast_path_agrees_with_the_general_decoder_on_mutated_tokens(
            t in arb_token(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 1..4),
            bits in prop_oneof![Just(vec![]), Just(vec![0]), Just(vec![1]), prop::collection::vec(any::<u8>(), 0..3)],
        ) {
            let mut data = t.encode().data().to_vec();
            for (at, byte, op) in edits {
                let i = at.index(data.len() + 1);
                match op {
                    0 => data.insert(i, byte),
                    1 if i < data.len() => data[i] = byte,
                    _ => data.truncate(i),
                }
            }
            agrees(&data, &bits)?;
        }

        #[test]
        fn fast_path_agrees_with_the_general_decoder_on_arbitrary_bytes(
            data in prop::collection::vec(any::<u8>(), 0..48),
        ) {
            agrees(&data, &[])?;
        }
    }
}
