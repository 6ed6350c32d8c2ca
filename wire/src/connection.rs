//! A buffered connection (TCP, or TLS over TCP: any [`Transport`]) that reads and writes whole
//! [`Message`]s (the mini-redis `Connection` layer), shared by the server loop and the client.
//!
//! Invariants: reads go through [`MessageCodec`], so a frame is handed out only once it is
//! complete, and the buffer grows only with the bytes that arrived (never by what a header
//! declares); a recoverable frame error has already been skipped when it is returned, so the
//! next read starts at the next frame. Each write sends one whole frame: an encoded one, or a
//! plain OP_MSG's prefix and body parts in vectored writes (the body is never copied). A
//! buffer that grew past [`RETAINED_BUFFER`] for one large message is let go once it is empty,
//! so an idle connection holds kilobytes, not the size of the largest batch it ever carried.
//!
//! With a frame timeout ([`Connection::with_frame_timeout`]), waiting is bounded only once a
//! frame has begun: a read may wait for a frame's first byte for ever (drivers keep pooled
//! connections idle for long), but from that byte on the whole frame must arrive within the
//! timeout; a write must finish within it. Over TLS a frame begins with its first record's
//! first byte, which the transport notes ([`Transport::partial_since`]) though no read shows
//! it until the record is whole. Past it the call fails with
//! [`CodecError::Timeout`] and the connection is no longer usable (a frame may be half done).

use std::io::IoSlice;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::{Decoder, Encoder};

use crate::codec::{CodecError, Direction, MessageCodec};
use crate::message::{Message, MsgFlags};
use crate::raw::Spliced;

const INITIAL_BUFFER: usize = 8 * 1024;
/// The most an empty buffer keeps between messages.
const RETAINED_BUFFER: usize = 64 * 1024;

/// Lets go of a buffer that grew for one large message, once it is empty.
fn shrink(buf: &mut BytesMut) {
    if buf.is_empty() && buf.capacity() > RETAINED_BUFFER {
        *buf = BytesMut::with_capacity(INITIAL_BUFFER);
    }
}

/// A write, within the frame timeout when there is one.
async fn timed(
    timeout: Option<Duration>,
    write: impl Future<Output = std::io::Result<()>>,
) -> Result<(), CodecError> {
    match timeout {
        None => write.await.map_err(CodecError::Io),
        Some(timeout) => tokio::time::timeout(timeout, write)
            .await
            .map_err(|_| CodecError::Timeout(Direction::Write, timeout))
            .and_then(|r| r.map_err(CodecError::Io)),
    }
}

/// Byte slices sent one after another, as a [`Buf`] that offers them all to a vectored write
/// (tokio's `write_all_buf` writes up to 64 slices a call).
struct Parts<'a> {
    /// Never an empty slice; the first not yet sent in whole is at `next`.
    parts: Vec<&'a [u8]>,
    next: usize,
    remaining: usize,
}

impl<'a> Parts<'a> {
    fn new(mut parts: Vec<&'a [u8]>) -> Parts<'a> {
        parts.retain(|p| !p.is_empty());
        let remaining = parts.iter().map(|p| p.len()).sum();
        Parts {
            parts,
            next: 0,
            remaining,
        }
    }
}

impl Buf for Parts<'_> {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.parts.get(self.next).copied().unwrap_or(&[])
    }

    fn chunks_vectored<'b>(&'b self, dst: &mut [IoSlice<'b>]) -> usize {
        let mut filled = 0;
        for (slot, part) in dst.iter_mut().zip(&self.parts[self.next..]) {
            *slot = IoSlice::new(part);
            filled += 1;
        }
        filled
    }

    fn advance(&mut self, mut cnt: usize) {
        self.remaining = self.remaining.saturating_sub(cnt);
        while cnt > 0 {
            let Some(part) = self.parts.get_mut(self.next) else {
                return;
            };
            if cnt < part.len() {
                *part = &part[cnt..];
                return;
            }
            cnt -= part.len();
            self.next += 1;
        }
    }
}

/// What a connection runs over: a TCP stream, or TLS over one.
pub trait Transport: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static {
    /// The TCP socket underneath.
    fn tcp(&self) -> &TcpStream;

    /// Whether it hands bytes out only once a whole record of them has come (TLS), so bytes
    /// can arrive that no read shows yet.
    fn decodes_records(&self) -> bool {
        false
    }

    /// For a transport that decodes records: since when it has held bytes of a record that
    /// it has not handed out (`None`: none held since the last [`Transport::handed_out`]).
    fn partial_since(&self) -> Option<tokio::time::Instant> {
        None
    }

    /// What it held was handed out (a read returned bytes).
    fn handed_out(&mut self) {}
}

impl Transport for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

pub struct Connection {
    stream: Box<dyn Transport>,
    read_buf: BytesMut,
    write_buf: BytesMut,
    codec: MessageCodec,
    /// See the module header; `None`: reads and writes wait as long as the peer takes.
    frame_timeout: Option<Duration>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.stream.tcp().peer_addr().ok())
            .finish_non_exhaustive()
    }
}

impl Connection {
    pub fn new(stream: impl Transport) -> Connection {
        Connection::over(Box::new(stream))
    }

    pub fn over(stream: Box<dyn Transport>) -> Connection {
        Connection {
            stream,
            read_buf: BytesMut::with_capacity(INITIAL_BUFFER),
            write_buf: BytesMut::with_capacity(INITIAL_BUFFER),
            codec: MessageCodec,
            frame_timeout: None,
        }
    }

    /// Bounds the time a frame may take to arrive once begun, and a reply to go out.
    pub fn with_frame_timeout(mut self, timeout: Duration) -> Connection {
        self.frame_timeout = Some(timeout);
        self
    }

    /// The next message; `Ok(None)` when the peer closed cleanly between frames.
    pub async fn read_message(&mut self) -> Result<Option<Message>, CodecError> {
        // Set once the frame has begun: when bytes of it are buffered.
        let mut deadline = None;
        loop {
            if let Some(message) = self.codec.decode(&mut self.read_buf)? {
                shrink(&mut self.read_buf);
                return Ok(Some(message));
            }
            if deadline.is_none() && !self.read_buf.is_empty() {
                deadline = self
                    .frame_timeout
                    .map(|t| (tokio::time::Instant::now() + t, t));
            }
            let n = match (deadline, self.frame_timeout) {
                (Some((at, timeout)), _) => {
                    tokio::time::timeout_at(at, self.stream.read_buf(&mut self.read_buf))
                        .await
                        .map_err(|_| CodecError::Timeout(Direction::Read, timeout))??
                }
                (None, Some(timeout)) if self.stream.decodes_records() => {
                    self.read_first_record(timeout).await?
                }
                (None, _) => self.stream.read_buf(&mut self.read_buf).await?,
            };
            if n > 0 {
                self.stream.handed_out();
            }
            if n == 0 {
                if self.read_buf.is_empty() {
                    return Ok(None);
                }
                return Err(CodecError::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "connection closed in the middle of a frame",
                )));
            }
        }
    }

    /// Waits for a frame's first bytes over a transport that decodes records: as long as
    /// nothing arrives, but a record whose first bytes have come must be whole within
    /// `timeout` of them (a client trickling a TLS record is closed like one trickling a
    /// frame).
    async fn read_first_record(&mut self, timeout: Duration) -> Result<usize, CodecError> {
        loop {
            let now = tokio::time::Instant::now();
            let until = self.stream.partial_since().map_or(now, |since| since) + timeout;
            match tokio::time::timeout_at(until, self.stream.read_buf(&mut self.read_buf)).await {
                Ok(read) => return Ok(read?),
                Err(_) => {
                    if self
                        .stream
                        .partial_since()
                        .is_some_and(|since| since.elapsed() >= timeout)
                    {
                        return Err(CodecError::Timeout(Direction::Read, timeout));
                    }
                }
            }
        }
    }

    /// Encodes and sends one message. A plain OP_MSG goes out as its prefix and its body's
    /// own bytes (one vectored write where the transport has them), with no copy of the body.
    pub async fn write_message(&mut self, message: &Message) -> Result<(), CodecError> {
        self.write_buf.clear();
        let parts = crate::frame::plain_msg_parts(message).map_err(CodecError::Encode)?;
        if parts.is_none() {
            self.codec.encode(message, &mut self.write_buf)?;
        }
        let (stream, encoded) = (&mut self.stream, &self.write_buf);
        let write = async move {
            match parts {
                Some((prefix, body)) => {
                    let mut frame = Parts::new(vec![&prefix[..], body]);
                    stream.write_all_buf(&mut frame).await
                }
                None => stream.write_all(encoded).await,
            }
        };
        let written = timed(self.frame_timeout, write).await;
        self.write_buf.clear();
        shrink(&mut self.write_buf);
        written
    }

    /// Sends a plain OP_MSG whose body is spliced ([`Spliced`]): the prefix and every part in
    /// vectored writes, so shared bytes (a change-stream batch's events) are never copied.
    pub async fn write_spliced(
        &mut self,
        request_id: i32,
        response_to: i32,
        flags: MsgFlags,
        body: &Spliced,
    ) -> Result<(), CodecError> {
        let prefix = crate::frame::msg_prefix(body.len(), request_id, response_to, flags)
            .map_err(CodecError::Encode)?;
        let mut frame = Parts::new(std::iter::once(&prefix[..]).chain(body.parts()).collect());
        let stream = &mut self.stream;
        timed(self.frame_timeout, stream.write_all_buf(&mut frame)).await
    }

    /// Sends bytes as they are (tests use this to send hand-built or malformed frames).
    pub async fn write_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// Best-effort check, without waiting, that an idle connection is still usable: the peer has
    /// not closed or reset it and sent nothing unasked (either would make the next reply
    /// ambiguous). It asks the socket itself (a non-blocking peek), not tokio's cached
    /// readiness, which can lag behind a peer that was just killed.
    pub fn is_stale(&self) -> bool {
        if !self.read_buf.is_empty() {
            return true;
        }
        let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        // The socket is non-blocking (tokio's), so the peek returns at once.
        match socket2::SockRef::from(self.stream.tcp()).peek(&mut probe) {
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
            Ok(_) => true,
        }
    }

    /// Flushes and shuts down the write half.
    pub async fn shutdown(&mut self) -> std::io::Result<()> {
        self.stream.shutdown().await
    }
}

#[cfg(test)]
mod buffer_tests {
    use super::*;

    #[test]
    fn a_buffer_grown_for_one_large_message_is_let_go_once_empty() {
        let mut grown = BytesMut::with_capacity(4 * 1024 * 1024);
        grown.extend_from_slice(b"pending");
        shrink(&mut grown);
        assert!(
            grown.capacity() >= 4 * 1024 * 1024,
            "kept while it holds bytes"
        );
        grown.clear();
        shrink(&mut grown);
        assert!(grown.capacity() <= RETAINED_BUFFER);
        let mut small = BytesMut::with_capacity(RETAINED_BUFFER);
        shrink(&mut small);
        assert_eq!(
            small.capacity(),
            RETAINED_BUFFER,
            "small buffers are kept as they are"
        );
    }
}
