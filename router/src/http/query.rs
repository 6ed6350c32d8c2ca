//! What an HTTP feed request asks for, parsed from its query string: the stream's scope and
//! start, the page's size and wait, the `watch()` options, and how events are rendered.
//!
//! Pure: no I/O. Invariants: every value is bounded before it is used (at most
//! [`MAX_PARAMS`] parameters, none twice, a `match` of at most [`MAX_MATCH_BYTES`]); a
//! request that asks for anything else is refused with the MongoDB error a driver would get
//! for the same option (`BadValue`, `FailedToParse`), never half-read.

use std::time::Duration;

use bson::{Bson, Document, doc};
use wire::{MongoError, Result};

pub const MAX_PARAMS: usize = 32;
pub const MAX_MATCH_BYTES: usize = 16 * 1024;
pub const DEFAULT_LIMIT: u32 = 1000;
pub const MAX_LIMIT: u32 = 10_000;
pub const MAX_WAIT_MS: u64 = 60_000;
pub const DEFAULT_HEARTBEAT_MS: u64 = 15_000;
/// The longest cursor taken (a resume token's hex, with room for its type bits).
pub const MAX_CURSOR_LEN: usize = 8 * 1024;

/// A query string's parameters, percent-decoded, in order.
pub fn params(query: &str) -> Result<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        if out.len() == MAX_PARAMS {
            return Err(MongoError::bad_value(format!(
                "more than {MAX_PARAMS} query parameters"
            )));
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (k, v) = (decode(k)?, decode(v)?);
        if out.iter().any(|(seen, _)| *seen == k) {
            return Err(MongoError::bad_value(format!(
                "query parameter '{k}' given twice"
            )));
        }
        out.push((k, v));
    }
    Ok(out)
}

fn decode(s: &str) -> Result<String> {
    let bad = || MongoError::bad_value("a query parameter is not valid percent-encoded UTF-8");
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).ok_or_else(bad)?;
                let hex = std::str::from_utf8(hex).map_err(|_| bad())?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| bad())
}

/// What a stream watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Cluster,
    Database(String),
    Collection(String, String),
}

impl Scope {
    /// `ns=` as `<db>` or `<db>.<coll>`; none (or empty) is the whole cluster.
    pub fn parse(ns: Option<&str>) -> Result<Scope> {
        let Some(ns) = ns.filter(|n| !n.is_empty()) else {
            return Ok(Scope::Cluster);
        };
        let scope = match ns.split_once('.') {
            Some((db, coll)) => Scope::Collection(db.to_string(), coll.to_string()),
            None => Scope::Database(ns.to_string()),
        };
        let (Scope::Database(db) | Scope::Collection(db, _)) = &scope else {
            return Ok(scope);
        };
        if db.is_empty() || db.len() > 64 || db.contains(['/', '\\', ' ', '"', '$', '\0']) {
            return Err(MongoError::new(
                wire::ErrorCode::INVALID_NAMESPACE,
                format!("'{ns}' is not a valid namespace"),
            ));
        }
        if let Scope::Collection(_, coll) = &scope
            && (coll.is_empty() || coll.contains('\0') || coll.len() > 255)
        {
            return Err(MongoError::new(
                wire::ErrorCode::INVALID_NAMESPACE,
                format!("'{ns}' is not a valid namespace"),
            ));
        }
        Ok(scope)
    }

    /// The database an `aggregate` watching it runs on, and the `aggregate` field's value.
    fn target(&self) -> (&str, Bson) {
        match self {
            Scope::Cluster => ("admin", Bson::Int32(1)),
            Scope::Database(db) => (db, Bson::Int32(1)),
            Scope::Collection(db, coll) => (db, Bson::String(coll.clone())),
        }
    }

    /// The `changeStreamBounds` command for this scope, and its database.
    pub fn bounds_command(&self) -> (&str, Document) {
        let (db, target) = self.target();
        let mut cmd = doc! {"changeStreamBounds": target};
        if *self == Scope::Cluster {
            cmd.insert("allChangesForCluster", true);
        }
        (db, cmd)
    }
}

/// Where a feed starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum From {
    /// The oldest change kept (the earliest marker).
    Oldest,
    /// After every change committed so far (as `watch()` without a start).
    Head,
    /// After the change (or position) this cursor names: a resume token.
    After(Document),
}

/// A resume token as a cursor: its `_data` hex, then `~` and its `_typeBits` as hex when it
/// has them.
pub fn cursor_of(token: &Document) -> Option<String> {
    let data = token.get_str("_data").ok()?;
    match token.get("_typeBits") {
        Some(Bson::Binary(b)) => Some(format!("{data}~{}", hex(&b.bytes))),
        _ => Some(data.to_string()),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The resume token a cursor names (its form only: the stream judges the token).
pub fn token_of(cursor: &str) -> Result<Document> {
    let bad = || {
        MongoError::new(
            wire::ErrorCode::INVALID_RESUME_TOKEN,
            "the cursor is not a resume token",
        )
    };
    if cursor.is_empty() || cursor.len() > MAX_CURSOR_LEN {
        return Err(bad());
    }
    let (data, type_bits) = match cursor.split_once('~') {
        Some((d, t)) => (d, Some(t)),
        None => (cursor, None),
    };
    let is_hex = |s: &str| s.len().is_multiple_of(2) && s.bytes().all(|b| b.is_ascii_hexdigit());
    if data.is_empty() || !is_hex(data) || !type_bits.is_none_or(is_hex) {
        return Err(bad());
    }
    let mut token = doc! {"_data": data.to_ascii_uppercase()};
    if let Some(t) = type_bits {
        let bytes = (0..t.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&t[i..i + 2], 16).map_err(|_| bad()))
            .collect::<Result<Vec<u8>>>()?;
        token.insert(
            "_typeBits",
            bson::Binary {
                subtype: bson::spec::BinarySubtype::Generic,
                bytes,
            },
        );
    }
    Ok(token)
}

/// A `GET /v1/changes` request.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedRequest {
    pub scope: Scope,
    pub from: From,
    /// The most changes a page holds; the most an SSE reply asks for at a time.
    pub limit: u32,
    /// How long a page waits for its first change.
    pub wait: Duration,
    /// Canonical Extended JSON instead of relaxed.
    pub canonical: bool,
    /// The `$changeStream` options given (`fullDocument`, `fullDocumentBeforeChange`,
    /// `showExpandedEvents`, `showCommitMetadata`).
    pub options: Document,
    /// The `$match` stage's filter, from its Extended JSON.
    pub filter: Option<Document>,
    /// How long an idle SSE stream goes without a heartbeat.
    pub heartbeat: Duration,
    /// The database whose user a Basic login names (`authSource`, else `admin`).
    pub auth_source: String,
}

fn number(name: &str, v: &str, max: u64) -> Result<u64> {
    let n: u64 = v.parse().map_err(|_| {
        MongoError::bad_value(format!("'{name}' must be a whole number, not '{v}'"))
    })?;
    if n > max {
        return Err(MongoError::bad_value(format!(
            "'{name}' must be at most {max}"
        )));
    }
    Ok(n)
}

impl FeedRequest {
    /// The Extended JSON form asked for.
    pub fn form(&self) -> super::extjson::Form {
        if self.canonical {
            super::extjson::Form::Canonical
        } else {
            super::extjson::Form::Relaxed
        }
    }

    pub fn parse(query: &str) -> Result<FeedRequest> {
        let params = params(query)?;
        let get = |k: &str| {
            params
                .iter()
                .find(|(name, _)| name == k)
                .map(|(_, v)| v.as_str())
        };
        for (name, _) in &params {
            if !matches!(
                name.as_str(),
                "ns" | "from"
                    | "limit"
                    | "waitMs"
                    | "json"
                    | "fullDocument"
                    | "fullDocumentBeforeChange"
                    | "showExpandedEvents"
                    | "showCommitMetadata"
                    | "match"
                    | "heartbeatMs"
                    | "authSource"
            ) {
                return Err(MongoError::bad_value(format!(
                    "unknown query parameter '{name}'"
                )));
            }
        }
        let from = match get("from") {
            None | Some("head") => From::Head,
            Some("oldest") => From::Oldest,
            Some(cursor) => From::After(token_of(cursor)?),
        };
        let limit = match get("limit") {
            None => DEFAULT_LIMIT,
            Some(v) => number("limit", v, u64::from(MAX_LIMIT))? as u32,
        };
        if limit == 0 {
            return Err(MongoError::bad_value("'limit' must be at least 1"));
        }
        let wait = Duration::from_millis(match get("waitMs") {
            None => 0,
            Some(v) => number("waitMs", v, MAX_WAIT_MS)?,
        });
        let heartbeat = Duration::from_millis(match get("heartbeatMs") {
            None => DEFAULT_HEARTBEAT_MS,
            Some(v) => number("heartbeatMs", v, MAX_WAIT_MS)?.max(100),
        });
        let canonical = match get("json") {
            None | Some("relaxed") => false,
            Some("canonical") => true,
            Some(other) => {
                return Err(MongoError::bad_value(format!(
                    "'json' must be relaxed or canonical, not '{other}'"
                )));
            }
        };
        let mut options = Document::new();
        for field in ["fullDocument", "fullDocumentBeforeChange"] {
            if let Some(v) = get(field) {
                options.insert(field, v);
            }
        }
        for flag in ["showExpandedEvents", "showCommitMetadata"] {
            match get(flag) {
                None => {}
                Some("true") => {
                    options.insert(flag, true);
                }
                Some("false") => {
                    options.insert(flag, false);
                }
                Some(_) => {
                    return Err(MongoError::bad_value(format!(
                        "'{flag}' must be true or false"
                    )));
                }
            }
        }
        let filter = get("match").map(parse_match).transpose()?;
        Ok(FeedRequest {
            scope: Scope::parse(get("ns"))?,
            from,
            limit,
            wait,
            canonical,
            options,
            filter,
            heartbeat,
            auth_source: get("authSource").unwrap_or("admin").to_string(),
        })
    }

    /// The `aggregate` that opens the stream, with its database, starting after `after`
    /// (the SSE `Last-Event-ID`) instead of the request's own start when given.
    pub fn aggregate(&self, after: Option<Document>) -> (&str, Document) {
        let (db, target) = self.scope.target();
        let mut spec = self.options.clone();
        if self.scope == Scope::Cluster {
            spec.insert("allChangesForCluster", true);
        }
        let start = match (after, &self.from) {
            (Some(token), _) => Some(token),
            (None, From::After(token)) => Some(token.clone()),
            (None, From::Oldest) => Some(crate::streams::earliest_marker().to_document()),
            (None, From::Head) => None,
        };
        if let Some(token) = start {
            // `startAfter` takes an invalidate's token too: a feed goes on past a drop.
            spec.insert("startAfter", token);
        }
        let mut pipeline = vec![Bson::Document(doc! {"$changeStream": spec})];
        if let Some(filter) = &self.filter {
            pipeline.push(Bson::Document(doc! {"$match": filter.clone()}));
        }
        (
            db,
            doc! {"aggregate": target, "pipeline": pipeline, "cursor": {"batchSize": 0}},
        )
    }
}

fn parse_match(json: &str) -> Result<Document> {
    if json.len() > MAX_MATCH_BYTES {
        return Err(MongoError::bad_value(format!(
            "'match' is longer than {MAX_MATCH_BYTES} bytes"
        )));
    }
    let value: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| MongoError::failed_to_parse(format!("'match' is not JSON: {e}")))?;
    match Bson::try_from(value) {
        Ok(Bson::Document(d)) => Ok(d),
        Ok(_) => Err(MongoError::failed_to_parse("'match' must be a JSON object")),
        Err(e) => Err(MongoError::failed_to_parse(format!(
            "'match' is not Extended JSON: {e}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_decoded_bounded_and_never_repeated() {
        let got = params("ns=a.b&match=%7B%22x%22%3A+1%7D&from=").expect("params");
        assert_eq!(
            got,
            [
                ("ns".to_string(), "a.b".to_string()),
                ("match".to_string(), "{\"x\": 1}".to_string()),
                ("from".to_string(), String::new()),
            ]
        );
        assert!(params("a=1&a=2").is_err());
        assert!(params("a=%zz").is_err());
        assert!(params("a=%e2%28").is_err(), "not UTF-8");
        assert!(params("a=%4").is_err());
        let many: Vec<String> = (0..=MAX_PARAMS).map(|i| format!("p{i}=1")).collect();
        assert!(params(&many.join("&")).is_err());
    }

    #[test]
    fn a_cursor_is_a_token_and_back() {
        let token = doc! {"_data": "82ABCDEF", "_typeBits": bson::Binary {
        subtype: bson::spec::BinarySubtype::Generic, bytes: vec![1, 0xfe] }};
        let cursor = cursor_of(&token).expect("cursor");
        assert_eq!(cursor, "82ABCDEF~01fe");
        assert_eq!(token_of(&cursor).expect("token"), token);
        assert_eq!(
            token_of("82abcdef").expect("token"),
            doc! {"_data": "82ABCDEF"}
        );
        for bad in ["", "xyz", "abc", "82AB~x", &"a".repeat(MAX_CURSOR_LEN + 2)] {
            let e = token_of(bad).expect_err(bad);
            assert_eq!(e.code, wire::ErrorCode::INVALID_RESUME_TOKEN.code);
        }
    }

    #[test]
    fn a_request_is_parsed_with_its_bounds() {
        let r = FeedRequest::parse("ns=app.orders&from=oldest&limit=5&waitMs=250&json=canonical&fullDocument=updateLookup&match=%7B%22operationType%22%3A%22insert%22%7D")
            .expect("request");
        assert_eq!(r.scope, Scope::Collection("app".into(), "orders".into()));
        assert_eq!(r.from, From::Oldest);
        assert_eq!(
            (r.limit, r.wait, r.canonical),
            (5, Duration::from_millis(250), true)
        );
        let (db, cmd) = r.aggregate(None);
        assert_eq!(db, "app");
        assert_eq!(cmd.get_str("aggregate").ok(), Some("orders"));
        let stages = cmd.get_array("pipeline").expect("pipeline");
        let spec = stages[0]
            .as_document()
            .and_then(|s| s.get_document("$changeStream").ok())
            .expect("spec");
        assert_eq!(spec.get_str("fullDocument").ok(), Some("updateLookup"));
        assert_eq!(
            spec.get_document("startAfter").ok(),
            Some(&crate::streams::earliest_marker().to_document())
        );
        assert_eq!(
            stages[1].as_document(),
            Some(&doc! {"$match": {"operationType": "insert"}})
        );
        // A Last-Event-ID wins over the request's own start.
        let (_, cmd) = r.aggregate(Some(doc! {"_data": "82"}));
        let spec = cmd.get_array("pipeline").expect("pipeline")[0]
            .as_document()
            .and_then(|s| s.get_document("$changeStream").ok())
            .cloned()
            .expect("spec");
        assert_eq!(
            spec.get_document("startAfter").ok(),
            Some(&doc! {"_data": "82"})
        );

        let cluster = FeedRequest::parse("").expect("request");
        assert_eq!(
            (cluster.scope.clone(), cluster.from.clone()),
            (Scope::Cluster, From::Head)
        );
        let (db, cmd) = cluster.aggregate(None);
        assert_eq!(db, "admin");
        assert!(cmd.to_string().contains("allChangesForCluster"));

        for bad in [
            "limit=0",
            "limit=10001",
            "limit=-1",
            "waitMs=60001",
            "json=yaml",
            "showExpandedEvents=yes",
            "match=%5B1%5D",
            "match=nope",
            "ns=%24bad.c",
            "ns=.c",
            "what=1",
        ] {
            assert!(FeedRequest::parse(bad).is_err(), "{bad}");
        }
    }
}
