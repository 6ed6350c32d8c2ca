//! User stages over change events, and the router's last steps after the merge: the
//! resume-token proof and the `_id` check (reference §3.3, §4.1; driver contract §4.6).
//!
//! Owns: running the user's stages one event at a time ([`UserPipeline`]), the rule that an
//! event's `_id` must still be its resume token ([`check_id`]), and their order on the router
//! ([`RouterStream`]).
//!
//! Invariants:
//! * every user stage is a single-document stage: one event in, zero or one event out;
//! * an event leaves the router only if its `_id` is exactly its token (`{_data, _typeBits?}`);
//!   otherwise the stream fails with 280 `ChangeStreamFatalError` labelled
//!   `NonResumableChangeStreamError` (drivers rely on the code and the label);
//! * the router runs [`EnsureResumeTokenPresent`] on the merged order, before the `_id` check.

use bson::{Bson, Document};
use wire::{ErrorCode, MongoError, Result};

use resume::token::ResumeTokenData;

use super::ChangeEvent;
use super::resumability::EnsureResumeTokenPresent;
use super::spec::{ChangeStreamSpec, UserStage};

/// The user's stages after `$changeStream`, compiled once.
#[derive(Debug, Clone, Default)]
pub struct UserPipeline {
    stages: Vec<UserStage>,
}

impl UserPipeline {
    pub fn new(stages: Vec<UserStage>) -> UserPipeline {
        UserPipeline { stages }
    }

    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// Runs every stage on `doc`; `None` when a stage drops it.
    pub fn apply(&self, mut doc: Document) -> Result<Option<Document>> {
        for stage in &self.stages {
            match stage {
                UserStage::Match(m) => {
                    if !m.try_matches(&doc)? {
                        return Ok(None);
                    }
                }
                UserStage::Transform(stage) => match stage.apply_one(doc)? {
                    Some(d) => doc = d,
                    None => return Ok(None),
                },
            }
        }
        Ok(Some(doc))
    }

    /// Runs the stages on an event, keeping its sort key.
    pub fn apply_event(&self, event: ChangeEvent) -> Result<Option<ChangeEvent>> {
        if self.stages.is_empty() {
            return Ok(Some(event));
        }
        let ChangeEvent { token, data, doc } = event;
        Ok(self.apply(doc)?.map(|doc| ChangeEvent { token, data, doc }))
    }
}

/// Fails with 280 unless `event.doc._id` is still exactly the event's resume token.
pub fn check_id(event: &ChangeEvent) -> Result<()> {
    let ok = match event.doc.get("_id") {
        Some(Bson::Document(id)) => {
            let hex_ok = id
                .get_str("_data")
                .is_ok_and(|d| is_upper_hex_of(d, event.token.data()));
            let bits_ok = match (id.get("_typeBits"), event.token.type_bits()) {
                (None, None) => true,
                (Some(Bson::Binary(b)), Some(bits)) => b.bytes == bits,
                _ => false,
            };
            hex_ok && bits_ok && id.len() == 1 + usize::from(event.token.type_bits().is_some())
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(MongoError::new(
            ErrorCode::CHANGE_STREAM_FATAL_ERROR,
            "Encountered an event whose _id field, which contains the resume token, was \
             modified by the pipeline. Modifying the _id field of an event makes it impossible \
             to resume the stream from that point. Only transformations that retain the \
             unmodified _id field are allowed.",
        )
        .with_label("NonResumableChangeStreamError"))
    }
}

/// Whether `s` is the uppercase hex of `bytes` (what MongoDB writes in `_data`), without
/// allocating.
fn is_upper_hex_of(s: &str, bytes: &[u8]) -> bool {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    s.len() == bytes.len() * 2
        && s.as_bytes()
            .chunks_exact(2)
            .zip(bytes)
            .all(|(pair, b)| pair == [HEX[usize::from(b >> 4)], HEX[usize::from(b & 0x0F)]])
}

/// The router's stages after the merge, for one client cursor.
#[derive(Debug, Clone)]
pub struct RouterStream {
    ensure: EnsureResumeTokenPresent,
    stages: UserPipeline,
}

impl RouterStream {
    /// `router_stages` are user stages the shards did not run (empty when all were pushed
    /// down, which is what [`crate::changestream::shard::ShardStream`] does).
    pub fn new(spec: &ChangeStreamSpec, router_stages: Vec<UserStage>) -> RouterStream {
        RouterStream {
            ensure: EnsureResumeTokenPresent::new(&spec.start),
            stages: UserPipeline::new(router_stages),
        }
    }

    /// One merged event in; the document to send the client, if any.
    pub fn process(&mut self, event: ChangeEvent) -> Result<Option<Document>> {
        let Some(event) = self.ensure.process(event)? else {
            return Ok(None);
        };
        let Some(event) = self.stages.apply_event(event)? else {
            return Ok(None);
        };
        check_id(&event)?;
        Ok(Some(event.doc))
    }

    /// Whether every event passes unchanged: no user stages, and no resume point to find.
    pub fn passes_through(&self) -> bool {
        self.stages.is_empty() && self.ensure.done()
    }

    /// Fails when the merge's promise (`pbrt`) is past the client's event token unseen.
    pub fn check_promise(&self, pbrt: &ResumeTokenData) -> Result<()> {
        self.ensure.check_promise(pbrt)
    }

    /// Whether the resume point has been passed; until then the reply's post-batch resume token
    /// stays the client's token.
    pub fn resume_point_passed(&self) -> bool {
        self.ensure.done()
    }
}

#[cfg(test)]
mod tests;
