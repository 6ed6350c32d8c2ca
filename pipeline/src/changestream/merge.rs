//! The router's k-way merge of the shards' change streams (`AsyncResultsMerger` in sorted,
//! tailable mode; reference §6, DESIGN "Time, order and the merge").
//!
//! Owns: the per-shard buffers, each shard's promise (its latest post-batch resume token), the
//! release rule, the stream's high-water mark, and the invalidated-shard rule.
//!
//! Invariants (property-tested in `merge/tests.rs`):
//! * a buffered event is released only when its token is ≤ the minimum promise over all shards,
//!   and nothing is released until every shard has made a promise. A shard's promise is a
//!   promise never to send a smaller token, so no later event can precede a released one;
//! * released tokens strictly increase (byte order of `_data`). An event whose token equals the
//!   last released one (the same event reported by two shards, e.g. a `drop` of a collection
//!   that lives on several shards) is released once;
//! * promises never go backwards (a smaller promise is ignored), and a batch must be sorted and
//!   not below the shard's promise, or it is rejected with `InternalError` and nothing changes;
//! * once every promise has passed an event, it is released exactly once;
//! * [`Merger::post_batch_resume_token`] never goes backwards and never passes an unreleased
//!   event: the last released token, raised to the minimum promise whenever nothing is ready;
//! * when nothing is ready and the minimum promise belongs to an invalidated shard, the stream is
//!   over: [`Merger::invalidated`] returns that shard's invalidate token (§6, "Invalidate on a
//!   sharded drop"); events from other shards that sort before it were released first.

use std::collections::VecDeque;

use resume::token::ResumeToken;
use wire::{MongoError, Result};

use super::ChangeEvent;

/// Index of a shard cursor in the merge.
pub type ShardId = usize;

/// What the merge sorts: anything with a resume token (a decoded event, or one the router
/// keeps as the bytes a shard sent).
pub trait Keyed {
    fn token(&self) -> &ResumeToken;
}

impl Keyed for ChangeEvent {
    fn token(&self) -> &ResumeToken {
        &self.token
    }
}

#[derive(Debug)]
struct Remote<E> {
    buffer: VecDeque<E>,
    promise: Option<ResumeToken>,
    invalidated: bool,
}

impl<E> Default for Remote<E> {
    fn default() -> Self {
        Remote {
            buffer: VecDeque::new(),
            promise: None,
            invalidated: false,
        }
    }
}

/// The merge state machine; feed it batches, pop released events.
#[derive(Debug)]
pub struct Merger<E = ChangeEvent> {
    remotes: Vec<Remote<E>>,
    last_released: Option<ResumeToken>,
    high_water: Option<ResumeToken>,
}

impl<E> Default for Merger<E> {
    fn default() -> Self {
        Merger {
            remotes: Vec::new(),
            last_released: None,
            high_water: None,
        }
    }
}

impl<E: Keyed> Merger<E> {
    /// A merge over `shards` remotes, reporting `initial_post_batch_resume_token` (the client's
    /// token or a high-water mark at the start time) until something better is known.
    pub fn new(shards: usize, initial_post_batch_resume_token: Option<ResumeToken>) -> Self {
        Merger {
            remotes: (0..shards).map(|_| Remote::default()).collect(),
            last_released: None,
            high_water: initial_post_batch_resume_token,
        }
    }

    /// Adds a remote (a new shard); it holds the merge back until its first promise.
    pub fn add_shard(&mut self) -> ShardId {
        self.remotes.push(Remote::default());
        self.remotes.len() - 1
    }

    pub fn shard_count(&self) -> usize {
        self.remotes.len()
    }

    /// One reply from `shard`: its events in token order and its post-batch resume token.
    pub fn push_batch(
        &mut self,
        shard: ShardId,
        events: Vec<E>,
        post_batch_resume_token: ResumeToken,
    ) -> Result<()> {
        let remote = self
            .remotes
            .get_mut(shard)
            .ok_or_else(|| MongoError::internal(format!("merge has no shard {shard}")))?;
        if remote.invalidated && !events.is_empty() {
            return Err(MongoError::internal(format!(
                "shard {shard} sent events after its invalidate"
            )));
        }
        let mut floor = remote
            .buffer
            .back()
            .map(|e| e.token())
            .or(remote.promise.as_ref());
        let mut strict = remote.buffer.back().is_some();
        for e in &events {
            if let Some(f) = floor
                && (e.token() < f || (strict && e.token() == f))
            {
                return Err(MongoError::internal(format!(
                    "shard {shard} sent events out of token order"
                )));
            }
            floor = Some(e.token());
            strict = true;
        }
        let newest = events.last().map(|e| e.token().clone());
        remote.buffer.extend(events);
        for t in [Some(post_batch_resume_token), newest]
            .into_iter()
            .flatten()
        {
            if remote.promise.as_ref().is_none_or(|p| t > *p) {
                remote.promise = Some(t);
            }
        }
        Ok(())
    }

    /// Marks `shard` as invalidated: its cursor closed with `invalidated: true` and its
    /// post-batch resume token (already pushed) is the invalidate token.
    pub fn mark_invalidated(&mut self, shard: ShardId) {
        if let Some(r) = self.remotes.get_mut(shard) {
            r.invalidated = true;
        }
    }

    /// The smallest promise, with its shard; `None` while some shard has made none.
    pub fn min_promise(&self) -> Option<(ShardId, &ResumeToken)> {
        let mut min: Option<(ShardId, &ResumeToken)> = None;
        for (i, r) in self.remotes.iter().enumerate() {
            let p = r.promise.as_ref()?;
            if min.is_none_or(|(_, m)| p < m) {
                min = Some((i, p));
            }
        }
        min
    }

    /// The next event in token order, if every promise has passed it.
    pub fn pop_ready(&mut self) -> Option<E> {
        loop {
            let shard = {
                let (_, min) = self.min_promise()?;
                self.remotes
                    .iter()
                    .enumerate()
                    .filter_map(|(i, r)| r.buffer.front().map(|e| (i, e.token())))
                    .min_by(|a, b| a.1.cmp(b.1))
                    .filter(|(_, t)| *t <= min)?
                    .0
            };
            let event = self.remotes.get_mut(shard)?.buffer.pop_front()?;
            if self.last_released.as_ref() == Some(event.token()) {
                continue;
            }
            self.last_released = Some(event.token().clone());
            self.high_water = Some(event.token().clone());
            return Some(event);
        }
    }

    /// The token to report as the reply's `postBatchResumeToken`: the last released token,
    /// raised to the minimum promise when nothing is ready. Everything up to it has been
    /// released and everything released later sorts after it, so it never goes backwards (it
    /// is remembered: a later batch can make events ready that sort before a newer promise).
    pub fn post_batch_resume_token(&mut self) -> Option<ResumeToken> {
        if !self.has_ready()
            && let Some((_, min)) = self.min_promise()
            && self.high_water.as_ref().is_none_or(|h| min > h)
        {
            self.high_water = Some(min.clone());
        }
        self.high_water.clone()
    }

    /// Whether [`Merger::pop_ready`] would return an event.
    pub fn has_ready(&self) -> bool {
        let Some((_, min)) = self.min_promise() else {
            return false;
        };
        self.remotes
            .iter()
            .filter_map(|r| r.buffer.front())
            .any(|e| e.token() <= min)
    }

    /// The invalidate token that ends the stream, once nothing is ready and the minimum
    /// promise belongs to an invalidated shard.
    pub fn invalidated(&self) -> Option<&ResumeToken> {
        let (shard, min) = self.min_promise()?;
        let remote = self.remotes.get(shard)?;
        (remote.invalidated && !self.has_ready()).then_some(min)
    }

    /// Events buffered (not yet released) across all shards.
    pub fn buffered(&self) -> usize {
        self.remotes.iter().map(|r| r.buffer.len()).sum()
    }

    /// Events buffered (not yet released) from `shard`.
    ///
    /// When every shard has events buffered, one of them is ready (each shard's promise is at
    /// least its own buffered events, so at least the smallest front): a reader that stops
    /// taking batches from shards holding enough, while nothing is ready, still always waits
    /// on some shard that holds none.
    pub fn buffered_of(&self, shard: ShardId) -> usize {
        self.remotes.get(shard).map_or(0, |r| r.buffer.len())
    }
}

#[cfg(test)]
mod tests;
