//! How a client batch of change events is put together, for a stream of its own and for a
//! client of a shared hub alike: which events it takes, and when it goes out. Pure: the
//! caller passes the time in and does the waiting.
//!
//! Invariants:
//! * a batch holds at most `n` events and at most [`BATCH_BYTES`] (each event counted with its
//!   array entry, [`entry_size`]), except that its first event always fits: an event larger
//!   than the budget goes out alone, never stalls the stream;
//! * an event refused for room is handed back, to start the next batch: nothing is skipped;
//! * a batch goes out as soon as it has an event (or asks for none), is full, or has more
//!   events waiting behind it, or at its deadline; only a batch that has room and nothing
//!   behind it waits, up to its client's pace (shared hubs: [`BatchAssembler::ready`]).

use bytes::Bytes;
use resume::token::ResumeToken;
use tokio::time::Instant;

/// A client batch stops before an event that would take it past this many bytes, so the
/// whole reply stays within MongoDB's 16 MiB document limit (drivers read replies as one
/// document; a message must also fit 48 MB). Each event counts its array entry too
/// ([`entry_size`]); 4 KiB are left for the rest of the reply.
const BATCH_BYTES: usize = 16 * 1024 * 1024 - 4096;

/// What an encoded event adds to a batch array: its size, its type byte and its index key.
fn entry_size(event: &Bytes) -> usize {
    event.len() + 8
}

/// One client batch in the making.
#[derive(Debug)]
pub(super) struct BatchAssembler {
    /// Events asked for (the getMore's `batchSize`).
    n: usize,
    events: Vec<Bytes>,
    /// Each event's token, when its client asked for them ([`BatchAssembler::keeping_tokens`]).
    tokens: Option<Vec<ResumeToken>>,
    bytes: usize,
    /// An event was refused for room: the batch is full by bytes.
    refused: bool,
}

/// What to do with the batch now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ready {
    /// Reply with it.
    Send,
    /// Wait for more events, at most until then.
    WaitUntil(Instant),
}

impl BatchAssembler {
    pub(super) fn new(n: usize) -> BatchAssembler {
        BatchAssembler {
            n,
            events: Vec::new(),
            tokens: None,
            bytes: 0,
            refused: false,
        }
    }

    /// Keeps each event's token beside it (`keep`), for a client that would otherwise read
    /// them back from the events' bytes.
    pub(super) fn keeping_tokens(mut self, keep: bool) -> BatchAssembler {
        self.tokens = keep.then(Vec::new);
        self
    }

    /// Whether the batch takes no more events (by count, or because one was refused).
    pub(super) fn is_full(&self) -> bool {
        self.refused || self.events.len() >= self.n
    }

    pub(super) fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    pub(super) fn len(&self) -> usize {
        self.events.len()
    }

    /// Takes `event`, or hands it back when the batch has no room for it (it starts the next
    /// batch). A full batch takes nothing.
    pub(super) fn offer(&mut self, token: &ResumeToken, event: Bytes) -> Result<(), Bytes> {
        let size = entry_size(&event);
        let fits = self.events.is_empty() || self.bytes + size <= BATCH_BYTES;
        if self.is_full() || !fits {
            self.refused |= !fits;
            return Err(event);
        }
        self.bytes += size;
        self.events.push(event);
        if let Some(tokens) = &mut self.tokens {
            tokens.push(token.clone());
        }
        Ok(())
    }

    /// Whether the batch goes out now. `more_waiting`: events are ready behind it (it cannot
    /// have caught up); `pace`: the earliest time its client should get another reply (a hub's
    /// client; `None` for no pacing).
    pub(super) fn ready(
        &self,
        now: Instant,
        deadline: Instant,
        more_waiting: bool,
        pace: Option<Instant>,
    ) -> Ready {
        if !self.events.is_empty()
            && !self.is_full()
            && !more_waiting
            && let Some(pace) = pace.filter(|p| *p > now)
        {
            return Ready::WaitUntil(pace.min(deadline));
        }
        if !self.events.is_empty() || self.n == 0 || self.is_full() || more_waiting {
            return Ready::Send;
        }
        if now >= deadline {
            Ready::Send
        } else {
            Ready::WaitUntil(deadline)
        }
    }

    /// The batch's events, and their tokens when it kept them (else none).
    pub(super) fn into_events(self) -> (Vec<Bytes>, Vec<ResumeToken>) {
        (self.events, self.tokens.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn event(len: usize) -> Bytes {
        Bytes::from(vec![0u8; len])
    }

    fn t() -> ResumeToken {
        ResumeToken::from_parts(vec![1, 2, 3], Vec::new())
    }

    #[test]
    fn a_batch_holds_at_most_n_events() {
        let mut b = BatchAssembler::new(2);
        assert!(b.offer(&t(), event(10)).is_ok());
        assert!(b.offer(&t(), event(10)).is_ok());
        assert!(b.is_full());
        assert_eq!(b.offer(&t(), event(10)).map_err(|e| e.len()), Err(10));
        assert_eq!(b.into_events().0.len(), 2);
    }

    #[test]
    fn an_event_past_the_byte_budget_is_handed_back_to_start_the_next_batch() {
        let mut b = BatchAssembler::new(10);
        let big = BATCH_BYTES / 2;
        assert!(b.offer(&t(), event(big)).is_ok());
        let refused = b
            .offer(&t(), event(big))
            .expect_err("no room for a second half");
        assert_eq!(refused.len(), big);
        assert!(b.is_full(), "a refusal fills the batch");
        assert!(b.offer(&t(), event(1)).is_err(), "nothing after a refusal");
        let mut next = BatchAssembler::new(10);
        assert!(next.offer(&t(), refused).is_ok());
    }

    #[test]
    fn an_event_larger_than_the_budget_goes_out_alone() {
        let mut b = BatchAssembler::new(10);
        assert!(b.offer(&t(), event(BATCH_BYTES + 1)).is_ok());
        assert!(b.offer(&t(), event(1)).is_err());
        assert_eq!(b.into_events().0.len(), 1);
    }

    #[test]
    fn tokens_are_kept_only_when_asked_for() {
        let mut b = BatchAssembler::new(10).keeping_tokens(true);
        b.offer(&t(), event(1)).unwrap();
        assert_eq!(b.into_events().1, [t()]);
        let mut b = BatchAssembler::new(10);
        b.offer(&t(), event(1)).unwrap();
        assert!(b.into_events().1.is_empty());
    }

    #[test]
    fn an_empty_batch_waits_for_its_deadline_and_then_goes_out() {
        let now = Instant::now();
        let deadline = now + Duration::from_secs(1);
        let b = BatchAssembler::new(10);
        assert_eq!(
            b.ready(now, deadline, false, None),
            Ready::WaitUntil(deadline)
        );
        assert_eq!(b.ready(deadline, deadline, false, None), Ready::Send);
        assert_eq!(
            BatchAssembler::new(0).ready(now, deadline, false, None),
            Ready::Send,
            "a batch of no events goes out at once"
        );
    }

    #[test]
    fn a_batch_with_events_goes_out_unless_its_client_is_paced() {
        let now = Instant::now();
        let deadline = now + Duration::from_secs(1);
        let pace = now + Duration::from_millis(100);
        let mut b = BatchAssembler::new(10);
        b.offer(&t(), event(10)).unwrap();
        assert_eq!(b.ready(now, deadline, false, None), Ready::Send);
        assert_eq!(
            b.ready(now, deadline, false, Some(pace)),
            Ready::WaitUntil(pace)
        );
        assert_eq!(b.ready(pace, deadline, false, Some(pace)), Ready::Send);
        assert_eq!(
            b.ready(now, now + Duration::from_millis(50), false, Some(pace)),
            Ready::WaitUntil(now + Duration::from_millis(50)),
            "pacing never passes the deadline"
        );
        assert_eq!(
            b.ready(now, deadline, true, Some(pace)),
            Ready::Send,
            "a client behind is not paced"
        );
    }

    #[test]
    fn a_full_batch_is_not_paced() {
        let now = Instant::now();
        let pace = now + Duration::from_millis(100);
        let mut b = BatchAssembler::new(1);
        b.offer(&t(), event(10)).unwrap();
        assert_eq!(
            b.ready(now, now + Duration::from_secs(1), false, Some(pace)),
            Ready::Send
        );
    }
}
