//! The shard half of a change stream, composed in MongoDB's order (reference §4.1): oplog match
//! → unwind transaction → transform (and, with `transactionNetEffect`, the fold of a
//! transaction's events into their net effect) → check invalidate → check resumability → classic-types
//! filter → pre- and post-images (from pre-images the shard looks up) → the user's stages and the
//! size limit or the split of large events.
//!
//! Owns: the per-cursor state of those stages and their order; nothing here reads the oplog.
//!
//! Invariants:
//! * events come out in token order for entries fed in oplog order (one entry's events share its
//!   `ts` and are ordered by `txnOpIndex`; an invalidate directly follows its trigger);
//! * the classic-types filter runs after the resume check and lets the client's own resume
//!   event through, so a token of an expanded event still resumes a stream without
//!   `showExpandedEvents` (the router swallows it);
//! * the event equal to the client's token (the resume point, which the router swallows) skips
//!   the user's stages, so a user `$match` cannot hide it from the router's resume proof; this
//!   is how `startAfter` an invalidate token works under a filter that hides `invalidate`s
//!   (MongoDB throws that event past the user's stages for the same reason);
//! * read directly (a driver connected to the shard's replica set, not through a router), the
//!   shard is the whole stream and proves the resume itself, as a replica set's mongod does
//!   ([`ShardStream::ensuring_resume_token`]): the resume-point event is swallowed, and an
//!   event or a promise past the client's token without it fails with 280;
//! * after an invalidate the stream yields nothing more and [`ShardStream::invalidated`] gives
//!   the token to close the cursor with (`invalidated: true`, post-batch resume token = it).

use bson::{Bson, Document, RawDocument};
use resume::ClusterTime;
use resume::token::{ResumeStatus, ResumeToken, ResumeTokenData, TokenVersion};
use wire::Result;

use super::ChangeEvent;
use super::images::{self, ImageSource};
use super::invalidate::CheckInvalidate;
use super::net_effect;
use super::oplog_match;
use super::post_merge::UserPipeline;
use super::resumability::{CheckResumability, EnsureResumeTokenPresent};
use super::spec::{ChangeStreamPipeline, ChangeStreamSpec, UserStage};
use super::split::{check_encoded_size, check_size, split_event};
use super::transform::{EncodedEvent, EntryFields, Transformer, is_classic_type};
use super::unwind::{OpTime, is_transaction_entry, unwind};

/// One shard cursor's change-stream stages.
#[derive(Debug, Clone)]
pub struct ShardStream {
    spec: ChangeStreamSpec,
    transformer: Transformer,
    invalidate: CheckInvalidate,
    resumability: CheckResumability,
    user: UserPipeline,
    /// The token of the resume-point event, which bypasses the user's stages.
    resume_point: Option<ResumeToken>,
    /// `$changeStreamSplitLargeEvent` ends the pipeline.
    split_large_events: bool,
    /// Read directly, not through a router: the resume proof a router would make.
    ensure: Option<EnsureResumeTokenPresent>,
    /// With `showCommitMetadata`: the last recorded commit metadata read, by its entry's `ts`.
    recorded: Option<(ClusterTime, Document)>,
}

impl ShardStream {
    /// `user_stages` are the stages pushed down to the shard (all of them, see
    /// [`oplog_match`]'s note on pushdown).
    pub fn new(spec: ChangeStreamSpec, user_stages: Vec<UserStage>) -> ShardStream {
        ShardStream {
            transformer: Transformer::new(&spec),
            invalidate: CheckInvalidate::new(&spec),
            resumability: CheckResumability::new(&spec.start),
            user: UserPipeline::new(user_stages),
            resume_point: None,
            split_large_events: false,
            ensure: None,
            recorded: None,
            spec,
        }
    }

    /// The stream of a client reading this shard directly (see the module header): it swallows
    /// the resume-point event and fails with 280 past the client's token without it.
    pub fn ensuring_resume_token(mut self) -> ShardStream {
        self.ensure = Some(EnsureResumeTokenPresent::new(&self.spec.start));
        self
    }

    /// Whether the shard may promise `promise` (its next post-batch resume token when it has
    /// read everything before it): a direct reader's client token that sorts before it and was
    /// not found never will be (280).
    pub fn check_promise(&self, promise: &ResumeTokenData) -> Result<()> {
        match &self.ensure {
            Some(ensure) => ensure.check_promise(promise),
            None => Ok(()),
        }
    }

    /// The shard stages of a parsed pipeline (all user stages pushed down, and the split).
    pub fn from_pipeline(p: ChangeStreamPipeline) -> ShardStream {
        let mut s = ShardStream::new(p.spec, p.user_stages);
        s.split_large_events = p.split_large_event;
        s
    }

    pub fn spec(&self) -> &ChangeStreamSpec {
        &self.spec
    }

    /// Whether the stream has passed its resume point (or never had one): from here on it
    /// holds no state a fresh stream of the same spec would not, so it may share a reader.
    pub fn resume_point_passed(&self) -> bool {
        self.resumability.passed()
    }

    /// The events one oplog entry yields, with their images, before the user's stages. `lookup`
    /// finds earlier entries of a transaction chain by optime; `images` reads what the image
    /// stages need.
    pub fn events_for_entry(
        &mut self,
        entry: &Document,
        lookup: &mut dyn FnMut(OpTime) -> Option<Document>,
        images: &mut dyn ImageSource,
    ) -> Result<Vec<ChangeEvent>> {
        let mut out = Vec::new();
        if self.invalidate.invalidated().is_some() {
            return Ok(out);
        }
        let resolved;
        let entry = match self.resolve_commit_metadata(entry, lookup) {
            Some(e) => {
                resolved = e;
                &resolved
            }
            None => entry,
        };
        if !oplog_match::matches(&self.spec, entry) {
            return Ok(out);
        }
        if is_transaction_entry(entry) && self.spec.options.transaction_net_effect {
            let ops = unwind(&self.spec, entry, lookup)?;
            for folded in net_effect::fold(&mut self.transformer, &ops)? {
                self.after_transform(folded.event, &folded.image_op, &mut out, images)?;
                if self.invalidate.invalidated().is_some() {
                    break;
                }
            }
        } else if is_transaction_entry(entry) {
            for op in unwind(&self.spec, entry, lookup)? {
                self.one(&op, &mut out, images)?;
                if self.invalidate.invalidated().is_some() {
                    break;
                }
            }
        } else {
            self.one(entry, &mut out, images)?;
        }
        Ok(out)
    }

    /// With `showCommitMetadata`, `entry` with the commit metadata its `commitMetadata` refers
    /// to in place of the reference (the shard writes the document once in a run of a
    /// command's entries, then `commitMetadata: Timestamp`, the `ts` of the entry holding it).
    /// `None` when the entry is read as it is. Streams read in `ts` order, so the entry holding
    /// the document was usually the last one read; else `lookup` reads it. A reference whose
    /// entry cannot be read (the shard keeps it as long as the reference) leaves the entry
    /// without metadata: its event's fields read `null`.
    fn resolve_commit_metadata(
        &mut self,
        entry: &Document,
        lookup: &mut dyn FnMut(OpTime) -> Option<Document>,
    ) -> Option<Document> {
        if !self.spec.options.show_commit_metadata {
            return None;
        }
        let at = match entry.get("commitMetadata")? {
            Bson::Document(meta) => {
                if let Some(Bson::Timestamp(ts)) = entry.get("ts") {
                    self.recorded = Some((ClusterTime::from(*ts), meta.clone()));
                }
                return None;
            }
            Bson::Timestamp(at) => ClusterTime::from(*at),
            _ => return None,
        };
        if self.recorded.as_ref().is_none_or(|(ts, _)| *ts != at) {
            let meta = lookup(OpTime { ts: at, term: -1 })
                .and_then(|e| e.get_document("commitMetadata").ok().cloned());
            self.recorded = meta.map(|m| (at, m));
        }
        let mut entry = entry.clone();
        match &self.recorded {
            Some((_, meta)) => entry.insert("commitMetadata", meta.clone()),
            None => entry.remove("commitMetadata"),
        };
        Some(entry)
    }

    /// Whether the stream asks for images the shard adds (it then needs pre-images looked up,
    /// and never takes the encoded path).
    pub fn wants_images(&self) -> bool {
        images::wanted(&self.spec)
    }

    fn one(
        &mut self,
        op: &Document,
        out: &mut Vec<ChangeEvent>,
        images: &mut dyn ImageSource,
    ) -> Result<()> {
        let Some(event) = self.transformer.transform(op)? else {
            return Ok(());
        };
        self.after_transform(event, op, out, images)
    }

    /// The stages after the transform, for an event made from `op`: invalidate, the resume
    /// check, the classic-types filter and the images.
    fn after_transform(
        &mut self,
        event: ChangeEvent,
        op: &Document,
        out: &mut Vec<ChangeEvent>,
        images: &mut dyn ImageSource,
    ) -> Result<()> {
        let (event, invalidate) = self.invalidate.process(event)?;
        for e in std::iter::once(event).chain(invalidate) {
            let status = self.resumability.check(&e);
            match status {
                Some(ResumeStatus::CheckNextDoc) => continue,
                Some(ResumeStatus::FoundToken) => self.resume_point = Some(e.token.clone()),
                _ => {}
            }
            let e = match &mut self.ensure {
                Some(ensure) => match ensure.process(e)? {
                    Some(e) => e,
                    None => continue,
                },
                None => e,
            };
            if !self.spec.options.show_expanded_events
                && !is_classic_type(e.operation_type())
                && status != Some(ResumeStatus::FoundToken)
            {
                continue;
            }
            let mut e = e;
            images::add_images(&self.spec, op, &mut e, images)?;
            out.push(e);
        }
        Ok(())
    }

    /// The user's stages on one event (after images); `None` when they drop it.
    pub fn apply_user_stages(&self, event: ChangeEvent) -> Result<Option<ChangeEvent>> {
        if self.resume_point.as_ref() == Some(&event.token) {
            return Ok(Some(event));
        }
        self.user.apply_event(event)
    }

    /// The user's stages, then the split of a large event (with `$changeStreamSplitLargeEvent`)
    /// or the 16 MiB limit (10334, without it): what follows the images.
    pub fn finish(&self, event: ChangeEvent) -> Result<Vec<ChangeEvent>> {
        let Some(event) = self.apply_user_stages(event)? else {
            return Ok(Vec::new());
        };
        if self.split_large_events {
            split_event(event)
        } else {
            check_size(&event)?;
            Ok(vec![event])
        }
    }

    /// [`ShardStream::process_entry`] straight from the entry's bytes, for the common case: a
    /// top-level CRUD entry, on a stream without shard-side stages that has passed its resume
    /// point (`transform::encoded`). `None` when the entry needs the general path: decode it
    /// and call [`ShardStream::process_entry`].
    pub fn process_encoded(&mut self, entry: &RawDocument) -> Result<Option<Vec<EncodedEvent>>> {
        if self.invalidate.invalidated().is_some() {
            return Ok(Some(Vec::new()));
        }
        if !self.user.is_empty()
            || self.split_large_events
            || !self.resumability.passed()
            || self.wants_images()
        {
            return Ok(None);
        }
        // The oplog match of a top-level CRUD entry: its namespace (migrations, and view
        // definitions on `system.views`, take the general path).
        let Some(fields) = EntryFields::read(entry) else {
            return Ok(None);
        };
        if !matches!(fields.op, "i" | "u" | "d") || fields.from_migrate {
            return Ok(None);
        }
        if !oplog_match::ns_matches(&self.spec, fields.ns) {
            return Ok(
                if oplog_match::view_definition_matches(&self.spec, fields.ns) {
                    None
                } else {
                    Some(Vec::new())
                },
            );
        }
        // CRUD events never invalidate, and they are classic types.
        let Some(event) = self.transformer.transform_encoded(&fields)? else {
            return Ok(None);
        };
        check_encoded_size(event.bytes.len())?;
        Ok(Some(vec![event]))
    }

    /// [`ShardStream::events_for_entry`] then [`ShardStream::finish`], where no pre-image is
    /// stored (images the stream asks for are `null`, or fail it when `required`).
    pub fn process_entry(
        &mut self,
        entry: &Document,
        lookup: &mut dyn FnMut(OpTime) -> Option<Document>,
    ) -> Result<Vec<ChangeEvent>> {
        self.process_entry_with_images(entry, lookup, &mut images::NoImages)
    }

    /// [`ShardStream::events_for_entry`] then [`ShardStream::finish`].
    pub fn process_entry_with_images(
        &mut self,
        entry: &Document,
        lookup: &mut dyn FnMut(OpTime) -> Option<Document>,
        images: &mut dyn ImageSource,
    ) -> Result<Vec<ChangeEvent>> {
        let mut out = Vec::new();
        for e in self.events_for_entry(entry, lookup, images)? {
            out.extend(self.finish(e)?);
        }
        Ok(out)
    }

    /// The reply's post-batch resume token (§5.9) once this cursor has consumed every oplog
    /// entry with `ts <= processed_through`: the invalidate token once invalidated, else the
    /// larger of `initial` (the spec's initial token) and a high-water mark just after
    /// `processed_through`, which every event already produced sorts before and every later one
    /// after. Never smaller than any token this stream has produced.
    pub fn post_batch_resume_token(
        &self,
        initial: &ResumeToken,
        processed_through: ClusterTime,
    ) -> ResumeToken {
        if let Some(t) = self.invalidated() {
            return t.clone();
        }
        let hwm =
            ResumeTokenData::high_water_mark(processed_through.next(), TokenVersion::default())
                .encode();
        if hwm > *initial { hwm } else { initial.clone() }
    }

    /// The invalidate token, once this stream has been invalidated.
    pub fn invalidated(&self) -> Option<&ResumeToken> {
        self.invalidate.invalidated()
    }
}

#[cfg(test)]
mod tests;
