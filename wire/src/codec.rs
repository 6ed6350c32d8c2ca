//! A tokio-util `Decoder`/`Encoder` over the pure [`frame`] functions.
//!
//! Invariants: the codec owns no protocol logic. It advances the buffer by exactly the frame
//! length the pure decoder reports, reserves room for a frame only after its length passed the
//! checks, and on a recoverable [`FrameError`] (`skip: Some(n)`) discards those `n` bytes before
//! returning the error so the next call starts at the next frame.
//!
//! With `tokio_util::codec::Framed`, any decoder error ends the stream; callers that want to keep
//! going after a recoverable error (the server does) call [`Decoder::decode`] themselves.

use bytes::{Buf, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::error::MongoError;
use crate::frame::{self, FrameError};
use crate::message::Message;

/// The codec error: the socket failed, a frame was bad, or a message could not be encoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("bad frame: {0}")]
    Frame(#[from] FrameError),
    #[error("cannot encode message: {0}")]
    Encode(MongoError),
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
                // Reserve for the rest of the frame once its (already valid) length is known.
                if let Some(len) = declared_len(src) {
                    src.reserve(len.saturating_sub(src.len()));
                }
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

/// The declared length of the frame at the front of `src`, if readable. Only called after
/// `frame::decode` accepted that length.
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
