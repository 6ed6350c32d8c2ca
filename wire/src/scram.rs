//! SCRAM-SHA-1 and SCRAM-SHA-256 (RFC 5802 / 7677) as MongoDB speaks them: the server side
//! (the stored credentials, and the two-step conversation that checks a client's proof; the
//! router's users) and the client side (a router or shard proving it holds the cluster's key
//! file to a shard).
//!
//! Owns: credential derivation (MongoDB's SHA-1 variant hashes `user:mongo:password` with MD5
//! first; SHA-256 uses the SASLprep'd password), message parsing, the proof check, and the
//! client's proof and check of the server's signature.
//!
//! Invariants: pure (no I/O; the caller supplies the nonces and looks the user up); the password
//! is never stored, only salt, iteration count, `StoredKey` and `ServerKey`; a malformed
//! message, a nonce that does not extend ours, a channel binding we did not offer, or a wrong
//! proof fails the conversation with an error, never a panic; the server signature is sent
//! only after the proof checked out, and a client trusts a server only once its signature
//! checked out.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, KeyInit, Mac};

/// The SCRAM variants MongoDB offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    Sha1,
    Sha256,
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha1 => "SCRAM-SHA-1",
            Mechanism::Sha256 => "SCRAM-SHA-256",
        }
    }

    pub fn parse(name: &str) -> Option<Mechanism> {
        match name {
            "SCRAM-SHA-1" => Some(Mechanism::Sha1),
            "SCRAM-SHA-256" => Some(Mechanism::Sha256),
            _ => None,
        }
    }

    /// MongoDB's default iteration counts.
    pub fn iterations(self) -> u32 {
        match self {
            Mechanism::Sha1 => 10_000,
            Mechanism::Sha256 => 15_000,
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha1 => mac::<Hmac<sha1::Sha1>>(key, data),
            Mechanism::Sha256 => mac::<Hmac<sha2::Sha256>>(key, data),
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha1 => <sha1::Sha1 as sha1::Digest>::digest(data).to_vec(),
            Mechanism::Sha256 => <sha2::Sha256 as sha2::Digest>::digest(data).to_vec(),
        }
    }

    fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            Mechanism::Sha1 => {
                let mut out = vec![0u8; 20];
                pbkdf2::pbkdf2_hmac::<sha1::Sha1>(password, salt, iterations, &mut out);
                out
            }
            Mechanism::Sha256 => {
                let mut out = vec![0u8; 32];
                pbkdf2::pbkdf2_hmac::<sha2::Sha256>(password, salt, iterations, &mut out);
                out
            }
        }
    }
}

fn mac<M: Mac + KeyInit>(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length.
    let mut m = <M as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

/// What is stored for one mechanism of one user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
}

/// The password as the mechanism hashes it: SCRAM-SHA-1 takes MongoDB's
/// `md5("user:mongo:password")` digest, SCRAM-SHA-256 the SASLprep'd password.
fn prepared_password(mechanism: Mechanism, user: &str, password: &str) -> Result<Vec<u8>, String> {
    match mechanism {
        Mechanism::Sha1 => {
            let digest =
                <md5::Md5 as md5::Digest>::digest(format!("{user}:mongo:{password}").as_bytes());
            Ok(hex(&digest).into_bytes())
        }
        Mechanism::Sha256 => stringprep::saslprep(password)
            .map(|p| p.as_bytes().to_vec())
            .map_err(|e| format!("the password is not valid for SCRAM-SHA-256: {e}")),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Credential {
    /// A credential for `password` with a fresh `salt`.
    pub fn derive(
        mechanism: Mechanism,
        user: &str,
        password: &str,
        salt: Vec<u8>,
    ) -> Result<Credential, String> {
        let iterations = mechanism.iterations();
        let prepared = prepared_password(mechanism, user, password)?;
        let salted = mechanism.salted_password(&prepared, &salt, iterations);
        let client_key = mechanism.hmac(&salted, b"Client Key");
        Ok(Credential {
            iterations,
            salt,
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(&salted, b"Server Key"),
        })
    }
}

impl Credential {
    /// Whether `password` is `user`'s under `mechanism` (a login that sends the password, as
    /// HTTP Basic does): the stored key derived again and compared in constant time. A
    /// credential of more than [`MAX_VERIFY_ITERATIONS`] is refused rather than hashed.
    pub fn verify(&self, mechanism: Mechanism, user: &str, password: &str) -> bool {
        if self.iterations == 0 || self.iterations > MAX_VERIFY_ITERATIONS {
            return false;
        }
        let Ok(prepared) = prepared_password(mechanism, user, password) else {
            return false;
        };
        let salted = mechanism.salted_password(&prepared, &self.salt, self.iterations);
        let stored = mechanism.hash(&mechanism.hmac(&salted, b"Client Key"));
        stored.len() == self.stored_key.len()
            && stored
                .iter()
                .zip(&self.stored_key)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

/// The most PBKDF2 iterations a password check spends (a user document is disk input: a
/// hostile count must not buy seconds of CPU per request).
pub const MAX_VERIFY_ITERATIONS: u32 = 1_000_000;

/// A failed conversation: MongoDB answers `AuthenticationFailed` (18) whatever the reason, so
/// as not to tell which part was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramError(pub String);

/// A conversation after the client's first message.
#[derive(Debug, Clone)]
pub struct Conversation {
    pub mechanism: Mechanism,
    pub user: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

/// The user a client-first message names, its bare form and its nonce.
pub struct ClientFirst {
    pub user: String,
    bare: String,
    nonce: String,
}

/// Parses `n,,n=<user>,r=<nonce>` (no channel binding: `y,,` is accepted, `p=` refused).
pub fn parse_client_first(message: &[u8]) -> Result<ClientFirst, ScramError> {
    let text = std::str::from_utf8(message).map_err(|_| bad("the first message is not UTF-8"))?;
    let rest = text
        .strip_prefix("n,,")
        .or_else(|| text.strip_prefix("y,,"))
        .ok_or_else(|| bad("channel binding is not supported"))?;
    let mut user = None;
    let mut nonce = None;
    for part in rest.split(',') {
        if let Some(u) = part.strip_prefix("n=") {
            user = Some(unescape_user(u)?);
        } else if let Some(r) = part.strip_prefix("r=") {
            nonce = Some(r.to_string());
        } else if part.starts_with("m=") {
            return Err(bad("SCRAM extensions are not supported"));
        }
    }
    let (Some(user), Some(nonce)) = (user, nonce) else {
        return Err(bad("the first message needs n= and r="));
    };
    if nonce.is_empty()
        || !nonce
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b',')
    {
        return Err(bad("a bad client nonce"));
    }
    Ok(ClientFirst {
        user,
        bare: rest.to_string(),
        nonce,
    })
}

fn unescape_user(u: &str) -> Result<String, ScramError> {
    let mut out = String::new();
    let mut rest = u;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(bad("a bad escape in the user name")),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

fn bad(what: &str) -> ScramError {
    ScramError(what.to_string())
}

impl Conversation {
    /// The server's first message for `first`, with our nonce part `server_nonce` and the
    /// user's `credential`.
    pub fn start(
        mechanism: Mechanism,
        first: ClientFirst,
        server_nonce: &str,
        credential: &Credential,
    ) -> (Conversation, Vec<u8>) {
        let nonce = format!("{}{server_nonce}", first.nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&credential.salt),
            credential.iterations
        );
        let bytes = server_first.clone().into_bytes();
        (
            Conversation {
                mechanism,
                user: first.user,
                client_first_bare: first.bare,
                server_first,
                nonce,
            },
            bytes,
        )
    }

    /// Checks the client's final message `c=biws,r=<nonce>,p=<proof>` against `credential`;
    /// returns the server's final message (`v=<signature>`).
    pub fn finish(&self, message: &[u8], credential: &Credential) -> Result<Vec<u8>, ScramError> {
        let text =
            std::str::from_utf8(message).map_err(|_| bad("the final message is not UTF-8"))?;
        let (without_proof, proof) = text
            .rsplit_once(",p=")
            .ok_or_else(|| bad("the final message has no proof"))?;
        let mut binding = None;
        let mut nonce = None;
        for part in without_proof.split(',') {
            if let Some(c) = part.strip_prefix("c=") {
                binding = Some(c);
            } else if let Some(r) = part.strip_prefix("r=") {
                nonce = Some(r);
            }
        }
        if !matches!(binding, Some("biws") | Some("eSws")) {
            return Err(bad("unexpected channel binding"));
        }
        if nonce != Some(self.nonce.as_str()) {
            return Err(bad("the nonce does not match"));
        }
        let proof = B64
            .decode(proof)
            .map_err(|_| bad("the proof is not base64"))?;
        let auth_message = format!(
            "{},{},{without_proof}",
            self.client_first_bare, self.server_first
        );
        let m = self.mechanism;
        let client_signature = m.hmac(&credential.stored_key, auth_message.as_bytes());
        if proof.len() != client_signature.len() {
            return Err(bad("the proof has the wrong length"));
        }
        let client_key: Vec<u8> = proof
            .iter()
            .zip(&client_signature)
            .map(|(p, s)| p ^ s)
            .collect();
        // Constant-time enough: both sides are hashes of fixed length.
        let matches = m
            .hash(&client_key)
            .iter()
            .zip(&credential.stored_key)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
        if !matches {
            return Err(bad("the proof is wrong"));
        }
        let server_signature = m.hmac(&credential.server_key, auth_message.as_bytes());
        Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
    }
}

/// The fewest iterations a client accepts from a server (RFC 7677's minimum).
const MIN_ITERATIONS: u32 = 4096;

/// The client's side of a conversation.
pub struct ClientConversation {
    mechanism: Mechanism,
    prepared: Vec<u8>,
    client_first_bare: String,
    nonce: String,
    /// What the server's final message must carry, once the client's proof is sent.
    expected_server_final: Option<Vec<u8>>,
}

/// The salted password for the last salt and iteration count a server sent: PBKDF2 is the
/// expensive step, and every connection to the same server gets the same salt.
#[derive(Default)]
pub struct SaltedCache(std::sync::Mutex<Option<Salted>>);

/// A salt, an iteration count, and the password salted with them.
type Salted = (Vec<u8>, u32, Vec<u8>);

fn escape_user(user: &str) -> String {
    user.replace('=', "=3D").replace(',', "=2C")
}

impl ClientConversation {
    /// The client's first message (`n,,n=<user>,r=<nonce>`) as `user` with `password`;
    /// `client_nonce` must be printable ASCII without commas.
    pub fn start(
        mechanism: Mechanism,
        user: &str,
        password: &str,
        client_nonce: &str,
    ) -> Result<(ClientConversation, Vec<u8>), ScramError> {
        let prepared = prepared_password(mechanism, user, password).map_err(ScramError)?;
        let client_first_bare = format!("n={},r={client_nonce}", escape_user(user));
        let message = format!("n,,{client_first_bare}").into_bytes();
        Ok((
            ClientConversation {
                mechanism,
                prepared,
                client_first_bare,
                nonce: client_nonce.to_string(),
                expected_server_final: None,
            },
            message,
        ))
    }

    /// The client's final message (`c=biws,r=<nonce>,p=<proof>`) for the server's first.
    pub fn respond(
        &mut self,
        server_first: &[u8],
        cache: &SaltedCache,
    ) -> Result<Vec<u8>, ScramError> {
        let text = std::str::from_utf8(server_first)
            .map_err(|_| bad("the server's first message is not UTF-8"))?;
        let (mut nonce, mut salt, mut iterations) = (None, None, None);
        for part in text.split(',') {
            if let Some(r) = part.strip_prefix("r=") {
                nonce = Some(r);
            } else if let Some(s) = part.strip_prefix("s=") {
                salt = Some(B64.decode(s).map_err(|_| bad("the salt is not base64"))?);
            } else if let Some(i) = part.strip_prefix("i=") {
                iterations = Some(i.parse::<u32>().map_err(|_| bad("a bad iteration count"))?);
            } else if part.starts_with("m=") {
                return Err(bad("SCRAM extensions are not supported"));
            }
        }
        let (Some(nonce), Some(salt), Some(iterations)) = (nonce, salt, iterations) else {
            return Err(bad("the server's first message needs r=, s= and i="));
        };
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err(bad("the server's nonce does not extend ours"));
        }
        if iterations < MIN_ITERATIONS {
            return Err(bad("the server asks for too few iterations"));
        }
        let m = self.mechanism;
        let salted = {
            let mut cached = cache.0.lock().unwrap_or_else(|e| e.into_inner());
            match &*cached {
                Some((s, i, salted)) if *s == salt && *i == iterations => salted.clone(),
                _ => {
                    let salted = m.salted_password(&self.prepared, &salt, iterations);
                    *cached = Some((salt, iterations, salted.clone()));
                    salted
                }
            }
        };
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{text},{without_proof}", self.client_first_bare);
        let client_key = m.hmac(&salted, b"Client Key");
        let signature = m.hmac(&m.hash(&client_key), auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(k, s)| k ^ s)
            .collect();
        let server_key = m.hmac(&salted, b"Server Key");
        let server_signature = m.hmac(&server_key, auth_message.as_bytes());
        self.expected_server_final =
            Some(format!("v={}", B64.encode(server_signature)).into_bytes());
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Checks the server's final message: the server knows the credential too.
    pub fn verify(&self, server_final: &[u8]) -> Result<(), ScramError> {
        match &self.expected_server_final {
            Some(expected) if expected.as_slice() == server_final => Ok(()),
            Some(_) => Err(bad("the server's signature is wrong")),
            None => Err(bad("the server finished before the client's proof")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conversation(mechanism: Mechanism, password_used: &str) -> Result<(), ScramError> {
        let credential =
            Credential::derive(mechanism, "ada", "s3cret", b"0123456789abcdef".to_vec())
                .expect("credential");
        let (mut client, client_first) =
            ClientConversation::start(mechanism, "ada", password_used, "clientnonce")?;
        let first = parse_client_first(&client_first)?;
        assert_eq!(first.user, "ada");
        let (conv, server_first) =
            Conversation::start(mechanism, first, "servernonce", &credential);
        assert!(server_first.starts_with(b"r=clientnonceservernonce,s="));
        let final_message = client.respond(&server_first, &SaltedCache::default())?;
        let server_final = conv.finish(&final_message, &credential)?;
        client.verify(&server_final)?;
        Ok(())
    }

    #[test]
    fn a_password_verifies_against_its_credential_only() {
        for mechanism in [Mechanism::Sha1, Mechanism::Sha256] {
            let mut credential =
                Credential::derive(mechanism, "ada", "s3cret", b"0123456789abcdef".to_vec())
                    .expect("credential");
            assert!(credential.verify(mechanism, "ada", "s3cret"));
            assert!(!credential.verify(mechanism, "ada", "s3cret "));
            assert!(!credential.verify(mechanism, "ada", ""));
            if mechanism == Mechanism::Sha1 {
                // SCRAM-SHA-1 hashes the user name in: another user's name does not verify.
                assert!(!credential.verify(mechanism, "bob", "s3cret"));
            }
            credential.iterations = MAX_VERIFY_ITERATIONS + 1;
            assert!(!credential.verify(mechanism, "ada", "s3cret"));
        }
    }

    #[test]
    fn a_client_refuses_a_server_that_does_not_know_the_key() {
        let (mut client, _) =
            ClientConversation::start(Mechanism::Sha256, "u", "p", "abc").expect("start");
        for bad_first in [
            &b"r=abc,s=AAAA,i=4096"[..],
            b"r=xyzdef,s=AAAA,i=4096",
            b"r=abcdef,s=AAAA,i=10",
            b"r=abcdef,s=!!,i=4096",
            b"r=abcdef,i=4096",
            b"\xff",
        ] {
            assert!(
                client.respond(bad_first, &SaltedCache::default()).is_err(),
                "{bad_first:?}"
            );
        }
        assert!(client.verify(b"v=AAAA").is_err(), "no proof sent yet");
        client
            .respond(b"r=abcdef,s=AAAA,i=4096", &SaltedCache::default())
            .expect("a good first message");
        assert!(client.verify(b"v=AAAA").is_err(), "a wrong signature");
    }

    #[test]
    fn user_names_are_escaped_both_ways() {
        let (_, first) =
            ClientConversation::start(Mechanism::Sha256, "a,b=", "p", "n").expect("start");
        assert_eq!(first, b"n,,n=a=2Cb=3D,r=n");
        assert_eq!(
            parse_client_first(&first).map(|f| f.user).ok(),
            Some("a,b=".to_string())
        );
    }

    #[test]
    fn the_right_password_authenticates_with_both_mechanisms() {
        conversation(Mechanism::Sha256, "s3cret").expect("sha-256");
        conversation(Mechanism::Sha1, "s3cret").expect("sha-1");
    }

    #[test]
    fn a_wrong_password_does_not() {
        assert!(conversation(Mechanism::Sha256, "wrong").is_err());
        assert!(conversation(Mechanism::Sha1, "wrong").is_err());
    }

    #[test]
    fn rfc_7677_test_vector() {
        // RFC 7677 §3: user "user", password "pencil".
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").expect("salt");
        let mut credential =
            Credential::derive(Mechanism::Sha256, "user", "pencil", salt).expect("credential");
        credential.iterations = 4096;
        let prepared = prepared_password(Mechanism::Sha256, "user", "pencil").expect("p");
        let salted = Mechanism::Sha256.salted_password(&prepared, &credential.salt, 4096);
        let client_key = Mechanism::Sha256.hmac(&salted, b"Client Key");
        credential.stored_key = Mechanism::Sha256.hash(&client_key);
        credential.server_key = Mechanism::Sha256.hmac(&salted, b"Server Key");
        let first = parse_client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO").expect("first");
        let (conv, server_first) = Conversation::start(
            Mechanism::Sha256,
            first,
            "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
            &credential,
        );
        assert_eq!(
            server_first,
            b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let server_final = conv
            .finish(
                b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
                &credential,
            )
            .expect("the RFC's proof");
        assert_eq!(
            server_final,
            b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
    }

    #[test]
    fn garbage_fails_cleanly() {
        for bad_first in [
            &b"p=tls-unique,,n=a,r=x"[..],
            b"n,,n=a",
            b"n,,r=x",
            b"\xff\xfe",
            b"",
            b"n,,n=a=2,r=x",
            b"n,,n=a,r=",
            b"n,,m=ext,n=a,r=x",
        ] {
            assert!(parse_client_first(bad_first).is_err(), "{bad_first:?}");
        }
        assert_eq!(
            parse_client_first(b"n,,n=a=2Cb=3D,r=x")
                .map(|f| f.user)
                .ok(),
            Some("a,b=".to_string())
        );
        let credential = Credential::derive(Mechanism::Sha256, "u", "p", vec![1; 16]).expect("c");
        let first = parse_client_first(b"n,,n=u,r=abc").expect("first");
        let (conv, _) = Conversation::start(Mechanism::Sha256, first, "def", &credential);
        for bad_final in [
            &b"c=biws,r=abcdef"[..],
            b"c=biws,r=abcXXX,p=AAAA",
            b"c=biws,r=abcdef,p=!!!",
            b"c=biws,r=abcdef,p=AAAA",
            b"c=cD10bHMtdW5pcXVlLCw=,r=abcdef,p=AAAA",
            b"\xff",
        ] {
            assert!(
                conv.finish(bad_final, &credential).is_err(),
                "{bad_final:?}"
            );
        }
    }
}
