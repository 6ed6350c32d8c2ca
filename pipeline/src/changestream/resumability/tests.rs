use bson::doc;
use resume::token::{ResumeStatus, ResumeTokenData, TokenVersion};

use super::*;
use crate::changestream::test_util::*;

fn ins(secs: u32, txn: u32, id: i32) -> ChangeEvent {
    event(
        insert_token(secs, txn, id),
        doc! {"operationType": "insert"},
    )
}

#[test]
fn check_resumability_swallows_only_events_before_the_client_token() {
    let start = StartPoint::ResumeAfter(insert_token(10, 1, 5));
    let mut c = CheckResumability::new(&start);
    let cases = [
        (ins(9, 0, 1), Some(ResumeStatus::CheckNextDoc)),
        (ins(10, 0, 9), Some(ResumeStatus::CheckNextDoc)),
        (ins(10, 1, 5), Some(ResumeStatus::FoundToken)),
        (ins(10, 1, 6), Some(ResumeStatus::SurpassedToken)),
        // Pass-through once surpassed.
        (ins(3, 0, 1), None),
    ];
    for (e, want) in cases {
        assert_eq!(c.check(&e), want, "{}", e.data);
    }
    // No client token: nothing to check.
    assert_eq!(
        CheckResumability::new(&StartPoint::None).check(&ins(1, 0, 1)),
        None
    );
}

#[test]
fn ensure_resume_token_present_swallows_up_to_and_including_the_token() {
    let start = StartPoint::ResumeAfter(insert_token(10, 1, 5));
    let mut e = EnsureResumeTokenPresent::new(&start);
    assert!(!e.done());
    assert!(e.process(ins(9, 0, 1)).unwrap().is_none());
    assert!(e.process(ins(10, 1, 5)).unwrap().is_none());
    // startAfter on several shards: the same token again is swallowed too.
    assert!(e.process(ins(10, 1, 5)).unwrap().is_none());
    assert!(!e.done());
    let next = e.process(ins(11, 0, 1)).unwrap().unwrap();
    assert_eq!(next.data, insert_token(11, 0, 1));
    assert!(e.done());
    assert!(e.process(ins(12, 0, 1)).unwrap().is_some());
}

#[test]
fn passing_the_token_unseen_is_a_fatal_280() {
    let start = StartPoint::ResumeAfter(insert_token(10, 1, 5));
    let mut e = EnsureResumeTokenPresent::new(&start);
    let err = e.process(ins(10, 2, 1)).unwrap_err();
    assert_eq!(err.code, 280);
    assert_eq!(err.code_name, "ChangeStreamFatalError");
    assert!(err.has_label("NonResumableChangeStreamError"));
    assert!(err.errmsg.contains("resume token was not found"));
}

#[test]
fn a_promise_past_the_token_unseen_is_a_fatal_280_too() {
    let start = StartPoint::ResumeAfter(insert_token(10, 1, 5));
    let mut e = EnsureResumeTokenPresent::new(&start);
    let at = |secs, inc| ResumeTokenData::high_water_mark(ct(secs, inc), TokenVersion::V2);
    assert!(e.check_promise(&at(10, 1)).is_ok(), "not past it yet");
    let err = e.check_promise(&at(10, 2)).unwrap_err();
    assert_eq!(err.code, 280);
    assert!(err.errmsg.contains("another cluster"), "{}", err.errmsg);
    // Seen, then passed: fine.
    assert!(e.process(ins(10, 1, 5)).unwrap().is_none());
    assert!(e.check_promise(&at(10, 2)).is_ok());
}

#[test]
fn high_water_mark_and_time_starts_need_no_proof() {
    let hwm = ResumeTokenData::high_water_mark(ct(10, 1), TokenVersion::V2);
    for start in [
        StartPoint::None,
        StartPoint::StartAtOperationTime(ct(10, 1)),
        StartPoint::ResumeAfter(hwm),
    ] {
        let mut e = EnsureResumeTokenPresent::new(&start);
        assert!(e.done());
        assert!(e.process(ins(10, 1, 5)).unwrap().is_some());
    }
}

#[test]
fn history_lost_when_the_oplog_starts_after_the_resume_point() {
    assert!(check_history(ct(10, 1), ct(10, 1)).is_ok());
    assert!(check_history(ct(10, 1), ct(9, 0)).is_ok());
    let err = check_history(ct(10, 1), ct(10, 2)).unwrap_err();
    assert_eq!(err.code, 286);
}

#[test]
fn version_policy_issues_v2_without_a_legacy_client_token() {
    let build = |v| ResumeTokenData::event(ct(10, 1), v, 0, Some(buuid(1)), Some(doc! {"_id": 1}));
    let mut p = TokenVersionPolicy::new(&StartPoint::ResumeAfter(insert_token(10, 0, 1)));
    let v2 = |v| {
        ResumeTokenData::event(
            ct(10, 1),
            v,
            0,
            Some(buuid(1)),
            Some(resume::token::event_identifier(
                "insert",
                Some(("documentKey", doc! {"_id": 1})),
            )),
        )
    };
    assert_eq!(p.make(v2).unwrap().version(), TokenVersion::V2);
    // A v1 client token: v1 at the token, v2 strictly after it.
    let client = build(TokenVersion::V1).unwrap();
    let mut p = TokenVersionPolicy::new(&StartPoint::StartAfter(client.clone()));
    assert_eq!(p.make(build).unwrap(), client);
    let later = |v| ResumeTokenData::event(ct(11, 1), v, 0, Some(buuid(1)), Some(doc! {"_id": 1}));
    assert_eq!(p.make(later).unwrap().version(), TokenVersion::V2);
    // And it never goes back.
    assert_eq!(p.make(build).unwrap().version(), TokenVersion::V2);
}
