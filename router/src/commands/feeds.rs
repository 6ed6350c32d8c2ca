//! The commands behind the HTTP feeds, which drivers can run too: `changeStreamBounds` (where a
//! stream can start: before the oldest change kept, after the newest), `snapshotCursor` (a
//! cluster time to read a snapshot at, and the cursor that follows that snapshot exactly) and
//! `createHttpToken` (a bearer token for the HTTP feeds, standing for the caller).

use bson::{Bson, Document, doc};
use resume::token::ResumeTokenData;
use wire::{MongoError, Result};

use super::Ctx;

/// A collection name, or 1 for the database: what these commands name first.
fn check_target(ctx: &Ctx<'_>) -> Result<()> {
    match ctx.cmd.get(ctx.name) {
        Some(Bson::String(coll)) if !coll.is_empty() => Ok(()),
        Some(v) if v.as_f64() == Some(1.0) || v.as_i64() == Some(1) || v.as_i32() == Some(1) => {
            Ok(())
        }
        _ => Err(MongoError::failed_to_parse(format!(
            "{} takes a collection name, or 1 for the database",
            ctx.name
        ))),
    }
}

/// `changeStreamBounds`: `{earliest, current}` tokens for `resumeAfter` / `startAfter`, with
/// their cluster times. `earliest` is the earliest marker (a stream started after it begins
/// at the oldest change kept when it is opened, however far retention moved meanwhile);
/// `earliestTime` is where that is now. `current` is after every change committed so far:
/// the first post-batch resume token of the stream opened now.
pub(super) async fn change_stream_bounds(ctx: &Ctx<'_>) -> Result<Document> {
    check_target(ctx)?;
    let cluster = ctx
        .args()
        .opt_bool("allChangesForCluster")?
        .unwrap_or(false);
    if cluster && ctx.db != "admin" {
        return Err(MongoError::bad_value(
            "allChangesForCluster is only valid on the admin database",
        ));
    }
    let streams = &ctx.seams.streams;
    let opened = streams
        .open(ctx.db, &crate::auth::roles::watch_of_bounds(ctx.cmd))
        .await?;
    if let Some(mut cursor) = opened.cursor {
        cursor.kill().await;
    }
    let current = opened
        .batch
        .post_batch_resume_token
        .ok_or_else(|| MongoError::internal("a stream opened without a resume token"))?;
    let current_data = ResumeTokenData::from_document(&current.to_document())
        .map_err(|e| MongoError::internal(format!("the stream's own token: {e}")))?;
    let current = match streams.stamp() {
        Some(cluster) => current_data.encode_stamped(cluster),
        None => current,
    };
    let earliest_time = streams.earliest_kept().await?;
    Ok(doc! {
        "earliest": crate::streams::earliest_marker().to_document(),
        "current": current.to_document(),
        "earliestTime": Bson::Timestamp(earliest_time),
        "currentTime": Bson::Timestamp(current_data.cluster_time().timestamp()),
        "ok": 1.0,
    })
}

/// `snapshotCursor: "<coll>"` (or 1 for the database): a cluster time `atClusterTime` to read
/// the snapshot at (`readConcern: {level: "snapshot", atClusterTime}`), and `cursor`, the
/// resume token that follows that snapshot exactly: a snapshot at `T` holds every write
/// committed at or before `T`, and a stream started after the high-water mark of the tick
/// after `T` has every change committed after `T`, so applying the one and then the other
/// misses nothing and applies nothing twice.
pub(super) async fn snapshot_cursor(ctx: &Ctx<'_>) -> Result<Document> {
    check_target(ctx)?;
    let at = ctx.seams.transport.clock().now();
    let follow = ResumeTokenData::high_water_mark(at.next(), Default::default());
    let cursor = match ctx.seams.streams.stamp() {
        Some(cluster) => follow.encode_stamped(cluster),
        None => follow.encode(),
    };
    Ok(doc! {
        "atClusterTime": Bson::Timestamp(at.timestamp()),
        "cursor": cursor.to_document(),
        "ok": 1.0,
    })
}

/// How long a token lives unless the command asks otherwise, and the longest it may.
const DEFAULT_TOKEN_SECS: i64 = 3600;
const MAX_TOKEN_SECS: i64 = 30 * 24 * 3600;

/// `createHttpToken {expiresAfterSecs}`: a bearer token for the HTTP feeds that stands for
/// the connection's first authenticated user (with that user's rights, read at each use),
/// signed with the cluster's key so that every router takes it, until it expires.
pub(super) async fn create_http_token(ctx: &Ctx<'_>) -> Result<Document> {
    let secs = ctx
        .args()
        .opt_i64("expiresAfterSecs")?
        .unwrap_or(DEFAULT_TOKEN_SECS);
    if !(1..=MAX_TOKEN_SECS).contains(&secs) {
        return Err(MongoError::bad_value(format!(
            "expiresAfterSecs must be between 1 and {MAX_TOKEN_SECS}"
        )));
    }
    let Some((user, db)) = ctx.seams.auth.users_of(ctx.conn.id).into_iter().next() else {
        return Err(MongoError::new(
            wire::ErrorCode::UNAUTHORIZED,
            "createHttpToken needs an authenticated user",
        ));
    };
    let key = ctx.seams.cluster_key().await?;
    let expires = crate::http::token::now_secs().saturating_add(secs as u64);
    let claims = crate::http::token::Claims { user, db, expires };
    Ok(doc! {
        "token": crate::http::token::sign(&key.key, &claims),
        "user": &claims.user,
        "db": &claims.db,
        "expiresAt": bson::DateTime::from_millis((expires as i64).saturating_mul(1000)),
        "ok": 1.0,
    })
}
