//! Bearer tokens for the HTTP feeds (`createHttpToken`): a user, its database and an expiry,
//! signed with the cluster's key (HMAC-SHA-256) so that any router of the cluster takes them.
//!
//! Pure: no I/O. Invariants: a token is `trb1.<payload>.<mac>` in unpadded base64url, at most
//! [`MAX_TOKEN_LEN`] bytes; one whose signature, form or expiry fails is refused, whichever it
//! was; the MAC is compared in constant time.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{KeyInit, Mac};

/// The longest token read (a user name and a database name are bounded well below it).
pub const MAX_TOKEN_LEN: usize = 2048;
const PREFIX: &str = "trb1.";
/// Keeps these MACs apart from any other use of the cluster's key.
const DOMAIN: &[u8] = b"tributary http token v1\0";

/// Who a token stands for, and until when (seconds since the Unix epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub user: String,
    pub db: String,
    pub expires: u64,
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn mac(key: &[u8], payload: &[u8]) -> Vec<u8> {
    let Ok(mut mac) = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(key) else {
        return Vec::new();
    };
    mac.update(DOMAIN);
    mac.update(payload);
    mac.finalize().into_bytes().to_vec()
}

fn payload(claims: &Claims) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + claims.user.len() + claims.db.len());
    for part in [claims.user.as_bytes(), claims.db.as_bytes()] {
        out.extend_from_slice(&(part.len() as u32).to_be_bytes());
        out.extend_from_slice(part);
    }
    out.extend_from_slice(&claims.expires.to_be_bytes());
    out
}

fn claims_of(payload: &[u8]) -> Option<Claims> {
    let mut rest = payload;
    let mut part = || -> Option<String> {
        let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let s = String::from_utf8(rest.get(4..4usize.checked_add(len)?)?.to_vec()).ok()?;
        rest = &rest[4 + len..];
        Some(s)
    };
    let user = part()?;
    let db = part()?;
    let expires = u64::from_be_bytes(rest.try_into().ok()?);
    Some(Claims { user, db, expires })
}

pub fn sign(key: &[u8], claims: &Claims) -> String {
    let payload = payload(claims);
    format!(
        "{PREFIX}{}.{}",
        B64.encode(&payload),
        B64.encode(mac(key, &payload))
    )
}

/// The claims of a token this cluster signed that has not expired at `now`.
pub fn verify(key: &[u8], token: &str, now: u64) -> Option<Claims> {
    if token.len() > MAX_TOKEN_LEN {
        return None;
    }
    let (payload, signature) = token.strip_prefix(PREFIX)?.split_once('.')?;
    let payload = B64.decode(payload).ok()?;
    let signature = B64.decode(signature).ok()?;
    let expected = mac(key, &payload);
    let same = expected.len() == signature.len()
        && expected
            .iter()
            .zip(&signature)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if !same {
        return None;
    }
    let claims = claims_of(&payload)?;
    (claims.expires > now).then_some(claims)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_verifies_until_it_expires_and_only_with_its_key() {
        let claims = Claims {
            user: "ada".into(),
            db: "admin".into(),
            expires: 1_000,
        };
        let token = sign(b"key", &claims);
        assert_eq!(verify(b"key", &token, 999), Some(claims.clone()));
        assert_eq!(verify(b"key", &token, 1_000), None, "expired");
        assert_eq!(verify(b"other key", &token, 0), None, "another cluster's");
        // Any change to the payload breaks the signature.
        let forged = sign(
            b"key",
            &Claims {
                user: "root".into(),
                ..claims
            },
        );
        let (_, forged_payload) = forged.split_at(PREFIX.len());
        let forged_payload = forged_payload.split('.').next().unwrap_or("");
        let original_mac = token.rsplit('.').next().unwrap_or("");
        assert_eq!(
            verify(
                b"key",
                &format!("{PREFIX}{forged_payload}.{original_mac}"),
                0
            ),
            None
        );
    }

    #[test]
    fn garbage_is_refused() {
        for token in [
            "",
            "trb1.",
            "trb1..",
            "trb1.!!.!!",
            "Basic abc",
            &"x".repeat(MAX_TOKEN_LEN + 1),
        ] {
            assert_eq!(verify(b"key", token, 0), None, "{token:.20}");
        }
        // A well-signed payload of the wrong shape.
        let payload = b"\x00\x00\x00\xffab";
        let token = format!(
            "{PREFIX}{}.{}",
            B64.encode(payload),
            B64.encode(mac(b"key", payload))
        );
        assert_eq!(verify(b"key", &token, 0), None);
    }
}
