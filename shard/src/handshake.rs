//! The handshake facts every `hello` of a shard server carries, whatever answers it (a shard,
//! or a replica-set member without one). A leaf: pure, no state.

use bson::Document;

/// `hello` (or `isMaster` when `name` is not `hello`) with the server limits and wire
/// versions; `writable`: whether this server takes writes; `now_millis`: its `localTime`.
pub fn hello(name: &str, hello_ok: bool, writable: bool, now_millis: u64) -> Document {
    let mut d = Document::new();
    if hello_ok {
        d.insert("helloOk", true);
    }
    d.insert(
        if name == "hello" {
            "isWritablePrimary"
        } else {
            "ismaster"
        },
        writable,
    );
    d.insert("maxBsonObjectSize", wire::MAX_BSON_OBJECT_SIZE as i32);
    d.insert("maxMessageSizeBytes", wire::MAX_MESSAGE_SIZE as i32);
    d.insert("maxWriteBatchSize", 100_000_i32);
    d.insert(
        "localTime",
        bson::DateTime::from_millis(i64::try_from(now_millis).unwrap_or(i64::MAX)),
    );
    d.insert("logicalSessionTimeoutMinutes", 30_i32);
    d.insert("connectionId", 1_i32);
    d.insert("minWireVersion", 0_i32);
    d.insert("maxWireVersion", wire::MAX_WIRE_VERSION);
    d.insert("readOnly", false);
    d.insert("ok", 1.0);
    d
}
