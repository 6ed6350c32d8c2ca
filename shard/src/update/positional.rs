//! The positional `$` operator: which array element the query matched.
//!
//! MongoDB records, while matching the query, the index of the array element that satisfied
//! the predicate on that array. We reconstruct it from the query: the predicates whose path is
//! the array's path or below it (top level, or inside a top-level `$and`) are evaluated, with
//! `pipeline::Matcher`, against a probe document holding only element `i` at the array's
//! path; the first `i` that satisfies all of them is the match. This equals MongoDB's answer
//! for single-predicate and `$elemMatch` queries (the common cases); with several independent
//! predicates on one array it picks the first element satisfying all of them.
//!
//! Invariant: no query, no relevant predicate, or no matching element is BadValue (2) "The
//! positional operator did not find the match needed from the query." (as in MongoDB).

use bson::{Bson, Document, doc};
use pipeline::Matcher;
use wire::{MongoError, Result};

use super::path::join;

fn not_found() -> MongoError {
    MongoError::bad_value("The positional operator did not find the match needed from the query.")
}

/// The index of the element of the array at `array_path` that the query matched.
pub fn matched_index(
    query: Option<&Document>,
    doc: &Document,
    array_path: &[String],
) -> Result<usize> {
    let query = query.ok_or_else(not_found)?;
    let prefix = join(array_path);
    if prefix.is_empty() {
        return Err(not_found());
    }
    let Some(Bson::Array(elements)) = pipeline::value::get_path(doc, &prefix) else {
        return Err(not_found());
    };
    let mut predicates = Vec::new();
    collect(query, &prefix, &mut predicates);
    if predicates.is_empty() {
        return Err(not_found());
    }
    let matcher = Matcher::parse(&doc! { "$and": predicates })?;
    for (i, e) in elements.iter().enumerate() {
        let mut probe = Bson::Array(vec![e.clone()]);
        for name in array_path.iter().rev() {
            probe = Bson::Document(doc! { name.clone(): probe });
        }
        if let Bson::Document(p) = probe
            && matcher.matches(&p)
        {
            return Ok(i);
        }
    }
    Err(not_found())
}

fn collect(query: &Document, prefix: &str, out: &mut Vec<Bson>) {
    for (k, v) in query {
        if k == "$and" {
            if let Bson::Array(clauses) = v {
                for c in clauses {
                    if let Bson::Document(d) = c {
                        collect(d, prefix, out);
                    }
                }
            }
        } else if k == prefix
            || k.strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('.'))
        {
            out.push(Bson::Document(doc! { k.clone(): v.clone() }));
        }
    }
}
