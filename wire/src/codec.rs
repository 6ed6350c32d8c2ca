//! A tokio-util `Decoder`/`Encoder` over the pure [`frame`] functions.
//!
//! Invariants: the codec owns no protocol logic. It advances the buffer by exactly the frame
//! length the pure decoder reports, and on a recoverable [`FrameError`] (`skip: Some(n)`)
//! discards those `n` bytes before returning the error so the next call starts at the next
//! frame.
//!
//! The read buffer grows with the bytes that actually arrived, never with what a header only
//! promises: while a frame is incomplete the codec makes room for at most
//! `max(bytes buffered, READ_STEP)` more (and never past the frame's end), and only when less
//! than [`READ_MIN_SPARE`] is free. So a peer that sends a header declaring 48 MB and then
//! trickles costs a few kilobytes, and a frame that does arrive grows its buffer by doubling
//! (amortised linear copying) to at most its own length plus a step. The declared length is
//! trusted for nothing but this bound, and only after `frame::decode` checked it against
//! [`crate::MAX_MESSAGE_SIZE`].
//!
//! With `tokio_util::codec::Framed`, any decoder error ends the stream; callers that want to keep
//! going after a recoverable error (the server does) call [`Decoder::decode`] themselves.

use bytes::{Buf, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::error::MongoError;
use crate::frame::{self, FrameError};
use crate::message::Message;

/// The least room the codec asks for at a time while a frame is incomplete.
pub const READ_STEP: usize = 8 * 1024;
/// The buffer grows only when less than this is free: a read into less would be a short one.
pub const READ_MIN_SPARE: usize = 4 * 1024;

/// The codec error: the socket failed, a frame was bad or too slow, or a message could not be
/// encoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("bad frame: {0}")]
    Frame(#[from] FrameError),
    #[error("cannot encode message: {0}")]
    Encode(MongoError),
    /// A frame had started to arrive (or a reply to go out) and did not finish within the
    /// connection's frame timeout.
    #[error("a frame did not {0} whole within {1:?}")]
    Timeout(Direction, std::time::Duration),
}

/// Which way a frame that timed out was going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Read,
    Write,
}

impl std::fmt::Display for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Direction::Read => "arrive",
            Direction::Write => "go out",
        })
    }
}

/// Frames [`Message`]s on a byte stream.
#[derive(Debug, Default, Clone, Copy)]
pub struct MessageCodec;

impl Decoder for MessageCodec {
    type Item = Message;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Message>, CodecError> {
        match frame::decode(src) {
            Ok(Some((message, len))) => {
                src.advance(len);
                Ok(Some(message))
            }
            Ok(None) => {
                make_room(src);
                Ok(None)
            }
            Err(e) => {
                if let Some(n) = e.skip {
                    src.advance(n.min(src.len()));
                }
                Err(CodecError::Frame(e))
            }
        }
    }
}

/// Makes room for the next read of an incomplete frame, in proportion to what has arrived
/// (see the module header). Without a readable length, room for the header is enough.
fn make_room(src: &mut BytesMut) {
    let remaining = declared_len(src).map_or(READ_STEP, |len| len.saturating_sub(src.len()));
    let spare = src.capacity() - src.len();
    if spare >= READ_MIN_SPARE.min(remaining) {
        return;
    }
    src.reserve(remaining.min(src.len().max(READ_STEP)));
}

/// The declared length of the frame at the front of `src`, if readable. Only called after
/// `frame::decode` accepted that length (or found too few bytes to read it).
fn declared_len(src: &[u8]) -> Option<usize> {
    let bytes: [u8; 4] = src.get(..4)?.try_into().ok()?;
    usize::try_from(i32::from_le_bytes(bytes)).ok()
}

impl Encoder<&Message> for MessageCodec {
    type Error = CodecError;

    fn encode(&mut self, item: &Message, dst: &mut BytesMut) -> Result<(), CodecError> {
        frame::encode(item, dst).map_err(CodecError::Encode)
    }
}

impl Encoder<Message> for MessageCodec {
    type Error = CodecError;

    fn encode(&mut self, item: Message, dst: &mut BytesMut) -> Result<(), CodecError> {
        frame::encode(&item, dst).map_err(CodecError::Encode)
    }
}

#[cfg(test)]
mod tests {
    use bson::rawdoc;
    use proptest::prelude::*;

    use super::*;
    use crate::MAX_MESSAGE_SIZE;
    use crate::frame::encode_to_vec;
    use crate::message::opcode;

    /// A header declaring a frame of `len` bytes.
    fn header(len: i32) -> Vec<u8> {
        let mut h = len.to_le_bytes().to_vec();
        h.extend_from_slice(&7i32.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes());
        h.extend_from_slice(&opcode::OP_MSG.to_le_bytes());
        h
    }

    /// What a socket read does: appends at most the buffer's spare capacity.
    fn read_into(buf: &mut BytesMut, bytes: &[u8]) -> usize {
        let n = bytes.len().min(buf.capacity() - buf.len());
        buf.extend_from_slice(&bytes[..n]);
        n
    }

    #[test]
    fn a_declared_48_mb_frame_with_a_few_bytes_sent_reserves_little() {
        for start in [BytesMut::new(), BytesMut::with_capacity(8 * 1024)] {
            let mut buf = start;
            buf.extend_from_slice(&header(MAX_MESSAGE_SIZE as i32));
            buf.extend_from_slice(b"abc");
            assert!(matches!(MessageCodec.decode(&mut buf), Ok(None)));
            assert!(
                buf.capacity() <= 2 * READ_STEP,
                "capacity {} for 19 bytes of a 48 MB frame",
                buf.capacity()
            );
            assert!(buf.capacity() > buf.len(), "room for the next read");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The buffer stays within twice what arrived plus two steps, however long the frame
        /// claims to be and however the bytes are split.
        #[test]
        fn the_buffer_grows_only_with_the_bytes_that_arrived(
            declared in 16usize..=MAX_MESSAGE_SIZE,
            sent in 0usize..200_000,
            chunk in 1usize..70_000,
        ) {
            let sent = sent.min(declared - 1);
            let mut bytes = header(declared as i32);
            bytes.resize(sent.max(16), 0);
            bytes.truncate(sent);
            let mut buf = BytesMut::with_capacity(8 * 1024);
            let mut at = 0;
            while at < bytes.len() {
                prop_assert!(matches!(MessageCodec.decode(&mut buf), Ok(None)));
                prop_assert!(buf.capacity() > buf.len(), "no room to read into");
                let end = (at + chunk).min(bytes.len());
                at += read_into(&mut buf, &bytes[at..end]);
                prop_assert!(buf.capacity() <= 2 * (at + 2 * READ_STEP));
            }
        }

        /// A frame read in pieces of any size decodes as it was sent, and its buffer never
        /// holds much more than the frame.
        #[test]
        fn a_frame_read_in_pieces_decodes_whole(
            filler in 0usize..300_000,
            chunk in 1usize..100_000,
        ) {
            let body = rawdoc! { "insert": "c", "pad": "x".repeat(filler), "$db": "t" };
            let message = Message::msg(3, body);
            let bytes = encode_to_vec(&message).expect("encodes");
            let mut buf = BytesMut::with_capacity(8 * 1024);
            let mut at = 0;
            let decoded = loop {
                if let Some(m) = MessageCodec.decode(&mut buf).expect("decodes") {
                    break m;
                }
                prop_assert!(at < bytes.len(), "whole frame sent but not decoded");
                let end = (at + chunk).min(bytes.len());
                at += read_into(&mut buf, &bytes[at..end]);
                prop_assert!(buf.capacity() <= 2 * (bytes.len() + 2 * READ_STEP));
            };
            prop_assert_eq!(decoded, message);
            prop_assert!(buf.is_empty());
        }
    }
}
