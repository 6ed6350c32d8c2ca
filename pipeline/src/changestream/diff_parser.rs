//! The `$v: 2` update diff → `updateDescription` (reference §1.4–§1.5).
//!
//! Owns: the depth-first walk of a document/array diff and the ambiguity rules for
//! `disambiguatedPaths`.
//!
//! Invariants:
//! * at each document level, `u` then `i` then `b` entries go to `updatedFields` (in diff order
//!   within each section), then `d` entries to `removedFields`, then each `s<field>` sub-diff is
//!   walked in order; at array level (`a: true`), `l` first adds `{field, newSize}` to
//!   `truncatedArrays`, then `u<i>` / `s<i>` in order;
//! * a path is ambiguous from the first component that contains a `.` or is a strictly numeric
//!   field name other than the first component; array indexes never make it ambiguous. Every
//!   recorded ambiguous path (updated, removed or truncated) is listed in `disambiguatedPaths`
//!   with names as strings and array indexes as int32;
//! * `disambiguatedPaths` is present (possibly `{}`) exactly when asked for (showExpandedEvents);
//! * malformed diffs are errors, never panics.

use bson::{Bson, Document, doc};
use wire::{MongoError, Result};

/// The parts of an `updateDescription`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpdateDescription {
    pub updated_fields: Document,
    pub removed_fields: Vec<Bson>,
    pub truncated_arrays: Vec<Bson>,
    pub disambiguated_paths: Document,
}

impl UpdateDescription {
    /// `{updatedFields, removedFields, truncatedArrays[, disambiguatedPaths]}`.
    pub fn into_document(self, with_disambiguated_paths: bool) -> Document {
        let mut d = doc! {
            "updatedFields": self.updated_fields,
            "removedFields": self.removed_fields,
            "truncatedArrays": self.truncated_arrays,
        };
        if with_disambiguated_paths {
            d.insert("disambiguatedPaths", self.disambiguated_paths);
        }
        d
    }
}

/// Parses the `diff` of an `{$v: 2, diff}` update entry.
pub fn parse_diff(diff: &Document) -> Result<UpdateDescription> {
    let mut b = Builder::default();
    b.document(diff, 0)?;
    Ok(b.out)
}

/// Deepest diff nesting accepted (BSON's own depth limit).
const MAX_DEPTH: usize = 200;

#[derive(Default)]
struct Builder {
    /// The current path: (component, is an array index, path ambiguous as of here).
    path: Vec<(String, bool, bool)>,
    out: UpdateDescription,
}

impl Builder {
    fn push(&mut self, field: &str, is_index: bool) {
        let already = self.path.last().is_some_and(|p| p.2);
        let ambiguous = already
            || (!is_index
                && ((!self.path.is_empty() && is_strictly_numeric(field)) || field.contains('.')));
        self.path.push((field.to_string(), is_index, ambiguous));
    }

    fn pop(&mut self) {
        self.path.pop();
    }

    fn dotted(&self) -> String {
        let mut s = String::new();
        for (i, (c, _, _)) in self.path.iter().enumerate() {
            if i > 0 {
                s.push('.');
            }
            s.push_str(c);
        }
        s
    }

    fn note_ambiguity(&mut self, dotted: &str) {
        if !self.path.last().is_some_and(|p| p.2) {
            return;
        }
        let parts: Vec<Bson> = self
            .path
            .iter()
            .map(|(c, is_index, _)| match (is_index, c.parse::<i32>()) {
                (true, Ok(i)) => Bson::Int32(i),
                _ => Bson::String(c.clone()),
            })
            .collect();
        self.out
            .disambiguated_paths
            .insert(dotted.to_string(), parts);
    }

    fn updated(&mut self, field: &str, is_index: bool, v: &Bson) {
        self.push(field, is_index);
        let dotted = self.dotted();
        self.out.updated_fields.insert(dotted.clone(), v.clone());
        self.note_ambiguity(&dotted);
        self.pop();
    }

    fn removed(&mut self, field: &str) {
        self.push(field, false);
        let dotted = self.dotted();
        self.out.removed_fields.push(Bson::String(dotted.clone()));
        self.note_ambiguity(&dotted);
        self.pop();
    }

    fn document(&mut self, diff: &Document, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(malformed("diff nested too deeply"));
        }
        for section in ["u", "i", "b"] {
            if let Some(v) = diff.get(section) {
                let Bson::Document(fields) = v else {
                    return Err(malformed(&format!("section '{section}' is not an object")));
                };
                for (f, v) in fields {
                    self.updated(f, false, v);
                }
            }
        }
        if let Some(v) = diff.get("d") {
            let Bson::Document(fields) = v else {
                return Err(malformed("section 'd' is not an object"));
            };
            for (f, _) in fields {
                self.removed(f);
            }
        }
        for (k, v) in diff {
            match k.as_str() {
                "u" | "i" | "b" | "d" => {}
                _ => {
                    let Some(field) = k.strip_prefix('s') else {
                        return Err(malformed(&format!("unknown key '{k}'")));
                    };
                    self.sub_diff(field, false, v, depth)?;
                }
            }
        }
        Ok(())
    }

    fn sub_diff(&mut self, field: &str, is_index: bool, v: &Bson, depth: usize) -> Result<()> {
        let Bson::Document(sub) = v else {
            return Err(malformed(&format!("sub-diff '{field}' is not an object")));
        };
        self.push(field, is_index);
        let r = if matches!(sub.get("a"), Some(Bson::Boolean(true))) {
            self.array(sub, depth + 1)
        } else {
            self.document(sub, depth + 1)
        };
        self.pop();
        r
    }

    fn array(&mut self, diff: &Document, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(malformed("diff nested too deeply"));
        }
        if let Some(l) = diff.get("l") {
            let size = match l {
                Bson::Int32(n) if *n >= 0 => *n,
                Bson::Int64(n) if *n >= 0 && *n <= i64::from(i32::MAX) => *n as i32,
                _ => return Err(malformed("array 'l' is not a non-negative int")),
            };
            let field = self.dotted();
            self.out.truncated_arrays.push(Bson::Document(
                doc! {"field": field.clone(), "newSize": size},
            ));
            self.note_ambiguity(&field);
        }
        for (k, v) in diff {
            if k == "a" || k == "l" {
                continue;
            }
            let (kind, index) = k.split_at(k.len().min(1));
            if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
                return Err(malformed(&format!("bad array diff key '{k}'")));
            }
            match kind {
                "u" => self.updated(index, true, v),
                "s" => self.sub_diff(index, true, v, depth)?,
                _ => return Err(malformed(&format!("bad array diff key '{k}'"))),
            }
        }
        Ok(())
    }
}

/// `FieldRef::isNumericPathComponentStrict`: digits only, no leading zero (except "0").
fn is_strictly_numeric(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s.len() == 1 || !s.starts_with('0'))
}

fn malformed(what: &str) -> MongoError {
    MongoError::bad_value(format!("malformed $v:2 update diff: {what}"))
}

#[cfg(test)]
mod tests;
