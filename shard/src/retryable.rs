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

use std::collections::BTreeMap;

use bson::{Bson, Document, doc};
use resume::ClusterTime;
use wire::{ErrorCode, MongoError};

use crate::oplog::SessionFields;
use crate::storage::{ReadTxn, StorageResult, Table, WriteTxn};

pub const TRANSACTION_TOO_OLD: ErrorCode = ErrorCode {
    code: 225,
    name: "TransactionTooOld",
};

/// The session fields of a write command.
#[derive(Debug, Clone)]
pub struct RetryInfo {
    pub lsid: Document,
    /// Storage key: the bytes of `lsid.id` (and `lsid.uid` when present).
    pub key: Vec<u8>,
    pub txn_number: i64,
    pub stmt_ids: Option<Vec<i32>>,
}

impl RetryInfo {
    /// `Some` when the command carries `lsid` and `txnNumber` outside a multi-document
    /// transaction (a retryable write).
    pub fn from_command(cmd: &Document) -> Result<Option<RetryInfo>, MongoError> {
        if cmd.contains_key("autocommit") {
            return Ok(None);
        }
        RetryInfo::session_of(cmd)
    }

    /// The session fields (`lsid`, `txnNumber`, `stmtIds`) of any command that has them.
    pub fn session_of(cmd: &Document) -> Result<Option<RetryInfo>, MongoError> {
        let (Some(lsid), Some(txn)) = (cmd.get("lsid"), cmd.get("txnNumber")) else {
            return Ok(None);
        };
        let Bson::Document(lsid) = lsid else {
            return Err(MongoError::type_mismatch(
                "BSON field 'lsid' is the wrong type, expected type 'object'",
            ));
        };
        let txn_number = match txn {
            Bson::Int64(n) => *n,
            Bson::Int32(n) => i64::from(*n),
            _ => {
                return Err(MongoError::type_mismatch(
                    "BSON field 'txnNumber' is the wrong type, expected type 'long'",
                ));
            }
        };
        let mut key = Vec::new();
        match lsid.get("id") {
            Some(Bson::Binary(b)) => key.extend_from_slice(&b.bytes),
            _ => {
                return Err(MongoError::new(
                    ErrorCode::NO_SUCH_KEY,
                    "BSON field 'OperationSessionInfo.lsid.id' is missing but a required field",
                ));
            }
        }
        if let Some(Bson::Binary(b)) = lsid.get("uid") {
            key.extend_from_slice(&b.bytes);
        }
        let stmt_ids = match cmd.get("stmtIds") {
            Some(Bson::Array(a)) => Some(
                a.iter()
                    .map(|v| match v {
                        Bson::Int32(i) => Ok(*i),
                        Bson::Int64(i) => i32::try_from(*i)
                            .map_err(|_| MongoError::bad_value("stmtId out of range")),
                        _ => Err(MongoError::type_mismatch("stmtIds must be integers")),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            _ => None,
        };
        Ok(Some(RetryInfo {
            lsid: lsid.clone(),
            key,
            txn_number,
            stmt_ids,
        }))
    }

    /// The statement id of the `i`-th statement.
    pub fn stmt_id(&self, i: usize) -> i32 {
        match &self.stmt_ids {
            Some(ids) => ids
                .get(i)
                .copied()
                .unwrap_or(i32::try_from(i).unwrap_or(i32::MAX)),
            None => i32::try_from(i).unwrap_or(i32::MAX),
        }
    }
}

/// The durable state of one session.
#[derive(Debug, Clone, Default)]
pub struct Record {
    pub txn_number: i64,
    pub stmts: BTreeMap<i32, Document>,
    pub last_op: Option<ClusterTime>,
    /// `txn_number` is a multi-document transaction that committed.
    pub committed_txn: bool,
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
        d
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

    /// Persists the record (in the batch's write transaction).
    pub fn save(&self, txn: &mut dyn WriteTxn) -> StorageResult<()> {
        if !self.dirty {
            return Ok(());
        }
        let mut buf = Vec::new();
        if self.record.to_document().to_writer(&mut buf).is_ok() {
            txn.put(Table::Retryable, &self.info.key, &buf)?;
        }
        Ok(())
    }
}

/// Records in the session's record that its transaction `txn_number` committed at `ts` (in
/// the commit's own storage transaction).
pub fn save_committed_transaction(
    txn: &mut dyn WriteTxn,
    key: &[u8],
    txn_number: i64,
    ts: ClusterTime,
) -> StorageResult<()> {
    let record = Record {
        txn_number,
        stmts: BTreeMap::new(),
        last_op: Some(ts),
        committed_txn: true,
    };
    let mut buf = Vec::new();
    record
        .to_document()
        .to_writer(&mut buf)
        .map_err(|e| crate::storage::StorageError::Engine(format!("a session record: {e}")))?;
    txn.put(Table::Retryable, key, &buf)
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
