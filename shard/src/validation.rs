//! Document validation: a collection's `validator`, `validationLevel` and `validationAction`
//! options, checked when `create` / `collMod` set them and enforced on every document an
//! insert, update, replacement, upsert or findAndModify is about to write.
//!
//! Invariants:
//! * The options stored in a catalog entry always parse ([`check_options`] runs before any DDL
//!   writes them), so enforcement never meets a bad validator.
//! * A refused document fails its statement with `DocumentValidationFailure` (121) before
//!   anything of the statement is written; `errInfo` is
//!   `{failingDocumentId, details}` as in MongoDB 7.0.
//! * `validationLevel: "off"`, an empty validator and `bypassDocumentValidation` skip the check;
//!   `moderate` skips it for updates of documents that already fail the validator;
//!   `validationAction: "warn"` logs the failure and lets the write through.
//! * Deletes are never validated.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bson::{Bson, Document, Uuid, doc};
use pipeline::validator::Validator;
use wire::{ErrorCode, MongoError};

use crate::catalog::CollectionEntry;

/// `validationLevel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Off,
    Strict,
    Moderate,
}

/// `validationAction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Error,
    Warn,
}

/// A collection's parsed validation options.
#[derive(Debug)]
pub struct Rules {
    validator: Validator,
    level: Level,
    action: Action,
}

fn wrong_type(cmd: &str, field: &str, v: &Bson, want: &str) -> MongoError {
    MongoError::type_mismatch(format!(
        "BSON field '{cmd}.{field}' is the wrong type '{}', expected type '{want}'",
        pipeline::value::type_name(v)
    ))
}

fn enumeration<T: Copy>(
    cmd: &str,
    field: &str,
    v: Option<&Bson>,
    default: T,
    values: &[(&str, T)],
) -> Result<T, MongoError> {
    let Some(v) = v else { return Ok(default) };
    let Bson::String(s) = v else {
        return Err(wrong_type(cmd, field, v, "string"));
    };
    values
        .iter()
        .find(|(name, _)| name == s)
        .map(|(_, t)| *t)
        .ok_or_else(|| {
            MongoError::bad_value(format!(
                "Enumeration value '{s}' for field '{cmd}.{field}' is not a valid value."
            ))
        })
}

fn level(cmd: &str, options: &Document) -> Result<Level, MongoError> {
    enumeration(
        cmd,
        "validationLevel",
        options.get("validationLevel"),
        Level::Strict,
        &[
            ("off", Level::Off),
            ("strict", Level::Strict),
            ("moderate", Level::Moderate),
        ],
    )
}

fn action(cmd: &str, options: &Document) -> Result<Action, MongoError> {
    enumeration(
        cmd,
        "validationAction",
        options.get("validationAction"),
        Action::Error,
        &[("error", Action::Error), ("warn", Action::Warn)],
    )
}

/// Checks the validation options of a `create` or `collMod` (`cmd`) on `db.coll`, refusing
/// what MongoDB refuses: wrongly typed or unknown values, validators MongoDB cannot run
/// (`$where`, `$text`, geo-near, bad `$jsonSchema`), validators on views and on the internal
/// databases and system collections.
pub fn check_options(
    cmd: &str,
    db: &str,
    coll: &str,
    options: &Document,
) -> Result<(), MongoError> {
    level(cmd, options)?;
    action(cmd, options)?;
    let Some(v) = options.get("validator") else {
        return Ok(());
    };
    let Bson::Document(spec) = v else {
        return Err(wrong_type(cmd, "validator", v, "object"));
    };
    if spec.is_empty() {
        return Ok(());
    }
    if options.contains_key("viewOn") {
        return Err(MongoError::new(
            ErrorCode::INVALID_OPTIONS,
            "option not supported on a view: validator",
        ));
    }
    if matches!(db, "admin" | "local" | "config") {
        return Err(MongoError::new(
            ErrorCode::INVALID_OPTIONS,
            format!("Document validators are not allowed on collections in the {db} database"),
        ));
    }
    if coll.starts_with("system.") {
        return Err(MongoError::new(
            ErrorCode::INVALID_OPTIONS,
            format!("Document validators not allowed on system collection {db}.{coll}"),
        ));
    }
    Validator::parse(spec)?;
    Ok(())
}

/// The collection's validation rules, or `None` when nothing is to be checked. Parsed rules
/// are cached by collection UUID and reused while the options stay the same.
pub fn rules_of(coll: &CollectionEntry) -> Option<Arc<Rules>> {
    let spec = match coll.options.get("validator") {
        Some(Bson::Document(d)) if !d.is_empty() => d,
        _ => return None,
    };
    let level_opt = coll.options.get("validationLevel");
    let action_opt = coll.options.get("validationAction");
    type Cache = HashMap<Uuid, (CacheKey, Arc<Rules>)>;
    type CacheKey = (Document, Option<Bson>, Option<Bson>);
    static CACHE: Mutex<Option<Cache>> = Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some(((s, l, a), rules)) = cache.get(&coll.uuid)
        && s == spec
        && l.as_ref() == level_opt
        && a.as_ref() == action_opt
    {
        return Some(rules.clone());
    }
    let key = (spec.clone(), level_opt.cloned(), action_opt.cloned());
    // Stored options were checked when set; one that does not parse validates nothing.
    let rules = Arc::new(Rules {
        validator: Validator::parse(spec).ok()?,
        level: level("create", &coll.options).ok()?,
        action: action("create", &coll.options).ok()?,
    });
    if cache.len() >= 1024 {
        cache.clear();
    }
    cache.insert(coll.uuid, (key, rules.clone()));
    Some(rules)
}

/// Checks `new`, about to be written to `coll` (replacing `old` for an update) at wall-clock
/// time `wall_ms` (the validator's `$$NOW`). `bypass`: the command's `bypassDocumentValidation`.
pub fn check(
    coll: &CollectionEntry,
    old: Option<&Document>,
    new: &Document,
    bypass: bool,
    wall_ms: u64,
) -> Result<(), MongoError> {
    if bypass {
        return Ok(());
    }
    let Some(rules) = rules_of(coll) else {
        return Ok(());
    };
    let now = bson::DateTime::from_millis(i64::try_from(wall_ms).unwrap_or(i64::MAX));
    if rules.level == Level::Off || rules.validator.is_empty() || rules.validator.matches(new, now)
    {
        return Ok(());
    }
    if rules.level == Level::Moderate && old.is_some_and(|o| !rules.validator.matches(o, now)) {
        return Ok(());
    }
    let err_info = doc! {
        "failingDocumentId": new.get("_id").cloned().unwrap_or(Bson::Null),
        "details": rules.validator.explain(new, now),
    };
    if rules.action == Action::Warn {
        tracing::warn!(ns = %coll.ns(), errInfo = %err_info, "Document would fail validation");
        return Ok(());
    }
    Err(MongoError::new(
        ErrorCode::DOCUMENT_VALIDATION_FAILURE,
        "Document failed validation",
    )
    .with_extra(doc! {"errInfo": err_info}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coll(options: Document) -> CollectionEntry {
        CollectionEntry::new("db", "c", Uuid::new(), options)
    }

    #[test]
    fn strict_refuses_with_121_and_err_info() {
        let c = coll(doc! {"validator": {"a": {"$type": "int"}}});
        assert!(check(&c, None, &doc! {"_id": 1, "a": 1}, false, 0).is_ok());
        let e = check(&c, None, &doc! {"_id": 2, "a": "x"}, false, 0).unwrap_err();
        assert_eq!(e.code, 121);
        assert_eq!(e.code_name, "DocumentValidationFailure");
        assert_eq!(e.errmsg, "Document failed validation");
        let info = e.extra.unwrap().get_document("errInfo").unwrap().clone();
        assert_eq!(info.get_i32("failingDocumentId").unwrap(), 2);
        assert_eq!(
            info.get_document("details")
                .unwrap()
                .get_str("operatorName")
                .unwrap(),
            "$type"
        );
    }

    #[test]
    fn moderate_lets_invalid_documents_be_updated_but_not_valid_ones_broken() {
        let c = coll(doc! {"validator": {"a": {"$gt": 0}}, "validationLevel": "moderate"});
        let bad_old = doc! {"_id": 1, "a": -5};
        let good_old = doc! {"_id": 1, "a": 5};
        let bad_new = doc! {"_id": 1, "a": -1};
        assert!(check(&c, Some(&bad_old), &bad_new, false, 0).is_ok());
        assert_eq!(
            check(&c, Some(&good_old), &bad_new, false, 0)
                .unwrap_err()
                .code,
            121
        );
        assert_eq!(check(&c, None, &bad_new, false, 0).unwrap_err().code, 121);
        let strict = coll(doc! {"validator": {"a": {"$gt": 0}}});
        assert_eq!(
            check(&strict, Some(&bad_old), &bad_new, false, 0)
                .unwrap_err()
                .code,
            121
        );
    }

    #[test]
    fn off_warn_bypass_and_empty_validators_let_writes_through() {
        let bad = doc! {"_id": 1, "a": "x"};
        for options in [
            doc! {"validator": {"a": 1}, "validationLevel": "off"},
            doc! {"validator": {"a": 1}, "validationAction": "warn"},
            doc! {"validator": {}},
            doc! {},
        ] {
            assert!(check(&coll(options), None, &bad, false, 0).is_ok());
        }
        assert!(check(&coll(doc! {"validator": {"a": 1}}), None, &bad, true, 0).is_ok());
    }

    #[test]
    fn options_are_checked_with_mongodb_codes() {
        let ok = |o: Document| check_options("create", "db", "c", &o);
        assert!(
            ok(doc! {"validator": {"a": 1}, "validationLevel": "moderate", "validationAction": "warn"})
                .is_ok()
        );
        assert_eq!(ok(doc! {"validator": 1}).unwrap_err().code, 14);
        assert_eq!(ok(doc! {"validationLevel": "x"}).unwrap_err().code, 2);
        assert_eq!(ok(doc! {"validationLevel": 1}).unwrap_err().code, 14);
        assert_eq!(ok(doc! {"validationAction": "x"}).unwrap_err().code, 2);
        assert_eq!(
            ok(doc! {"validator": {"$where": "1"}}).unwrap_err().code,
            224
        );
        assert_eq!(
            ok(doc! {"validator": {"$jsonSchema": {"foo": 1}}})
                .unwrap_err()
                .code,
            9
        );
        assert_eq!(
            check_options("create", "admin", "c", &doc! {"validator": {"a": 1}})
                .unwrap_err()
                .code,
            72
        );
        assert_eq!(
            check_options("create", "db", "system.x", &doc! {"validator": {"a": 1}})
                .unwrap_err()
                .code,
            72
        );
    }
}
