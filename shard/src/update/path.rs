//! Update paths: parsing the dotted field paths of update operators (`a.b`, `a.0`, `a.$`,
//! `a.$[]`, `a.$[id]`) and the order in which MongoDB 5.0+ applies sibling fields.
//!
//! Invariants:
//! * A parsed [`UpdatePath`] has at least one part and no empty part; its first part is a plain
//!   field (never positional); it holds at most one positional `$`.
//! * [`cmp_field_names`] is a total order: numeric-looking names compare as numbers (`"2"` <
//!   `"10"`), everything else bytewise. Siblings in the update tree are applied in this order,
//!   which is why `{$set: {z: 1, a: 1}}` creates `a` before `z`.

use std::cmp::Ordering;

use wire::{ErrorCode, MongoError, Result};

/// One component of an update path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// A field name, or an array index when it is numeric and meets an array.
    Field(String),
    /// `$`: the array element matched by the query.
    Positional,
    /// `$[]`: every element of the array.
    All,
    /// `$[id]`: the elements matched by the array filter named `id`.
    Filtered(String),
}

impl Part {
    pub fn is_dynamic(&self) -> bool {
        !matches!(self, Part::Field(_))
    }

    /// The component as written in the update.
    pub fn as_written(&self) -> String {
        match self {
            Part::Field(f) => f.clone(),
            Part::Positional => "$".to_string(),
            Part::All => "$[]".to_string(),
            Part::Filtered(id) => format!("$[{id}]"),
        }
    }
}

/// A parsed update path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdatePath {
    pub parts: Vec<Part>,
    /// The path exactly as written (used in error messages).
    pub dotted: String,
}

impl UpdatePath {
    /// Parses a field path of an update operator.
    pub fn parse(path: &str) -> Result<UpdatePath> {
        pipeline::value::check_path_length(path)?;
        if path.is_empty() {
            return Err(MongoError::new(
                ErrorCode::EMPTY_FIELD_NAME,
                "An empty update path is not valid.",
            ));
        }
        let mut parts = Vec::new();
        let mut positional = 0;
        for raw in path.split('.') {
            if raw.is_empty() {
                return Err(MongoError::new(
                    ErrorCode::EMPTY_FIELD_NAME,
                    format!(
                        "The update path '{path}' contains an empty field name, which is not allowed."
                    ),
                ));
            }
            let part = if raw == "$" {
                positional += 1;
                Part::Positional
            } else if raw == "$[]" {
                Part::All
            } else if let Some(id) = raw.strip_prefix("$[").and_then(|r| r.strip_suffix(']')) {
                Part::Filtered(id.to_string())
            } else {
                Part::Field(raw.to_string())
            };
            parts.push(part);
        }
        match parts.first() {
            Some(Part::Positional) => {
                return Err(MongoError::bad_value(format!(
                    "Cannot have positional (i.e. '$') element in the first component in path '{path}'"
                )));
            }
            Some(Part::All | Part::Filtered(_)) => {
                return Err(MongoError::bad_value(format!(
                    "Cannot have array filter identifier (i.e. '$[<id>]') element in the first component in path '{path}'"
                )));
            }
            _ => {}
        }
        if positional > 1 {
            return Err(MongoError::bad_value(format!(
                "Too many positional (i.e. '$') elements found in path '{path}'"
            )));
        }
        Ok(UpdatePath {
            parts,
            dotted: path.to_string(),
        })
    }

    pub fn is_dynamic(&self) -> bool {
        self.parts.iter().any(Part::is_dynamic)
    }

    /// The plain field names of a path without dynamic parts.
    pub fn fields(&self) -> Vec<String> {
        self.parts.iter().map(Part::as_written).collect()
    }

    /// Whether `self` equals `other` or is a proper prefix of it (part-wise).
    pub fn is_prefix_of(&self, other: &UpdatePath) -> bool {
        self.parts.len() <= other.parts.len()
            && self.parts.iter().zip(&other.parts).all(|(a, b)| a == b)
    }
}

/// Whether a component is made of ASCII digits only (MongoDB's lenient numeric test, used for
/// ordering siblings).
fn is_numeric(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// The order in which sibling fields of an update are applied (MongoDB 5.0+): numeric names
/// by numeric value, other names bytewise.
pub fn cmp_field_names(a: &str, b: &str) -> Ordering {
    if is_numeric(a) && is_numeric(b) {
        let (ta, tb) = (a.trim_start_matches('0'), b.trim_start_matches('0'));
        ta.len()
            .cmp(&tb.len())
            .then_with(|| ta.cmp(tb))
            .then_with(|| a.len().cmp(&b.len()))
    } else {
        a.as_bytes().cmp(b.as_bytes())
    }
}

/// A field name ordered by [`cmp_field_names`], for `BTreeMap` keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldKey(pub String);

impl Ord for FieldKey {
    fn cmp(&self, other: &Self) -> Ordering {
        cmp_field_names(&self.0, &other.0)
    }
}

impl PartialOrd for FieldKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A concrete path as a dotted string.
pub fn join(parts: &[String]) -> String {
    parts.join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dynamic_components() {
        let p = UpdatePath::parse("a.$[].b.$[x].0.$").unwrap();
        assert_eq!(
            p.parts,
            vec![
                Part::Field("a".into()),
                Part::All,
                Part::Field("b".into()),
                Part::Filtered("x".into()),
                Part::Field("0".into()),
                Part::Positional
            ]
        );
        assert!(p.is_dynamic());
    }

    #[test]
    fn empty_paths_and_components_are_rejected_with_empty_field_name() {
        assert_eq!(UpdatePath::parse("").unwrap_err().code, 56);
        assert_eq!(UpdatePath::parse("a..b").unwrap_err().code, 56);
        assert_eq!(UpdatePath::parse("a.").unwrap_err().code, 56);
    }

    #[test]
    fn positional_first_or_twice_is_rejected() {
        assert_eq!(UpdatePath::parse("$.a").unwrap_err().code, 2);
        assert_eq!(UpdatePath::parse("$[].a").unwrap_err().code, 2);
        assert_eq!(UpdatePath::parse("a.$.b.$").unwrap_err().code, 2);
    }

    #[test]
    fn sibling_order_is_numeric_for_numbers_and_bytewise_otherwise() {
        assert_eq!(cmp_field_names("2", "10"), Ordering::Less);
        assert_eq!(cmp_field_names("a", "b"), Ordering::Less);
        assert_eq!(cmp_field_names("B", "a"), Ordering::Less);
        assert_eq!(cmp_field_names("10", "9a"), Ordering::Less);
        assert_eq!(cmp_field_names("01", "1"), Ordering::Greater);
        assert_eq!(cmp_field_names("7", "7"), Ordering::Equal);
    }
}
