//! `compare_against_client_token` follows `compareAgainstClientResumeToken` (§5.7): fields are
//! compared in token order, the version is ignored, and a client token naming a fragment of an
//! unsplit event asks for a split.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

mod common;

use std::cmp::Ordering;

use bson::{Document, Uuid, doc};
use proptest::prelude::*;
use resume::ResumeStatus::{CheckNextDoc, FoundToken, NeedsSplit, SurpassedToken};
use resume::{
    ClusterTime, ResumeTokenData, TokenVersion, compare_against_client_token, event_identifier,
};

const T: ClusterTime = ClusterTime::new(100, 5);

fn uuid(b: u8) -> Uuid {
    Uuid::from_bytes([b; 16])
}

fn insert(id: i32) -> Document {
    event_identifier("insert", Some(("documentKey", doc! {"_id": id})))
}

fn ev(ts: ClusterTime, txn: u32, u: u8, id: i32) -> ResumeTokenData {
    ResumeTokenData::event(ts, TokenVersion::V2, txn, Some(uuid(u)), Some(insert(id))).unwrap()
}

#[test]
fn the_same_event_is_the_resume_point() {
    assert_eq!(
        compare_against_client_token(&ev(T, 0, 1, 1), &ev(T, 0, 1, 1)),
        FoundToken
    );
}

#[test]
fn numerically_equal_document_keys_match() {
    let client = ResumeTokenData::event(
        T,
        TokenVersion::V2,
        0,
        Some(uuid(1)),
        Some(event_identifier(
            "insert",
            Some(("documentKey", doc! {"_id": 1.0})),
        )),
    )
    .unwrap();
    assert_eq!(
        compare_against_client_token(&ev(T, 0, 1, 1), &client),
        FoundToken
    );
}

#[test]
fn later_cluster_time_surpasses() {
    assert_eq!(
        compare_against_client_token(&ev(T.next(), 0, 1, 1), &ev(T, 9, 9, 9)),
        SurpassedToken
    );
    assert_eq!(
        compare_against_client_token(&ev(T.prev(), 9, 9, 9), &ev(T, 0, 1, 1)),
        CheckNextDoc
    );
}

#[test]
fn an_event_at_a_high_water_mark_time_surpasses_it() {
    let hwm = ResumeTokenData::high_water_mark(T, TokenVersion::V2);
    assert_eq!(
        compare_against_client_token(&ev(T, 0, 1, 1), &hwm),
        SurpassedToken
    );
    assert_eq!(
        compare_against_client_token(&hwm, &ev(T, 0, 1, 1)),
        CheckNextDoc
    );
    assert_eq!(compare_against_client_token(&hwm, &hwm), FoundToken);
}

#[test]
fn txn_op_index_orders_within_a_transaction() {
    assert_eq!(
        compare_against_client_token(&ev(T, 1, 1, 1), &ev(T, 2, 1, 1)),
        CheckNextDoc
    );
    assert_eq!(
        compare_against_client_token(&ev(T, 3, 1, 1), &ev(T, 2, 1, 1)),
        SurpassedToken
    );
}

#[test]
fn an_invalidate_follows_its_trigger() {
    let trigger = ev(T, 0, 1, 1);
    let invalidate = ev(T, 0, 1, 1).with_from_invalidate(true);
    assert_eq!(
        compare_against_client_token(&invalidate, &trigger),
        SurpassedToken
    );
    assert_eq!(
        compare_against_client_token(&trigger, &invalidate),
        CheckNextDoc
    );
}

#[test]
fn uuid_then_identifier_decide() {
    assert_eq!(
        compare_against_client_token(&ev(T, 0, 1, 9), &ev(T, 0, 2, 1)),
        CheckNextDoc
    );
    assert_eq!(
        compare_against_client_token(&ev(T, 0, 3, 1), &ev(T, 0, 2, 9)),
        SurpassedToken
    );
    assert_eq!(
        compare_against_client_token(&ev(T, 0, 1, 1), &ev(T, 0, 1, 2)),
        CheckNextDoc
    );
    assert_eq!(
        compare_against_client_token(&ev(T, 0, 1, 3), &ev(T, 0, 1, 2)),
        SurpassedToken
    );
}

#[test]
fn version_is_ignored() {
    let v1 =
        ResumeTokenData::event(T, TokenVersion::V1, 0, Some(uuid(1)), Some(insert(1))).unwrap();
    assert_eq!(
        compare_against_client_token(&v1, &ev(T, 0, 1, 1)),
        FoundToken
    );
    assert!(
        v1.encode() < ev(T, 0, 1, 1).encode(),
        "but v1 sorts before v2 by bytes"
    );
}

#[test]
fn fragments() {
    let frag = |n: Option<u32>| ev(T, 0, 1, 1).with_fragment_num(n).unwrap();
    assert_eq!(
        compare_against_client_token(&frag(None), &frag(Some(2))),
        NeedsSplit
    );
    assert_eq!(
        compare_against_client_token(&frag(Some(1)), &frag(Some(2))),
        CheckNextDoc
    );
    assert_eq!(
        compare_against_client_token(&frag(Some(2)), &frag(Some(2))),
        FoundToken
    );
    assert_eq!(
        compare_against_client_token(&frag(Some(3)), &frag(Some(2))),
        SurpassedToken
    );
    assert_eq!(
        compare_against_client_token(&frag(Some(0)), &frag(None)),
        SurpassedToken
    );
}

proptest! {
    /// Apart from `NeedsSplit`, the status is the logical order with the version ignored:
    /// before → CheckNextDoc, equal → FoundToken, after → SurpassedToken.
    #[test]
    fn status_agrees_with_logical_order_ignoring_version(
        a in common::arb_token(true),
        b in common::arb_token(true),
    ) {
        let status = compare_against_client_token(&a, &b);
        // Only compare byte-wise when the layouts agree (same version).
        if a.version() == b.version() {
            let order = a.encode().data().cmp(b.encode().data());
            let expected = match order {
                Ordering::Less => CheckNextDoc,
                Ordering::Equal => FoundToken,
                Ordering::Greater => SurpassedToken,
            };
            if status != NeedsSplit {
                prop_assert_eq!(status, expected, "{} vs {}", a, b);
            } else {
                prop_assert!(a.fragment_num().is_none() && b.fragment_num().is_some());
            }
        }
    }
}
