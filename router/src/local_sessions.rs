//! The router's logical session cache, as `$listLocalSessions` lists it: every session id
//! (`lsid.id`) a command carried or `startSession` handed out, with the user it belongs to and
//! when it was last used. Sessions stay implicit (any `lsid` is accepted); this is bookkeeping.
//!
//! Invariants: one entry per (session id, user); `endSessions` removes the caller's sessions,
//! `killAllSessions` every one; `lastUse` never goes back; a session unused for
//! [`SESSION_TIMEOUT_MS`] is no longer listed, and is dropped when room is needed; the cache
//! holds at most [`MAX_SESSIONS`] entries (then the least recently used go first). Time comes
//! in as `now`.

use std::collections::HashMap;
use std::sync::Mutex;

use bson::{Binary, Bson, DateTime, Document, doc, spec::BinarySubtype};
use sha2::{Digest, Sha256};

/// The most sessions remembered (MongoDB's default cache size).
pub const MAX_SESSIONS: usize = 1_000_000;

/// How long an unused session lives (`localLogicalSessionTimeoutMinutes`: 30).
pub const SESSION_TIMEOUT_MS: i64 = 30 * 60 * 1000;

fn expired(e: &Entry, now: DateTime) -> bool {
    e.last_use
        .timestamp_millis()
        .saturating_add(SESSION_TIMEOUT_MS)
        < now.timestamp_millis()
}

/// A user as `user@db` (empty: no authenticated user).
pub type UserName = String;

#[derive(Debug, Clone)]
struct Entry {
    id: Binary,
    user: UserName,
    last_use: DateTime,
}

/// The cache.
#[derive(Default)]
pub struct LocalSessions {
    map: Mutex<HashMap<(Vec<u8>, UserName), Entry>>,
}

/// The users a `$listLocalSessions` asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Which {
    All,
    Users(Vec<UserName>),
}

/// `SHA256(user@db)`, the session's `uid` (of the empty name without authentication).
pub fn uid(user: &str) -> Binary {
    Binary {
        subtype: BinarySubtype::Generic,
        bytes: Sha256::digest(user.as_bytes()).to_vec(),
    }
}

/// The session id of an `lsid` document (`{id: UUID}`).
pub fn session_id(lsid: &Bson) -> Option<Binary> {
    match lsid.as_document()?.get("id")? {
        Bson::Binary(b) => Some(b.clone()),
        _ => None,
    }
}

impl LocalSessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(Vec<u8>, UserName), Entry>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a use of session `id` by `user` at `now`.
    pub fn touch(&self, id: Binary, user: UserName, now: DateTime) {
        let mut map = self.lock();
        let key = (id.bytes.clone(), user.clone());
        if let Some(e) = map.get_mut(&key) {
            e.last_use = e.last_use.max(now);
            return;
        }
        if map.len() >= MAX_SESSIONS {
            map.retain(|_, e| !expired(e, now));
        }
        if map.len() >= MAX_SESSIONS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, e)| e.last_use)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(
            key,
            Entry {
                id,
                user,
                last_use: now,
            },
        );
    }

    /// Forgets the sessions `ids` of `user` (`endSessions`).
    pub fn end(&self, ids: &[Binary], user: &str) {
        let mut map = self.lock();
        for id in ids {
            map.remove(&(id.bytes.clone(), user.to_string()));
        }
    }

    /// The ids of `user`'s sessions (`killSessions: []` with authentication).
    pub fn ids_of(&self, user: &str) -> Vec<Vec<u8>> {
        self.lock()
            .keys()
            .filter(|(_, u)| u == user)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Forgets every session (`killAllSessions`).
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// The live sessions of `which` at `now`, as `$listLocalSessions` documents, oldest use
    /// first.
    pub fn list(&self, which: &Which, now: DateTime) -> Vec<Document> {
        let map = self.lock();
        let mut entries: Vec<&Entry> = map
            .values()
            .filter(|e| !expired(e, now))
            .filter(|e| match which {
                Which::All => true,
                Which::Users(users) => users.contains(&e.user),
            })
            .collect();
        entries.sort_by_key(|e| (e.last_use, e.id.bytes.clone()));
        entries
            .into_iter()
            .map(|e| {
                let mut d = doc! {
                    "_id": {"id": Bson::Binary(e.id.clone()), "uid": Bson::Binary(uid(&e.user))},
                    "lastUse": e.last_use,
                };
                if !e.user.is_empty() {
                    d.insert("user", doc! {"name": &e.user});
                }
                d
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> Binary {
        Binary {
            subtype: BinarySubtype::Uuid,
            bytes: vec![n; 16],
        }
    }

    #[test]
    fn sessions_are_listed_per_user_and_forgotten_when_ended() {
        let cache = LocalSessions::default();
        let t = |ms| DateTime::from_millis(ms);
        cache.touch(id(1), String::new(), t(10));
        cache.touch(id(2), "alice@admin".into(), t(20));
        cache.touch(id(1), String::new(), t(30));
        cache.touch(id(1), String::new(), t(5));
        let all = cache.list(&Which::All, t(40));
        assert_eq!(all.len(), 2);
        // lastUse never goes back.
        let mine = cache.list(&Which::Users(vec![String::new()]), t(40));
        assert_eq!(mine.len(), 1);
        assert_eq!(mine[0].get_datetime("lastUse").unwrap(), &t(30));
        assert!(mine[0].get("user").is_none());
        let alice = cache.list(&Which::Users(vec!["alice@admin".into()]), t(40));
        assert_eq!(
            alice[0].get_document("user").unwrap(),
            &doc! {"name": "alice@admin"}
        );
        assert_eq!(
            alice[0].get_document("_id").unwrap().get("uid"),
            Some(&Bson::Binary(uid("alice@admin")))
        );
        cache.end(&[id(2)], "bob@admin");
        assert_eq!(cache.list(&Which::All, t(40)).len(), 2);
        cache.end(&[id(2)], "alice@admin");
        assert_eq!(cache.list(&Which::All, t(40)).len(), 1);
        // Thirty minutes unused: no longer listed.
        assert_eq!(cache.list(&Which::All, t(30 + SESSION_TIMEOUT_MS)).len(), 1);
        assert!(
            cache
                .list(&Which::All, t(31 + SESSION_TIMEOUT_MS))
                .is_empty()
        );
        cache.clear();
        assert!(cache.list(&Which::All, t(40)).is_empty());
    }
}
