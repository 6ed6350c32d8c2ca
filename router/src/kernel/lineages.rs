//! The cluster's memory of each shard's history: `config.shardLineages` on the config shard,
//! one document per shard with its history id, the last boot the cluster saw, and how far
//! that history had reached (its newest oplog entry: only entries can be lost; a run that
//! wrote nothing lost nothing a token could have seen). See `shard::lineage` for what a shard
//! keeps itself.
//!
//! Owns: comparing what a shard says of itself with what the cluster remembers ([`judge`]),
//! marking a boot lost on the shard when the shard came back with less history than the
//! cluster had seen (its data directory restored from an older copy), and keeping the
//! registry up to date: every second (`lineage_interval`), and before a stream resumes or re-opens a shard's
//! stream ([`verify_now`]), so a resume after a restore is judged against the restore.
//!
//! Invariants: a boot is marked lost only when the cluster recorded that the same history had
//! reached past the boot's start before the boot (an ordinary restart starts at or above
//! everything it handed out, so it is never marked); a boot is marked on the shard before the
//! registry moves past it, so a failure is retried on the next pass; registry updates are
//! compare-and-set on the previous document, so routers racing never move it backwards.

use std::sync::Arc;
use std::time::Duration;

use bson::{Bson, Document, doc};
use resume::ClusterTime;
use shard::lineage::Lineage;
use shard::sharding::ShardId;
use wire::Result;

use crate::kernel::config::ConfigStore;
use crate::kernel::services::{Service, Services};
use crate::kernel::shard_client::TransportError;
use crate::kernel::transport::{Resend, ShardTransport};

const DB: &str = "config";
const COLL: &str = "shardLineages";
/// How often the registry is brought up to date by default.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// What the cluster remembers of one shard's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub history_id: bson::Uuid,
    /// The `to` of the latest boot seen (or where the history began).
    pub last_boot: ClusterTime,
    /// The newest oplog entry of that history the cluster saw.
    pub reached: ClusterTime,
}

/// What to do about one shard: the boots to mark lost (each by its `to`, with how far the
/// history had reached before it), then the registry's new entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    pub lost: Vec<(ClusterTime, ClusterTime)>,
    pub entry: Entry,
}

fn latest_boot(l: &Lineage) -> ClusterTime {
    l.boots.last().map_or(l.began, |b| b.to)
}

/// Compares a shard's lineage (and its newest entry) with the registry's entry.
pub fn judge(known: Option<&Entry>, lineage: &Lineage, newest: ClusterTime) -> Judgement {
    let fresh = Entry {
        history_id: lineage.history_id,
        last_boot: latest_boot(lineage),
        reached: newest,
    };
    let Some(known) = known.filter(|k| k.history_id == lineage.history_id) else {
        // First sight, or a new history at this shard's place (an empty data directory):
        // tokens from before it are refused by the shard itself (`began`).
        return Judgement {
            lost: Vec::new(),
            entry: fresh,
        };
    };
    // The first boot the registry has not seen: if it starts below what the history had
    // reached, the shard came back from an older copy. Later boots start above that boot's
    // `to`, beyond anything the lost run had.
    let lost = lineage
        .boots
        .iter()
        .find(|b| b.to > known.last_boot)
        .filter(|b| b.from < known.reached && !b.lost)
        .map(|b| vec![(b.to, known.reached)])
        .unwrap_or_default();
    Judgement {
        lost,
        entry: Entry {
            reached: known.reached.max(newest),
            ..fresh
        },
    }
}

fn ts(t: ClusterTime) -> Bson {
    Bson::Timestamp(t.timestamp())
}

fn entry_of(d: &Document) -> Option<Entry> {
    let time = |k: &str| match d.get(k) {
        Some(Bson::Timestamp(t)) => Some(ClusterTime::from(*t)),
        _ => None,
    };
    let history_id = match d.get("historyId") {
        Some(Bson::Binary(b)) => bson::Uuid::from_bytes(b.bytes.as_slice().try_into().ok()?),
        _ => return None,
    };
    Some(Entry {
        history_id,
        last_boot: time("lastBoot")?,
        reached: time("reached")?,
    })
}

fn entry_fields(e: &Entry) -> Document {
    doc! {"historyId": e.history_id, "lastBoot": ts(e.last_boot), "reached": ts(e.reached)}
}

/// One command to a shard that is not waited for: a shard that cannot be reached now is
/// judged on a later pass (this runs before resumes, which must not wait on it).
async fn ask(
    transport: &ShardTransport,
    shard: ShardId,
    db: &str,
    cmd: Document,
) -> Result<Document> {
    let reply = transport
        .send_body(shard, db, cmd, Duration::ZERO, Resend::Lost)
        .await
        .map_err(TransportError::into_error)?;
    let reply = reply.into_document().unwrap_or_else(|e| e.to_document());
    match wire::MongoError::from_reply(&reply) {
        Some(e) => Err(e),
        None => Ok(reply),
    }
}

/// One pass over every shard.
async fn verify(transport: &ShardTransport) -> Result<()> {
    let ids = transport.all();
    let names = transport.names();
    let lineages = futures::future::join_all(
        ids.iter()
            .map(|&id| ask(transport, id, "admin", doc! {"_shardsvrLineage": 1})),
    )
    .await;
    let reply = ask(
        transport,
        ShardId::CONFIG,
        DB,
        doc! {"find": COLL, "filter": {}, "batchSize": i32::MAX},
    )
    .await?;
    let known: Vec<(String, Entry)> = reply
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .map(|b| {
            b.iter()
                .filter_map(Bson::as_document)
                .filter_map(|d| Some((d.get_str("_id").ok()?.to_string(), entry_of(d)?)))
                .collect()
        })
        .unwrap_or_default();
    let mut updates = Vec::new();
    for ((&id, name), reply) in ids.iter().zip(&names).zip(lineages) {
        let Ok(reply) = reply else { continue };
        let Some(lineage) = reply
            .get_document("lineage")
            .ok()
            .and_then(Lineage::from_document)
        else {
            continue;
        };
        let newest = match reply.get("newest") {
            Some(Bson::Timestamp(t)) => ClusterTime::from(*t),
            _ => continue,
        };
        let before = known.iter().find(|(n, _)| n == name).map(|(_, e)| e);
        let judgement = judge(before, &lineage, newest);
        for (to, reached) in &judgement.lost {
            // Every time the lost run handed out reached a client through a router, which
            // observed it: this router's clock is past all of it that this router gave out,
            // and past the newest entry the cluster saw.
            let reached = (*reached).max(transport.clock().now());
            tracing::warn!(shard = %name, boot = %to, %reached, "shard came back with less history than the cluster had seen: marking the stretch lost");
            ask(
                transport,
                id,
                "admin",
                doc! {"_shardsvrMarkLineageLost": 1, "to": ts(*to), "reached": ts(reached)},
            )
            .await?;
        }
        if before == Some(&judgement.entry) {
            continue;
        }
        let filter = match before {
            Some(e) => {
                let mut f = entry_fields(e);
                f.insert("_id", name.as_str());
                f
            }
            None => doc! {"_id": name.as_str()},
        };
        updates.push(Bson::Document(
            doc! {"q": filter, "u": {"$set": entry_fields(&judgement.entry)}, "upsert": true},
        ));
    }
    if !updates.is_empty() {
        // One commit for every shard's entry. A concurrent router's update makes one a
        // duplicate or a no-op: both fine, the next pass starts from what is stored.
        let update = doc! {"update": COLL, "updates": updates, "ordered": false};
        let _ = ask(transport, ShardId::CONFIG, DB, update).await;
    }
    Ok(())
}

/// The cluster's registry of shard histories as this router keeps it up to date, and the
/// cluster's id. Passes are serialised, so a caller waits for one that started after it asked.
pub struct Lineages {
    transport: Arc<ShardTransport>,
    config: ConfigStore,
    /// How often [`Lineages::keep_up`] passes (zero: only before resumes).
    interval: Duration,
    last_done: tokio::sync::Mutex<Option<tokio::time::Instant>>,
    cluster_id: tokio::sync::OnceCell<bson::Uuid>,
}

impl Lineages {
    pub fn new(transport: Arc<ShardTransport>, interval: Duration) -> Lineages {
        Lineages {
            config: ConfigStore::new(transport.clone()),
            transport,
            interval,
            last_done: tokio::sync::Mutex::new(None),
            cluster_id: tokio::sync::OnceCell::new(),
        }
    }

    /// The cluster's id: `config.version` `{_id: 1, clusterId}` on the config shard, as
    /// MongoDB keeps it, made by the first router that needs it (another router's racing
    /// insert loses and reads the winner's). Stamped on the high-water-mark tokens this
    /// cluster gives out.
    pub async fn cluster_id(&self) -> Result<bson::Uuid> {
        self.cluster_id
            .get_or_try_init(|| async {
                let ours = doc! {"_id": 1, "clusterId": bson::Uuid::new()};
                let stored = self.config.get_or_insert(DB, "version", ours).await?;
                match stored.get("clusterId") {
                    Some(Bson::Binary(b)) => b
                        .bytes
                        .as_slice()
                        .try_into()
                        .map(bson::Uuid::from_bytes)
                        .map_err(|_| wire::MongoError::internal("the cluster's id is not a UUID")),
                    _ => Err(wire::MongoError::internal("the cluster's id is not a UUID")),
                }
            })
            .await
            .copied()
    }

    /// The cluster's id if this router has learnt it ([`Lineages::cluster_id`]).
    pub fn known_cluster_id(&self) -> Option<bson::Uuid> {
        self.cluster_id.get().copied()
    }

    /// `cmd` with a cluster-stamped resume token (`resumeAfter` / `startAfter`) in MongoDB's form
    /// again; `None` when it has none. A token stamped by another cluster is 280, non-resumable.
    pub async fn unstamp_start(&self, cmd: &Document) -> Result<Option<Document>> {
        let Some(spec) = pipeline::changestream::spec::stage_of(cmd) else {
            return Ok(None);
        };
        for field in ["resumeAfter", "startAfter"] {
            let Some(stamped) = spec
                .get_document(field)
                .ok()
                .and_then(|t| resume::token::ResumeToken::from_document(t).ok())
                .and_then(|t| t.unstamp())
            else {
                continue;
            };
            let (plain, stamp) = stamped;
            let ours = self.cluster_id().await?;
            if stamp != ours {
                return Err(wire::MongoError::new(
                    wire::ErrorCode::CHANGE_STREAM_FATAL_ERROR,
                    format!(
                        "cannot resume stream: the resume token comes from another cluster \
                         (cluster id {stamp}; this cluster is {ours})"
                    ),
                )
                .with_label("NonResumableChangeStreamError"));
            }
            let mut cmd = cmd.clone();
            if let Ok(pipeline) = cmd.get_array_mut("pipeline")
                && let Some(Bson::Document(first)) = pipeline.first_mut()
                && let Ok(spec) = first.get_document_mut("$changeStream")
            {
                spec.insert(field, plain.to_document());
            }
            return Ok(Some(cmd));
        }
        Ok(None)
    }

    /// Brings the registry (and lost marks) up to date now: a pass that starts after this
    /// call.
    pub async fn verify_now(&self) -> Result<()> {
        let asked = tokio::time::Instant::now();
        let mut last = self.last_done.lock().await;
        if last.is_some_and(|t| t > asked) {
            return Ok(());
        }
        verify(&self.transport).await?;
        *last = Some(tokio::time::Instant::now());
        Ok(())
    }
}

/// Starts keeping the registry up to date every interval (none when it is zero: then only
/// before resumes), and learning the cluster's id.
pub fn keep_up(services: &Services, lineages: &Arc<Lineages>) {
    if !lineages.interval.is_zero() {
        services.start(KeepUp(lineages.clone()));
    }
}

/// The registry's pass, as a service.
struct KeepUp(Arc<Lineages>);

impl Service for KeepUp {
    const NAME: &'static str = "lineages";

    fn period(&self) -> Duration {
        self.0.interval
    }

    async fn pass(&mut self) {
        if let Err(e) = self.0.verify_now().await {
            tracing::debug!(error = %e, "shard lineage registry not updated");
        }
        if self.0.known_cluster_id().is_none() {
            let _ = self.0.cluster_id().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shard::lineage::Boot;

    fn t(s: u32) -> ClusterTime {
        ClusterTime::new(s, 0)
    }

    fn lineage(boots: &[(u32, u32)]) -> Lineage {
        Lineage {
            history_id: bson::Uuid::from_bytes([7; 16]),
            began: t(100),
            boots: boots
                .iter()
                .map(|&(from, to)| Boot {
                    from: t(from),
                    to: t(to),
                    lost: false,
                })
                .collect(),
        }
    }

    #[test]
    fn an_ordinary_restart_is_not_a_loss() {
        let first = judge(None, &lineage(&[]), t(110));
        assert!(first.lost.is_empty());
        let running = judge(Some(&first.entry), &lineage(&[]), t(150));
        assert_eq!(running.entry.reached, t(150));
        // Restarted: the boot starts at the reservation, at or above all it handed out.
        let restarted = judge(Some(&running.entry), &lineage(&[(150, 300)]), t(303));
        assert!(restarted.lost.is_empty());
        assert_eq!(restarted.entry.last_boot, t(300));
    }

    #[test]
    fn a_restored_copy_loses_the_stretch_after_it() {
        let seen = judge(None, &lineage(&[(150, 300)]), t(400)).entry;
        // The copy was taken before the boot at 300 and reserved up to 120 only.
        let restored = judge(Some(&seen), &lineage(&[(120, 500)]), t(503));
        assert_eq!(restored.lost, vec![(t(500), t(400))]);
        assert_eq!(restored.entry.reached, t(503));
        // Judged once: the registry has moved past it.
        let again = judge(Some(&restored.entry), &lineage(&[(120, 500)]), t(510));
        assert!(again.lost.is_empty());
        // Restored from a copy taken in the same boot the registry knows.
        let seen = judge(None, &lineage(&[(150, 300)]), t(400)).entry;
        let same_boot_copy = judge(Some(&seen), &lineage(&[(150, 300), (350, 600)]), t(603));
        assert_eq!(same_boot_copy.lost, vec![(t(600), t(400))]);
    }

    #[test]
    fn a_new_history_is_not_judged_against_the_old() {
        let seen = judge(None, &lineage(&[(150, 300)]), t(400)).entry;
        let mut empty = lineage(&[]);
        empty.history_id = bson::Uuid::from_bytes([9; 16]);
        empty.began = t(700);
        let j = judge(Some(&seen), &empty, t(703));
        assert!(j.lost.is_empty());
        assert_eq!(j.entry.history_id, empty.history_id);
    }
}
