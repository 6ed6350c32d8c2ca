//! The session fields of a command (`lsid`, `txnNumber`, `stmtIds`), parsed: what a retryable
//! write, a transaction statement or an ordered batch's reservation carries of its session. A
//! leaf: it reads the command document and nothing of the shard.

use bson::{Bson, Document};
use wire::{ErrorCode, MongoError};

/// A command's session and transaction number: what the router's transactions and the
/// shard's retryable writes both key on.
#[derive(Debug, Clone)]
pub struct Session<'a> {
    pub lsid: &'a Document,
    /// The bytes of `lsid.id` (and `lsid.uid` when present).
    pub key: Vec<u8>,
    pub txn_number: i64,
}

impl Session<'_> {
    /// `lsid` and `txnNumber` of `cmd`; `None` without both.
    pub fn of(cmd: &Document) -> Result<Option<Session<'_>>, MongoError> {
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
        Ok(Some(Session {
            lsid,
            key,
            txn_number,
        }))
    }
}

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
        let Some(Session {
            lsid,
            key,
            txn_number,
        }) = Session::of(cmd)?
        else {
            return Ok(None);
        };
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
