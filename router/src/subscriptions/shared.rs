//! A subscription's shared log on this router: one stream read for every consumer this router
//! serves, so a hundred consumers of a subscription cost about what one does.
//!
//! The log holds every message after `base` up to `end` (the stream's position), in token
//! order. A consumer whose position is at or after `base` reads from it (one at or past its
//! end waits for it to grow, or grows it); one further behind reads by itself (its own
//! [`Feed`]) until it reaches the log. One reader at a time extends the log; the others wait for it without holding any
//! lock.
//!
//! A stream error that means "cannot go on from here" (lost history) is the error of the
//! consumers at or past where the log's stream failed; the others see a pause, and the log
//! starts again at the position of the next one to read, so none of them is failed for a
//! history it never reached.
//!
//! Invariants: the log is contiguous (nothing after `base` and at or before `end` is missing);
//! `base` and `end` only rise until the log is restarted (after a stream error); the log holds
//! at most [`MAX_LOG_BYTES`] and [`MAX_LOG_MESSAGES`], and nothing every consumer served here
//! has passed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use resume::token::ResumeToken;
use wire::{MongoError, Result};

use super::delivery::Message;
use super::feed::{Feed, Source, needs_reset};
use super::spec::Definition;

pub const MAX_LOG_BYTES: usize = 32 << 20;
pub const MAX_LOG_MESSAGES: usize = 100_000;

#[derive(Default)]
struct Log {
    /// `None`: not started (the next reader starts it at its position).
    base: Option<ResumeToken>,
    end: Option<ResumeToken>,
    messages: VecDeque<Arc<Message>>,
    bytes: usize,
    /// Whether the stream had nothing newer when it was last read.
    at_head: bool,
}

impl Log {
    /// Whether a consumer at `at` reads from the log: at or after its base (one ahead of its
    /// end extends it, taking only what follows its position).
    fn covers(&self, at: &ResumeToken) -> bool {
        self.base.as_ref().is_some_and(|b| b <= at)
    }

    /// Drops what every consumer has passed (`passed`), and the oldest past the bounds.
    fn trim(&mut self, passed: Option<&ResumeToken>) {
        while let Some(front) = self.messages.front() {
            let passed_by_all = passed.is_some_and(|p| front.token <= *p);
            let over = self.bytes > MAX_LOG_BYTES || self.messages.len() > MAX_LOG_MESSAGES;
            if !(passed_by_all || over) {
                break;
            }
            let Some(m) = self.messages.pop_front() else {
                break;
            };
            self.bytes -= m.size();
            self.base = Some(m.token.clone());
        }
    }
}

/// What a read from the log gave.
pub struct Taken {
    pub messages: Vec<Arc<Message>>,
    /// The log's end, when the messages reach it (the consumer's horizon may move there).
    pub end: Option<ResumeToken>,
    pub at_head: bool,
}

#[derive(Default)]
pub struct Shared {
    log: Mutex<Log>,
    /// The stream: held only by the reader extending the log.
    feed: tokio::sync::Mutex<Feed>,
    grew: tokio::sync::Notify,
}

impl Shared {
    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a consumer at `at` reads from the log (else by itself). A log not started yet
    /// covers anyone: the first reader starts it where it stands.
    pub fn covers(&self, at: &ResumeToken) -> bool {
        let log = self.log();
        log.base.is_none() || log.covers(at)
    }

    /// Up to `n` messages after `at` and `budget` bytes (one at least); `None` when the log
    /// does not cover `at` (it is before the base).
    pub fn after(&self, at: &ResumeToken, n: usize, budget: usize) -> Option<Taken> {
        let log = self.log();
        if !log.covers(at) {
            return None;
        }
        let first = log.messages.partition_point(|m| m.token <= *at);
        let mut messages = Vec::new();
        let mut bytes = 0usize;
        for m in log.messages.iter().skip(first).take(n) {
            if !messages.is_empty() && bytes + m.size() > budget {
                break;
            }
            bytes += m.size();
            messages.push(m.clone());
        }
        let reached = first + messages.len() == log.messages.len();
        Some(Taken {
            messages,
            end: reached.then(|| log.end.clone()).flatten(),
            at_head: reached && log.at_head,
        })
    }

    /// Extends the log by up to `n` messages, waiting up to `wait` for the first; when another
    /// reader is extending it, waits for that instead. `at`: where the log starts if it has
    /// not; `passed`: what every consumer served here has passed (trimmed off).
    pub async fn extend(
        &self,
        source: Source<'_>,
        def: &Definition,
        at: &ResumeToken,
        passed: Option<&ResumeToken>,
        n: usize,
        wait: Duration,
    ) -> Result<()> {
        let grew = self.grew.notified();
        tokio::pin!(grew);
        grew.as_mut().enable();
        let Ok(mut feed) = self.feed.try_lock() else {
            let _ = tokio::time::timeout(wait, grew).await;
            return Ok(());
        };
        let from = {
            let mut log = self.log();
            if log.base.is_none() {
                log.base = Some(at.clone());
                log.end = Some(at.clone());
            }
            log.end.clone()
        };
        let fetched = feed.fetch(source, def, from.as_ref(), n, wait).await;
        let fetched = match fetched {
            Ok(f) => f,
            Err(e) => {
                feed.restart().await;
                *self.log() = Log::default();
                self.grew.notify_waiters();
                // The stream failed at `from`: only a consumer at or past it cannot go on
                // (lost history, say); one behind it reopens the log at its own position.
                if needs_reset(&e) && from.as_ref().is_some_and(|f| at < f) {
                    return Err(MongoError::internal(format!(
                        "the shared stream starts again ({})",
                        e.errmsg
                    )));
                }
                return Err(e);
            }
        };
        {
            let mut log = self.log();
            while let Some(m) = feed.pop() {
                log.bytes += m.size();
                log.end = Some(m.token.clone());
                log.messages.push_back(m);
            }
            if let Some(t) = feed.scanned()
                && log.end.as_ref().is_none_or(|e| t > e)
            {
                log.end = Some(t.clone());
            }
            log.at_head = fetched.at_head;
            log.trim(passed);
        }
        self.grew.notify_waiters();
        Ok(())
    }

    /// Stops the stream.
    pub async fn close(&self) {
        self.feed.lock().await.restart().await;
        *self.log() = Log::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn token(n: u64) -> ResumeToken {
        ResumeToken::from_parts(n.to_be_bytes().to_vec(), Vec::new())
    }

    fn log_of(base: u64, ns: &[u64], end: u64) -> Log {
        let messages: VecDeque<Arc<Message>> = ns
            .iter()
            .map(|n| Arc::new(Message::new(token(*n), Bytes::from(vec![0u8; 100]))))
            .collect();
        Log {
            base: Some(token(base)),
            end: Some(token(end)),
            bytes: messages.len() * 100,
            messages,
            at_head: true,
        }
    }

    #[test]
    fn a_reader_takes_what_follows_its_position_and_learns_when_it_reached_the_end() {
        let shared = Shared::default();
        *shared.log() = log_of(1, &[2, 4, 6], 7);
        let t = shared.after(&token(2), 1, usize::MAX).expect("covered");
        assert_eq!(t.messages[0].token, token(4));
        assert_eq!(t.end, None, "6 follows");
        let t = shared.after(&token(4), 10, usize::MAX).expect("covered");
        assert_eq!(t.messages.len(), 1);
        assert_eq!(t.end, Some(token(7)));
        assert!(t.at_head);
        assert!(
            shared.after(&token(0), 10, usize::MAX).is_none(),
            "before the base"
        );
        let ahead = shared.after(&token(8), 10, usize::MAX).expect("covered");
        assert!(
            ahead.messages.is_empty(),
            "past the end: nothing yet, it waits for the log or grows it"
        );
        let t = shared.after(&token(1), 10, 150).expect("covered");
        assert_eq!(
            t.messages.len(),
            1,
            "the byte budget (one message at least)"
        );
    }

    #[test]
    fn the_log_lets_go_of_what_everyone_passed_and_of_what_passes_its_bounds() {
        let mut log = log_of(1, &[2, 4, 6], 7);
        log.trim(Some(&token(4)));
        assert_eq!(log.base, Some(token(4)));
        assert_eq!(log.messages.len(), 1);
        assert!(log.covers(&token(4)) && !log.covers(&token(3)));
        let mut big = log_of(0, &(1..=10).collect::<Vec<_>>(), 10);
        big.bytes = MAX_LOG_BYTES + 1;
        big.trim(None);
        assert_eq!(big.messages.len(), 9, "one message over the bound goes");
    }
}
