//! Invalidation (`$_internalChangeStreamCheckInvalidate`, reference §2.3, §4.2): after an event
//! that ends a stream of this level, queue an `invalidate` event and close.
//!
//! Owns: which event types invalidate which levels, the invalidate event itself, and the
//! `startAfter`-an-invalidate-token exception.
//!
//! Invariants:
//! * collection streams are invalidated by `drop`, `rename` (the oplog filter only lets renames
//!   from or to the watched name through) and `dropDatabase`; database streams by
//!   `dropDatabase`; cluster streams never;
//! * the invalidate's token is the triggering event's token with `fromInvalidate = true`, so it
//!   sorts right after its trigger; the event has only `_id`, `operationType`, `clusterTime`,
//!   `wallTime`;
//! * after `startAfter` with an invalidate token, only the first event seen is special: if it
//!   invalidates, no invalidate is generated, unless that invalidate equals the client's token,
//!   in which case it is generated (for the resume check to find) but does not close the stream;
//! * once closed, [`CheckInvalidate::invalidated`] holds the invalidate token (the cursor's last
//!   post-batch resume token); the caller stops feeding entries.

use bson::{Bson, doc};
use resume::token::{ResumeStatus, ResumeToken, ResumeTokenData};
use wire::Result;

use super::ChangeEvent;
use super::spec::{ChangeStreamSpec, StartPoint, StreamLevel};

/// Whether an event of `operation_type` invalidates a stream of `level`.
pub fn is_invalidating(level: StreamLevel, operation_type: &str) -> bool {
    match level {
        StreamLevel::Collection => matches!(operation_type, "drop" | "rename" | "dropDatabase"),
        StreamLevel::Database => operation_type == "dropDatabase",
        StreamLevel::Cluster => false,
    }
}

/// The `invalidate` event that follows `trigger`.
pub fn invalidate_event(trigger: &ChangeEvent) -> ChangeEvent {
    let data = trigger.data.clone().with_from_invalidate(true);
    let token = data.encode();
    let mut d = doc! {
        "_id": token.to_document(),
        "operationType": "invalidate",
        "clusterTime": trigger.doc.get("clusterTime").cloned().unwrap_or(Bson::Null),
    };
    if let Some(wall) = trigger.doc.get("wallTime") {
        d.insert("wallTime", wall.clone());
    }
    ChangeEvent {
        token,
        data,
        doc: d,
    }
}

/// The stage's state for one shard cursor.
#[derive(Debug, Clone)]
pub struct CheckInvalidate {
    level: StreamLevel,
    /// `startAfter`'s invalidate token, until the first event has been seen.
    start_after_invalidate: Option<ResumeTokenData>,
    invalidated: Option<ResumeToken>,
}

impl CheckInvalidate {
    pub fn new(spec: &ChangeStreamSpec) -> CheckInvalidate {
        let start_after_invalidate = match &spec.start {
            StartPoint::StartAfter(t) if t.from_invalidate() => Some(t.clone()),
            _ => None,
        };
        CheckInvalidate {
            level: spec.level,
            start_after_invalidate,
            invalidated: None,
        }
    }

    /// Passes `event` on, followed by its `invalidate` when it ends the stream.
    pub fn process(&mut self, event: ChangeEvent) -> Result<(ChangeEvent, Option<ChangeEvent>)> {
        let skip_token = self.start_after_invalidate.take();
        if !is_invalidating(self.level, event.operation_type()) {
            return Ok((event, None));
        }
        let invalidate = invalidate_event(&event);
        match skip_token {
            Some(client)
                if invalidate.data.compare_against_client_token(&client)
                    != ResumeStatus::FoundToken =>
            {
                Ok((event, None))
            }
            Some(_) => Ok((event, Some(invalidate))),
            None => {
                self.invalidated = Some(invalidate.token.clone());
                Ok((event, Some(invalidate)))
            }
        }
    }

    /// The invalidate token once the stream has been invalidated.
    pub fn invalidated(&self) -> Option<&ResumeToken> {
        self.invalidated.as_ref()
    }
}

#[cfg(test)]
mod tests;
