//! Values as MongoDB's error messages show them (`{ _id: 1 }`, `"x"`, `ObjectId('…')`, as
//! `BSONElement::toString` writes them), bounded: a string longer than 160 bytes shows its
//! first 150 and `..."`, as MongoDB's does, and a whole rendering stops at
//! [`wire::capped::MESSAGE_VALUE_LIMIT`] bytes, so showing a 16 MiB value costs a kilobyte.
//!
//! Invariant: a rendering streams into the capped text; nothing is formatted whole first.

use std::fmt::{self, Display, Formatter};

use bson::{Bson, Document};

/// A value shown as in MongoDB's messages, cut at the message limit.
pub fn render(v: &Bson) -> String {
    wire::capped::for_message(Shown(v))
}

/// A document shown as in MongoDB's messages (`{ a: 1, b: "x" }`), cut at the message limit.
pub fn render_doc(d: &Document) -> String {
    wire::capped::for_message(ShownDoc(d))
}

/// A value, displayed as MongoDB's messages show it.
pub struct Shown<'a>(pub &'a Bson);

/// A document, displayed as MongoDB's messages show it.
pub struct ShownDoc<'a>(pub &'a Document);

/// Strings longer than this show only their first [`STRING_SHOWN`] bytes.
const STRING_LONG: usize = 160;
const STRING_SHOWN: usize = 150;

impl Display for Shown<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self.0 {
            Bson::String(s) if s.len() > STRING_LONG => {
                write!(f, "\"{}...\"", &s[..s.floor_char_boundary(STRING_SHOWN)])
            }
            Bson::String(s) => write!(f, "\"{s}\""),
            Bson::ObjectId(o) => write!(f, "ObjectId('{o}')"),
            Bson::Int32(i) => write!(f, "{i}"),
            Bson::Int64(i) => write!(f, "{i}"),
            Bson::Double(d) if d.is_finite() && d.fract() == 0.0 && d.abs() < 1e15 => {
                write!(f, "{d:.1}")
            }
            Bson::Double(d) => write!(f, "{d}"),
            Bson::Boolean(b) => write!(f, "{b}"),
            Bson::Null => f.write_str("null"),
            Bson::Document(d) => ShownDoc(d).fmt(f),
            Bson::Array(a) if a.is_empty() => f.write_str("[]"),
            Bson::Array(a) => {
                f.write_str("[ ")?;
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    Shown(v).fmt(f)?;
                }
                f.write_str(" ]")
            }
            Bson::DateTime(d) => write!(f, "new Date({})", d.timestamp_millis()),
            other => other.fmt(f),
        }
    }
}

impl Display for ShownDoc<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("{}");
        }
        f.write_str("{ ")?;
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}: {}", Shown(v))?;
        }
        f.write_str(" }")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, oid::ObjectId};

    #[test]
    fn values_show_as_mongodb_messages_show_them() {
        let oid = ObjectId::parse_str("65a000000000000000000001").unwrap();
        let d = doc! {"_id": 1, "a": "x", "b": 2.0, "c": 2.5, "d": [1, {"e": null}], "f": [], "g": {}, "o": oid};
        assert_eq!(
            render_doc(&d),
            "{ _id: 1, a: \"x\", b: 2.0, c: 2.5, d: [ 1, { e: null } ], f: [], g: {}, \
             o: ObjectId('65a000000000000000000001') }"
        );
    }

    #[test]
    fn a_long_string_shows_its_first_150_bytes() {
        assert_eq!(
            render(&Bson::String("s".repeat(160))),
            format!("\"{}\"", "s".repeat(160))
        );
        assert_eq!(
            render(&Bson::String("s".repeat(161))),
            format!("\"{}...\"", "s".repeat(150))
        );
    }

    #[test]
    fn a_huge_value_costs_the_message_limit() {
        let huge = doc! {"k": vec![Bson::Int32(1); 1 << 20]};
        let shown = render_doc(&huge);
        assert_eq!(shown.len(), wire::capped::MESSAGE_VALUE_LIMIT + "...".len());
        assert!(shown.starts_with("{ k: [ 1, 1") && shown.ends_with("..."));
    }
}
