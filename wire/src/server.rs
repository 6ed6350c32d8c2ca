//! The connection loop shared by the router and the shard servers: frames in, [`Handler`] calls,
//! frames out.
//!
//! Invariants:
//! * One request at a time per connection, answered in the form it came in: an OP_MSG gets an
//!   OP_MSG reply (`responseTo` = its `requestID`, flags 0), an OP_QUERY an OP_REPLY
//!   (`responseFlags` 8, cursor 0, one document); a compressed request gets a reply compressed
//!   the same way, except handshake and auth commands, which are never compressed; a request
//!   with a checksum gets a reply with one.
//! * Exhaust cursors: a `getMore` sent with `exhaustAllowed` whose reply leaves the cursor open
//!   with a non-empty batch is answered with `moreToCome` set, and the loop runs the same
//!   `getMore` again by itself, each reply answering the previous one (`responseTo` = its
//!   `requestID`), until a reply closes the cursor, comes back empty, or fails: that one goes
//!   out with flags 0 and the client speaks again (see [`exhausts`]). Every other request gets
//!   at most one reply.
//! * A request with `moreToCome` never gets a reply, not even an error (the client will not read
//!   one, and a stray reply would be taken as the answer to its next request).
//! * Compression is negotiated here: a hello with `compression: [...]` gets back, in an `ok`
//!   reply, the names it offered that we support, in its order (the field is left out when none).
//! * Bad input never panics or hangs the loop. A frame whose length cannot be trusted, or that
//!   fails to parse, is answered (when its `requestID` is known) with `{ok: 0, errmsg, code,
//!   codeName}` and the connection is closed, as mongod does for connection-fatal parse errors.
//!   A well-framed message we cannot serve (unknown opcode, invalid BSON in a body, an OP_QUERY
//!   command other than the handshake) is answered with an error and the loop carries on.
//! * Every value from the network is bounded before use and every wait on a peer has a deadline,
//!   except the wait for a frame's first byte (pooled connections idle for long): a connection
//!   past the limit is closed at once; the read buffer grows only with bytes that arrived; a
//!   frame must arrive whole, a reply go out and a TLS handshake finish within the frame timeout
//!   (see [`crate::limits`]), else the connection is closed.
//!
//! The decisions (request → [`Request`], handler reply → reply frame) are the pure functions
//! [`prepare`] and [`reply_message`]; the async part only moves bytes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bson::{Bson, Document, RawDocumentBuf, doc};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::codec::CodecError;
use crate::connection::{Connection, Transport};
use crate::error::{ErrorCode, MongoError, reply_ok};
use crate::frame::FrameError;
use crate::limits::{Admitted, Connections, Limits};
use crate::message::{Compressor, Message, MsgFlags, Op, OpMsg, OpReply, opcode, to_document};
use crate::raw::{CursorBody, Spliced};
use crate::tls::ServerTls;

/// A command as the handler sees it, whatever opcode carried it.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The kind-0 body, with each kind-1 sequence merged in as an array under its identifier.
    pub body: Document,
    /// From `$db`, or from OP_QUERY's `<db>.$cmd`.
    pub db: String,
    pub more_to_come: bool,
    pub exhaust_allowed: bool,
    pub legacy_op_query: bool,
}

impl Request {
    /// The command name: the body's first key.
    pub fn command_name(&self) -> &str {
        self.body.keys().next().map(String::as_str).unwrap_or("")
    }
}

/// What the handler wants sent back.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Document(Document),
    /// A reply already encoded.
    Raw(RawDocumentBuf),
    /// A cursor reply whose batch is shared bytes (change-stream batches), sent without a copy.
    Cursor(CursorBody),
    /// Send nothing (the request needs no answer).
    NoReply,
    /// Close the socket without answering (fail points use this to simulate a network error).
    CloseConnection,
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionInfo {
    pub id: u64,
    pub peer: SocketAddr,
}

/// Serves commands. One call per request; calls on one connection never overlap.
#[async_trait::async_trait]
pub trait Handler: Send + Sync + 'static {
    async fn handle(&self, conn: &ConnectionInfo, req: Request) -> Reply;

    /// A connection opened, before its first request.
    fn opened(&self, _conn: &ConnectionInfo) {}

    /// A connection closed (or its task stopped), after its last request.
    fn closed(&self, _conn: &ConnectionInfo) {}
}

/// Tells the handler a connection closed when dropped, however its task ends.
struct Opened<H: Handler> {
    handler: Arc<H>,
    conn: ConnectionInfo,
}

impl<H: Handler> Drop for Opened<H> {
    fn drop(&mut self) {
        self.handler.closed(&self.conn);
    }
}

/// Commands that open a connection: never compressed, and where compression is negotiated.
const HELLO_COMMANDS: [&str; 3] = ["hello", "isMaster", "ismaster"];
/// Commands whose replies are never compressed (OP_COMPRESSED spec).
const UNCOMPRESSED_COMMANDS: [&str; 11] = [
    "hello",
    "isMaster",
    "ismaster",
    "saslStart",
    "saslContinue",
    "getnonce",
    "authenticate",
    "createUser",
    "updateUser",
    "copydbSaslStart",
    "copydbgetnonce",
];
/// Commands mongod still accepts over OP_QUERY (`checkAllowedOpQueryCommand`).
const OP_QUERY_COMMANDS: [&str; 9] = [
    "hello",
    "isMaster",
    "ismaster",
    "_isSelf",
    "authenticate",
    "buildinfo",
    "buildInfo",
    "saslContinue",
    "saslStart",
];

/// How to address the reply to one request.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplyTo {
    pub request_id: i32,
    /// Answer with OP_REPLY (the request was an OP_QUERY).
    pub legacy: bool,
    /// Compress the reply with this (the request's compressor, unless the command is exempt).
    pub compressor: Option<Compressor>,
    /// Send nothing at all.
    pub more_to_come: bool,
    /// Append a CRC-32C to the reply (the request carried one, as mongod answers).
    pub checksum: bool,
    /// `Some` when the request was a hello offering compressors: the ones we accept.
    pub negotiated: Option<Vec<Compressor>>,
}

/// The outcome of [`prepare`]: a request for the handler, or an error to answer with directly.
#[derive(Debug, Clone, PartialEq)]
pub enum Prepared {
    Request(Request, ReplyTo),
    Error(MongoError, ReplyTo),
}

/// Runs synchronous work that may take long (a scan, a pipeline, parsing a large command) on
/// a multi-threaded runtime with `block_in_place`: the worker's other tasks (a new
/// connection's accept, a `ping`, a `_killOperations`) move to another thread meanwhile
/// instead of waiting behind it. On any other runtime (tests) it just runs.
pub fn long_running<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

// Messages past `LARGE_MESSAGE` bytes are turned into requests under `long_running`: parsing
// a 16 MiB command of a million small elements takes a debug build about a second.
use crate::limits::LARGE_MESSAGE;

/// [`prepare`], aside from the worker's other tasks when the message is large.
fn prepare_aside_if_large(message: Message) -> Prepared {
    if message.op.bytes() > LARGE_MESSAGE {
        long_running(|| prepare(message))
    } else {
        prepare(message)
    }
}

/// Turns a decoded message into a handler request (pure).
pub fn prepare(message: Message) -> Prepared {
    let mut to = ReplyTo {
        request_id: message.request_id,
        legacy: false,
        compressor: message.compressor,
        more_to_come: false,
        checksum: false,
        negotiated: None,
    };
    let request = match message.op {
        Op::Msg(msg) => {
            to.more_to_come = msg.flags.more_to_come();
            to.checksum = msg.flags.checksum_present();
            request_from_msg(msg)
        }
        Op::Query(query) => {
            to.legacy = true;
            request_from_query(query)
        }
        Op::Reply(_) => Err(MongoError::new(
            ErrorCode::PROTOCOL_ERROR,
            format!("Unsupported opcode {} from a client", opcode::OP_REPLY),
        )),
    };
    match request {
        Ok(req) => {
            let name = req.command_name();
            if UNCOMPRESSED_COMMANDS.contains(&name) {
                to.compressor = None;
            }
            if HELLO_COMMANDS.contains(&name) {
                to.negotiated = offered_compressors(&req.body);
            }
            Prepared::Request(req, to)
        }
        Err(e) => Prepared::Error(e, to),
    }
}

/// A command document is a BSON object: at most 16 MiB (and the 16 KiB MongoDB allows for its
/// own fields), whatever the 48 MB a message may carry in document sequences. Checked before
/// the body is parsed, so an oversized one costs no parse.
fn check_body_size(body: &bson::RawDocument) -> Result<(), MongoError> {
    let size = body.as_bytes().len();
    if size > crate::MAX_INTERNAL_BSON_SIZE {
        return Err(MongoError::new(
            ErrorCode::BSON_OBJECT_TOO_LARGE,
            format!(
                "BSONObj size: {size} ({size:#X}) is invalid. Size must be between 0 and {}(16MB)",
                crate::MAX_INTERNAL_BSON_SIZE
            ),
        ));
    }
    Ok(())
}

fn request_from_msg(msg: OpMsg) -> Result<Request, MongoError> {
    check_body_size(&msg.body)?;
    let mut body = to_document(&msg.body)?;
    for seq in &msg.sequences {
        if body.contains_key(&seq.identifier) {
            return Err(MongoError::with_code(
                40433,
                format!(
                    "Duplicate field between body and document sequence {}",
                    seq.identifier
                ),
            ));
        }
        let docs = seq
            .documents
            .iter()
            .map(|d| to_document(d).map(Bson::Document))
            .collect::<Result<Vec<_>, _>>()?;
        body.insert(seq.identifier.clone(), docs);
    }
    let db = match body.get("$db") {
        Some(Bson::String(db)) => db.clone(),
        Some(_) => {
            return Err(MongoError::type_mismatch("$db must be a string"));
        }
        None => {
            return Err(MongoError::with_code(
                40571,
                "OP_MSG requests require a $db argument",
            ));
        }
    };
    Ok(Request {
        body,
        db,
        more_to_come: msg.flags.more_to_come(),
        exhaust_allowed: msg.flags.exhaust_allowed(),
        legacy_op_query: false,
    })
}

fn request_from_query(query: crate::message::OpQuery) -> Result<Request, MongoError> {
    let unsupported = |what: &str| {
        MongoError::new(
            ErrorCode::UNSUPPORTED_OP_QUERY_COMMAND,
            format!(
                "Unsupported OP_QUERY command: {what}. The client driver may require an upgrade. \
                 For more details see https://dochub.mongodb.org/core/legacy-opcode-removal"
            ),
        )
    };
    let db = query
        .command_db()
        .ok_or_else(|| unsupported(&query.full_collection_name))?
        .to_string();
    check_body_size(&query.query)?;
    let mut body = to_document(&query.query)?;
    // Drivers may wrap the command as `{$query: {...}, $readPreference: ...}`.
    if let Some(Bson::Document(inner)) = body.get("$query") {
        body = inner.clone();
    }
    let name = body.keys().next().cloned().unwrap_or_default();
    if !OP_QUERY_COMMANDS.contains(&name.as_str()) {
        return Err(unsupported(&name));
    }
    Ok(Request {
        body,
        db,
        more_to_come: false,
        exhaust_allowed: false,
        legacy_op_query: true,
    })
}

/// The supported compressors a hello offers, in the client's order (`None` if it offers none).
fn offered_compressors(body: &Document) -> Option<Vec<Compressor>> {
    let offered = body.get_array("compression").ok()?;
    let mut accepted: Vec<Compressor> = Vec::new();
    for c in offered
        .iter()
        .filter_map(Bson::as_str)
        .filter_map(Compressor::from_name)
    {
        if !accepted.contains(&c) {
            accepted.push(c);
        }
    }
    Some(accepted)
}

/// The frame that answers a request with `reply` (pure); `None` when nothing is to be sent.
pub fn reply_message(to: &ReplyTo, mut reply: Document) -> Option<Message> {
    if to.more_to_come {
        return None;
    }
    if let Some(accepted) = &to.negotiated
        && !accepted.is_empty()
        && reply_ok(&reply)
    {
        let names: Vec<Bson> = accepted.iter().map(|c| Bson::from(c.name())).collect();
        reply.insert("compression", names);
    }
    let raw = RawDocumentBuf::try_from(&reply).unwrap_or_else(|e| {
        tracing::error!(error = %e, "handler reply is not serialisable");
        error_raw(&MongoError::internal(format!(
            "reply could not be serialised: {e}"
        )))
    });
    raw_reply_message(to, raw)
}

/// The frame that answers a request with an encoded reply (pure); `None` when nothing is to be
/// sent. Compression negotiation is a hello's business, so it is never added here.
pub fn raw_reply_message(to: &ReplyTo, raw: RawDocumentBuf) -> Option<Message> {
    if to.more_to_come {
        return None;
    }
    Some(Message {
        request_id: next_reply_id(),
        response_to: to.request_id,
        compressor: to.compressor,
        op: if to.legacy {
            Op::Reply(OpReply::command_reply(raw))
        } else {
            let mut msg = OpMsg::new(raw);
            if to.checksum {
                msg.flags = MsgFlags(MsgFlags::CHECKSUM_PRESENT);
            }
            Op::Msg(msg)
        },
    })
}

/// A frame ready to send: an encoded message, or a plain OP_MSG with a spliced body.
enum Outgoing {
    Message(Message),
    Spliced {
        request_id: i32,
        response_to: i32,
        flags: MsgFlags,
        body: Spliced,
    },
}

impl Outgoing {
    fn request_id(&self) -> i32 {
        match self {
            Outgoing::Message(m) => m.request_id,
            Outgoing::Spliced { request_id, .. } => *request_id,
        }
    }

    /// Flags an exhaust reply: more replies follow without a request.
    fn set_more_to_come(&mut self) {
        let flags = match self {
            Outgoing::Message(Message {
                op: Op::Msg(msg), ..
            }) => &mut msg.flags,
            Outgoing::Spliced { flags, .. } => flags,
            Outgoing::Message(_) => return,
        };
        *flags = MsgFlags(flags.0 | MsgFlags::MORE_TO_COME);
    }

    async fn send(&self, io: &mut Connection) -> Result<(), CodecError> {
        match self {
            Outgoing::Message(m) => io.write_message(m).await,
            Outgoing::Spliced {
                request_id,
                response_to,
                flags,
                body,
            } => {
                io.write_spliced(*request_id, *response_to, *flags, body)
                    .await
            }
        }
    }
}

/// The frame for a handler's reply (`None` for replies that send nothing). A cursor reply
/// keeps its parts on a plain OP_MSG; a legacy, compressed or checksummed reply needs its bytes
/// whole, so there it is copied once.
fn frame_of(to: &ReplyTo, reply: Reply) -> Option<Outgoing> {
    let message = match reply {
        Reply::Document(doc) => reply_message(to, doc),
        Reply::Raw(raw) => raw_reply_message(to, raw),
        Reply::Cursor(_) if to.more_to_come => None,
        Reply::Cursor(c) if !to.legacy && to.compressor.is_none() && !to.checksum => {
            return Some(Outgoing::Spliced {
                request_id: next_reply_id(),
                response_to: to.request_id,
                flags: MsgFlags(0),
                body: c.doc,
            });
        }
        Reply::Cursor(c) => match c.doc.to_raw() {
            Ok(raw) => raw_reply_message(to, raw),
            Err(e) => reply_message(to, e.to_document()),
        },
        Reply::NoReply | Reply::CloseConnection => None,
    };
    message.map(Outgoing::Message)
}

/// Whether an exhaust `getMore`'s reply lets the stream go on (pure): it succeeded, its
/// cursor is still open, and its batch was not empty (an empty batch from a tailable cursor
/// hands the turn back to the client rather than spinning).
pub fn exhausts(reply: &Reply) -> bool {
    let (ok, id, batch_len) = match reply {
        Reply::Document(d) => {
            let cursor = d.get_document("cursor").ok();
            (
                reply_ok(d),
                cursor.and_then(|c| c.get_i64("id").ok()).unwrap_or(0),
                cursor
                    .and_then(|c| c.get_array("nextBatch").ok())
                    .map_or(0, Vec::len),
            )
        }
        Reply::Raw(raw) => {
            let ok = match raw.get("ok") {
                Ok(Some(bson::RawBsonRef::Double(v))) => v != 0.0,
                Ok(Some(bson::RawBsonRef::Int32(v))) => v != 0,
                Ok(Some(bson::RawBsonRef::Int64(v))) => v != 0,
                _ => false,
            };
            let cursor = raw.get_document("cursor").ok();
            (
                ok,
                cursor.and_then(|c| c.get_i64("id").ok()).unwrap_or(0),
                cursor
                    .and_then(|c| c.get_array("nextBatch").ok())
                    .map_or(0, |a| a.into_iter().count()),
            )
        }
        Reply::Cursor(c) => (true, c.id, c.batch_len),
        Reply::NoReply | Reply::CloseConnection => return false,
    };
    ok && id != 0 && batch_len > 0
}

/// The error reply for a frame that failed to decode, when it can be addressed.
fn frame_error_reply(e: &FrameError) -> Option<Message> {
    let request_id = e.request_id?;
    let to = ReplyTo {
        request_id,
        legacy: e.op_code == Some(opcode::OP_QUERY),
        compressor: None,
        more_to_come: false,
        checksum: false,
        negotiated: None,
    };
    reply_message(&to, e.error.to_document())
}

fn error_raw(e: &MongoError) -> RawDocumentBuf {
    let doc = e.to_document();
    RawDocumentBuf::try_from(&doc).unwrap_or_else(|_| RawDocumentBuf::new())
}

/// Request ids for server-originated messages (replies); only uniqueness matters.
fn next_reply_id() -> i32 {
    static NEXT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed) & i32::MAX
}

/// Serves one admitted connection until the peer closes it, a fatal frame error, a frame
/// timeout, or `CloseConnection`; with `tls`, after telling whether it speaks TLS (see
/// [`crate::tls`]). Dropping `admitted` at the end counts the connection out.
pub async fn serve_connection<H: Handler>(
    stream: TcpStream,
    handler: Arc<H>,
    conn: ConnectionInfo,
    tls: Option<Arc<ServerTls>>,
    admitted: Admitted,
) {
    let span = tracing::info_span!("connection", id = conn.id, peer = %conn.peer);
    async move {
        let _ = stream.set_nodelay(true);
        let transport: Box<dyn Transport> = match &tls {
            None => Box::new(stream),
            Some(tls) => match tls.accept(stream, admitted.limits().frame_timeout).await {
                Some(t) => t,
                None => return,
            },
        };
        run_connection(transport, handler, conn, &admitted).await;
    }
    .instrument(span)
    .await;
}

async fn run_connection<H: Handler>(
    stream: Box<dyn Transport>,
    handler: Arc<H>,
    conn: ConnectionInfo,
    admitted: &Admitted,
) {
    handler.opened(&conn);
    let _open = Opened {
        handler: Arc::clone(&handler),
        conn,
    };
    let mut io = Connection::over(stream).with_frame_timeout(admitted.limits().frame_timeout);
    tracing::debug!("connection opened");
    loop {
        let message = match io.read_message().await {
            Ok(Some(message)) => message,
            Ok(None) => break,
            Err(CodecError::Frame(e)) => {
                tracing::debug!(error = %e.error, "bad frame");
                if let Some(reply) = frame_error_reply(&e)
                    && io.write_message(&reply).await.is_err()
                {
                    break;
                }
                if e.skip.is_some() {
                    continue;
                }
                break;
            }
            Err(e @ CodecError::Timeout(..)) => {
                tracing::info!(error = %e, "closing the connection");
                break;
            }
            Err(e) => {
                tracing::debug!(error = %e, "connection read failed");
                break;
            }
        };
        // In `serverStatus.connections.active` until the reply is out; a large message waits
        // for its turn first (the others in hand hold what their parsed forms take).
        let _busy = admitted.busy();
        let _turn = admitted.turn(message.op.bytes()).await;
        let (frame, to) = match prepare_aside_if_large(message) {
            Prepared::Request(req, mut to) => {
                let again = (req.exhaust_allowed
                    && req.command_name() == "getMore"
                    && !to.legacy
                    && !to.more_to_come)
                    .then(|| req.clone());
                let mut reply = handler.handle(&conn, req).await;
                if let Some(req) = again {
                    // Stream the cursor: each reply flagged moreToCome, then the next getMore.
                    while exhausts(&reply) {
                        let current = std::mem::replace(&mut reply, Reply::NoReply);
                        let Some(mut frame) = frame_of(&to, current) else {
                            break;
                        };
                        frame.set_more_to_come();
                        if frame.send(&mut io).await.is_err() {
                            let _ = io.shutdown().await;
                            return;
                        }
                        to.request_id = frame.request_id();
                        reply = handler.handle(&conn, req.clone()).await;
                    }
                }
                match reply {
                    Reply::NoReply => continue,
                    Reply::CloseConnection => break,
                    other => (frame_of(&to, other), to),
                }
            }
            Prepared::Error(e, to) => {
                tracing::debug!(error = %e, "request rejected");
                (
                    reply_message(&to, e.to_document()).map(Outgoing::Message),
                    to,
                )
            }
        };
        let Some(frame) = frame else {
            continue;
        };
        let sent = match frame.send(&mut io).await {
            Err(CodecError::Encode(e)) => {
                // The reply itself is unsendable (too large): tell the client why instead.
                tracing::warn!(error = %e, "reply could not be encoded");
                match reply_message(&to, e.to_document()) {
                    Some(frame) => io.write_message(&frame).await,
                    None => Ok(()),
                }
            }
            other => other,
        };
        match sent {
            Ok(()) => {}
            Err(e @ CodecError::Timeout(..)) => {
                tracing::info!(error = %e, "closing the connection");
                break;
            }
            Err(e) => {
                tracing::debug!(error = %e, "connection write failed");
                break;
            }
        }
    }
    let _ = io.shutdown().await;
    tracing::debug!("connection closed");
}

/// Accepts connections until `cancel` fires, one task per connection (ids from 1), then waits
/// for the connection tasks, which also stop on `cancel`. Default [`Limits`].
pub async fn serve<H: Handler>(listener: TcpListener, handler: Arc<H>, cancel: CancellationToken) {
    serve_with_tls(listener, handler, cancel, None).await;
}

/// [`serve`], with TLS as `tls` says (`None`: plain only).
pub async fn serve_with_tls<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    cancel: CancellationToken,
    tls: Option<Arc<ServerTls>>,
) {
    let connections = Arc::new(Connections::new(Limits::default()));
    serve_with(listener, handler, cancel, tls, connections).await;
}

/// [`serve_with_tls`], admitting connections through `connections` (its limits, and the
/// counters the caller reports): past the limit a new connection is accepted and closed at
/// once, as mongod does.
pub async fn serve_with<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    cancel: CancellationToken,
    tls: Option<Arc<ServerTls>>,
    connections: Arc<Connections>,
) {
    let next_id = AtomicU64::new(1);
    let tracker = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let Some(admitted) = connections.admit() else {
                    // Closed before anything is read from it (refusals are logged by `admit`).
                    drop(stream);
                    continue;
                };
                let conn = ConnectionInfo {
                    id: next_id.fetch_add(1, Ordering::Relaxed),
                    peer,
                };
                let handler = Arc::clone(&handler);
                let cancel = cancel.clone();
                let tls = tls.clone();
                tracker.spawn(async move {
                    tokio::select! {
                        _ = cancel.cancelled() => {}
                        _ = serve_connection(stream, handler, conn, tls, admitted) => {}
                    }
                });
            }
            Err(e) => {
                // Typically out of file descriptors: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
        }
    }
    tracker.close();
    tracker.wait().await;
}

/// `{ok: 1}` plus `fields`: a convenience for handlers and tests.
pub fn ok_reply(fields: Document) -> Document {
    let mut d = doc! { "ok": 1.0 };
    d.extend(fields);
    d
}

#[cfg(test)]
mod tests {
    use bson::rawdoc;

    use super::*;
    use crate::message::{DocumentSequence, OpQuery};

    fn op_msg(body: RawDocumentBuf, compressor: Option<Compressor>) -> Message {
        Message {
            compressor,
            ..Message::msg(9, body)
        }
    }

    #[test]
    fn an_exhaust_stream_goes_on_only_while_the_cursor_is_open_and_yields() {
        let batch = |id: i64, n: usize| {
            Reply::Document(
                doc! {"cursor": {"id": id, "nextBatch": vec![Bson::Int32(1); n]}, "ok": 1.0},
            )
        };
        assert!(exhausts(&batch(7, 2)));
        assert!(!exhausts(&batch(0, 2)), "a closed cursor ends the stream");
        assert!(
            !exhausts(&batch(7, 0)),
            "an empty batch hands the turn back"
        );
        assert!(!exhausts(&Reply::Document(doc! {"ok": 0.0, "code": 43})));
        let raw =
            RawDocumentBuf::try_from(&doc! {"cursor": {"id": 7_i64, "nextBatch": [1]}, "ok": 1.0})
                .expect("raw");
        assert!(exhausts(&Reply::Raw(raw)));
        assert!(!exhausts(&Reply::NoReply));
    }

    #[test]
    fn op_query_commands_are_unwrapped_from_dollar_query() {
        let m = Message {
            request_id: 4,
            response_to: 0,
            compressor: None,
            op: Op::Query(OpQuery {
                flags: 0,
                full_collection_name: "admin.$cmd".into(),
                number_to_skip: 0,
                number_to_return: -1,
                query: rawdoc! { "$query": { "isMaster": 1 }, "$readPreference": { "mode": "secondaryPreferred" } },
                return_fields_selector: None,
            }),
        };
        let Prepared::Request(req, to) = prepare(m) else {
            panic!("rejected")
        };
        assert_eq!(req.body, doc! { "isMaster": 1 });
        assert_eq!(req.db, "admin");
        assert!(req.legacy_op_query && to.legacy);
        assert_eq!(to.negotiated, None, "no compression offered");
    }

    #[test]
    fn a_sequence_clashing_with_a_body_field_is_rejected() {
        let mut m = op_msg(rawdoc! { "insert": "c", "documents": [], "$db": "t" }, None);
        if let Op::Msg(msg) = &mut m.op {
            msg.sequences.push(DocumentSequence {
                identifier: "documents".into(),
                documents: vec![],
            });
        }
        let Prepared::Error(e, _) = prepare(m) else {
            panic!("accepted")
        };
        assert_eq!(e.code, 40433);
    }

    #[test]
    fn handshake_and_auth_replies_are_never_compressed() {
        for name in ["hello", "isMaster", "ismaster", "saslStart", "saslContinue"] {
            let mut body = Document::new();
            body.insert(name, 1);
            body.insert("$db", "admin");
            let raw = RawDocumentBuf::try_from(&body).unwrap();
            let Prepared::Request(_, to) = prepare(op_msg(raw, Some(Compressor::Zlib))) else {
                panic!("rejected")
            };
            assert_eq!(to.compressor, None, "{name}");
        }
        let Prepared::Request(_, to) = prepare(op_msg(
            rawdoc! { "find": "c", "$db": "t" },
            Some(Compressor::Zlib),
        )) else {
            panic!("rejected")
        };
        assert_eq!(to.compressor, Some(Compressor::Zlib));
    }

    #[test]
    fn negotiated_compressors_go_only_into_ok_replies() {
        let hello =
            rawdoc! { "hello": 1, "compression": ["zlib", "zlib", "snappy", 7], "$db": "admin" };
        let Prepared::Request(_, to) = prepare(op_msg(hello, None)) else {
            panic!("rejected")
        };
        assert_eq!(
            to.negotiated,
            Some(vec![Compressor::Zlib, Compressor::Snappy])
        );
        let ok = reply_message(&to, doc! { "ok": 1 }).unwrap();
        let Op::Msg(msg) = &ok.op else { panic!() };
        assert_eq!(
            to_document(&msg.body)
                .unwrap()
                .get_array("compression")
                .unwrap(),
            &vec![Bson::from("zlib"), Bson::from("snappy")]
        );
        let err = reply_message(&to, doc! { "ok": 0 }).unwrap();
        let Op::Msg(msg) = &err.op else { panic!() };
        assert!(!to_document(&msg.body).unwrap().contains_key("compression"));
    }

    #[test]
    fn more_to_come_requests_produce_no_reply_frame() {
        let mut m = op_msg(rawdoc! { "insert": "c", "$db": "t" }, None);
        if let Op::Msg(msg) = &mut m.op {
            msg.flags = MsgFlags(MsgFlags::MORE_TO_COME);
        }
        let Prepared::Request(req, to) = prepare(m) else {
            panic!("rejected")
        };
        assert!(req.more_to_come);
        assert_eq!(reply_message(&to, doc! { "ok": 1 }), None);
        assert_eq!(reply_message(&to, doc! { "ok": 0, "code": 2 }), None);
    }
}

/// The limits over real sockets: a frame timeout of [`DEADLINE`], a connection limit of two.
#[cfg(test)]
mod limit_tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    const DEADLINE: Duration = Duration::from_millis(300);
    /// Far longer than any test waits for: a test that hits it has failed.
    const PATIENCE: Duration = Duration::from_secs(10);

    /// Answers `{ok: 1}`; `wait` holds its reply until `release` is notified, counting how
    /// many wait at once.
    #[derive(Default)]
    struct Ok1 {
        release: tokio::sync::Notify,
        waiting: std::sync::atomic::AtomicUsize,
        most_waiting: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl Handler for Ok1 {
        async fn handle(&self, _conn: &ConnectionInfo, req: Request) -> Reply {
            use std::sync::atomic::Ordering::SeqCst;
            if req.command_name() == "wait" {
                let now = self.waiting.fetch_add(1, SeqCst) + 1;
                self.most_waiting.fetch_max(now, SeqCst);
                self.release.notified().await;
                self.waiting.fetch_sub(1, SeqCst);
            }
            Reply::Document(doc! {"ok": 1.0})
        }
    }

    async fn start(max: u64) -> (SocketAddr, Arc<Connections>, Arc<Ok1>, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let limits = Limits {
            max_connections: max,
            frame_timeout: DEADLINE,
        };
        let connections = Arc::new(Connections::with_max(limits, max));
        let handler = Arc::new(Ok1::default());
        let cancel = CancellationToken::new();
        tokio::spawn(serve_with(
            listener,
            Arc::clone(&handler),
            cancel.clone(),
            None,
            Arc::clone(&connections),
        ));
        (addr, connections, handler, cancel)
    }

    fn request(name: &str) -> Message {
        let mut body = Document::new();
        body.insert(name, 1);
        body.insert("$db", "admin");
        Message::msg(1, RawDocumentBuf::try_from(&body).expect("serialises"))
    }

    /// Sends `name` and waits for its `{ok: 1}`.
    async fn round_trip(conn: &mut Connection, name: &str) {
        conn.write_message(&request(name)).await.expect("send");
        let reply = tokio::time::timeout(PATIENCE, conn.read_message())
            .await
            .expect("an answer in time")
            .expect("a frame")
            .expect("not closed");
        assert_eq!(reply.response_to, 1);
    }

    /// Whether the server closed `stream` within [`PATIENCE`] (EOF or reset).
    async fn closed(stream: &mut TcpStream) -> bool {
        let mut buf = [0u8; 64];
        loop {
            match tokio::time::timeout(PATIENCE, stream.read(&mut buf)).await {
                Err(_) => return false,
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
            }
        }
    }

    #[tokio::test]
    async fn a_trickling_frame_is_cut_off_at_its_deadline_while_an_idle_connection_stays() {
        let (addr, connections, _, cancel) = start(10).await;
        let mut idle = Connection::new(TcpStream::connect(addr).await.expect("connect"));
        round_trip(&mut idle, "ping").await;

        // A header promising 1 MB, then a byte every 50 ms, for ever.
        let mut trickler = TcpStream::connect(addr).await.expect("connect");
        let mut header = 1_000_000i32.to_le_bytes().to_vec();
        header.extend_from_slice(&[0; 12]);
        trickler.write_all(&header).await.expect("header");
        let (mut read_half, mut write_half) = trickler.into_split();
        let drip = tokio::spawn(async move {
            while write_half.write_all(b"x").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let mut buf = [0u8; 16];
        let outcome = tokio::time::timeout(PATIENCE, read_half.read(&mut buf)).await;
        assert!(
            matches!(outcome, Ok(Ok(0)) | Ok(Err(_))),
            "the trickling connection was closed: {outcome:?}"
        );
        drip.abort();

        // Idle for several deadlines between frames: still served.
        tokio::time::sleep(DEADLINE * 4).await;
        round_trip(&mut idle, "ping").await;
        assert_eq!(connections.counts().current, 1);
        cancel.cancel();
    }

    #[tokio::test]
    async fn a_connection_past_the_limit_is_closed_at_once_and_counted() {
        let (addr, connections, handler, cancel) = start(2).await;
        let mut first = Connection::new(TcpStream::connect(addr).await.expect("connect"));
        let mut second = Connection::new(TcpStream::connect(addr).await.expect("connect"));
        round_trip(&mut first, "ping").await;
        round_trip(&mut second, "ping").await;

        let mut third = TcpStream::connect(addr).await.expect("connect");
        assert!(closed(&mut third).await, "the third connection is closed");
        let counts = connections.counts();
        assert_eq!((counts.current, counts.available), (2, 0));
        assert_eq!((counts.total_created, counts.rejected), (2, 1));

        // A request in flight makes its connection active.
        first.write_message(&request("wait")).await.expect("send");
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while connections.counts().active != 1 {
            assert!(tokio::time::Instant::now() < deadline, "never active");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        handler.release.notify_one();
        first.read_message().await.expect("reply").expect("open");
        assert_eq!(connections.counts().active, 0);

        // Room again once one closes.
        drop(second);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while connections.counts().current != 1 {
            assert!(tokio::time::Instant::now() < deadline, "never counted out");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut fourth = Connection::new(TcpStream::connect(addr).await.expect("connect"));
        round_trip(&mut fourth, "ping").await;
        assert_eq!(connections.counts().total_created, 3);
        cancel.cancel();
    }

    #[tokio::test]
    async fn large_messages_are_handled_a_few_at_a_time() {
        use std::sync::atomic::Ordering::SeqCst;
        let (addr, _, handler, cancel) = start(10).await;
        let mut large = Document::new();
        large.insert("wait", 1);
        large.insert("pad", "p".repeat(crate::limits::LARGE_MESSAGE + 1));
        large.insert("$db", "admin");
        let large = Message::msg(1, RawDocumentBuf::try_from(&large).expect("serialises"));
        let n = crate::limits::LARGE_AT_ONCE + 1;
        let mut conns = Vec::new();
        for _ in 0..n {
            let mut c = Connection::new(TcpStream::connect(addr).await.expect("connect"));
            c.write_message(&large).await.expect("send");
            conns.push(c);
        }
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while handler.waiting.load(SeqCst) < crate::limits::LARGE_AT_ONCE {
            assert!(tokio::time::Instant::now() < deadline, "never handled");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The last one waits its turn, unparsed; a small request is not held up meanwhile.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            handler.most_waiting.load(SeqCst),
            crate::limits::LARGE_AT_ONCE
        );
        let mut small = Connection::new(TcpStream::connect(addr).await.expect("connect"));
        round_trip(&mut small, "ping").await;
        // Each release wakes one waiting handler (or is kept for the next to arrive); each
        // one released gives its turn to the one waiting.
        for _ in 0..n {
            handler.release.notify_one();
        }
        for c in &mut conns {
            let reply = tokio::time::timeout(PATIENCE, c.read_message())
                .await
                .expect("an answer in time")
                .expect("a frame");
            assert!(reply.is_some(), "answered");
        }
        assert_eq!(
            handler.most_waiting.load(SeqCst),
            crate::limits::LARGE_AT_ONCE
        );
        cancel.cancel();
    }

    #[tokio::test]
    async fn a_reply_the_client_does_not_read_is_given_up_at_the_deadline() {
        let (addr, connections, _, cancel) = start(10).await;
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        // Pipelined pings whose replies are never read: once the socket buffers fill, a write
        // blocks, and must give up at the deadline rather than hold the connection for ever.
        let ping = crate::frame::encode_to_vec(&request("ping")).expect("encode");
        let mut sent = 0usize;
        let gave_up = loop {
            match tokio::time::timeout(PATIENCE, stream.write_all(&ping)).await {
                Ok(Ok(())) => sent += 1,
                Ok(Err(_)) => break true,
                Err(_) => break false,
            }
            if connections.counts().current == 0 {
                break true;
            }
        };
        assert!(gave_up, "the server kept the connection after {sent} pings");
        cancel.cancel();
    }
}

/// Spliced cursor replies over real sockets: the bytes a client reads are the reply's document.
#[cfg(test)]
mod spliced_tests {
    use bytes::Bytes;

    use super::*;
    use crate::raw::CursorReply;

    /// Answers every request with a cursor reply of `EVENTS` events, spliced.
    struct Events;

    const EVENTS: usize = 300;

    fn event(i: usize) -> Document {
        doc! {"_id": {"_data": format!("82{i:08X}")}, "i": i as i64, "pad": "p".repeat(i % 2000)}
    }

    #[async_trait::async_trait]
    impl Handler for Events {
        async fn handle(&self, _conn: &ConnectionInfo, _req: Request) -> Reply {
            let events: Vec<Bytes> = (0..EVENTS)
                .map(|i| Bytes::from(event(i).to_vec().expect("encodes")))
                .collect();
            let mut body = CursorReply {
                ns: "db.c",
                id: 9,
                first: false,
                batch: &events,
                post_batch_resume_token: None,
                invalidated: false,
            }
            .splice();
            body.doc.append(bson::cstr!("extra"), 1_i32);
            Reply::Cursor(body)
        }
    }

    fn expected() -> Document {
        let batch: Vec<Bson> = (0..EVENTS).map(|i| Bson::Document(event(i))).collect();
        doc! {"cursor": {"nextBatch": batch, "id": 9_i64, "ns": "db.c"}, "ok": 1.0, "extra": 1}
    }

    async fn ask(compressor: Option<Compressor>) -> Document {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let cancel = CancellationToken::new();
        tokio::spawn(serve(listener, Arc::new(Events), cancel.clone()));
        let mut conn = Connection::new(TcpStream::connect(addr).await.expect("connect"));
        let mut request = Message::msg(
            3,
            RawDocumentBuf::try_from(&doc! {"getMore": 9_i64, "collection": "c", "$db": "db"})
                .expect("raw"),
        );
        request.compressor = compressor;
        conn.write_message(&request).await.expect("send");
        let reply = tokio::time::timeout(Duration::from_secs(10), conn.read_message())
            .await
            .expect("in time")
            .expect("a frame")
            .expect("not closed");
        cancel.cancel();
        assert_eq!(reply.response_to, 3);
        assert_eq!(reply.compressor, compressor, "answered as asked");
        let Op::Msg(msg) = reply.op else {
            panic!("not an OP_MSG")
        };
        Document::try_from(msg.body.as_ref()).expect("decodes")
    }

    #[tokio::test]
    async fn a_spliced_reply_reads_as_its_document() {
        assert_eq!(ask(None).await, expected());
    }

    #[tokio::test]
    async fn a_compressed_spliced_reply_is_made_whole_and_reads_the_same() {
        assert_eq!(ask(Some(Compressor::Zlib)).await, expected());
    }
}
