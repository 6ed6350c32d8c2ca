//! Retryable writes: per-session records of which statements of the session's latest
//! `txnNumber` have executed, and with what result.
//!
//! Invariants:
//! * A record is written in the same commit as the writes it describes, so a statement is
//!   recorded as executed exactly when its effects are durable.
//! * A retried statement (same `lsid`, `txnNumber`, `stmtId`) returns the recorded result and is
//!   never applied twice.
//! * A `txnNumber` below the session's latest is rejected with `TransactionTooOld` (225); a
//!   higher one starts a fresh record.
//! * Oplog entries of a retryable write chain through `prevOpTime` within one `txnNumber`.
//! * A record expires with its session: [`purge`] deletes the records whose last write, or last
//!   `refreshSessions` ([`refresh`]), is more than [`SESSION_TIMEOUT`] old
//!   (`logicalSessionTimeoutMinutes`), as MongoDB reaps `config.transactions` when a session
//!   expires. A statement retried after that is new.

use std::collections::BTreeMap;
use std::time::Duration;

use bson::{Bson, Document, doc};
use resume::ClusterTime;
use wire::{ErrorCode, MongoError};

use crate::oplog::SessionFields;
use crate::state::ShardState;
use crate::storage::{ReadTxn, StorageError, StorageResult, Table, WriteTxn};
use crate::writer::{WriteCtx, WriteOutput, Writer};

/// How long a session lives after its last write (`logicalSessionTimeoutMinutes`: 30).
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// How often the shard looks for expired records (`logicalSessionRefreshMillis`: 5 minutes).
pub const PURGE_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// The most records one purge pass deletes (one writer job).
pub const PURGE_BATCH: usize = 1_000;

pub const TRANSACTION_TOO_OLD: ErrorCode = ErrorCode {
    code: 225,
    name: "TransactionTooOld",
};

pub use crate::session::RetryInfo;

/// The durable state of one session.
#[derive(Debug, Clone, Default)]
pub struct Record {
    pub txn_number: i64,
    pub stmts: BTreeMap<i32, Document>,
    pub last_op: Option<ClusterTime>,
    /// `txn_number` is a multi-document transaction that committed.
    pub committed_txn: bool,
    /// The wall-clock time of the record's last write (`lastWriteDate`), in milliseconds.
    pub last_write_ms: u64,
    /// When a `refreshSessions` last named the session (`lastUse`), in milliseconds (0: never).
    pub last_use_ms: u64,
}

impl Record {
    /// The session's record (the default when it has none).
    pub fn load(txn: &dyn ReadTxn, key: &[u8]) -> StorageResult<Record> {
        Ok(match txn.get(Table::Retryable, key)? {
            Some(bytes) => bson::Document::from_reader(bytes.as_slice())
                .map(|d| Record::from_document(&d))
                .unwrap_or_default(),
            None => Record::default(),
        })
    }

    fn to_document(&self) -> Document {
        let stmts: Vec<Bson> = self
            .stmts
            .iter()
            .map(|(id, r)| Bson::Document(doc! {"id": *id, "result": r.clone()}))
            .collect();
        let mut d = doc! {"txnNumber": self.txn_number, "stmts": stmts};
        if let Some(t) = self.last_op {
            d.insert("lastOp", t.timestamp());
        }
        if self.committed_txn {
            d.insert("txnState", "committed");
        }
        let wall = i64::try_from(self.last_write_ms).unwrap_or(i64::MAX);
        d.insert("lastWriteDate", bson::DateTime::from_millis(wall));
        if self.last_use_ms > 0 {
            let used = i64::try_from(self.last_use_ms).unwrap_or(i64::MAX);
            d.insert("lastUse", bson::DateTime::from_millis(used));
        }
        d
    }

    /// When the session was last written or refreshed: it expires [`SESSION_TIMEOUT`] after.
    fn last_active_ms(&self) -> u64 {
        self.last_write_ms.max(self.last_use_ms)
    }

    /// The record as stored, written at wall-clock `wall_ms`.
    fn to_bytes(&self, wall_ms: u64) -> StorageResult<Vec<u8>> {
        Record {
            last_write_ms: wall_ms,
            ..self.clone()
        }
        .encode()
    }

    /// The record as stored, as it is.
    fn encode(&self) -> StorageResult<Vec<u8>> {
        let mut buf = Vec::new();
        self.to_document()
            .to_writer(&mut buf)
            .map_err(|e| StorageError::Engine(format!("a session record: {e}")))?;
        Ok(buf)
    }

    fn from_document(d: &Document) -> Record {
        let mut stmts = BTreeMap::new();
        if let Ok(a) = d.get_array("stmts") {
            for s in a {
                if let Some(s) = s.as_document()
                    && let (Ok(id), Ok(r)) = (s.get_i32("id"), s.get_document("result"))
                {
                    stmts.insert(id, r.clone());
                }
            }
        }
        Record {
            txn_number: d.get_i64("txnNumber").unwrap_or(0),
            stmts,
            last_op: match d.get("lastOp") {
                Some(Bson::Timestamp(t)) => Some(ClusterTime::from(*t)),
                _ => None,
            },
            committed_txn: d.get_str("txnState").is_ok_and(|s| s == "committed"),
            // A record from before the field existed counts as written long ago.
            last_write_ms: d
                .get_datetime("lastWriteDate")
                .map_or(0, |t| u64::try_from(t.timestamp_millis()).unwrap_or(0)),
            last_use_ms: d
                .get_datetime("lastUse")
                .map_or(0, |t| u64::try_from(t.timestamp_millis()).unwrap_or(0)),
        }
    }
}

/// A retryable write in progress inside one writer batch.
#[derive(Debug)]
pub struct RetryState {
    pub info: RetryInfo,
    pub record: Record,
    dirty: bool,
}

impl RetryState {
    /// Loads the session's record and checks the `txnNumber`.
    pub fn begin(
        txn: &dyn ReadTxn,
        info: RetryInfo,
    ) -> StorageResult<Result<RetryState, MongoError>> {
        let record = Record::load(txn, &info.key)?;
        if record.txn_number > info.txn_number {
            return Ok(Err(MongoError::new(
                TRANSACTION_TOO_OLD,
                format!(
                    "Retryable write with txnNumber {} is prohibited on session {} because a newer \
                     retryable write with txnNumber {} has already started on this session.",
                    info.txn_number,
                    session_display(&info.lsid),
                    record.txn_number
                ),
            )));
        }
        let record = if record.txn_number < info.txn_number || record.stmts.is_empty() {
            Record {
                txn_number: info.txn_number,
                ..Record::default()
            }
        } else {
            record
        };
        Ok(Ok(RetryState {
            info,
            record,
            dirty: false,
        }))
    }

    /// The recorded result of statement `stmt`, if it already executed.
    pub fn executed(&self, stmt: i32) -> Option<&Document> {
        self.record.stmts.get(&stmt)
    }

    /// The session fields for the next oplog entry of statement `stmt`.
    pub fn session_fields(&self, stmt: i32) -> SessionFields {
        SessionFields {
            lsid: self.info.lsid.clone(),
            txn_number: self.info.txn_number,
            stmt_id: Some(stmt),
            prev_op_time: self.record.last_op,
        }
    }

    /// Notes that an oplog entry of this write was written at `ts`.
    pub fn wrote_entry(&mut self, ts: ClusterTime) {
        self.record.last_op = Some(ts);
        self.dirty = true;
    }

    /// Records the result of an executed statement.
    pub fn record(&mut self, stmt: i32, result: Document) {
        self.record.stmts.insert(stmt, result);
        self.dirty = true;
    }

    /// Persists the record (in the batch's write transaction, at wall-clock `wall_ms`).
    pub fn save(&self, txn: &mut dyn WriteTxn, wall_ms: u64) -> StorageResult<()> {
        if !self.dirty {
            return Ok(());
        }
        txn.put(
            Table::Retryable,
            &self.info.key,
            &self.record.to_bytes(wall_ms)?,
        )
    }
}

/// Records in the session's record that its transaction `txn_number` committed at `ts` (in
/// the commit's own storage transaction).
pub fn save_committed_transaction(
    txn: &mut dyn WriteTxn,
    key: &[u8],
    txn_number: i64,
    ts: ClusterTime,
    wall_ms: u64,
) -> StorageResult<()> {
    let record = Record {
        txn_number,
        stmts: BTreeMap::new(),
        last_op: Some(ts),
        committed_txn: true,
        last_write_ms: wall_ms,
        last_use_ms: 0,
    };
    txn.put(Table::Retryable, key, &record.to_bytes(wall_ms)?)
}

/// Whether a record last written at `last_write_ms` has expired at `now_ms`.
fn expired(last_write_ms: u64, now_ms: u64) -> bool {
    let timeout = u64::try_from(SESSION_TIMEOUT.as_millis()).unwrap_or(u64::MAX);
    now_ms.saturating_sub(last_write_ms) > timeout
}

/// One purge pass: deletes up to [`PURGE_BATCH`] expired session records in one writer job
/// (each checked again inside it, so a session written in between keeps its record).
/// Returns how many it deleted.
pub async fn purge(state: &ShardState, writer: &Writer) -> Result<usize, MongoError> {
    let now_ms = state.now_millis();
    crate::expiry::purge_pass(
        state,
        writer,
        Table::Retryable,
        PURGE_BATCH,
        move |_, v| {
            let last = Document::from_reader(v)
                .map(|d| Record::from_document(&d).last_active_ms())
                .unwrap_or(0);
            expired(last, now_ms)
        },
        |w, k| {
            Ok(expired(
                Record::load(w.txn(), k)?.last_active_ms(),
                w.wall_ms,
            ))
        },
    )
    .await
}

/// How many sessions one writer job of a `refreshSessions` touches.
const REFRESH_BATCH: usize = 1_000;

/// The session keys a `refreshSessions` names (`lsid.id`, then `lsid.uid` when given, as
/// [`RetryInfo`] keys a session).
pub fn refreshed_sessions(cmd: &Document) -> Result<Vec<Vec<u8>>, MongoError> {
    let Ok(lsids) = cmd.get_array("refreshSessions") else {
        return Err(MongoError::type_mismatch(
            "BSON field 'refreshSessions.refreshSessions' is the wrong type, expected type 'array'",
        ));
    };
    let mut keys = Vec::with_capacity(lsids.len());
    for lsid in lsids {
        let Bson::Document(lsid) = lsid else {
            return Err(MongoError::type_mismatch(
                "BSON field 'refreshSessions.refreshSessions' elements must be objects",
            ));
        };
        let Some(Bson::Binary(id)) = lsid.get("id") else {
            return Err(MongoError::new(
                ErrorCode::NO_SUCH_KEY,
                "BSON field 'refreshSessions.refreshSessions.id' is missing but a required field",
            ));
        };
        let mut key = id.bytes.clone();
        if let Some(Bson::Binary(uid)) = lsid.get("uid") {
            key.extend_from_slice(&uid.bytes);
        }
        keys.push(key);
    }
    Ok(keys)
}

/// `refreshSessions`: the sessions `keys` were used now; the records of those that have one
/// expire [`SESSION_TIMEOUT`] from now (their `lastWriteDate` stays). Writer jobs of at most
/// [`REFRESH_BATCH`] sessions; returns how many records they touched.
pub async fn refresh(writer: &Writer, keys: Vec<Vec<u8>>) -> Result<usize, MongoError> {
    let mut touched = 0;
    for batch in keys.chunks(REFRESH_BATCH) {
        let batch = batch.to_vec();
        let job = move |w: &mut WriteCtx<'_>| -> StorageResult<WriteOutput> {
            let mut n = 0_i64;
            for key in &batch {
                if w.txn().get(Table::Retryable, key)?.is_none() {
                    continue;
                }
                let mut record = Record::load(w.txn(), key)?;
                record.last_use_ms = w.wall_ms;
                w.txn_mut().put(Table::Retryable, key, &record.encode()?)?;
                n += 1;
            }
            Ok(WriteOutput {
                reply: doc! {"n": n, "ok": 1.0},
                op_time: None,
            })
        };
        let out = writer.submit(Box::new(job)).await?;
        touched += usize::try_from(out.reply.get_i64("n").unwrap_or(0)).unwrap_or(0);
    }
    Ok(touched)
}

fn session_display(lsid: &Document) -> String {
    match lsid.get("id") {
        Some(Bson::Binary(b)) => match b.to_uuid() {
            Ok(u) => u.to_string(),
            Err(_) => format!("{:?}", b.bytes),
        },
        _ => "?".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statement_ids_default_to_positions() {
        let cmd = doc! {"lsid": {"id": bson::Uuid::new()}, "txnNumber": 3_i64};
        let info = RetryInfo::from_command(&cmd).unwrap().unwrap();
        assert_eq!(info.stmt_id(2), 2);
        let cmd = doc! {"lsid": {"id": bson::Uuid::new()}, "txnNumber": 3_i64, "stmtIds": [7, 9]};
        let info = RetryInfo::from_command(&cmd).unwrap().unwrap();
        assert_eq!(info.stmt_id(1), 9);
    }

    #[test]
    fn record_round_trips() {
        let mut r = Record {
            txn_number: 4,
            ..Default::default()
        };
        r.stmts.insert(1, doc! {"n": 1});
        r.last_op = Some(ClusterTime::new(3, 4));
        let back = Record::from_document(&r.to_document());
        assert!(!back.committed_txn);
        r.committed_txn = true;
        assert!(Record::from_document(&r.to_document()).committed_txn);
        assert_eq!(back.txn_number, 4);
        assert_eq!(back.stmts.get(&1), Some(&doc! {"n": 1}));
        assert_eq!(back.last_op, Some(ClusterTime::new(3, 4)));
    }
}
