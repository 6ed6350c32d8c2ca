//! A replica set's configuration document, as `replSetGetConfig` answers it and
//! `replSetReconfig` takes it: read with MongoDB's checks and codes into the members Raft is
//! to have, and written from the configuration Raft has. Pure: no I/O.
//!
//! Invariants:
//! * A configuration read here names this member, has 1 to 7 voters and at most
//!   [`wire::replset::MAX_MEMBERS`] members, each with a distinct `_id` (0 to 255) and host; a
//!   member without a vote has priority 0, and there are no arbiters (every member holds the
//!   data).
//! * Its `version` is above the current one. The version is the log index of the entry that
//!   made the configuration, so a driver or shell that reads the config, raises its version by
//!   one and sends it back passes, and two operators racing on one version cannot both win.

use bson::{Bson, Document, doc};
use wire::{ErrorCode, MongoError};

use crate::repl::{ConfigMember, MemberId, SetConfig};

/// The most voters a set may have (MongoDB's limit).
pub const MAX_VOTERS: usize = 7;

/// Reads `replSetReconfig`'s configuration for the set `name`, whose configuration is
/// `current`, as run on member `me`: the members the set is to have.
pub fn parse(
    value: Option<&Bson>,
    name: &str,
    current: &SetConfig,
    me: MemberId,
) -> Result<Vec<ConfigMember>, MongoError> {
    let invalid = |msg: String| MongoError::new(ErrorCode::INVALID_REPLICA_SET_CONFIG, msg);
    let Some(Bson::Document(config)) = value else {
        return Err(MongoError::new(
            ErrorCode::TYPE_MISMATCH,
            "replSetReconfig takes the new configuration, an object",
        ));
    };
    match config.get("_id") {
        Some(Bson::String(id)) if id == name => {}
        Some(Bson::String(id)) => {
            return Err(invalid(format!(
                "Attempting to reconfigure a replica set with name {id}, but this member's set \
                 is {name}; rejecting"
            )));
        }
        _ => {
            return Err(invalid(
                "the configuration's _id must be the set's name".into(),
            ));
        }
    }
    let version = config
        .get("version")
        .and_then(whole)
        .ok_or_else(|| invalid("the configuration's version must be a whole number".into()))?;
    let current_version = i64::try_from(current.version).unwrap_or(i64::MAX);
    if version <= current_version {
        return Err(MongoError::new(
            ErrorCode::NEW_REPLICA_SET_CONFIGURATION_INCOMPATIBLE,
            format!(
                "New replica set configuration version must be greater than old, but \
                 {version} is not greater than {current_version} for replica set {name}"
            ),
        ));
    }
    let Some(Bson::Array(list)) = config.get("members") else {
        return Err(invalid(
            "the configuration's members must be an array".into(),
        ));
    };
    if list.is_empty() || list.len() > wire::replset::MAX_MEMBERS {
        return Err(invalid(format!(
            "a replica set has 1 to {} members, not {}",
            wire::replset::MAX_MEMBERS,
            list.len()
        )));
    }
    let mut members: Vec<ConfigMember> = Vec::with_capacity(list.len());
    for entry in list {
        let member = member(entry).map_err(invalid)?;
        if members.iter().any(|m| m.id == member.id) {
            return Err(invalid(format!("two members have _id {}", member.id)));
        }
        if members.iter().any(|m| m.addr == member.addr) {
            return Err(invalid(format!("two members have host {}", member.addr)));
        }
        members.push(member);
    }
    let voters = members.iter().filter(|m| m.voter).count();
    if voters == 0 || voters > MAX_VOTERS {
        return Err(invalid(format!(
            "Replica set configuration contains {voters} voting members, but must be at least 1 \
             and no more than {MAX_VOTERS}"
        )));
    }
    if !members.iter().any(|m| m.id == me) {
        return Err(MongoError::new(
            ErrorCode::NODE_NOT_FOUND,
            format!(
                "No host described in new configuration with _id {me} for replica set {name} \
                 maps to this node (the primary hands over first: replSetStepDown)"
            ),
        ));
    }
    Ok(members)
}

/// One entry of `members`.
fn member(entry: &Bson) -> Result<ConfigMember, String> {
    let Bson::Document(m) = entry else {
        return Err("each member must be an object".into());
    };
    let id = m
        .get("_id")
        .and_then(whole)
        .filter(|id| (0..=255).contains(id))
        .ok_or("a member's _id must be a whole number from 0 to 255")?;
    let addr = match m.get("host") {
        Some(Bson::String(h)) if !h.is_empty() && h.contains(':') && !h.contains(['/', ',']) => {
            h.clone()
        }
        _ => return Err(format!("member {id}'s host must be \"host:port\"")),
    };
    if m.get_bool("arbiterOnly").unwrap_or(false) {
        return Err(format!(
            "member {id}: arbiters are not supported (every member holds the data)"
        ));
    }
    let votes = match m.get("votes") {
        None => 1,
        Some(v) => whole(v)
            .filter(|v| matches!(v, 0 | 1))
            .ok_or_else(|| format!("member {id}'s votes must be 0 or 1"))?,
    };
    let priority = match m.get("priority") {
        None => None,
        Some(Bson::Double(p)) if p.is_finite() && (0.0..=1000.0).contains(p) => Some(*p),
        Some(p) => match whole(p) {
            Some(p) if (0..=1000).contains(&p) => Some(p as f64),
            _ => return Err(format!("member {id}'s priority must be from 0 to 1000")),
        },
    };
    // A member's priority is 1 unless it says otherwise.
    if votes == 0 && priority.unwrap_or(1.0) != 0.0 {
        return Err(format!(
            "member {id}: priority must be 0 when non-voting (votes:0)"
        ));
    }
    Ok(ConfigMember {
        id: MemberId::try_from(id).map_err(|e| e.to_string())?,
        addr,
        voter: votes == 1,
    })
}

/// A whole number of any BSON numeric type.
pub(super) fn whole(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        Bson::Double(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e15 => Some(*f as i64),
        _ => None,
    }
}

/// `replSetGetConfig`'s `config` for the set `name` in `term`.
pub fn document(name: &str, config: &SetConfig, term: u64) -> Document {
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let members: Vec<Bson> = config
        .members
        .iter()
        .map(|m| {
            Bson::Document(doc! {
                "_id": n(m.id),
                "host": &m.addr,
                "arbiterOnly": false,
                "buildIndexes": true,
                "hidden": false,
                "priority": if m.voter { 1.0 } else { 0.0 },
                "tags": {},
                "secondaryDelaySecs": 0_i64,
                "votes": i32::from(m.voter),
            })
        })
        .collect();
    doc! {
        "_id": name,
        "version": n(config.version),
        "term": n(term),
        "members": members,
        "protocolVersion": 1_i64,
        "writeConcernMajorityJournalDefault": true,
        "settings": {
            "chainingAllowed": false,
            "heartbeatIntervalMillis": 150_i64,
            "electionTimeoutMillis": 600_i64,
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn current() -> SetConfig {
        SetConfig {
            version: 1,
            members: (0..3)
                .map(|id| ConfigMember {
                    id,
                    addr: format!("h:{id}"),
                    voter: true,
                })
                .collect(),
        }
    }

    fn reconfig(members: Vec<Bson>, version: i64) -> Bson {
        Bson::Document(doc! {"_id": "rs", "version": version, "members": members})
    }

    fn code(r: Result<Vec<ConfigMember>, MongoError>) -> i32 {
        r.unwrap_err().code
    }

    #[test]
    fn what_it_writes_it_reads_back_with_the_version_raised() {
        let mut config = current();
        config.members[2].voter = false;
        let mut d = document("rs", &config, 4);
        d.insert("version", 2_i64);
        let members = parse(Some(&Bson::Document(d)), "rs", &config, 0).unwrap();
        assert_eq!(members, config.members);
    }

    #[test]
    fn a_member_is_added_as_a_voter_or_without_a_vote() {
        let members = vec![
            Bson::Document(doc! {"_id": 0, "host": "h:0"}),
            Bson::Document(doc! {"_id": 7, "host": "h:7", "votes": 0, "priority": 0}),
        ];
        let parsed = parse(Some(&reconfig(members, 2)), "rs", &current(), 0).unwrap();
        assert_eq!(
            parsed,
            vec![
                ConfigMember {
                    id: 0,
                    addr: "h:0".into(),
                    voter: true
                },
                ConfigMember {
                    id: 7,
                    addr: "h:7".into(),
                    voter: false
                },
            ]
        );
    }

    #[test]
    fn mongodb_s_checks_refuse_with_its_codes() {
        let one = |m: Document| {
            vec![
                Bson::Document(doc! {"_id": 0, "host": "h:0"}),
                Bson::Document(m),
            ]
        };
        let c = current();
        assert_eq!(code(parse(None, "rs", &c, 0)), 14);
        assert_eq!(
            code(parse(
                Some(&Bson::Document(
                    doc! {"_id": "other", "version": 2, "members": []}
                )),
                "rs",
                &c,
                0
            )),
            93
        );
        assert_eq!(
            code(parse(
                Some(&reconfig(one(doc! {"_id": 1, "host": "h:1"}), 1)),
                "rs",
                &c,
                0
            )),
            103
        );
        assert_eq!(
            code(parse(
                Some(&reconfig(one(doc! {"_id": 0, "host": "h:9"}), 2)),
                "rs",
                &c,
                0
            )),
            93
        );
        assert_eq!(
            code(parse(
                Some(&reconfig(one(doc! {"_id": 1, "host": "h:0"}), 2)),
                "rs",
                &c,
                0
            )),
            93
        );
        assert_eq!(
            code(parse(
                Some(&reconfig(
                    one(doc! {"_id": 1, "host": "h:1", "votes": 0}),
                    2
                )),
                "rs",
                &c,
                0
            )),
            93,
            "a member without a vote needs priority 0"
        );
        assert_eq!(
            code(parse(
                Some(&reconfig(
                    one(doc! {"_id": 1, "host": "h:1", "arbiterOnly": true}),
                    2
                )),
                "rs",
                &c,
                0
            )),
            93
        );
        assert_eq!(
            code(parse(
                Some(&reconfig(one(doc! {"_id": 256, "host": "h:1"}), 2)),
                "rs",
                &c,
                0
            )),
            93
        );
        let eight: Vec<Bson> = (0..8)
            .map(|i| Bson::Document(doc! {"_id": i, "host": format!("h:{i}")}))
            .collect();
        assert_eq!(code(parse(Some(&reconfig(eight, 2)), "rs", &c, 0)), 93);
        let without_me = vec![Bson::Document(doc! {"_id": 1, "host": "h:1"})];
        assert_eq!(code(parse(Some(&reconfig(without_me, 2)), "rs", &c, 0)), 74);
    }
}
