//! The `$v: 2` update diff → `updateDescription` (reference §1.4–§1.5).
//!
//! Owns: the depth-first walk of a document/array diff and the ambiguity rules for
//! `disambiguatedPaths`. One walk serves two outputs: decoded ([`parse_diff`]) and, from the
//! diff's bytes, the encoded `updateDescription` written straight into a buffer with the updated
//! values copied ([`write_raw_update_description`], the encoded path of the transform).
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
//! * the bytes written from a diff's bytes equal the decoded output encoded (tested), with one
//!   exception no MongoDB diff has: a diff naming one updated path twice gives the decoded
//!   `updatedFields` one field and the bytes two;
//! * malformed diffs are errors, never panics.

use bson::raw::{CStr, RawDocumentBuf, cstr};
use bson::spec::ElementType;
use bson::{Bson, Document, RawBsonRef, RawDocument, doc};
use wire::{MongoError, Result};

use super::bson_writer::{self as w, begin, end};

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
    let (mut path, mut parts) = (String::new(), Vec::new());
    let mut walk = Walk {
        path: &mut path,
        parts: &mut parts,
        out: Decoded::default(),
        disambiguated: None,
    };
    walk.diff(diff)?;
    Ok(UpdateDescription {
        updated_fields: walk.out.updated,
        removed_fields: walk.out.removed,
        truncated_arrays: walk.out.truncated,
        disambiguated_paths: walk.disambiguated.unwrap_or_default(),
    })
}

/// Buffers [`write_raw_update_description`] reuses from one diff to the next (their content
/// means nothing between calls).
#[derive(Debug, Clone, Default)]
pub struct DiffBuffers {
    path: String,
    parts: Vec<Part>,
    /// The elements of `removedFields` and of `truncatedArrays`, written as the walk meets
    /// them and copied after `updatedFields`.
    removed: Vec<u8>,
    truncated: Vec<u8>,
}

/// [`parse_diff`] from the diff's bytes, encoded: appends the `updateDescription` document
/// (`into_document`'s, with the updated values copied as the diff holds them) to `out`. On
/// error, `out` holds a partial document.
pub fn write_raw_update_description(
    diff: &RawDocument,
    with_disambiguated_paths: bool,
    buffers: &mut DiffBuffers,
    out: &mut Vec<u8>,
) -> Result<()> {
    let DiffBuffers {
        path,
        parts,
        removed,
        truncated,
    } = buffers;
    path.clear();
    parts.clear();
    removed.clear();
    truncated.clear();

    let description = begin(out);
    w::element_name(out, ElementType::EmbeddedDocument, cstr!("updatedFields"));
    let updated = begin(out);
    let mut walk = Walk {
        path,
        parts,
        out: Encoded {
            updated: out,
            removed,
            removed_count: 0,
            truncated,
            truncated_count: 0,
        },
        disambiguated: None,
    };
    walk.diff(diff)?;
    let disambiguated = walk.disambiguated;
    end(out, updated)?;
    for (name, elements) in [
        (cstr!("removedFields"), &buffers.removed),
        (cstr!("truncatedArrays"), &buffers.truncated),
    ] {
        w::element_name(out, ElementType::Array, name);
        let array = begin(out);
        out.extend_from_slice(elements);
        end(out, array)?;
    }
    if with_disambiguated_paths {
        match disambiguated {
            // Rare: encoded from the decoded paths.
            Some(paths) => {
                let paths = RawDocumentBuf::try_from(&paths)
                    .map_err(|e| MongoError::internal(format!("encoding a diff: {e}")))?;
                w::document(out, cstr!("disambiguatedPaths"), &paths);
            }
            None => {
                w::element_name(
                    out,
                    ElementType::EmbeddedDocument,
                    cstr!("disambiguatedPaths"),
                );
                let empty = begin(out);
                end(out, empty)?;
            }
        }
    }
    end(out, description)
}

/// Deepest diff nesting accepted (BSON's own depth limit).
const MAX_DEPTH: usize = 200;

/// A diff as the walker reads it: a decoded document, or bytes.
trait Diff<'a>: Copy {
    type Value: Copy;
    /// The diff's fields, in order; an error for a malformed one (and nothing after it).
    fn fields(self) -> impl Iterator<Item = Result<(&'a str, Self::Value)>>;
    fn as_diff(v: Self::Value) -> Option<Self>;
    fn is_true(v: Self::Value) -> bool;
    /// A non-negative int32 or int64 that fits in an int32.
    fn as_size(v: Self::Value) -> Option<i32>;
}

impl<'a> Diff<'a> for &'a Document {
    type Value = &'a Bson;
    fn fields(self) -> impl Iterator<Item = Result<(&'a str, &'a Bson)>> {
        self.iter().map(|(k, v)| Ok((k.as_str(), v)))
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
    fn fields(self) -> impl Iterator<Item = Result<(&'a str, RawBsonRef<'a>)>> {
        self.iter().map(|field| {
            field
                .map(|(k, v)| (k.as_str(), v))
                .map_err(|e| malformed(&e.to_string()))
        })
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

/// Where the walk's findings go, by dotted path.
trait Output<V> {
    fn updated(&mut self, path: &str, v: V) -> Result<()>;
    fn removed(&mut self, path: &str) -> Result<()>;
    fn truncated(&mut self, path: &str, new_size: i32) -> Result<()>;
}

/// The decoded output of [`parse_diff`].
#[derive(Default)]
struct Decoded {
    updated: Document,
    removed: Vec<Bson>,
    truncated: Vec<Bson>,
}

impl Output<&Bson> for Decoded {
    fn updated(&mut self, path: &str, v: &Bson) -> Result<()> {
        self.updated.insert(path, v.clone());
        Ok(())
    }
    fn removed(&mut self, path: &str) -> Result<()> {
        self.removed.push(Bson::String(path.to_string()));
        Ok(())
    }
    fn truncated(&mut self, path: &str, new_size: i32) -> Result<()> {
        self.truncated
            .push(Bson::Document(doc! {"field": path, "newSize": new_size}));
        Ok(())
    }
}

/// The encoded output of [`write_raw_update_description`]: updated fields written in place
/// (into the open `updatedFields`), the elements of the two arrays into their buffers.
struct Encoded<'o> {
    updated: &'o mut Vec<u8>,
    removed: &'o mut Vec<u8>,
    removed_count: usize,
    truncated: &'o mut Vec<u8>,
    truncated_count: usize,
}

impl<'a> Output<RawBsonRef<'a>> for Encoded<'_> {
    fn updated(&mut self, path: &str, v: RawBsonRef<'a>) -> Result<()> {
        let name = <&CStr>::try_from(path).map_err(|e| malformed(&e.to_string()))?;
        w::value(self.updated, name, v);
        Ok(())
    }
    fn removed(&mut self, path: &str) -> Result<()> {
        w::index_name(self.removed, ElementType::String, self.removed_count);
        w::string_value(self.removed, path);
        self.removed_count += 1;
        Ok(())
    }
    fn truncated(&mut self, path: &str, new_size: i32) -> Result<()> {
        let out = &mut *self.truncated;
        w::index_name(out, ElementType::EmbeddedDocument, self.truncated_count);
        let entry = begin(out);
        w::string(out, cstr!("field"), path);
        w::int32(out, cstr!("newSize"), new_size);
        end(out, entry)?;
        self.truncated_count += 1;
        Ok(())
    }
}

/// One component of the current path: `path[start..end]`.
#[derive(Debug, Clone, Copy)]
struct Part {
    start: usize,
    end: usize,
    is_index: bool,
    /// The path is ambiguous as of this component.
    ambiguous: bool,
}

/// The walk of one diff: the current dotted path (one buffer that grows and shrinks with the
/// walk, with its components' bounds beside it) and what it has found.
struct Walk<'b, O> {
    path: &'b mut String,
    parts: &'b mut Vec<Part>,
    out: O,
    /// Ambiguous paths seen so far, by dotted path (the second one of a path replaces the first).
    disambiguated: Option<Document>,
}

impl<O> Walk<'_, O> {
    fn push(&mut self, field: &str, is_index: bool) {
        let last = self.parts.last();
        let ambiguous = last.is_some_and(|p| p.ambiguous)
            || (!is_index
                && ((last.is_some() && is_strictly_numeric(field)) || field.contains('.')));
        if last.is_some() {
            self.path.push('.');
        }
        let start = self.path.len();
        self.path.push_str(field);
        self.parts.push(Part {
            start,
            end: self.path.len(),
            is_index,
            ambiguous,
        });
    }

    fn pop(&mut self) {
        if let Some(p) = self.parts.pop() {
            // Drop the component, and the dot before it unless it was the first.
            let dot = usize::from(!self.parts.is_empty());
            self.path.truncate(p.start.saturating_sub(dot));
        }
    }

    /// Lists the current path in `disambiguatedPaths` if it is ambiguous.
    fn note_ambiguity(&mut self) {
        if !self.parts.last().is_some_and(|p| p.ambiguous) {
            return;
        }
        let components: Vec<Bson> = self
            .parts
            .iter()
            .map(|p| {
                let c = self.path.get(p.start..p.end).unwrap_or("");
                match (p.is_index, c.parse::<i32>()) {
                    (true, Ok(i)) => Bson::Int32(i),
                    _ => Bson::String(c.to_string()),
                }
            })
            .collect();
        self.disambiguated
            .get_or_insert_with(Document::new)
            .insert(self.path.as_str(), components);
    }

    fn updated<V>(&mut self, field: &str, is_index: bool, v: V) -> Result<()>
    where
        O: Output<V>,
    {
        self.push(field, is_index);
        self.out.updated(self.path, v)?;
        self.note_ambiguity();
        self.pop();
        Ok(())
    }

    fn removed<V>(&mut self, field: &str) -> Result<()>
    where
        O: Output<V>,
    {
        self.push(field, false);
        self.out.removed(self.path)?;
        self.note_ambiguity();
        self.pop();
        Ok(())
    }

    /// Walks a whole diff.
    fn diff<'a, D: Diff<'a>>(&mut self, diff: D) -> Result<()>
    where
        O: Output<D::Value>,
    {
        let mut fields = Vec::with_capacity(16);
        read_fields(diff, &mut fields)?;
        self.document::<D>(&mut fields, 0, 0)
    }

    // Each level of the diff is read once, in full, onto one stack of fields (`fields[at..]`
    // are the current level's; a sub-diff's go on top while it is walked). So every field is
    // read once, and a malformed one fails its level before any of it is used.
    //
    // The walk recurses through `document`/`array` and `sub_diff` only; everything else is in
    // functions of their own, so that each level of nesting costs the stack little (a diff may
    // nest up to `MAX_DEPTH` levels).

    fn document<'a, D: Diff<'a>>(
        &mut self,
        fields: &mut Vec<(&'a str, D::Value)>,
        at: usize,
        depth: usize,
    ) -> Result<()>
    where
        O: Output<D::Value>,
    {
        if depth > MAX_DEPTH {
            return Err(malformed("diff nested too deeply"));
        }
        self.sections::<D>(fields.get(at..).unwrap_or_default())?;
        for i in at..fields.len() {
            let Some(&(k, v)) = fields.get(i) else { break };
            match k {
                "u" | "i" | "b" | "d" => {}
                _ => {
                    let Some(field) = k.strip_prefix('s') else {
                        return Err(malformed(&format!("unknown key '{k}'")));
                    };
                    self.sub_diff::<D>(field, false, v, fields, depth)?;
                }
            }
        }
        Ok(())
    }

    /// The `u`, `i`, `b` and `d` sections of a document diff (the first of each).
    fn sections<'a, D: Diff<'a>>(&mut self, level: &[(&'a str, D::Value)]) -> Result<()>
    where
        O: Output<D::Value>,
    {
        let section = |name: &str| level.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
        for name in ["u", "i", "b"] {
            let Some(v) = section(name) else { continue };
            let Some(updated) = D::as_diff(v) else {
                return Err(malformed(&format!("section '{name}' is not an object")));
            };
            for field in updated.fields() {
                let (f, v) = field?;
                self.updated(f, false, v)?;
            }
        }
        if let Some(v) = section("d") {
            let Some(removed) = D::as_diff(v) else {
                return Err(malformed("section 'd' is not an object"));
            };
            for field in removed.fields() {
                let (f, _) = field?;
                self.removed::<D::Value>(f)?;
            }
        }
        Ok(())
    }

    fn sub_diff<'a, D: Diff<'a>>(
        &mut self,
        field: &str,
        is_index: bool,
        v: D::Value,
        fields: &mut Vec<(&'a str, D::Value)>,
        depth: usize,
    ) -> Result<()>
    where
        O: Output<D::Value>,
    {
        let Some(sub) = D::as_diff(v) else {
            return Err(malformed(&format!("sub-diff '{field}' is not an object")));
        };
        let at = fields.len();
        read_fields(sub, fields)?;
        let is_array = fields
            .get(at..)
            .unwrap_or_default()
            .iter()
            .any(|(k, v)| *k == "a" && D::is_true(*v));
        self.push(field, is_index);
        let r = if is_array {
            self.array::<D>(fields, at, depth + 1)
        } else {
            self.document::<D>(fields, at, depth + 1)
        };
        self.pop();
        fields.truncate(at);
        r
    }

    fn array<'a, D: Diff<'a>>(
        &mut self,
        fields: &mut Vec<(&'a str, D::Value)>,
        at: usize,
        depth: usize,
    ) -> Result<()>
    where
        O: Output<D::Value>,
    {
        if depth > MAX_DEPTH {
            return Err(malformed("diff nested too deeply"));
        }
        self.truncation::<D>(fields.get(at..).unwrap_or_default())?;
        for i in at..fields.len() {
            let Some(&(k, v)) = fields.get(i) else { break };
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
                "s" => self.sub_diff::<D>(index, true, v, fields, depth)?,
                _ => return Err(malformed(&format!("bad array diff key '{k}'"))),
            }
        }
        Ok(())
    }

    /// The `l` of an array diff (its first).
    fn truncation<'a, D: Diff<'a>>(&mut self, level: &[(&'a str, D::Value)]) -> Result<()>
    where
        O: Output<D::Value>,
    {
        if let Some(&(_, l)) = level.iter().find(|(k, _)| *k == "l") {
            let Some(size) = D::as_size(l) else {
                return Err(malformed("array 'l' is not a non-negative int"));
            };
            self.out.truncated(self.path, size)?;
            self.note_ambiguity();
        }
        Ok(())
    }
}

/// Reads every field of one level of a diff onto `fields`.
fn read_fields<'a, D: Diff<'a>>(diff: D, fields: &mut Vec<(&'a str, D::Value)>) -> Result<()> {
    for field in diff.fields() {
        fields.push(field?);
    }
    Ok(())
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
