//! Frames for generated requests, and the verdict on a reply. Pure: bytes in, bytes or a
//! verdict out.
//!
//! Frames are built with the `wire` crate's own encoder (the body and sequence documents are
//! handed over as `RawDocumentBuf`s, which it copies without parsing, so hostile nesting costs
//! nothing here).
//!
//! Invariant checked on every reply ([`check_reply`]): `ok` is present; an `ok: 0` reply has a
//! numeric `code` and a string `errmsg`; so do each `writeErrors` entry and a
//! `writeConcernError`.

use bson::{RawBsonRef, RawDocument, RawDocumentBuf};
use wire::message::{Compressor, DocumentSequence, Message, MsgFlags, Op, OpMsg};

use super::generate::Request;
use super::value::{EncodeContext, Value, encode_document};

/// The encoded body of `fields`.
pub fn document(fields: &[(String, Value)], cx: EncodeContext) -> RawDocumentBuf {
    to_raw(encode_document(fields, cx))
}

fn to_raw(bytes: Vec<u8>) -> RawDocumentBuf {
    // `encode_document` always writes a correct length prefix and terminator, which is all
    // `from_bytes` checks.
    RawDocumentBuf::from_bytes(bytes).unwrap_or_else(|_| RawDocumentBuf::new())
}

/// The OP_MSG message for `req`.
pub fn message(
    req: &Request,
    request_id: i32,
    cx: EncodeContext,
    flags: u32,
    compressor: Option<Compressor>,
) -> Message {
    let sequences = req
        .sequences
        .iter()
        .map(|(identifier, docs)| DocumentSequence {
            identifier: identifier.clone(),
            documents: docs
                .iter()
                .map(|d| match d {
                    Value::Doc(fields) => document(fields, cx),
                    other => document(&[("v".into(), other.clone())], cx),
                })
                .collect(),
        })
        .collect();
    Message {
        request_id,
        response_to: 0,
        compressor,
        op: Op::Msg(OpMsg {
            flags: MsgFlags(flags),
            body: document(&req.body, cx),
            sequences,
        }),
    }
}

/// The OP_MSG frame for `req`, or why it cannot be framed (over the message size limit).
pub fn command_frame(req: &Request, request_id: i32, cx: EncodeContext) -> Result<Vec<u8>, String> {
    wire::frame::encode_to_vec(&message(req, request_id, cx, 0, None)).map_err(|e| e.to_string())
}

/// A plain OP_MSG frame for a body, for the harness's own commands.
pub fn plain_frame(body: &bson::Document, request_id: i32) -> Result<Vec<u8>, String> {
    let raw = RawDocumentBuf::try_from(body).map_err(|e| e.to_string())?;
    wire::frame::encode_to_vec(&Message::msg(request_id, raw)).map_err(|e| e.to_string())
}

/// What a reply says about the request.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// `ok: 1`.
    Ok,
    /// `ok: 0` with a code and a message.
    Error { code: i64, code_name: String },
    /// A reply breaking the invariant above.
    Malformed(String),
}

/// The body of a reply frame, decoded with the `wire` crate (an OP_MSG body or an OP_REPLY's
/// document).
pub fn reply_body(frame: &[u8]) -> Result<RawDocumentBuf, String> {
    match wire::frame::decode(frame) {
        Ok(Some((m, _))) => match m.op {
            Op::Msg(msg) => Ok(msg.body),
            Op::Reply(r) => r
                .documents
                .into_iter()
                .next()
                .ok_or_else(|| "OP_REPLY without a document".to_string()),
            Op::Query(_) => Err("the server sent an OP_QUERY".into()),
        },
        Ok(None) => Err("incomplete reply frame".into()),
        Err(e) => Err(format!("undecodable reply frame: {e}")),
    }
}

/// Checks a reply body against the invariant (top-level fields only: no recursion into
/// whatever the reply echoes).
pub fn check_reply(body: &RawDocument) -> Verdict {
    let ok = match body.get("ok") {
        Ok(Some(v)) => number(v),
        Ok(None) => return Verdict::Malformed("reply without `ok`".into()),
        Err(e) => return Verdict::Malformed(format!("reply is not valid BSON: {e}")),
    };
    if let Some(problem) = error_fields_problem(body, "writeConcernError") {
        return Verdict::Malformed(problem);
    }
    if let Ok(Some(RawBsonRef::Array(errors))) = body.get("writeErrors") {
        for e in errors {
            match e {
                Ok(RawBsonRef::Document(d)) => {
                    if let Some(problem) = code_and_errmsg(d) {
                        return Verdict::Malformed(format!("a writeErrors entry {problem}"));
                    }
                }
                _ => return Verdict::Malformed("a writeErrors entry is not a document".into()),
            }
        }
    }
    match ok {
        Some(1.0) => Verdict::Ok,
        Some(0.0) => match code_and_errmsg(body) {
            Some(problem) => Verdict::Malformed(format!("ok: 0 reply {problem}")),
            None => Verdict::Error {
                code: body
                    .get("code")
                    .ok()
                    .flatten()
                    .and_then(number)
                    .unwrap_or(-1.0) as i64,
                code_name: body
                    .get_str("codeName")
                    .map(str::to_string)
                    .unwrap_or_default(),
            },
        },
        Some(v) => Verdict::Malformed(format!("`ok` is {v}")),
        None => Verdict::Malformed("`ok` is not a number".into()),
    }
}

fn error_fields_problem(body: &RawDocument, key: &str) -> Option<String> {
    match body.get(key) {
        Ok(Some(RawBsonRef::Document(d))) => code_and_errmsg(d).map(|p| format!("{key} {p}")),
        Ok(Some(_)) => Some(format!("{key} is not a document")),
        _ => None,
    }
}

/// `None` when `d` has a numeric `code` and a string `errmsg`, else what is wrong.
fn code_and_errmsg(d: &RawDocument) -> Option<String> {
    let code = d.get("code").ok().flatten().and_then(number);
    let errmsg = d.get("errmsg").ok().flatten().and_then(RawBsonRef::as_str);
    match (code, errmsg) {
        (Some(_), Some(_)) => None,
        (None, Some(_)) => Some("lacks a numeric `code`".into()),
        (Some(_), None) => Some("lacks a string `errmsg`".into()),
        (None, None) => Some("lacks `code` and `errmsg`".into()),
    }
}

fn number(v: RawBsonRef<'_>) -> Option<f64> {
    match v {
        RawBsonRef::Double(f) => Some(f),
        RawBsonRef::Int32(i) => Some(f64::from(i)),
        RawBsonRef::Int64(i) => Some(i as f64),
        RawBsonRef::Boolean(b) => Some(if b { 1.0 } else { 0.0 }),
        RawBsonRef::Decimal128(d) => d.to_string().parse().ok(),
        _ => None,
    }
}

/// The `cursor.id` of a reply, if it has one.
pub fn cursor_id(body: &RawDocument) -> Option<i64> {
    body.get_document("cursor").ok()?.get_i64("id").ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, rawdoc};

    #[test]
    fn an_error_reply_needs_code_and_errmsg() {
        assert_eq!(check_reply(&rawdoc! {"ok": 1.0}), Verdict::Ok);
        assert_eq!(
            check_reply(&rawdoc! {"ok": 0.0, "errmsg": "x", "code": 2, "codeName": "BadValue"}),
            Verdict::Error {
                code: 2,
                code_name: "BadValue".into()
            }
        );
        assert!(matches!(
            check_reply(&rawdoc! {"ok": 0.0, "errmsg": "x"}),
            Verdict::Malformed(_)
        ));
        assert!(matches!(
            check_reply(&rawdoc! {"ok": 0, "code": 2}),
            Verdict::Malformed(_)
        ));
        assert!(matches!(check_reply(&rawdoc! {}), Verdict::Malformed(_)));
        assert!(matches!(
            check_reply(&rawdoc! {"ok": 1, "writeErrors": [{"index": 0, "errmsg": "x"}]}),
            Verdict::Malformed(_)
        ));
    }

    #[test]
    fn generated_frames_decode_as_op_msg_with_well_formed_bson() {
        use crate::fuzz::generate::{Case, Generator};
        let names = [
            "find",
            "aggregate",
            "insert",
            "update",
            "findAndModify",
            "createIndexes",
            "explain",
            "hello",
        ]
        .map(String::from);
        let g = Generator::new(42, &names);
        let mut checked = 0;
        for i in 0..200 {
            let Case::Command(req) = g.case(i) else {
                continue;
            };
            let Ok(bytes) = command_frame(&req, 9, EncodeContext::default()) else {
                continue;
            };
            let (msg, n) = wire::frame::decode(&bytes)
                .unwrap_or_else(|e| panic!("iteration {i}: {e}"))
                .unwrap_or_else(|| panic!("iteration {i}: incomplete"));
            assert_eq!(n, bytes.len(), "iteration {i}");
            let Op::Msg(m) = msg.op else {
                panic!("iteration {i}: not an OP_MSG")
            };
            // Well-formed BSON; only nesting past the limit may be refused.
            if let Err(e) = wire::message::check_document(&m.body) {
                assert_eq!(e.code, wire::ErrorCode::OVERFLOW.code, "iteration {i}: {e}");
            }
            for seq in &m.sequences {
                for d in &seq.documents {
                    if let Err(e) = wire::message::check_document(d) {
                        assert_eq!(e.code, wire::ErrorCode::OVERFLOW.code, "iteration {i}: {e}");
                    }
                }
            }
            checked += 1;
        }
        assert!(checked > 100, "{checked} frames checked");
    }

    #[test]
    fn a_plain_frame_decodes_to_its_body() {
        let frame = plain_frame(&doc! {"ping": 1, "$db": "admin"}, 5).unwrap();
        let body = reply_body(&frame).unwrap();
        assert_eq!(body.get_i32("ping").unwrap(), 1);
    }
}
