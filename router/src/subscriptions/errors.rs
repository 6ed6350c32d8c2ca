//! The errors subscriptions add, each a MongoDB error document with a stable code (9100–9106,
//! listed in the guide's error table); bad options use MongoDB's own codes.

use wire::{ErrorCode, MongoError};

pub fn not_found(id: &str) -> MongoError {
    MongoError::new(
        ErrorCode::SUBSCRIPTION_NOT_FOUND,
        format!("no subscription '{id}'"),
    )
}

pub fn consumer_not_found(id: &str, consumer: &str) -> MongoError {
    MongoError::new(
        ErrorCode::CONSUMER_NOT_FOUND,
        format!("subscription '{id}' has no consumer '{consumer}'"),
    )
}

pub fn exists(id: &str) -> MongoError {
    MongoError::new(
        ErrorCode::SUBSCRIPTION_EXISTS,
        format!("subscription '{id}' exists already with another definition"),
    )
}

pub fn expired(id: &str, consumer: &str) -> MongoError {
    MongoError::new(
        ErrorCode::SUBSCRIPTION_EXPIRED,
        format!(
            "consumer '{consumer}' of subscription '{id}' fell further behind than its maxLag \
             allows and expired; reset it (alterSubscription with reset) to go on"
        ),
    )
}

pub fn reset_required(id: &str, consumer: &str, why: &str) -> MongoError {
    MongoError::new(
        ErrorCode::SUBSCRIPTION_RESET_REQUIRED,
        format!(
            "consumer '{consumer}' of subscription '{id}' cannot go on from where it stands \
             ({why}); reset it (alterSubscription with reset)"
        ),
    )
}

pub fn reserved(ns: &str) -> MongoError {
    MongoError::new(
        ErrorCode::RESERVED_NAMESPACE,
        format!("{ns} holds the subscriptions' state: it is read-only to users"),
    )
}

pub fn lease_moved(id: &str, consumer: &str, owner: &str, for_ms: u64) -> MongoError {
    MongoError::new(
        ErrorCode::CONSUMER_LEASE_MOVED,
        format!(
            "consumer '{consumer}' of subscription '{id}' is served by the router at {owner} \
             for up to {for_ms} ms more: read it there, or again after that"
        ),
    )
}

/// [`lease_moved`] naming the owner's address (`errInfo.owner`): the router that got the
/// command may forward it there.
pub fn lease_held_at(id: &str, consumer: &str, owner: &str, for_ms: u64) -> MongoError {
    lease_moved(id, consumer, owner, for_ms).with_extra(bson::doc! {
        "errInfo": {"owner": owner, "retryAfterMS": for_ms as i64},
    })
}

/// The address of the router holding a consumer's lease, from a [`lease_held_at`] error.
pub fn owner_of(e: &MongoError) -> Option<&str> {
    if e.code != ErrorCode::CONSUMER_LEASE_MOVED.code {
        return None;
    }
    e.extra
        .as_ref()?
        .get_document("errInfo")
        .ok()?
        .get_str("owner")
        .ok()
}
