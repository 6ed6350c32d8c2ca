//! The members' transport across processes: each Raft message is one OP_MSG command on
//! `admin`, sent with a pooled `wire::Client` (with the cluster's TLS and key-file login) and
//! answered by the receiving member's [`Replica::answer`].
//!
//! | command | carries |
//! |---|---|
//! | `_replAppendEntries` | the request as JSON in `m`, its entries in `entries`, each a binary in `codec`'s entry frame (write sets travel as they are) |
//! | `_replVote`, `_replPreVote` | the request as JSON in `m` |
//! | `_replSnapshot` | the vote and the snapshot's meta as JSON in `m`, a piece of its rows in `data` at `offset`, `done` on the last |
//! | `_replTransferLeader` | the request as JSON in `m` |
//! | `_replRejoin` | `member`: a member that lost its data asks the leader to take it back (see `Replica::rejoin`) |
//!
//! The reply is `{ok: 1, m: <response as JSON>}` (a snapshot's pieces but the last answer
//! `null`).
//!
//! Invariants:
//! * A snapshot travels in its pieces (`snapshot`: about 8 MB each, or one row), in order,
//!   each one message under the 48 MB message limit, read from the sender's storage one piece
//!   ahead of the one in flight; the receiver writes one snapshot's pieces to a file (a piece
//!   that does not continue them starts over or is refused; one that does not decode is
//!   refused) and installs it from there at the last. Neither holds the snapshot in memory.
//! * Every call has the deadline openraft gives it (`RPCOption::hard_ttl`); a call without a
//!   reply is `Unreachable`, so openraft retries it with its backoff.
//! * A message that does not decode is refused with 2 `BadValue`, never applied in part.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use bson::{Bson, Document, doc};
use openraft::alias::{SnapshotMetaOf, SnapshotOf, VoteOf};
use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use wire::{ErrorCode, MongoError};

use super::codec::{decode_entry, encode_entry};
use super::snapshot::{Received, Receiving, Snapshot};
use super::{MemberId, Raft, TypeConfig};
use crate::log::WriteSet;

/// A snapshot being received: where its pieces go, and the one in progress with its message
/// head (the vote and meta as sent).
pub(super) struct Incoming {
    dir: std::path::PathBuf,
    receiving: Option<(Vec<u8>, Receiving)>,
}

impl Incoming {
    /// Received snapshots are written to files in `dir`.
    pub(super) fn new(dir: &std::path::Path) -> Incoming {
        Incoming {
            dir: dir.to_path_buf(),
            receiving: None,
        }
    }
}

/// The commands a member answers for its peers.
pub const COMMANDS: [&str; 6] = [
    "_replAppendEntries",
    "_replVote",
    "_replPreVote",
    "_replSnapshot",
    "_replTransferLeader",
    "_replRejoin",
];

fn binary(bytes: Vec<u8>) -> Bson {
    Bson::Binary(bson::Binary {
        subtype: bson::spec::BinarySubtype::Generic,
        bytes,
    })
}

fn json<T: Serialize>(value: &T) -> Result<Bson, MongoError> {
    serde_json::to_vec(value)
        .map(binary)
        .map_err(|e| MongoError::internal(format!("encoding a Raft message: {e}")))
}

fn bad(e: impl std::fmt::Display) -> MongoError {
    MongoError::new(
        ErrorCode::BAD_VALUE,
        format!("a malformed Raft message: {e}"),
    )
}

fn bytes_of<'a>(d: &'a Document, field: &str) -> Result<&'a [u8], MongoError> {
    match d.get(field) {
        Some(Bson::Binary(b)) => Ok(&b.bytes),
        _ => Err(bad(format!("no binary field {field}"))),
    }
}

fn from_json<T: DeserializeOwned>(d: &Document, field: &str) -> Result<T, MongoError> {
    serde_json::from_slice(bytes_of(d, field)?).map_err(bad)
}

/// The vote and meta of a snapshot message.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(bound = "")]
struct SnapshotHead {
    vote: VoteOf<TypeConfig>,
    meta: SnapshotMetaOf<TypeConfig>,
}

/// Answers one peer message with `raft` (the server side; see the module header).
pub(super) async fn answer(
    raft: &Raft,
    incoming: &Mutex<Incoming>,
    name: &str,
    body: &Document,
) -> Result<Document, MongoError> {
    let failed = |e: &dyn std::fmt::Display| {
        MongoError::new(
            ErrorCode::INTERRUPTED_DUE_TO_REPL_STATE_CHANGE,
            format!("this member cannot answer {name}: {e}"),
        )
    };
    let reply = match name {
        "_replAppendEntries" => {
            let mut rpc: AppendEntriesRequest<TypeConfig> = from_json(body, "m")?;
            let entries = body.get_array("entries").map_err(bad)?;
            rpc.entries = entries
                .iter()
                .map(|e| match e {
                    Bson::Binary(b) => decode_entry(&b.bytes).map_err(bad),
                    _ => Err(bad("an entry that is not binary")),
                })
                .collect::<Result<_, _>>()?;
            json(&raft.append_entries(rpc).await.map_err(|e| failed(&e))?)?
        }
        "_replVote" => json(
            &raft
                .vote(from_json(body, "m")?)
                .await
                .map_err(|e| failed(&e))?,
        )?,
        "_replPreVote" => json(
            &raft
                .pre_vote(from_json(body, "m")?)
                .await
                .map_err(|e| failed(&e))?,
        )?,
        "_replSnapshot" => {
            let head: SnapshotHead = from_json(body, "m")?;
            let Some(data) = piece(incoming, body)? else {
                return Ok(doc! {"ok": 1.0, "m": json(&None::<SnapshotResponse<TypeConfig>>)?});
            };
            let snapshot = openraft::Snapshot {
                meta: head.meta,
                snapshot: Snapshot::Received(data),
            };
            let reply = raft
                .install_full_snapshot(head.vote, snapshot)
                .await
                .map_err(|e| failed(&e))?;
            json(&Some(reply))?
        }
        "_replTransferLeader" => {
            let reply = raft
                .handle_transfer_leader(from_json(body, "m")?)
                .await
                .map_err(|e| failed(&e))?;
            json(&reply)?
        }
        other => {
            return Err(MongoError::new(
                ErrorCode::COMMAND_NOT_FOUND,
                format!("no such command: '{other}'"),
            ));
        }
    };
    Ok(doc! {"ok": 1.0, "m": reply})
}

/// Takes one piece of a snapshot into `incoming`: the whole snapshot once this is the last
/// piece, `None` before. A piece at offset 0 starts a snapshot (dropping any other's pieces);
/// any other must continue the snapshot being received, or it is refused and that snapshot
/// dropped (the sender starts over). A piece that does not decode as a write set is refused.
fn piece(incoming: &Mutex<Incoming>, body: &Document) -> Result<Option<Received>, MongoError> {
    let head = bytes_of(body, "m")?;
    let data = WriteSet::decode(bytes_of(body, "data")?).map_err(bad)?;
    let offset = match body.get("offset") {
        None => 0,
        Some(Bson::Int64(o)) => u64::try_from(*o).map_err(bad)?,
        Some(_) => return Err(bad("a snapshot piece's offset is a long")),
    };
    let done = body.get_bool("done").unwrap_or(true);
    let stored = |e: std::io::Error| {
        MongoError::internal(format!("keeping a snapshot's piece on disk: {e}"))
    };
    let mut slot = incoming.lock().unwrap_or_else(|e| e.into_inner());
    if offset == 0 {
        slot.receiving = None;
        slot.receiving = Some((head.to_vec(), Receiving::start(&slot.dir).map_err(stored)?));
    }
    let continues = slot
        .receiving
        .as_ref()
        .is_some_and(|(h, so_far)| h == head && so_far.received == offset);
    if !continues {
        slot.receiving = None;
        return Err(bad(format!(
            "a snapshot piece at offset {offset} that does not continue the snapshot received"
        )));
    }
    if let Some((_, so_far)) = slot.receiving.as_mut()
        && let Err(e) = so_far.take(&data)
    {
        slot.receiving = None;
        return Err(stored(e));
    }
    if !done {
        return Ok(None);
    }
    match slot.receiving.take() {
        Some((_, receiving)) => receiving.finish().map(Some).map_err(stored),
        None => Ok(None),
    }
}

/// The other members' addresses and one pooled client to each.
pub struct WireNet {
    clients: Mutex<HashMap<String, Arc<wire::Client>>>,
    tls: Option<wire::tls::ClientTls>,
    key: Option<Arc<wire::keyfile::KeyFile>>,
}

impl WireNet {
    pub fn new(
        tls: Option<wire::tls::ClientTls>,
        key: Option<Arc<wire::keyfile::KeyFile>>,
    ) -> Arc<WireNet> {
        Arc::new(WireNet {
            clients: Mutex::default(),
            tls,
            key,
        })
    }

    pub(super) fn client(&self, addr: &str) -> Arc<wire::Client> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        clients
            .entry(addr.to_string())
            .or_insert_with(|| {
                Arc::new(
                    wire::Client::with_tls(addr.to_string(), self.tls.clone())
                        .with_key(self.key.clone()),
                )
            })
            .clone()
    }
}

/// The link to one member over the wire.
pub(super) struct WirePeer {
    pub(super) to: MemberId,
    pub(super) client: Arc<wire::Client>,
}

impl WirePeer {
    /// Sends `cmd` and decodes the reply's `m`, within `option`'s deadline.
    async fn call<T: DeserializeOwned>(
        &self,
        cmd: Document,
        option: &RPCOption,
    ) -> Result<T, Unreachable<TypeConfig>> {
        let to = self.to;
        let unreachable =
            move |e: &dyn std::fmt::Display| Unreachable::from_string(format!("member {to}: {e}"));
        let sent = tokio::time::timeout(option.hard_ttl(), self.client.command("admin", &cmd));
        let reply = match sent.await {
            Err(_) => return Err(unreachable(&"no reply within the deadline")),
            Ok(Err(e)) => return Err(unreachable(&e)),
            Ok(Ok(reply)) => reply,
        };
        if let Some(e) = MongoError::from_reply(&reply) {
            return Err(unreachable(&e.errmsg));
        }
        from_json(&reply, "m").map_err(|e| unreachable(&e.errmsg))
    }
}

fn command(name: &str, m: Bson) -> Document {
    let mut cmd = Document::new();
    cmd.insert(name, 1);
    cmd.insert("m", m);
    cmd
}

fn encoding(e: MongoError) -> Unreachable<TypeConfig> {
    Unreachable::from_string(e.errmsg)
}

impl RaftNetworkV2<TypeConfig> for WirePeer {
    type SnapshotData = Snapshot;

    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let entries = std::mem::take(&mut rpc.entries)
            .iter()
            .map(|e| encode_entry(e).map(binary))
            .collect::<Result<Vec<Bson>, _>>()
            .map_err(|e| Unreachable::from_string(e.to_string()))?;
        let mut cmd = command("_replAppendEntries", json(&rpc).map_err(encoding)?);
        cmd.insert("entries", entries);
        Ok(self.call(cmd, &option).await?)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let cmd = command("_replVote", json(&rpc).map_err(encoding)?);
        Ok(self.call(cmd, &option).await?)
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let cmd = command("_replPreVote", json(&rpc).map_err(encoding)?);
        Ok(self.call(cmd, &option).await?)
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<TypeConfig>,
        snapshot: SnapshotOf<TypeConfig, Snapshot>,
        _cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let head = SnapshotHead {
            vote,
            meta: snapshot.meta,
        };
        let head = json(&head).map_err(encoding)?;
        let unreadable = |e: std::io::Error| {
            Unreachable::from_string(format!("reading the snapshot to send: {e}"))
        };
        // One piece read ahead of the one sent, so the last is known as it goes.
        let (rows, first) = snapshot
            .snapshot
            .next_piece_off_runtime()
            .await
            .map_err(unreadable)?;
        let mut rows = rows;
        let mut piece = first.unwrap_or_default();
        let mut offset: u64 = 0;
        loop {
            let (rest, next) = rows.next_piece_off_runtime().await.map_err(unreadable)?;
            rows = rest;
            let done = next.is_none();
            let len = piece.encoded().len() as u64;
            let mut cmd = command("_replSnapshot", head.clone());
            cmd.insert("offset", i64::try_from(offset).unwrap_or(i64::MAX));
            cmd.insert("data", binary(piece.encoded().to_vec()));
            cmd.insert("done", done);
            let reply: Option<SnapshotResponse<TypeConfig>> = self.call(cmd, &option).await?;
            match (reply, next) {
                (Some(reply), _) => return Ok(reply),
                (None, Some(next)) => {
                    offset += len;
                    piece = next;
                }
                (None, None) => {
                    return Err(Unreachable::from_string(
                        "the snapshot's last piece was not answered",
                    )
                    .into());
                }
            }
        }
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        let cmd = command("_replTransferLeader", json(&req).map_err(encoding)?);
        Ok(self.call(cmd, &option).await?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn message(head: &[u8], offset: i64, data: &[u8], done: bool) -> Document {
        doc! {"_replSnapshot": 1, "m": binary(head.to_vec()), "offset": offset,
        "data": binary(data.to_vec()), "done": done}
    }

    /// A piece: one row `key` of table 1 set to `value`.
    fn row(key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut set = WriteSet::with_prefix(0, 64);
        set.push(crate::log::Op {
            table: 1,
            key,
            value: Some(value),
        })
        .unwrap();
        set.encoded().to_vec()
    }

    /// Every piece of a received snapshot, concatenated.
    fn contents(received: Received) -> Vec<u8> {
        let mut snapshot = Snapshot::Received(received);
        let mut all = Vec::new();
        while let Some(piece) = snapshot.next_piece().unwrap() {
            all.extend_from_slice(piece.encoded());
        }
        all
    }

    #[test]
    fn a_snapshot_is_assembled_from_its_pieces_in_order_and_only_so() {
        /// What taking a piece gives: nothing yet, the whole snapshot (its pieces' keys), or a
        /// refusal.
        enum Then {
            More,
            Whole(&'static [&'static [u8]]),
            Refused,
        }
        use Then::*;
        let (a, b, c) = (row(b"a", b"1"), row(b"b", b"2"), row(b"c", b"3"));
        let n = a.len() as i64;
        /// A piece (its head, offset, row, whether it is the last) and what it gives.
        type Step<'a> = (&'static [u8], i64, &'a [u8], bool, Then);
        let steps: [Step; 11] = [
            (b"h", 0, &a, false, More),
            (b"h", n, &b, false, More),
            (b"h", 2 * n, &c, true, Whole(&[b"a", b"b", b"c"])),
            // A gap, a repeat or another snapshot's piece is refused, and what was taken is
            // dropped.
            (b"h", 0, &a, false, More),
            (b"h", 2 * n, &c, false, Refused),
            (b"h", n, &b, true, Refused),
            (b"h", 0, &a, false, More),
            (b"g", n, &b, true, Refused),
            // A new snapshot starts over.
            (b"h", 0, &a, false, More),
            (b"k", 0, &c, false, More),
            (b"k", n, &b, true, Whole(&[b"c", b"b"])),
        ];
        let dir = tempfile::tempdir().unwrap();
        let incoming = Mutex::new(Incoming::new(dir.path()));
        for (i, (head, offset, data, done, then)) in steps.into_iter().enumerate() {
            let got = piece(&incoming, &message(head, offset, data, done));
            match then {
                More => assert!(got.unwrap().is_none(), "step {i}"),
                Whole(keys) => {
                    let all = contents(got.unwrap().expect("the whole snapshot"));
                    let set = WriteSet::decode(&all).unwrap();
                    let got: Vec<&[u8]> = set.ops().map(|op| op.key).collect();
                    assert_eq!(got, keys, "step {i}");
                }
                Refused => assert!(got.is_err(), "step {i}"),
            }
        }
        // A message without pieces is a whole snapshot.
        let whole =
            doc! {"_replSnapshot": 1, "m": binary(b"d".to_vec()), "data": binary(a.clone())};
        assert_eq!(contents(piece(&incoming, &whole).unwrap().unwrap()), a);
        // A piece that is not a write set is refused.
        let garbage = message(b"h", 0, &[9, 9, 9], true);
        assert!(piece(&incoming, &garbage).is_err());
        // No file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
