//! Property tests for the pure framing: round trips, split reads, and hostile bytes.

#![allow(clippy::unwrap_used)] // tests may unwrap (common rules)

use bson::{Bson, Document, RawDocumentBuf};
use bytes::BytesMut;
use proptest::prelude::*;
use tokio_util::codec::Decoder;
use wire::codec::MessageCodec;
use wire::frame::{decode, encode_to_vec};
use wire::message::{Compressor, DocumentSequence, Message, MsgFlags, Op, OpMsg, OpQuery, OpReply};
use wire::server::prepare;

fn leaf() -> impl Strategy<Value = Bson> {
    prop_oneof![
        any::<i32>().prop_map(Bson::Int32),
        any::<i64>().prop_map(Bson::Int64),
        any::<bool>().prop_map(Bson::Boolean),
        "[a-zA-Z0-9 é]{0,20}".prop_map(Bson::String),
        any::<f64>().prop_map(Bson::Double),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(|bytes| {
            Bson::Binary(bson::Binary {
                subtype: bson::spec::BinarySubtype::Generic,
                bytes,
            })
        }),
        Just(Bson::Null),
    ]
}

fn document() -> impl Strategy<Value = RawDocumentBuf> {
    let value = leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(("[a-z$_]{1,8}", inner.clone()), 0..4)
                .prop_map(|kv| Bson::Document(kv.into_iter().collect::<Document>())),
            proptest::collection::vec(inner, 0..4).prop_map(Bson::Array),
        ]
    });
    proptest::collection::vec(("[a-z$_]{1,8}", value), 0..6).prop_map(|kv| {
        let doc: Document = kv.into_iter().collect();
        RawDocumentBuf::try_from(&doc).expect("generated documents serialise")
    })
}

fn flags() -> impl Strategy<Value = MsgFlags> {
    (any::<bool>(), any::<bool>(), any::<bool>(), any::<u16>()).prop_map(
        |(checksum, more, exhaust, high)| {
            let mut f = u32::from(high & 0xFFFE) << 16; // optional bits only
            if checksum {
                f |= MsgFlags::CHECKSUM_PRESENT;
            }
            if more {
                f |= MsgFlags::MORE_TO_COME;
            }
            if exhaust {
                f |= MsgFlags::EXHAUST_ALLOWED;
            }
            MsgFlags(f)
        },
    )
}

fn op_msg() -> impl Strategy<Value = Op> {
    let sequences = proptest::collection::btree_map(
        "[a-z]{1,10}",
        proptest::collection::vec(document(), 0..4),
        0..3,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|(identifier, documents)| DocumentSequence {
                identifier,
                documents,
            })
            .collect::<Vec<_>>()
    });
    (flags(), document(), sequences).prop_map(|(flags, body, sequences)| {
        Op::Msg(OpMsg {
            flags,
            body,
            sequences,
        })
    })
}

fn op_query() -> impl Strategy<Value = Op> {
    (
        any::<u32>(),
        "[a-z]{1,8}\\.\\$cmd",
        any::<i32>(),
        any::<i32>(),
        document(),
        proptest::option::of(document()),
    )
        .prop_map(|(flags, ns, skip, ret, query, sel)| {
            Op::Query(OpQuery {
                flags,
                full_collection_name: ns,
                number_to_skip: skip,
                number_to_return: ret,
                query,
                return_fields_selector: sel,
            })
        })
}

fn op_reply() -> impl Strategy<Value = Op> {
    (
        any::<u32>(),
        any::<i64>(),
        any::<i32>(),
        proptest::collection::vec(document(), 0..4),
    )
        .prop_map(|(response_flags, cursor_id, starting_from, documents)| {
            Op::Reply(OpReply {
                response_flags,
                cursor_id,
                starting_from,
                documents,
            })
        })
}

fn compressor() -> impl Strategy<Value = Option<Compressor>> {
    prop_oneof![
        Just(None),
        Just(Some(Compressor::Noop)),
        Just(Some(Compressor::Snappy)),
        Just(Some(Compressor::Zlib)),
        Just(Some(Compressor::Zstd)),
    ]
}

fn message() -> impl Strategy<Value = Message> {
    (
        any::<i32>(),
        any::<i32>(),
        compressor(),
        prop_oneof![op_msg(), op_query(), op_reply()],
    )
        .prop_map(|(request_id, response_to, compressor, op)| Message {
            request_id,
            response_to,
            compressor,
            op,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Invariant: a command's conversion is the bson crate's, with every array allocated at its
    /// exact length.
    #[test]
    fn conversion_is_the_crates_with_exact_arrays(raw in document()) {
        let ours = wire::message::to_document(&raw).unwrap();
        prop_assert_eq!(&ours, &Document::try_from(raw.as_ref()).unwrap());
        let mut pending: Vec<&Bson> = ours.values().collect();
        while let Some(v) = pending.pop() {
            match v {
                Bson::Array(items) => {
                    prop_assert_eq!(items.capacity(), items.len());
                    pending.extend(items);
                }
                Bson::Document(d) => pending.extend(d.values()),
                _ => {}
            }
        }
    }

    /// Invariant: decode(encode(m)) == m, consuming exactly the encoded frame.
    #[test]
    fn encode_then_decode_is_identity(m in message()) {
        let bytes = encode_to_vec(&m).unwrap();
        prop_assert_eq!(decode(&bytes).unwrap(), Some((m, bytes.len())));
    }

    /// Invariant: frames decode the same however the bytes are split across reads.
    #[test]
    fn split_reads_decode_like_whole_ones(
        a in message(),
        b in message(),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let mut bytes = encode_to_vec(&a).unwrap();
        bytes.extend(encode_to_vec(&b).unwrap());
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len())).collect();
        points.push(bytes.len());
        points.sort_unstable();
        let mut codec = MessageCodec;
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut start = 0;
        for p in points {
            buf.extend_from_slice(&bytes[start..p]);
            start = p;
            while let Some(m) = codec.decode(&mut buf).unwrap() {
                out.push(m);
            }
        }
        prop_assert_eq!(out, vec![a, b]);
        prop_assert!(buf.is_empty());
    }

    /// Invariant: arbitrary bytes never panic, and a decoded frame never claims more bytes
    /// than it was given.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(Some((m, n))) = decode(&bytes) {
            prop_assert!(n <= bytes.len());
            let _ = prepare(m);
        }
    }

    /// Invariant: corrupting any bytes of a valid frame gives an error or some message, never a
    /// panic; whatever decodes also survives the server's request preparation.
    #[test]
    fn corrupted_frames_never_panic(
        m in message(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = encode_to_vec(&m).unwrap();
        for (i, v) in flips {
            let at = i.index(bytes.len());
            bytes[at] = v;
        }
        if let Ok(Some((m, n))) = decode(&bytes) {
            prop_assert!(n <= bytes.len());
            let _ = prepare(m);
        }
    }

    /// Invariant: random payloads behind a valid header (so the opcode-specific parsers, not the
    /// length check, see them) never panic.
    #[test]
    fn random_payloads_under_valid_headers_never_panic(
        op in prop_oneof![Just(1i32), Just(2004), Just(2012), Just(2013), any::<i32>()],
        payload in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let mut bytes = ((16 + payload.len()) as i32).to_le_bytes().to_vec();
        bytes.extend_from_slice(&1i32.to_le_bytes());
        bytes.extend_from_slice(&0i32.to_le_bytes());
        bytes.extend_from_slice(&op.to_le_bytes());
        bytes.extend_from_slice(&payload);
        if let Ok(Some((m, n))) = decode(&bytes) {
            prop_assert_eq!(n, bytes.len());
            let _ = prepare(m);
        }
    }
}
