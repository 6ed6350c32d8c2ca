//! The SASL commands as servers receive them (`saslStart`, `saslContinue`): reading their
//! payload and mechanism, writing payloads back, and MongoDB's errors for them. Shared by the
//! router (users) and the shards (the key-file login).
//!
//! Invariant: a malformed command is an error document with MongoDB's code (9, 334, 18),
//! never a panic; a failed login says only "Authentication failed.", whatever went wrong.

use bson::{Binary, Bson, Document, spec::BinarySubtype};

use crate::error::{ErrorCode, MongoError};
use crate::scram::{self, ClientFirst, Mechanism};

/// 18 `AuthenticationFailed`, whatever the reason (MongoDB does not say which part was wrong).
pub fn auth_failed() -> MongoError {
    MongoError::new(ErrorCode::AUTHENTICATION_FAILED, "Authentication failed.")
}

/// A command's `payload` (binary, or a string as some clients send it).
pub fn payload_of(cmd: &Document) -> Result<Vec<u8>, MongoError> {
    match cmd.get("payload") {
        Some(Bson::Binary(b)) => Ok(b.bytes.clone()),
        Some(Bson::String(s)) => Ok(s.as_bytes().to_vec()),
        _ => Err(MongoError::failed_to_parse(
            "SASL payload must be binary data",
        )),
    }
}

/// A payload to send back.
pub fn binary(bytes: Vec<u8>) -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::Generic,
        bytes,
    })
}

/// A `saslStart`'s mechanism (334 when it is not a SCRAM one) and its client-first message
/// (18 when malformed).
pub fn start_of(cmd: &Document) -> Result<(Mechanism, ClientFirst), MongoError> {
    let name = cmd.get_str("mechanism").unwrap_or("");
    let Some(mechanism) = Mechanism::parse(name) else {
        return Err(MongoError::with_code(
            334,
            format!("Received authentication for mechanism {name} which is not enabled"),
        ));
    };
    let first = scram::parse_client_first(&payload_of(cmd)?).map_err(|_| auth_failed())?;
    Ok((mechanism, first))
}
