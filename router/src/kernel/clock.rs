//! The router's view of cluster time: the highest `$clusterTime` it has seen from drivers and
//! shards. It gossips that value on every command to a shard, so a shard's clock never runs
//! behind a write the router has already acknowledged elsewhere.
//!
//! Invariant: the value only grows (`fetch_max`), so gossip is monotonic per router.

use std::sync::atomic::{AtomicU64, Ordering};

use bson::{Binary, Bson, Document, RawDocument, Timestamp, doc, spec::BinarySubtype};
use resume::ClusterTime;

#[derive(Debug, Default)]
pub struct ClusterClock {
    max_seen: AtomicU64,
}

impl ClusterClock {
    pub fn new() -> Self {
        ClusterClock::default()
    }

    pub fn now(&self) -> ClusterTime {
        ClusterTime::from_u64(self.max_seen.load(Ordering::Acquire))
    }

    pub fn observe(&self, t: ClusterTime) {
        self.max_seen.fetch_max(t.as_u64(), Ordering::AcqRel);
    }

    /// Reads `$clusterTime.clusterTime` (and `operationTime`) from a document, if present.
    pub fn observe_document(&self, d: &Document) {
        if let Some(t) = cluster_time_of(d) {
            self.observe(t);
        }
        if let Ok(t) = d.get_timestamp("operationTime") {
            self.observe(t.into());
        }
    }

    /// Observes the `$clusterTime` a client sent, unless it is more than `max_drift` ahead of
    /// this machine's wall clock (`maxAcceptableLogicalClockDriftSecs`): then the command is
    /// refused with `ClusterTimeFailsRateLimiter` and the clock does not move, so no client
    /// can push every later write's time far into the future.
    pub fn observe_client(&self, d: &Document, max_drift: std::time::Duration) -> wire::Result<()> {
        let Some(t) = cluster_time_of(d) else {
            return Ok(());
        };
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let limit = wall.saturating_add(max_drift).as_secs();
        if u64::from(t.secs) > limit {
            return Err(wire::MongoError::new(
                wire::ErrorCode::CLUSTER_TIME_FAILS_RATE_LIMITER,
                format!(
                    "New cluster time, {}, is too far from this node's wall clock time, {}.",
                    t.secs,
                    wall.as_secs()
                ),
            ));
        }
        self.observe(t);
        Ok(())
    }

    /// [`ClusterClock::observe_document`] for an encoded reply.
    pub fn observe_raw(&self, d: &RawDocument) {
        let cluster_time = d
            .get_document("$clusterTime")
            .ok()
            .and_then(|c| c.get_timestamp("clusterTime").ok());
        let op_time = d.get_timestamp("operationTime").ok();
        for t in cluster_time.into_iter().chain(op_time) {
            self.observe(t.into());
        }
    }

    /// The `$clusterTime` document to attach to a command or reply.
    pub fn gossip(&self) -> Document {
        cluster_time_document(self.now())
    }

    /// [`ClusterClock::gossip`] signed with the cluster's key (with `--auth`).
    pub fn gossip_signed(&self, key: &ClusterKey) -> Document {
        let t = self.now();
        doc! {
            "clusterTime": Bson::Timestamp(Timestamp::from(t)),
            "signature": {
                "hash": Binary { subtype: BinarySubtype::Generic, bytes: key.sign(t) },
                "keyId": key.id,
            },
        }
    }

    /// With `--auth`, a client may move the clock only with a time this cluster signed:
    /// a `$clusterTime` ahead of ours whose signature does not check out is refused with
    /// `TimeProofMismatch` (204). A time we already have needs no proof.
    pub fn verify_client(&self, d: &Document, key: &ClusterKey) -> wire::Result<()> {
        let Some(t) = cluster_time_of(d) else {
            return Ok(());
        };
        if t <= self.now() {
            return Ok(());
        }
        let signature = d
            .get_document("$clusterTime")
            .ok()
            .and_then(|c| c.get_document("signature").ok());
        let hash = signature.and_then(|s| s.get_binary_generic("hash").ok());
        let key_id = signature.and_then(|s| s.get_i64("keyId").ok());
        if key_id == Some(key.id) && hash.is_some_and(|h| *h == key.sign(t)) {
            return Ok(());
        }
        Err(wire::MongoError::new(
            wire::ErrorCode::TIME_PROOF_MISMATCH,
            "Cluster time signature is invalid: the time was not signed by this cluster",
        ))
    }
}

/// `readConcern.atClusterTime` and `readConcern.afterClusterTime` name a time a read must see;
/// neither may be ahead of the cluster's time (after the command's own `$clusterTime`, which
/// passed [`ClusterClock::observe_client`] or [`ClusterClock::verify_client`], was observed).
/// A shard waits for such a time by moving its clock there, so an unchecked one would throw
/// every later write into the future. MongoDB refuses both with `InvalidOptions`.
pub fn check_read_times(cmd: &Document, now: ClusterTime) -> wire::Result<()> {
    let Ok(rc) = cmd.get_document("readConcern") else {
        return Ok(());
    };
    for field in ["atClusterTime", "afterClusterTime"] {
        let t = match rc.get(field) {
            None => continue,
            Some(Bson::Timestamp(t)) => ClusterTime::from(*t),
            Some(_) => {
                return Err(wire::MongoError::type_mismatch(format!(
                    "BSON field 'readConcern.{field}' is the wrong type, expected type 'timestamp'"
                )));
            }
        };
        if t > now {
            return Err(wire::MongoError::new(
                wire::ErrorCode::INVALID_OPTIONS,
                format!(
                    "readConcern {field} value must not be greater than the current \
                     clusterTime. Requested clusterTime: {}; current clusterTime: {}",
                    display(t),
                    display(now)
                ),
            ));
        }
    }
    Ok(())
}

/// `Timestamp(secs, inc)`, as MongoDB prints times in messages.
fn display(t: ClusterTime) -> String {
    format!("Timestamp({}, {})", t.secs, t.inc)
}

/// The key that signs cluster times (with `--auth`), shared by every router through the
/// config shard.
#[derive(Debug, Clone)]
pub struct ClusterKey {
    pub id: i64,
    pub key: Vec<u8>,
}

impl ClusterKey {
    /// HMAC-SHA1 of the time (as MongoDB's, 20 bytes).
    pub fn sign(&self, t: ClusterTime) -> Vec<u8> {
        use hmac::{KeyInit, Mac};
        let Ok(mut mac) = <hmac::Hmac<sha1::Sha1> as KeyInit>::new_from_slice(&self.key) else {
            return vec![0; 20];
        };
        mac.update(&t.as_u64().to_be_bytes());
        mac.finalize().into_bytes().to_vec()
    }
}

/// `{clusterTime, signature: {hash, keyId}}` with an all-zero signature (no auth).
pub fn cluster_time_document(t: ClusterTime) -> Document {
    doc! {
        "clusterTime": Bson::Timestamp(Timestamp::from(t)),
        "signature": {
            "hash": Binary { subtype: BinarySubtype::Generic, bytes: vec![0; 20] },
            "keyId": 0_i64,
        },
    }
}

/// The `$clusterTime.clusterTime` of a command or reply.
pub fn cluster_time_of(d: &Document) -> Option<ClusterTime> {
    d.get_document("$clusterTime")
        .ok()?
        .get_timestamp("clusterTime")
        .ok()
        .map(ClusterTime::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_auth_only_signed_times_move_the_clock() {
        let clock = ClusterClock::new();
        clock.observe(ClusterTime::new(100, 1));
        let key = ClusterKey {
            id: 1,
            key: vec![7; 20],
        };
        let other = ClusterClock::new();
        other.observe(ClusterTime::new(200, 1));
        let signed = doc! {"ping": 1, "$clusterTime": other.gossip_signed(&key)};
        assert!(clock.verify_client(&signed, &key).is_ok());
        let mut forged = signed.clone();
        if let Ok(ct) = forged.get_document_mut("$clusterTime") {
            ct.insert(
                "clusterTime",
                Bson::Timestamp(Timestamp {
                    time: 300,
                    increment: 1,
                }),
            );
        }
        assert_eq!(
            clock.verify_client(&forged, &key).map_err(|e| e.code),
            Err(204)
        );
        let unsigned =
            doc! {"ping": 1, "$clusterTime": cluster_time_document(ClusterTime::new(150, 1))};
        assert_eq!(
            clock.verify_client(&unsigned, &key).map_err(|e| e.code),
            Err(204)
        );
        let old = doc! {"ping": 1, "$clusterTime": cluster_time_document(ClusterTime::new(50, 1))};
        assert!(
            clock.verify_client(&old, &key).is_ok(),
            "a time we have needs no proof"
        );
    }

    #[test]
    fn a_client_cannot_move_the_clock_past_the_allowed_drift() {
        let clock = ClusterClock::new();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(0);
        let drift = std::time::Duration::from_secs(3600);
        let at = |secs: u32| doc! {"ping": 1, "$clusterTime": cluster_time_document(ClusterTime::new(secs, 1))};
        assert!(clock.observe_client(&at(now + 60), drift).is_ok());
        assert_eq!(clock.now().secs, now + 60);
        let e = clock
            .observe_client(&at(now + 7200), drift)
            .expect_err("two hours ahead");
        assert_eq!(e.code, 205);
        assert_eq!(
            clock.now().secs,
            now + 60,
            "the refused time is not observed"
        );
        assert!(clock.observe_client(&doc! {"ping": 1}, drift).is_ok());
    }

    #[test]
    fn a_read_may_not_name_a_time_ahead_of_the_cluster() {
        let now = ClusterTime::new(100, 5);
        let read = |field: &str, t: ClusterTime| {
            doc! {"find": "c", "readConcern": {"level": "snapshot", field: Bson::Timestamp(t.timestamp())}}
        };
        for field in ["atClusterTime", "afterClusterTime"] {
            assert!(check_read_times(&read(field, now), now).is_ok());
            assert!(check_read_times(&read(field, ClusterTime::new(99, 9)), now).is_ok());
            let e = check_read_times(&read(field, ClusterTime::new(100, 6)), now)
                .expect_err("one tick ahead");
            assert_eq!((e.code, e.code_name.as_str()), (72, "InvalidOptions"));
            let e = check_read_times(&read(field, ClusterTime::new(4_000_000_000, 1)), now)
                .expect_err("the year 2096");
            assert_eq!(e.code, 72);
        }
        let wrong = doc! {"find": "c", "readConcern": {"afterClusterTime": 5}};
        assert_eq!(check_read_times(&wrong, now).map_err(|e| e.code), Err(14));
        assert!(check_read_times(&doc! {"find": "c"}, now).is_ok());
    }

    #[test]
    fn gossip_never_goes_backwards() {
        let c = ClusterClock::new();
        c.observe(ClusterTime::new(10, 2));
        c.observe(ClusterTime::new(9, 7));
        assert_eq!(c.now(), ClusterTime::new(10, 2));
        c.observe_document(&doc! {"$clusterTime": cluster_time_document(ClusterTime::new(11, 0))});
        assert_eq!(c.now(), ClusterTime::new(11, 0));
    }
}
