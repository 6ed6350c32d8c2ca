//! The match-expression language of `find` filters and `$match`.

use bson::Document;

use crate::Result;

/// A parsed filter.
#[derive(Debug, Clone)]
pub struct Matcher {}

impl Matcher {
    /// Parses a filter; unknown operators are `BadValue` (2), malformed ones `FailedToParse` (9).
    pub fn parse(filter: &Document) -> Result<Matcher> {
        let _ = filter;
        unimplemented!("pipeline helper")
    }

    pub fn matches(&self, doc: &Document) -> bool {
        let _ = doc;
        unimplemented!("pipeline helper")
    }
}
