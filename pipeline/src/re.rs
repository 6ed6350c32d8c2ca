//! [`Re`]: a regular expression compiled with MongoDB's options, as `$regex` (and `$in`'s
//! regexes), `$regexMatch`/`$regexFind`/`$regexFindAll` and JSON Schema's `pattern` use it.
//!
//! Invariants: a pattern is at most [`MAX_PATTERN_LEN`] bytes (51091 past it), checked before
//! it is compiled; options are `i`, `m`, `s`, `x` and `u` (implied), any other is 51108; the
//! BSON source is kept (options sorted), for a stored regex value to match the same regex.

use std::fmt;

use bson::Bson;

use crate::{MongoError, Result};

/// A compiled regular expression and its BSON source.
#[derive(Clone)]
pub struct Re {
    pattern: String,
    options: String,
    re: regex::Regex,
}

impl fmt::Debug for Re {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}/{}", self.pattern, self.options)
    }
}

/// The longest regular expression pattern, in bytes (MongoDB's `kMaxPatternLength`).
pub const MAX_PATTERN_LEN: usize = 32_764;

impl Re {
    /// Compiles a PCRE-style pattern with MongoDB options (`i`, `m`, `s`, `x`; `u` accepted and
    /// implied). Invalid options are BadValue 51108, invalid patterns 51091.
    pub fn new(pattern: &str, options: &str) -> Result<Re> {
        if pattern.len() > MAX_PATTERN_LEN {
            return Err(MongoError::with_code(
                51091,
                "Regular expression is invalid: pattern string is longer than the limit set by the application",
            ));
        }
        let mut b = regex::RegexBuilder::new(pattern);
        for c in options.chars() {
            match c {
                'i' => b.case_insensitive(true),
                'm' => b.multi_line(true),
                's' => b.dot_matches_new_line(true),
                'x' => b.ignore_whitespace(true),
                'u' => &mut b,
                other => {
                    return Err(MongoError::with_code(
                        51108,
                        format!("invalid flag in regex options: {other}"),
                    ));
                }
            };
        }
        let re = b.build().map_err(|e| {
            MongoError::with_code(51091, format!("Regular expression is invalid: {e}"))
        })?;
        let mut opts: Vec<char> = options.chars().collect();
        opts.sort_unstable();
        Ok(Re {
            pattern: pattern.to_string(),
            options: opts.into_iter().collect(),
            re,
        })
    }

    /// Whether the string matches anywhere (PCRE `match` semantics, not anchored).
    pub fn is_match(&self, s: &str) -> bool {
        self.re.is_match(s)
    }

    /// The compiled expression.
    pub fn regex(&self) -> &regex::Regex {
        &self.re
    }

    /// Strings and symbols are searched; a stored regex matches when it is the same regex.
    pub(crate) fn matches_value(&self, v: &Bson) -> bool {
        match v {
            Bson::String(s) | Bson::Symbol(s) => self.re.is_match(s),
            Bson::RegularExpression(r) => {
                r.pattern.as_str() == self.pattern && r.options.as_str() == self.options
            }
            _ => false,
        }
    }
}
