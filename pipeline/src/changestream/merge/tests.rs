use bson::doc;
use proptest::prelude::*;
use resume::token::{ResumeTokenData, TokenVersion};

use super::*;
use crate::changestream::test_util::*;

fn ins(secs: u32, id: i32) -> ChangeEvent {
    event(insert_token(secs, 0, id), doc! {"operationType": "insert"})
}

fn hwm(secs: u32) -> ResumeToken {
    ResumeTokenData::high_water_mark(ct(secs, 0), TokenVersion::V2).encode()
}

fn drain(m: &mut Merger) -> Vec<ResumeToken> {
    std::iter::from_fn(|| m.pop_ready())
        .map(|e| e.token)
        .collect()
}

#[test]
fn nothing_is_released_until_every_shard_has_promised() {
    let mut m = Merger::new(2, None);
    m.push_batch(0, vec![ins(5, 1)], hwm(100)).unwrap();
    assert!(m.pop_ready().is_none());
    assert_eq!(m.post_batch_resume_token(), None);
    m.push_batch(1, vec![], hwm(3)).unwrap();
    assert!(
        m.pop_ready().is_none(),
        "shard 1 may still send something before ts 5"
    );
    assert_eq!(m.post_batch_resume_token(), Some(hwm(3)));
    m.push_batch(1, vec![], hwm(6)).unwrap();
    assert_eq!(drain(&mut m), [ins(5, 1).token]);
    assert_eq!(m.post_batch_resume_token(), Some(hwm(6)));
}

#[test]
fn events_interleave_by_token() {
    let mut m = Merger::new(3, Some(hwm(1)));
    assert_eq!(m.post_batch_resume_token(), Some(hwm(1)));
    m.push_batch(0, vec![ins(2, 1), ins(7, 2)], hwm(10))
        .unwrap();
    m.push_batch(1, vec![ins(3, 3), ins(4, 4)], hwm(10))
        .unwrap();
    m.push_batch(2, vec![ins(2, 9)], hwm(5)).unwrap();
    let got = drain(&mut m);
    assert_eq!(
        got,
        [
            ins(2, 1).token,
            ins(2, 9).token,
            ins(3, 3).token,
            ins(4, 4).token
        ]
    );
    // ins(7) waits for shard 2's promise.
    assert_eq!(m.post_batch_resume_token(), Some(hwm(5)));
    assert_eq!(m.buffered(), 1);
    m.push_batch(2, vec![], hwm(8)).unwrap();
    assert_eq!(drain(&mut m), [ins(7, 2).token]);
}

#[test]
fn the_same_event_from_two_shards_is_released_once() {
    let mut m = Merger::new(2, None);
    m.push_batch(0, vec![ins(5, 1)], hwm(9)).unwrap();
    m.push_batch(1, vec![ins(5, 1)], hwm(9)).unwrap();
    assert_eq!(drain(&mut m), [ins(5, 1).token]);
}

#[test]
fn out_of_order_batches_are_rejected_without_side_effects() {
    let mut m = Merger::new(1, None);
    m.push_batch(0, vec![ins(5, 1)], hwm(6)).unwrap();
    assert!(m.push_batch(0, vec![ins(4, 1)], hwm(9)).is_err());
    assert!(m.push_batch(0, vec![ins(7, 1), ins(6, 1)], hwm(9)).is_err());
    assert!(m.push_batch(7, vec![], hwm(9)).is_err());
    assert_eq!(drain(&mut m), [ins(5, 1).token]);
    // A smaller promise does not move the promise back.
    m.push_batch(0, vec![], hwm(2)).unwrap();
    assert_eq!(m.min_promise().map(|(_, t)| t.clone()), Some(hwm(6)));
}

#[test]
fn a_new_shard_holds_the_merge_until_it_promises() {
    let mut m = Merger::new(1, None);
    m.push_batch(0, vec![ins(5, 1)], hwm(9)).unwrap();
    let s = m.add_shard();
    assert!(m.pop_ready().is_none());
    m.push_batch(s, vec![], hwm(9)).unwrap();
    assert_eq!(drain(&mut m).len(), 1);
}

#[test]
fn sharded_drop_invalidates_once_earlier_events_are_out() {
    let s = coll_spec("db", "c");
    let mut t = crate::changestream::transform::Transformer::new(&s);
    let drop = t
        .transform(&cmd("db", 5, doc! {"drop": "c"}))
        .unwrap()
        .unwrap();
    let inv = crate::changestream::invalidate::invalidate_event(&drop);
    let mut m = Merger::new(2, None);
    // Shard 0 applied the drop at ts 5 and closed; shard 1 has an insert at ts 4 and one at 6.
    m.push_batch(0, vec![drop.clone(), inv.clone()], inv.token.clone())
        .unwrap();
    m.mark_invalidated(0);
    m.push_batch(1, vec![ins(4, 1), ins(6, 2)], hwm(7)).unwrap();
    assert!(m.invalidated().is_none(), "events are still ready");
    let got = drain(&mut m);
    assert_eq!(got, [ins(4, 1).token, drop.token, inv.token.clone()]);
    assert_eq!(m.invalidated(), Some(&inv.token));
    assert_eq!(m.post_batch_resume_token(), Some(inv.token.clone()));
    assert!(m.pop_ready().is_none(), "nothing after the invalidate");
    assert!(m.push_batch(0, vec![ins(9, 9)], hwm(10)).is_err());
}

/// One shard's stream: sorted distinct event times, cut into batches, each with a promise
/// between its last event and the next batch's first.
fn shard_stream() -> impl Strategy<Value = Vec<(Vec<u32>, u32)>> {
    (
        prop::collection::btree_set(1u32..400, 0..25),
        prop::collection::vec(0usize..4, 0..30),
    )
        .prop_map(|(times, cuts)| {
            let times: Vec<u32> = times.into_iter().collect();
            let mut batches = Vec::new();
            let mut i = 0;
            for c in cuts {
                let end = (i + c).min(times.len());
                let events = times.get(i..end).unwrap_or_default().to_vec();
                // Promise: a high-water mark at most the next event's time (which sorts before
                // the event), at least the last event's time + 1.
                let next = times.get(end).copied().unwrap_or(500);
                let last = events.last().copied().unwrap_or(0);
                let promise = next.max(last + 1);
                batches.push((events, promise));
                i = end;
            }
            let rest = times.get(i..).unwrap_or_default().to_vec();
            batches.push((rest, 500));
            batches
        })
}

proptest! {
    /// Released tokens strictly increase, each is ≤ every promise at release time, and once all
    /// promises pass everything, every pushed event has been released exactly once, in global
    /// token order (so no later promise could have preceded a released event).
    #[test]
    fn merge_releases_every_event_once_in_token_order(
        shards in prop::collection::vec(shard_stream(), 1..5),
        schedule in prop::collection::vec((0usize..5, any::<bool>()), 0..80),
    ) {
        let n = shards.len();
        let mut m = Merger::new(n, None);
        let mut next_batch = vec![0usize; n];
        let mut released: Vec<ResumeToken> = Vec::new();
        let mut last_pbrt: Option<ResumeToken> = None;
        let mut all: Vec<ResumeToken> = Vec::new();
        let mut push = |m: &mut Merger, s: usize, all: &mut Vec<ResumeToken>| {
            let Some((events, promise)) = shards[s].get(next_batch[s]) else { return };
            next_batch[s] += 1;
            // Events are distinct across shards: the id names the shard.
            let evs: Vec<ChangeEvent> = events.iter().map(|t| ins(*t, s as i32)).collect();
            all.extend(evs.iter().map(|e| e.token.clone()));
            m.push_batch(s, evs, hwm(*promise)).unwrap();
        };
        let pop = |m: &mut Merger, released: &mut Vec<ResumeToken>| {
            while let Some(e) = m.pop_ready() {
                let (_, min) = m.min_promise().unwrap();
                prop_assert!(e.token <= *min);
                if let Some(last) = released.last() {
                    prop_assert!(e.token > *last);
                }
                let pbrt = m.post_batch_resume_token().unwrap();
                prop_assert!(pbrt >= e.token);
                released.push(e.token);
            }
            Ok(())
        };
        for (s, do_pop) in schedule {
            push(&mut m, s % n, &mut all);
            if do_pop {
                pop(&mut m, &mut released)?;
            }
            // While nothing is ready, some shard holds nothing (a reader that waits only on
            // shards holding little never waits on none).
            if !m.has_ready() {
                prop_assert!((0..n).any(|s| m.buffered_of(s) == 0));
            }
            // The reported post-batch resume token never goes backwards, and never passes an
            // event that is still buffered.
            let pbrt = m.post_batch_resume_token();
            prop_assert!(pbrt >= last_pbrt);
            if let Some(p) = &pbrt {
                prop_assert!(m.remotes.iter().flat_map(|r| r.buffer.iter()).all(|e| e.token > *p));
            }
            last_pbrt = pbrt;
        }
        // Flush: every shard sends its remaining batches, ending with a promise past everything.
        for (s, batches) in shards.iter().enumerate() {
            for _ in 0..batches.len() {
                push(&mut m, s, &mut all);
            }
        }
        pop(&mut m, &mut released)?;
        all.sort();
        prop_assert_eq!(released, all);
        prop_assert_eq!(m.buffered(), 0);
    }
}
