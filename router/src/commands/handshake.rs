//! The handshake: `hello`/`isMaster`, presenting the router as a mongos (or, with
//! `--replSetMode`, as a single-node replica set primary), and `buildInfo`.
//!
//! `logicalSessionTimeoutMinutes` must be present: it is what turns on sessions, retryable writes
//! and transactions in drivers. No `topologyVersion`, so drivers poll instead of streaming.

use bson::{Bson, DateTime, Document, doc};
use wire::Result;

use super::Ctx;
use crate::options::Presentation;

pub const VERSION: &str = "7.0.0";
/// An arbitrary but stable election id for the replica-set presentation.
const ELECTION_ID: [u8; 12] = [0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 1];

pub(super) fn hello(ctx: &Ctx<'_>) -> Result<Document> {
    let legacy = ctx.name != "hello";
    let mut reply = Document::new();
    reply.insert(
        if legacy {
            "ismaster"
        } else {
            "isWritablePrimary"
        },
        true,
    );
    match ctx.seams.options.presentation {
        Presentation::Mongos => {
            reply.insert("msg", "isdbgrid");
        }
        Presentation::ReplicaSet => {
            let me = ctx.seams.options.advertised_host.to_lowercase();
            reply.insert("setName", "tributary");
            reply.insert("setVersion", 1);
            reply.insert("secondary", false);
            reply.insert("hosts", vec![Bson::String(me.clone())]);
            reply.insert("primary", me.clone());
            reply.insert("me", me);
            reply.insert("electionId", bson::oid::ObjectId::from_bytes(ELECTION_ID));
            let t = ctx.seams.clock.now();
            reply.insert(
                "lastWrite",
                doc! {
                    "opTime": {"ts": Bson::Timestamp(t.timestamp()), "t": 1_i64},
                    "lastWriteDate": DateTime::from_millis(i64::from(t.secs) * 1000),
                },
            );
        }
    }
    if ctx.cmd.contains_key("helloOk") {
        reply.insert("helloOk", true);
    }
    reply.insert("maxBsonObjectSize", wire::MAX_BSON_OBJECT_SIZE as i32);
    reply.insert("maxMessageSizeBytes", wire::MAX_MESSAGE_SIZE as i32);
    reply.insert("maxWriteBatchSize", 100_000);
    reply.insert("localTime", DateTime::now());
    reply.insert("logicalSessionTimeoutMinutes", 30);
    reply.insert("connectionId", ctx.conn.id as i64);
    reply.insert("minWireVersion", 0);
    reply.insert("maxWireVersion", wire::MAX_WIRE_VERSION);
    reply.insert("readOnly", false);
    reply.insert("ok", 1.0);
    Ok(reply)
}

pub(super) fn build_info() -> Result<Document> {
    Ok(doc! {
        "version": VERSION,
        "gitVersion": "tributary",
        "versionArray": [7, 0, 0, 0],
        "bits": 64,
        "debug": false,
        "maxBsonObjectSize": wire::MAX_BSON_OBJECT_SIZE as i32,
        "storageEngines": ["redb"],
        "modules": [],
        "javascriptEngine": "none",
        "ok": 1.0,
    })
}
