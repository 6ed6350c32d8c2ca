//! Resuming a stream: the shard's `CheckResumability`, the router's `EnsureResumeTokenPresent`
//! and the token-version stickiness rule (reference §4.2, §5.6–§5.8).
//!
//! Owns: where a resumed stream restarts and how it proves that it restarted exactly there.
//!
//! Invariants:
//! * [`CheckResumability`] drops every event that sorts before the client token
//!   (`compareAgainstClientResumeToken` says `CheckNextDoc`) and passes everything else; it never
//!   fails on a surpassed token, since on a sharded cluster the token may live on another shard;
//! * [`EnsureResumeTokenPresent`] (after the merge) swallows events up to and including the
//!   client token (once per shard after `startAfter`, hence "and equal ones after it"), then
//!   passes everything; reaching an event past the token without having seen it, or a merge
//!   promise past it ([`EnsureResumeTokenPresent::check_promise`]), fails with 280
//!   `ChangeStreamFatalError` labelled `NonResumableChangeStreamError`;
//! * [`TokenVersionPolicy`] issues tokens in the client token's version until an event sorts
//!   strictly after the resume point, then the default version for good, so tokens built before
//!   that point compare correctly with the client's.

use resume::ClusterTime;
use resume::token::{ResumeStatus, ResumeTokenData, TokenError, TokenVersion};
use wire::{ErrorCode, MongoError, Result};

use super::ChangeEvent;
use super::spec::StartPoint;

/// The token version to build events with (§5.6).
#[derive(Debug, Clone)]
pub struct TokenVersionPolicy {
    /// The client's token while its version differs from the default and no event has passed it.
    sticky: Option<ResumeTokenData>,
}

impl TokenVersionPolicy {
    pub fn new(start: &StartPoint) -> TokenVersionPolicy {
        TokenVersionPolicy {
            sticky: start
                .client_token()
                .filter(|t| t.version() != TokenVersion::default())
                .cloned(),
        }
    }

    /// Builds a token with `build(version)` in the version this event must use.
    pub fn make(
        &mut self,
        build: impl Fn(TokenVersion) -> std::result::Result<ResumeTokenData, TokenError>,
    ) -> Result<ResumeTokenData> {
        if let Some(client) = &self.sticky {
            let t = build(client.version())?;
            if t.compare_against_client_token(client) != ResumeStatus::SurpassedToken {
                return Ok(t);
            }
            self.sticky = None;
        }
        Ok(build(TokenVersion::default())?)
    }

    /// [`TokenVersionPolicy::make`] with a builder that may decline (`Ok(None)`, for a reason
    /// that does not depend on the version: it declines for every version or for none). A
    /// decline leaves the policy as it was, for the caller to build the token another way.
    pub fn make_if(
        &mut self,
        build: impl Fn(TokenVersion) -> std::result::Result<Option<ResumeTokenData>, TokenError>,
    ) -> Result<Option<ResumeTokenData>> {
        if let Some(client) = &self.sticky {
            let Some(t) = build(client.version())? else {
                return Ok(None);
            };
            if t.compare_against_client_token(client) != ResumeStatus::SurpassedToken {
                return Ok(Some(t));
            }
            self.sticky = None;
        }
        Ok(build(TokenVersion::default())?)
    }
}

/// The shard-side swallow of events before the client's token.
#[derive(Debug, Clone)]
pub struct CheckResumability {
    client: Option<ResumeTokenData>,
}

impl CheckResumability {
    pub fn new(start: &StartPoint) -> CheckResumability {
        CheckResumability {
            client: start.client_token().cloned(),
        }
    }

    /// Where `event` lies relative to the client token; `None` once past it (or without one).
    /// The caller keeps the event unless the status is `CheckNextDoc`.
    /// Whether the stream has passed its resume point (or never had one).
    pub fn passed(&self) -> bool {
        self.client.is_none()
    }

    pub fn check(&mut self, event: &ChangeEvent) -> Option<ResumeStatus> {
        let client = self.client.as_ref()?;
        let status = event.data.compare_against_client_token(client);
        if status == ResumeStatus::SurpassedToken {
            self.client = None;
        }
        Some(status)
    }
}

/// `OplogQueryMinTsMissing` → `ChangeStreamHistoryLost`: the oplog no longer reaches back to
/// `scan_start` when its oldest entry is newer.
pub fn check_history(scan_start: ClusterTime, oldest_entry: ClusterTime) -> Result<()> {
    if oldest_entry > scan_start {
        return Err(MongoError::new(
            ErrorCode::CHANGE_STREAM_HISTORY_LOST,
            format!(
                "Resume of change stream was not possible, as the resume point may no longer be \
                 in the oplog: the oldest entry is at {oldest_entry}, the stream needs {scan_start}"
            ),
        )
        .with_label("NonResumableChangeStreamError"));
    }
    Ok(())
}

/// The router-side proof that a resumed stream restarted at the client's event token.
#[derive(Debug, Clone)]
pub struct EnsureResumeTokenPresent {
    /// The client token while it has not been passed; `None` = pass-through.
    client: Option<ResumeTokenData>,
    found: bool,
}

impl EnsureResumeTokenPresent {
    /// Active only when resuming from an event token (a high-water mark has nothing to find).
    pub fn new(start: &StartPoint) -> EnsureResumeTokenPresent {
        EnsureResumeTokenPresent {
            client: start
                .client_token()
                .filter(|t| !t.is_high_water_mark())
                .cloned(),
            found: false,
        }
    }

    /// Whether the stream is past the resume point (or never had one to find). Until then the
    /// router keeps reporting the client's token as the post-batch resume token.
    pub fn done(&self) -> bool {
        self.client.is_none()
    }

    /// The merge promises nothing more will come before `promise` (its post-batch resume
    /// token with no event ready): a client event token that sorts before it and was not seen
    /// never will be. Fails then, at once, instead of holding the stream at the token.
    pub fn check_promise(&self, promise: &ResumeTokenData) -> Result<()> {
        match &self.client {
            Some(client)
                if !self.found
                    && promise.compare_against_client_token(client)
                        == ResumeStatus::SurpassedToken =>
            {
                Err(not_found(client))
            }
            _ => Ok(()),
        }
    }

    /// `Ok(Some(event))` to deliver, `Ok(None)` to swallow.
    pub fn process(&mut self, event: ChangeEvent) -> Result<Option<ChangeEvent>> {
        let Some(client) = &self.client else {
            return Ok(Some(event));
        };
        match event.data.compare_against_client_token(client) {
            ResumeStatus::CheckNextDoc => Ok(None),
            ResumeStatus::FoundToken => {
                self.found = true;
                Ok(None)
            }
            ResumeStatus::SurpassedToken if self.found => {
                self.client = None;
                Ok(Some(event))
            }
            ResumeStatus::SurpassedToken | ResumeStatus::NeedsSplit => Err(not_found(client)),
        }
    }
}

fn not_found(client: &ResumeTokenData) -> MongoError {
    MongoError::new(
        ErrorCode::CHANGE_STREAM_FATAL_ERROR,
        format!(
            "cannot resume stream; the resume token was not found. {{_data: \"{}\"}} (its event \
             is in no shard's history: it comes from another cluster, or from history a shard \
             lost when its data was restored from an older copy)",
            client.encode().data_hex()
        ),
    )
    .with_label("NonResumableChangeStreamError")
}

#[cfg(test)]
mod tests;
