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

use bson::raw::{CString, cstr};
use bson::{Bson, Document, RawBson, RawBsonRef, RawDocument, RawDocumentBuf, doc};
use wire::{MongoError, Result};

/// The parts of an `updateDescription`; `updated_fields` is a document, or the encoded fields
/// when the diff was read from an entry's bytes ([`parse_raw_diff`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpdateDescription<F = Document> {
    pub updated_fields: F,
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

impl UpdateDescription<RawDocumentBuf> {
    /// [`UpdateDescription::into_document`], encoded, with the updated values as the entry
    /// held them.
    pub fn into_raw(self, with_disambiguated_paths: bool) -> Result<RawDocumentBuf> {
        let mut d = RawDocumentBuf::new();
        d.append(cstr!("updatedFields"), self.updated_fields);
        d.append(
            cstr!("removedFields"),
            raw(Bson::Array(self.removed_fields))?,
        );
        d.append(
            cstr!("truncatedArrays"),
            raw(Bson::Array(self.truncated_arrays))?,
        );
        if with_disambiguated_paths {
            d.append(
                cstr!("disambiguatedPaths"),
                raw(Bson::Document(self.disambiguated_paths))?,
            );
        }
        Ok(d)
    }
}

fn raw(v: Bson) -> Result<RawBson> {
    RawBson::try_from(v).map_err(|e| MongoError::internal(format!("encoding a diff: {e}")))
}

/// Parses the `diff` of an `{$v: 2, diff}` update entry.
pub fn parse_diff(diff: &Document) -> Result<UpdateDescription> {
    let mut b = Builder::<Document>::default();
    b.document(diff, 0)?;
    Ok(b.out)
}

/// [`parse_diff`] from the entry's bytes: the updated values are copied, not decoded.
pub fn parse_raw_diff(diff: &RawDocument) -> Result<UpdateDescription<RawDocumentBuf>> {
    let mut b = Builder::<RawDocumentBuf>::default();
    b.document(diff, 0)?;
    Ok(b.out)
}

/// Deepest diff nesting accepted (BSON's own depth limit).
const MAX_DEPTH: usize = 200;

/// A diff as the walker reads it: a decoded document, or bytes.
trait Diff<'a>: Copy {
    type Value: Copy;
    /// The diff's fields, in order.
    fn fields(self) -> Result<Vec<(&'a str, Self::Value)>>;
    fn as_diff(v: Self::Value) -> Option<Self>;
    fn is_true(v: Self::Value) -> bool;
    /// A non-negative int32 or int64 that fits in an int32.
    fn as_size(v: Self::Value) -> Option<i32>;
}

impl<'a> Diff<'a> for &'a Document {
    type Value = &'a Bson;
    fn fields(self) -> Result<Vec<(&'a str, &'a Bson)>> {
        Ok(self.iter().map(|(k, v)| (k.as_str(), v)).collect())
    }
    fn as_diff(v: &'a Bson) -> Option<Self> {
        v.as_document()
    }
    fn is_true(v: &'a Bson) -> bool {
        matches!(v, Bson::Boolean(true))
    }
    fn as_size(v: &'a Bson) -> Option<i32> {
        match v {
            Bson::Int32(n) if *n >= 0 => Some(*n),
            Bson::Int64(n) if *n >= 0 && *n <= i64::from(i32::MAX) => Some(*n as i32),
            _ => None,
        }
    }
}

impl<'a> Diff<'a> for &'a RawDocument {
    type Value = RawBsonRef<'a>;
    fn fields(self) -> Result<Vec<(&'a str, RawBsonRef<'a>)>> {
        self.iter()
            .map(|e| e.map(|(k, v)| (k.as_str(), v)))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| malformed(&e.to_string()))
    }
    fn as_diff(v: RawBsonRef<'a>) -> Option<Self> {
        v.as_document()
    }
    fn is_true(v: RawBsonRef<'a>) -> bool {
        matches!(v, RawBsonRef::Boolean(true))
    }
    fn as_size(v: RawBsonRef<'a>) -> Option<i32> {
        match v {
            RawBsonRef::Int32(n) if n >= 0 => Some(n),
            RawBsonRef::Int64(n) if n >= 0 && n <= i64::from(i32::MAX) => Some(n as i32),
            _ => None,
        }
    }
}

/// Where updated fields go: a document of decoded values, or encoded ones.
trait Updated<V> {
    fn put(&mut self, path: String, v: V) -> Result<()>;
}

impl Updated<&Bson> for Document {
    fn put(&mut self, path: String, v: &Bson) -> Result<()> {
        self.insert(path, v.clone());
        Ok(())
    }
}

impl<'a> Updated<RawBsonRef<'a>> for RawDocumentBuf {
    fn put(&mut self, path: String, v: RawBsonRef<'a>) -> Result<()> {
        let key = CString::try_from(path).map_err(|e| malformed(&e.to_string()))?;
        self.append(key, v);
        Ok(())
    }
}

#[derive(Default)]
struct Builder<F> {
    /// The current path: (component, is an array index, path ambiguous as of here).
    path: Vec<(String, bool, bool)>,
    out: UpdateDescription<F>,
}

impl<F> Builder<F> {
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

    fn updated<V>(&mut self, field: &str, is_index: bool, v: V) -> Result<()>
    where
        F: Updated<V>,
    {
        self.push(field, is_index);
        let dotted = self.dotted();
        self.out.updated_fields.put(dotted.clone(), v)?;
        self.note_ambiguity(&dotted);
        self.pop();
        Ok(())
    }

    fn removed(&mut self, field: &str) {
        self.push(field, false);
        let dotted = self.dotted();
        self.out.removed_fields.push(Bson::String(dotted.clone()));
        self.note_ambiguity(&dotted);
        self.pop();
    }

    fn document<'a, D: Diff<'a>>(&mut self, diff: D, depth: usize) -> Result<()>
    where
        F: Updated<D::Value>,
    {
        if depth > MAX_DEPTH {
            return Err(malformed("diff nested too deeply"));
        }
        let fields = diff.fields()?;
        let section = |name: &str| fields.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
        for name in ["u", "i", "b"] {
            if let Some(v) = section(name) {
                let Some(updated) = D::as_diff(v) else {
                    return Err(malformed(&format!("section '{name}' is not an object")));
                };
                for (f, v) in updated.fields()? {
                    self.updated(f, false, v)?;
                }
            }
        }
        if let Some(v) = section("d") {
            let Some(removed) = D::as_diff(v) else {
                return Err(malformed("section 'd' is not an object"));
            };
            for (f, _) in removed.fields()? {
                self.removed(f);
            }
        }
        for &(k, v) in &fields {
            match k {
                "u" | "i" | "b" | "d" => {}
                _ => {
                    let Some(field) = k.strip_prefix('s') else {
                        return Err(malformed(&format!("unknown key '{k}'")));
                    };
                    self.sub_diff::<D>(field, false, v, depth)?;
                }
            }
        }
        Ok(())
    }

    fn sub_diff<'a, D: Diff<'a>>(
        &mut self,
        field: &str,
        is_index: bool,
        v: D::Value,
        depth: usize,
    ) -> Result<()>
    where
        F: Updated<D::Value>,
    {
        let Some(sub) = D::as_diff(v) else {
            return Err(malformed(&format!("sub-diff '{field}' is not an object")));
        };
        self.push(field, is_index);
        let is_array = sub
            .fields()?
            .iter()
            .any(|(k, v)| *k == "a" && D::is_true(*v));
        let r = if is_array {
            self.array(sub, depth + 1)
        } else {
            self.document(sub, depth + 1)
        };
        self.pop();
        r
    }

    fn array<'a, D: Diff<'a>>(&mut self, diff: D, depth: usize) -> Result<()>
    where
        F: Updated<D::Value>,
    {
        if depth > MAX_DEPTH {
            return Err(malformed("diff nested too deeply"));
        }
        let fields = diff.fields()?;
        if let Some(&(_, l)) = fields.iter().find(|(k, _)| *k == "l") {
            let Some(size) = D::as_size(l) else {
                return Err(malformed("array 'l' is not a non-negative int"));
            };
            let field = self.dotted();
            self.out.truncated_arrays.push(Bson::Document(
                doc! {"field": field.clone(), "newSize": size},
            ));
            self.note_ambiguity(&field);
        }
        for &(k, v) in &fields {
            if k == "a" || k == "l" {
                continue;
            }
            // By characters: a damaged key may start with a multi-byte one.
            let (kind, index) = k.split_at(k.chars().next().map_or(0, char::len_utf8));
            if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
                return Err(malformed(&format!("bad array diff key '{k}'")));
            }
            match kind {
                "u" => self.updated(index, true, v)?,
                "s" => self.sub_diff::<D>(index, true, v, depth)?,
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
