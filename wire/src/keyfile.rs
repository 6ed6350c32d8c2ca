//! The cluster's shared key file (`--keyFile`), as MongoDB's internal authentication uses it:
//! routers and shards prove to a shard that they hold the same key by logging in as the
//! internal user `__system@local` with SCRAM-SHA-256, the key being the password.
//!
//! Owns: reading and checking the file (MongoDB's rules: 6 to 1,024 base64 characters once
//! whitespace is removed; on Unix, no permissions for group or others), the `__system`
//! credentials a shard checks, and the client's side of the login over one connection.
//!
//! Invariants: the key itself is never logged or shown in an error; a connection is used for
//! commands only after the server's signature checked out (the server knows the key too).

use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bson::{Binary, Bson, RawDocumentBuf, doc, spec::BinarySubtype};

use crate::scram::{ClientConversation, Credential, Mechanism, SaltedCache};

/// The internal user a key-file login names.
pub const SYSTEM_USER: &str = "__system";
/// Its database.
pub const SYSTEM_DB: &str = "local";

/// A cluster key, read from a key file.
pub struct KeyFile {
    key: String,
    sha256: Credential,
    sha1: Credential,
    salted: SaltedCache,
}

impl std::fmt::Debug for KeyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyFile(..)")
    }
}

impl KeyFile {
    /// Reads and checks the key file at `path`.
    pub fn read(path: &Path) -> Result<Arc<KeyFile>, String> {
        let shown = path.display();
        let meta = std::fs::metadata(path).map_err(|e| format!("key file {shown}: {e}"))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            if meta.permissions().mode() & 0o077 != 0 {
                return Err(format!(
                    "permissions on {shown} are too open (chmod 400 or 600 it)"
                ));
            }
        }
        #[cfg(not(unix))]
        let _ = meta;
        let text = std::fs::read_to_string(path).map_err(|e| format!("key file {shown}: {e}"))?;
        KeyFile::from_contents(&text)
            .map(Arc::new)
            .map_err(|e| format!("key file {shown}: {e}"))
    }

    /// A key from a key file's contents (whitespace is not part of the key).
    pub fn from_contents(text: &str) -> Result<KeyFile, String> {
        let key: String = text.split_whitespace().collect();
        if key.len() < 6 {
            return Err("the key is too short (at least 6 characters)".to_string());
        }
        if key.len() > 1024 {
            return Err("the key is too long (at most 1024 characters)".to_string());
        }
        if !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
        {
            return Err("the key has a character outside the base64 set".to_string());
        }
        let credential = |m: Mechanism| {
            let salt: Vec<u8> = (0..28).map(|_| rand::random::<u8>()).collect();
            Credential::derive(m, SYSTEM_USER, &key, salt)
        };
        Ok(KeyFile {
            sha256: credential(Mechanism::Sha256)?,
            sha1: credential(Mechanism::Sha1)?,
            key,
            salted: SaltedCache::default(),
        })
    }

    /// What a server checks a `__system` login with `mechanism` against.
    pub fn credential(&self, mechanism: Mechanism) -> &Credential {
        match mechanism {
            Mechanism::Sha256 => &self.sha256,
            Mechanism::Sha1 => &self.sha1,
        }
    }

    /// The first command of a `__system` login, and the conversation that answers the
    /// server's replies ([`Login::next`]).
    pub fn login(self: &Arc<KeyFile>) -> Result<(Login, RawDocumentBuf), String> {
        let nonce = B64.encode((0..24).map(|_| rand::random::<u8>()).collect::<Vec<u8>>());
        let (conversation, first) =
            ClientConversation::start(Mechanism::Sha256, SYSTEM_USER, &self.key, &nonce)
                .map_err(|e| e.0)?;
        let start = doc! {
            "saslStart": 1,
            "mechanism": Mechanism::Sha256.name(),
            "payload": binary(first),
            "options": {"skipEmptyExchange": true},
            "$db": SYSTEM_DB,
        };
        let login = Login {
            key: self.clone(),
            conversation,
            proof_sent: false,
        };
        Ok((login, raw(&start)?))
    }
}

/// A `__system` login in progress over one connection.
pub struct Login {
    key: Arc<KeyFile>,
    conversation: ClientConversation,
    proof_sent: bool,
}

impl Login {
    /// Takes the server's reply to the last command: the next command to send, or `None` once
    /// the login succeeded. Err says why it failed.
    pub fn next(&mut self, reply: &RawDocumentBuf) -> Result<Option<RawDocumentBuf>, String> {
        let (id, payload, done) = step(reply)?;
        let payload = if self.proof_sent {
            self.conversation.verify(&payload).map_err(|e| e.0)?;
            if done {
                return Ok(None);
            }
            Vec::new()
        } else {
            if done {
                return Err("the server finished before our proof".to_string());
            }
            self.proof_sent = true;
            self.conversation
                .respond(&payload, &self.key.salted)
                .map_err(|e| e.0)?
        };
        let next = doc! {
            "saslContinue": 1,
            "conversationId": id,
            "payload": binary(payload),
            "$db": SYSTEM_DB,
        };
        raw(&next).map(Some)
    }
}

fn binary(bytes: Vec<u8>) -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::Generic,
        bytes,
    })
}

fn raw(d: &bson::Document) -> Result<RawDocumentBuf, String> {
    RawDocumentBuf::try_from(d).map_err(|e| e.to_string())
}

/// `(conversationId, payload, done)` of a SASL reply, or the server's error.
fn step(reply: &RawDocumentBuf) -> Result<(i32, Vec<u8>, bool), String> {
    let reply = crate::message::to_document(reply).map_err(|e| e.to_string())?;
    if let Some(e) = crate::MongoError::from_reply(&reply) {
        return Err(format!("{} ({})", e.errmsg, e.code_name));
    }
    let id = reply
        .get_i32("conversationId")
        .map_err(|_| "the reply has no conversationId".to_string())?;
    let payload = match reply.get("payload") {
        Some(Bson::Binary(b)) => b.bytes.clone(),
        _ => return Err("the reply has no payload".to_string()),
    };
    Ok((id, payload, reply.get_bool("done").unwrap_or(false)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_mongodbs_rules() {
        assert!(KeyFile::from_contents("abc").is_err(), "too short");
        assert!(
            KeyFile::from_contents(&"a".repeat(1025)).is_err(),
            "too long"
        );
        assert!(KeyFile::from_contents("abcdef!").is_err(), "not base64");
        let spaced = KeyFile::from_contents("abc def\nghi=\n").expect("whitespace is ignored");
        assert_eq!(spaced.key, "abcdefghi=");
    }

    #[cfg(unix)]
    #[test]
    fn a_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("keyfile-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("key");
        std::fs::write(&path, "0123456789abcdef\n").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = KeyFile::read(&path).expect_err("0644");
        assert!(e.contains("too open"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).expect("chmod");
        assert!(KeyFile::read(&path).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
