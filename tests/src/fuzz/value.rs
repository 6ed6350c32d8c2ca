//! The values the generator builds commands from, their BSON encoding and a short rendering.
//!
//! A [`Value`] is a BSON value whose hostile parts stay small until encoded: a nesting 100,000
//! levels deep is one [`Value::Nest`], a 15 MB string one [`Value::LongString`], a million-element
//! array one [`Value::Repeat`]. So generating, cloning, dropping and rendering a request costs
//! little whatever it encodes to, and nothing recurses over the hostile depth.
//!
//! Invariants:
//! * [`encode_document`] walks a `Nest` with a loop, never with recursion; it recurses only over
//!   the `Doc` / `Array` structure the generator built by hand, which is a few levels deep.
//! * The bytes it returns are one well-formed BSON document whenever every key is free of NUL
//!   bytes (a NUL in a key is replaced by U+0001 so that the structure stays sound); what the
//!   server must refuse (too deep, too large, bad UTF-8 in a name…) is in the content, not in
//!   the framing.
//! * [`Value::render`] output is bounded by the budget it is given, whatever the value holds.

use bson::{Bson, Document};

/// A BSON value, with compact forms for what would be huge.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Any value but a document or an array (those are [`Value::Doc`] and [`Value::Array`]).
    Scalar(Bson),
    Doc(Vec<(String, Value)>),
    Array(Vec<Value>),
    /// `levels` repeated `times` times around `leaf`: levels `[{$and}, [0]]` twice around
    /// `{x: 1}` is `{$and: [{$and: [{x: 1}]}]}`.
    Nest {
        levels: Vec<Level>,
        times: u32,
        leaf: Box<Value>,
    },
    /// `count` copies of `item`: an array, or a document with keys `f0`, `f1`, ….
    Repeat {
        count: u32,
        item: Box<Value>,
        as_doc: bool,
    },
    /// A string of `len` bytes repeating `pattern` (cut at a character boundary).
    LongString {
        len: u32,
        pattern: String,
    },
    /// The id of the cursor the request's prelude opened (0 when it opened none).
    CursorId,
}

/// One level of a [`Value::Nest`]: a document with one field named `key`, or an array with one
/// element.
#[derive(Debug, Clone, PartialEq)]
pub struct Level {
    pub array: bool,
    pub key: String,
}

impl Level {
    pub fn doc(key: &str) -> Level {
        Level {
            array: false,
            key: key.to_string(),
        }
    }

    pub fn array() -> Level {
        Level {
            array: true,
            key: "0".to_string(),
        }
    }
}

/// What encoding needs from the connection: the cursor a prelude opened.
#[derive(Debug, Clone, Copy, Default)]
pub struct EncodeContext {
    pub cursor_id: i64,
}

impl From<Bson> for Value {
    fn from(b: Bson) -> Value {
        match b {
            Bson::Document(d) => Value::from(d),
            Bson::Array(a) => Value::Array(a.into_iter().map(Value::from).collect()),
            other => Value::Scalar(other),
        }
    }
}

impl From<Document> for Value {
    fn from(d: Document) -> Value {
        Value::Doc(d.into_iter().map(|(k, v)| (k, Value::from(v))).collect())
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::Scalar(Bson::String(s.to_string()))
    }
}

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Scalar(Bson::String(s))
    }
}

impl From<i32> for Value {
    fn from(n: i32) -> Value {
        Value::Scalar(Bson::Int32(n))
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Value {
        Value::Scalar(Bson::Int64(n))
    }
}

impl From<f64> for Value {
    fn from(n: f64) -> Value {
        Value::Scalar(Bson::Double(n))
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Value {
        Value::Scalar(Bson::Boolean(b))
    }
}

impl Value {
    /// The field `key` of a document value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Doc(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The BSON element type byte this value encodes with.
    pub fn element_type(&self) -> u8 {
        match self {
            Value::Scalar(b) => b.element_type() as u8,
            Value::Doc(_) => 0x03,
            Value::Array(_) => 0x04,
            Value::Nest {
                levels,
                times,
                leaf,
            } => match levels.first() {
                Some(level) if *times > 0 => level_type(level),
                _ => leaf.element_type(),
            },
            Value::Repeat { as_doc, .. } => {
                if *as_doc {
                    0x03
                } else {
                    0x04
                }
            }
            Value::LongString { .. } => 0x02,
            Value::CursorId => 0x12,
        }
    }

    /// An upper bound on the encoded size, in bytes (cheap: no encoding).
    pub fn encoded_size_bound(&self) -> usize {
        match self {
            Value::Scalar(b) => scalar_size_bound(b),
            Value::Doc(fields) => {
                5 + fields
                    .iter()
                    .map(|(k, v)| 2 + k.len() + v.encoded_size_bound())
                    .sum::<usize>()
            }
            Value::Array(items) => {
                5 + items
                    .iter()
                    .map(|v| 12 + v.encoded_size_bound())
                    .sum::<usize>()
            }
            Value::Nest {
                levels,
                times,
                leaf,
            } => {
                let per_round: usize = levels.iter().map(|l| 7 + l.key.len()).sum();
                per_round.saturating_mul(*times as usize) + leaf.encoded_size_bound()
            }
            Value::Repeat { count, item, .. } => {
                // Per element: type byte, key (`f` and up to 10 digits), NUL.
                5 + (*count as usize).saturating_mul(13 + item.encoded_size_bound())
            }
            Value::LongString { len, .. } => 5 + *len as usize,
            Value::CursorId => 8,
        }
    }

    /// Appends this value's encoding (without type byte or key) to `out`.
    fn encode_into(&self, out: &mut Vec<u8>, cx: EncodeContext) {
        match self {
            Value::Scalar(b) => encode_scalar(b, out),
            Value::Doc(fields) => {
                let start = begin(out);
                for (k, v) in fields {
                    put_element(out, k, v, cx);
                }
                close(out, start);
            }
            Value::Array(items) => {
                let start = begin(out);
                for (i, v) in items.iter().enumerate() {
                    put_element(out, &i.to_string(), v, cx);
                }
                close(out, start);
            }
            Value::Nest {
                levels,
                times,
                leaf,
            } => encode_nest(levels, *times, leaf, out, cx),
            Value::Repeat {
                count,
                item,
                as_doc,
            } => {
                let mut one = Vec::new();
                item.encode_into(&mut one, cx);
                let ty = item.element_type();
                let start = begin(out);
                for i in 0..*count {
                    out.push(ty);
                    if *as_doc {
                        out.push(b'f');
                    }
                    out.extend_from_slice(i.to_string().as_bytes());
                    out.push(0);
                    out.extend_from_slice(&one);
                }
                close(out, start);
            }
            Value::LongString { len, pattern } => {
                let s = long_string(*len as usize, pattern);
                out.extend_from_slice(&(s.len() as i32 + 1).to_le_bytes());
                out.extend_from_slice(s.as_bytes());
                out.push(0);
            }
            Value::CursorId => out.extend_from_slice(&cx.cursor_id.to_le_bytes()),
        }
    }

    /// A relaxed-extended-JSON-like rendering of at most about `budget` bytes: compact forms
    /// show as `<nest …>`, `<repeat …>`, `<string …>`; long strings are cut with their length.
    pub fn render(&self, budget: usize) -> String {
        let mut out = String::new();
        self.render_into(&mut out, budget);
        if out.len() > budget {
            let mut cut = budget;
            while !out.is_char_boundary(cut) {
                cut -= 1;
            }
            out.truncate(cut);
            out.push_str("…(truncated)");
        }
        out
    }

    fn render_into(&self, out: &mut String, budget: usize) {
        if out.len() > budget {
            return;
        }
        match self {
            Value::Scalar(Bson::String(s)) if s.len() > 200 => {
                out.push_str(&json_string(&cut(s, 120)));
                out.push_str(&format!("<…{} bytes>", s.len()));
            }
            Value::Scalar(b) => {
                let json = scalar_json(b);
                if json.len() > 400 {
                    out.push_str(&cut(&json, 300));
                    out.push_str(&format!("<…{} bytes>", json.len()));
                } else {
                    out.push_str(&json);
                }
            }
            Value::Doc(fields) => {
                out.push('{');
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    if k.len() > 200 {
                        out.push_str(&json_string(&cut(k, 120)));
                        out.push_str(&format!("<…{} bytes>", k.len()));
                    } else {
                        out.push_str(&json_string(k));
                    }
                    out.push_str(": ");
                    v.render_into(out, budget);
                    if out.len() > budget {
                        return;
                    }
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    v.render_into(out, budget);
                    if out.len() > budget {
                        return;
                    }
                }
                out.push(']');
            }
            Value::Nest {
                levels,
                times,
                leaf,
            } => {
                let shape: Vec<String> = levels
                    .iter()
                    .map(|l| {
                        if l.array {
                            "[".to_string()
                        } else {
                            format!("{{{}: ", json_string(&l.key))
                        }
                    })
                    .collect();
                out.push_str(&format!("<nest {} × {} around ", times, shape.concat()));
                leaf.render_into(out, budget);
                out.push('>');
            }
            Value::Repeat {
                count,
                item,
                as_doc,
            } => {
                let what = if *as_doc { "fields" } else { "elements" };
                out.push_str(&format!("<{count} {what} of "));
                item.render_into(out, budget);
                out.push('>');
            }
            Value::LongString { len, pattern } => {
                out.push_str(&format!(
                    "<string of {len} bytes repeating {}>",
                    json_string(&cut(pattern, 40))
                ));
            }
            Value::CursorId => out.push_str("<cursor id from the prelude>"),
        }
    }
}

/// A scalar in relaxed extended JSON, binary data in hex rather than base64 (written here:
/// `Bson::into_relaxed_extjson` needs a bson feature this workspace does not turn on).
fn scalar_json(b: &Bson) -> String {
    match b {
        Bson::Double(f) if f.is_finite() && f.fract() != 0.0 => f.to_string(),
        Bson::Double(f) if f.is_finite() && f.abs() < 1e15 => format!("{f:.1}"),
        Bson::Double(f) => format!("{{\"$numberDouble\": \"{f}\"}}"),
        Bson::String(s) => json_string(s),
        Bson::Boolean(v) => v.to_string(),
        Bson::Null => "null".into(),
        Bson::Int32(n) => n.to_string(),
        Bson::Int64(n) => n.to_string(),
        Bson::Decimal128(d) => format!("{{\"$numberDecimal\": \"{d}\"}}"),
        Bson::Undefined => "{\"$undefined\": true}".into(),
        Bson::MinKey => "{\"$minKey\": 1}".into(),
        Bson::MaxKey => "{\"$maxKey\": 1}".into(),
        Bson::ObjectId(o) => format!("{{\"$oid\": \"{o}\"}}"),
        Bson::DateTime(d) => format!(
            "{{\"$date\": {{\"$numberLong\": \"{}\"}}}}",
            d.timestamp_millis()
        ),
        Bson::Timestamp(t) => format!(
            "{{\"$timestamp\": {{\"t\": {}, \"i\": {}}}}}",
            t.time, t.increment
        ),
        Bson::RegularExpression(r) => format!(
            "{{\"$regularExpression\": {{\"pattern\": {}, \"options\": {}}}}}",
            json_string(r.pattern.as_str()),
            json_string(r.options.as_str())
        ),
        Bson::Binary(bin) => {
            let hex: String = bin.bytes.iter().map(|x| format!("{x:02x}")).collect();
            format!(
                "{{\"$binary\": {{\"hex\": \"{hex}\", \"subType\": \"{:02x}\"}}}}",
                u8::from(bin.subtype)
            )
        }
        Bson::JavaScriptCode(c) => format!("{{\"$code\": {}}}", json_string(c)),
        Bson::JavaScriptCodeWithScope(c) => format!(
            "{{\"$code\": {}, \"$scope\": {}}}",
            json_string(&c.code),
            Value::from(c.scope.clone()).render(200)
        ),
        Bson::Symbol(s) => format!("{{\"$symbol\": {}}}", json_string(s)),
        other => format!("{other:?}"),
    }
}

fn level_type(level: &Level) -> u8 {
    if level.array { 0x04 } else { 0x03 }
}

/// Encodes a document made of `fields`.
pub fn encode_document(fields: &[(String, Value)], cx: EncodeContext) -> Vec<u8> {
    let mut out = Vec::new();
    let start = begin(&mut out);
    for (k, v) in fields {
        put_element(&mut out, k, v, cx);
    }
    close(&mut out, start);
    out
}

/// Reserves a document's length prefix; [`close`] fills it in.
fn begin(out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    start
}

fn put_element(out: &mut Vec<u8>, key: &str, value: &Value, cx: EncodeContext) {
    out.push(value.element_type());
    put_key(out, key);
    value.encode_into(out, cx);
}

fn put_key(out: &mut Vec<u8>, key: &str) {
    out.extend(key.bytes().map(|b| if b == 0 { 1 } else { b }));
    out.push(0);
}

/// The iterative encoding of a [`Value::Nest`]: opens every level, writes the leaf, then closes
/// the levels innermost first.
fn encode_nest(levels: &[Level], times: u32, leaf: &Value, out: &mut Vec<u8>, cx: EncodeContext) {
    let total = if levels.is_empty() {
        0
    } else {
        levels.len() * times as usize
    };
    if total == 0 {
        leaf.encode_into(out, cx);
        return;
    }
    let mut starts = Vec::with_capacity(total);
    for i in 0..total {
        let level = &levels[i % levels.len()];
        starts.push(begin(out));
        if i + 1 < total {
            out.push(level_type(&levels[(i + 1) % levels.len()]));
            put_key(out, &level.key);
        } else {
            out.push(leaf.element_type());
            put_key(out, &level.key);
            leaf.encode_into(out, cx);
        }
    }
    while let Some(start) = starts.pop() {
        close(out, start);
    }
}

/// Writes the terminating NUL of the document begun at `start` and patches its length.
fn close(out: &mut Vec<u8>, start: usize) {
    out.push(0);
    let len = (out.len() - start) as i32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// A scalar's value bytes: encoded as the only field of a document with an empty key, then cut
/// out (`[len:4][type][\0]` before it, the document's NUL after).
fn encode_scalar(b: &Bson, out: &mut Vec<u8>) {
    let mut d = Document::new();
    d.insert("", b.clone());
    match d.to_vec() {
        Ok(bytes) if bytes.len() >= 7 => out.extend_from_slice(&bytes[6..bytes.len() - 1]),
        // Unencodable (a NUL inside a regex pattern, say): a null's empty encoding would not
        // match its type byte, so write an empty string of the same shape instead.
        _ => out.extend_from_slice(&1i32.to_le_bytes()),
    }
}

fn scalar_size_bound(b: &Bson) -> usize {
    match b {
        Bson::String(s) | Bson::Symbol(s) | Bson::JavaScriptCode(s) => s.len() + 5,
        Bson::Binary(bin) => bin.bytes.len() + 5,
        Bson::RegularExpression(r) => r.pattern.len() + r.options.len() + 2,
        Bson::JavaScriptCodeWithScope(c) => c.code.len() + 1024,
        Bson::Int32(_) => 4,
        Bson::Boolean(_) => 1,
        Bson::Null | Bson::Undefined | Bson::MinKey | Bson::MaxKey => 0,
        Bson::ObjectId(_) => 12,
        Bson::Decimal128(_) => 16,
        _ => 8,
    }
}

/// `len` bytes of `pattern` repeated, cut back to a character boundary.
pub fn long_string(len: usize, pattern: &str) -> String {
    let pattern = if pattern.is_empty() { "x" } else { pattern };
    let mut s = pattern.repeat(len / pattern.len() + 1);
    let mut cut = len.min(s.len());
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    s
}

fn cut(s: &str, n: usize) -> String {
    let mut end = n.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{RawDocumentBuf, doc};

    #[test]
    fn plain_values_encode_as_the_bson_crate_does() {
        let d = doc! {"a": 1, "b": {"c": [1, "x", 2.5, null]}, "d": bson::Decimal128::from_bytes([7; 16])};
        let ours = encode_document(
            match &Value::from(d.clone()) {
                Value::Doc(f) => f,
                _ => unreachable!(),
            },
            EncodeContext::default(),
        );
        assert_eq!(ours, d.to_vec().unwrap());
    }

    #[test]
    fn a_nest_encodes_without_recursion_and_decodes_to_its_depth() {
        let nest = Value::Nest {
            levels: vec![Level::doc("$and"), Level::array()],
            times: 3,
            leaf: Box::new(Value::from(doc! {"x": 1})),
        };
        let bytes = encode_document(&[("f".into(), nest)], EncodeContext::default());
        let parsed = Document::try_from(RawDocumentBuf::from_bytes(bytes).unwrap()).unwrap();
        assert_eq!(
            parsed,
            doc! {"f": {"$and": [{"$and": [{"$and": [{"x": 1}]}]}]}}
        );
        // 200,000 levels: a recursive encoder would overflow the test thread's stack.
        let deep = Value::Nest {
            levels: vec![Level::array()],
            times: 200_000,
            leaf: Box::new(Value::from(1)),
        };
        let bytes = encode_document(&[("f".into(), deep)], EncodeContext::default());
        assert!(RawDocumentBuf::from_bytes(bytes).is_ok());
    }

    #[test]
    fn compact_forms_encode_to_their_size_and_render_briefly() {
        let v = Value::Doc(vec![
            (
                "s".into(),
                Value::LongString {
                    len: 1_000_000,
                    pattern: "é".into(),
                },
            ),
            (
                "r".into(),
                Value::Repeat {
                    count: 1000,
                    item: Box::new(Value::from(7)),
                    as_doc: true,
                },
            ),
            ("c".into(), Value::CursorId),
        ]);
        let Value::Doc(fields) = &v else {
            unreachable!()
        };
        let bytes = encode_document(fields, EncodeContext { cursor_id: 42 });
        assert!(bytes.len() <= v.encoded_size_bound());
        let d = Document::try_from(RawDocumentBuf::from_bytes(bytes).unwrap()).unwrap();
        assert_eq!(d.get_str("s").unwrap().len(), 1_000_000);
        assert_eq!(d.get_document("r").unwrap().get_i32("f999").unwrap(), 7);
        assert_eq!(d.get_i64("c").unwrap(), 42);
        assert!(v.render(300).len() < 400);
    }
}
