//! MongoDB KeyString V1 value encoding (ascending order only), with its type bits.
//!
//! Owns the byte format of §5.3–5.4 of the change-streams reference: every BSON value maps to
//! a self-delimiting byte string whose `memcmp` order equals MongoDB's BSON comparison order
//! (canonical type order first, then value), and numerically equal values of different numeric
//! types (int32 1, int64 1, double 1.0, decimal 1.00) encode to identical bytes. What the byte
//! string erases (int32 vs int64 vs double vs decimal and its exponent, string vs symbol, -0.0)
//! goes into the separate [`TypeBits`] stream, so `decode(encode(v), type_bits) == v` exactly.
//!
//! [`Builder::append_raw_document`] (in `raw`) encodes a document from its BSON bytes, as
//! [`Builder::append_document`] encodes the decoded document.
//!
//! Three readers share one format: [`decode_value`] builds the value, [`skip_value`] validates
//! and steps over it without allocating, and [`fast_scalar`] reads the common scalars
//! (timestamps, bools, null, int32/int64) directly. Property tests check that they agree.
//!
//! Invariants:
//! * encoding never fails and never panics; decoding returns [`KeyStringError`] on any
//!   malformed input and never panics (all reads are bounds-checked, nesting is limited);
//! * the encoding of one value is prefix-free, so a sequence of values compares element-wise.

use bson::{
    Binary, Bson, DateTime, Decimal128, Document, JavaScriptCodeWithScope, Regex, Timestamp,
    oid::ObjectId, spec::BinarySubtype,
};

use crate::decimal::{self, Dec};

mod raw;

/// The canonical type bytes ("CTypes"). For types whose value lives partly in the CType byte
/// (numbers, bools) the generic one is used before field names inside objects.
pub mod ctype {
    pub const MIN_KEY: u8 = 10;
    pub const UNDEFINED: u8 = 15;
    pub const NULLISH: u8 = 20;
    pub const NUMERIC: u8 = 30;
    pub const STRING_LIKE: u8 = 60;
    pub const OBJECT: u8 = 70;
    pub const ARRAY: u8 = 80;
    pub const BIN_DATA: u8 = 90;
    pub const OID: u8 = 100;
    pub const BOOL: u8 = 110;
    pub const DATE: u8 = 120;
    pub const TIMESTAMP: u8 = 130;
    pub const REGEX: u8 = 140;
    pub const DBREF: u8 = 150;
    pub const CODE: u8 = 160;
    pub const CODE_WITH_SCOPE: u8 = 170;
    pub const MAX_KEY: u8 = 240;

    pub const NUMERIC_NAN: u8 = NUMERIC;
    pub const NUMERIC_NEGATIVE_LARGE_MAGNITUDE: u8 = NUMERIC + 1;
    pub const NUMERIC_NEGATIVE_8_BYTE_INT: u8 = NUMERIC + 2;
    pub const NUMERIC_NEGATIVE_1_BYTE_INT: u8 = NUMERIC + 9;
    pub const NUMERIC_NEGATIVE_SMALL_MAGNITUDE: u8 = NUMERIC + 10;
    pub const NUMERIC_ZERO: u8 = NUMERIC + 11;
    pub const NUMERIC_POSITIVE_SMALL_MAGNITUDE: u8 = NUMERIC + 12;
    pub const NUMERIC_POSITIVE_1_BYTE_INT: u8 = NUMERIC + 13;
    pub const NUMERIC_POSITIVE_8_BYTE_INT: u8 = NUMERIC + 20;
    pub const NUMERIC_POSITIVE_LARGE_MAGNITUDE: u8 = NUMERIC + 21;

    pub const BOOL_FALSE: u8 = BOOL;
    pub const BOOL_TRUE: u8 = BOOL + 1;

    /// Terminates a complete KeyString (after the last value, before any RecordId).
    pub const END: u8 = 4;
}

/// Decimal continuation markers: the low bits of a fractional number's encoding telling how a
/// Decimal128 relates to the double stored in front of it.
pub(crate) mod dcm {
    pub const EQUAL_TO_DOUBLE: u64 = 0;
    pub const CONTINUATION_LESS_THAN_DOUBLE_15: u64 = 1;
    pub const EQUAL_TO_DOUBLE_15: u64 = 2;
    pub const CONTINUATION_GREATER_THAN_DOUBLE_15: u64 = 3;
}

/// Type-bit codes.
mod tb {
    pub const STRING: u8 = 0;
    pub const SYMBOL: u8 = 1;
    pub const INT: u8 = 0;
    pub const LONG: u8 = 1;
    pub const DOUBLE: u8 = 2;
    pub const DECIMAL: u8 = 3;
    pub const SPECIAL_ZERO_PREFIX: u8 = 3;
    pub const V1_NEGATIVE_DOUBLE_ZERO: u8 = 0x18;
    pub const DECIMAL_ZERO_0XXX: u8 = 0x1a;
    pub const DECIMAL_ZERO_5XXX: u8 = 0x1f;
    pub const STORED_DECIMAL_EXPONENT_BITS: u32 = 6;
    pub const STORED_DECIMAL_EXPONENT_MASK: u32 = (1 << STORED_DECIMAL_EXPONENT_BITS) - 1;
    pub const MAX_BYTES_FOR_SHORT_ENCODING: usize = 127;
}

/// Deepest nesting the decoder accepts (MongoDB's default maximum BSON depth).
pub const MAX_DEPTH: u32 = 200;

/// A malformed KeyString or type-bits buffer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("KeyString format error: {0}")]
pub struct KeyStringError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, KeyStringError> {
    Err(KeyStringError(msg.into()))
}

// ---------------------------------------------------------------------------------------------
// Type bits
// ---------------------------------------------------------------------------------------------

/// The type-bits stream built alongside a KeyString: bits packed least-significant first.
#[derive(Debug, Clone, Default)]
pub struct TypeBits {
    /// The bytes materialized so far (see [`TypeBits::bit`]): the first [`INLINE_BYTES`] of
    /// them held inline, so that the short streams of common keys and tokens never allocate;
    /// all of them in `spilled` once there are more.
    inline: [u8; INLINE_BYTES],
    spilled: Vec<u8>,
    /// How many bytes are materialized.
    materialized: usize,
    cur_bit: usize,
    all_zeros: bool,
}

/// Type-bit bytes a [`TypeBits`] holds without allocating (128 bits).
const INLINE_BYTES: usize = 16;

impl PartialEq for TypeBits {
    fn eq(&self, other: &Self) -> bool {
        self.data() == other.data()
            && self.cur_bit == other.cur_bit
            && self.all_zeros == other.all_zeros
    }
}

impl Eq for TypeBits {}

impl TypeBits {
    pub fn new() -> Self {
        TypeBits {
            inline: [0; INLINE_BYTES],
            spilled: Vec::new(),
            materialized: 0,
            cur_bit: 0,
            all_zeros: true,
        }
    }

    /// The materialized bytes.
    fn data(&self) -> &[u8] {
        if self.materialized <= INLINE_BYTES {
            self.inline.get(..self.materialized).unwrap_or_default()
        } else {
            &self.spilled
        }
    }

    /// Materializes the bytes up to `byte` (zeros), and gives that one.
    fn byte_mut(&mut self, byte: usize) -> Option<&mut u8> {
        if byte >= self.materialized {
            if byte >= INLINE_BYTES && self.materialized <= INLINE_BYTES {
                self.spilled = self.data().to_vec();
            }
            self.materialized = byte + 1;
            if self.materialized > INLINE_BYTES {
                self.spilled.resize(self.materialized, 0);
            }
        }
        if self.materialized <= INLINE_BYTES {
            self.inline.get_mut(byte)
        } else {
            self.spilled.get_mut(byte)
        }
    }

    /// True when no bit set so far is 1 (the wire form then omits `_typeBits`).
    pub fn is_all_zeros(&self) -> bool {
        self.all_zeros
    }

    fn bit(&mut self, one: bool) {
        // Bytes are materialized lazily, up to the last one bit, so that the common all-zero
        // stream has none; `to_bytes` pads to `ceil(cur_bit / 8)` bytes.
        if one {
            self.all_zeros = false;
            let shift = self.cur_bit % 8;
            if let Some(b) = self.byte_mut(self.cur_bit / 8) {
                *b |= 1 << shift;
            }
        }
        self.cur_bit += 1;
    }

    fn two(&mut self, code: u8) {
        self.bit(code & 2 != 0);
        self.bit(code & 1 != 0);
    }

    fn append_zero_5(&mut self, code: u8) {
        for pos in (0..5).rev() {
            self.bit((code >> pos) & 1 != 0);
        }
    }

    fn append_decimal_zero(&mut self, which: u32) {
        // `which` < 6 << 12: the 3-bit prefix selects one of kDecimalZero0xxx..5xxx.
        let prefix = (which >> 12).min(u32::from(tb::DECIMAL_ZERO_5XXX - tb::DECIMAL_ZERO_0XXX));
        self.append_zero_5(tb::DECIMAL_ZERO_0XXX + prefix as u8);
        for pos in (0..12).rev() {
            self.bit((which >> pos) & 1 != 0);
        }
    }

    fn append_decimal_exponent(&mut self, bits: u32) {
        for pos in (0..tb::STORED_DECIMAL_EXPONENT_BITS).rev() {
            self.bit((bits >> pos) & 1 != 0);
        }
    }

    /// Number of bits appended.
    pub fn len(&self) -> usize {
        self.cur_bit
    }

    pub fn is_empty(&self) -> bool {
        self.cur_bit == 0
    }

    /// Appends all bits of `other`.
    pub fn append_all(&mut self, other: &TypeBits) {
        if other.all_zeros {
            self.cur_bit += other.cur_bit;
            return;
        }
        let mut r = other.reader();
        for _ in 0..other.cur_bit {
            self.bit(r.bit().unwrap_or(0) == 1);
        }
    }

    /// Reads these bits back (unserialized).
    pub fn reader(&self) -> TypeBitsReader<'_> {
        TypeBitsReader {
            data: self.data(),
            limit: self.cur_bit.div_ceil(8),
            cur_bit: 0,
        }
    }

    /// The serialized form: empty when all zeros; one byte when a single data byte below 0x80;
    /// `0x80|len` + data up to 127 bytes; else `0x80`, u32 LE length, data.
    pub fn to_bytes(&self) -> Vec<u8> {
        if self.all_zeros {
            return Vec::new();
        }
        // Every appended bit that starts a byte allocates that byte, zeros included.
        let n = self.cur_bit.div_ceil(8);
        let data = self.data();
        let pad = n.saturating_sub(data.len());
        let mut out = Vec::with_capacity(n + 5);
        if n == 1 && data.first().is_some_and(|b| *b < 0x80) {
            out.extend_from_slice(data);
            return out;
        }
        if n <= tb::MAX_BYTES_FOR_SHORT_ENCODING {
            out.push(0x80 | n as u8);
        } else {
            out.push(0x80);
            out.extend_from_slice(&(n as u32).to_le_bytes());
        }
        out.extend_from_slice(data);
        out.resize(out.len() + pad, 0);
        out
    }
}

/// Reads a serialized type-bits buffer.
#[derive(Debug, Clone)]
pub struct TypeBitsReader<'a> {
    data: &'a [u8],
    /// Addressable bytes; bytes in `data.len()..limit` read as zero (a lazily materialized
    /// [`TypeBits`]). Ignored when `data` is empty (the all-zeros stream).
    limit: usize,
    cur_bit: usize,
}

impl<'a> TypeBitsReader<'a> {
    /// Parses the serialized form (see [`TypeBits::to_bytes`]); an empty buffer is all zeros.
    /// The whole buffer must be consumed by the size prefix and its data.
    pub fn new(buf: &'a [u8]) -> Result<Self, KeyStringError> {
        let data: &[u8] = match buf {
            [] | [0] => &[],
            [first, ..] if *first < 0x80 => {
                if buf.len() != 1 {
                    return err("trailing bytes after single-byte type bits");
                }
                buf
            }
            [0x80, rest @ ..] => {
                let (len, data) = match rest {
                    [a, b, c, d, data @ ..] => {
                        (u32::from_le_bytes([*a, *b, *c, *d]) as usize, data)
                    }
                    _ => return err("truncated type bits size"),
                };
                if len <= tb::MAX_BYTES_FOR_SHORT_ENCODING {
                    return err("Invalid overlong encoding.");
                }
                if data.len() != len {
                    return err("type bits size does not match its data");
                }
                data
            }
            [first, data @ ..] => {
                let len = usize::from(first & 0x7f);
                if data.len() != len {
                    return err("type bits size does not match its data");
                }
                data
            }
        };
        Ok(TypeBitsReader {
            data,
            limit: data.len(),
            cur_bit: 0,
        })
    }

    /// An all-zeros reader (no `_typeBits`).
    pub fn zeros() -> TypeBitsReader<'static> {
        TypeBitsReader {
            data: &[],
            limit: 0,
            cur_bit: 0,
        }
    }

    fn all_zeros(&self) -> bool {
        self.data.iter().all(|b| *b == 0)
    }

    fn bit(&mut self) -> Result<u8, KeyStringError> {
        if self.data.is_empty() {
            return Ok(0);
        }
        let byte = self.cur_bit / 8;
        let off = self.cur_bit % 8;
        self.cur_bit += 1;
        match self.data.get(byte) {
            Some(b) => Ok((b >> off) & 1),
            None if byte < self.limit => Ok(0),
            None => err("Invalid size byte(s)."),
        }
    }

    fn numeric(&mut self) -> Result<u8, KeyStringError> {
        let hi = self.bit()?;
        Ok((hi << 1) | self.bit()?)
    }

    /// Returns the zero type: INT, LONG, DOUBLE, `NEG_DOUBLE_ZERO`, or a decimal-zero prefix.
    fn zero(&mut self) -> Result<u8, KeyStringError> {
        let mut res = self.numeric()?;
        if res == tb::SPECIAL_ZERO_PREFIX {
            for _ in 0..3 {
                res = (res << 1) | self.bit()?;
            }
        }
        Ok(res)
    }

    fn decimal_zero(&mut self, zero_type: u8) -> Result<u32, KeyStringError> {
        let mut which = u32::from(zero_type - tb::DECIMAL_ZERO_0XXX);
        for _ in 0..12 {
            which = (which << 1) | u32::from(self.bit()?);
        }
        Ok(which)
    }

    pub(crate) fn decimal_exponent_bits(&mut self) -> Result<u32, KeyStringError> {
        let mut e = 0u32;
        for _ in 0..tb::STORED_DECIMAL_EXPONENT_BITS {
            e = (e << 1) | u32::from(self.bit()?);
        }
        Ok(e)
    }

    /// How many bits have been read.
    pub fn position(&self) -> usize {
        self.cur_bit
    }

    /// A reader over the same stream positioned at bit `bit`.
    pub fn at(&self, bit: usize) -> Self {
        TypeBitsReader {
            cur_bit: bit,
            ..self.clone()
        }
    }

    /// The bits `start..end` of this stream as a new [`TypeBits`].
    pub fn extract(&self, start: usize, end: usize) -> TypeBits {
        let mut out = TypeBits::new();
        let mut r = self.at(start);
        for _ in start..end {
            out.bit(r.bit().unwrap_or(0) == 1);
        }
        out
    }

    /// True when every bit of the buffer was consumed or is zero (no stray one bits).
    pub fn only_zeros_remain(&self) -> bool {
        if self.all_zeros() {
            return true;
        }
        let total = self.data.len() * 8;
        (self.cur_bit..total).all(|i| {
            self.data
                .get(i / 8)
                .is_some_and(|b| (b >> (i % 8)) & 1 == 0)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------------

/// Builds a KeyString (ascending) and its type bits, one value at a time.
#[derive(Debug, Clone, Default)]
pub struct Builder {
    buf: Vec<u8>,
    type_bits: TypeBits,
}

impl Builder {
    pub fn new() -> Self {
        Builder {
            buf: Vec::with_capacity(128),
            type_bits: TypeBits::new(),
        }
    }

    /// Appends one top-level value (CType byte + payload; no name).
    pub fn append(&mut self, v: &Bson) {
        append_value(&mut self.buf, &mut self.type_bits, v);
    }

    /// Appends an int32 (type bits `00`), as `append(&Bson::Int32(v))`.
    pub fn append_i32(&mut self, v: i32) {
        self.type_bits.two(tb::INT);
        append_integer(&mut self.buf, i64::from(v));
    }

    /// Appends a Timestamp, as `append(&Bson::Timestamp(..))`.
    pub fn append_timestamp(&mut self, secs: u32, inc: u32) {
        self.buf.push(ctype::TIMESTAMP);
        let v = (u64::from(secs) << 32) | u64::from(inc);
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    /// Appends a bool.
    pub fn append_bool(&mut self, v: bool) {
        self.buf.push(if v {
            ctype::BOOL_TRUE
        } else {
            ctype::BOOL_FALSE
        });
    }

    /// Appends null.
    pub fn append_null(&mut self) {
        self.buf.push(ctype::NULLISH);
    }

    /// Appends a UUID as BinData subtype 4: `5A 10 04` + 16 bytes.
    pub fn append_uuid(&mut self, bytes: &[u8; 16]) {
        self.buf.extend_from_slice(&[ctype::BIN_DATA, 16, 4]);
        self.buf.extend_from_slice(bytes);
    }

    /// Appends one top-level object (same bytes as `append(&Bson::Document(..))`, no clone).
    pub fn append_document(&mut self, d: &Document) {
        self.buf.push(ctype::OBJECT);
        append_object_body(&mut self.buf, &mut self.type_bits, d);
    }

    /// Starts a top-level object; add fields with `field_*`, close it with
    /// [`Builder::end_object`]. Produces the same bytes as [`Builder::append_document`].
    pub fn begin_object(&mut self) {
        self.buf.push(ctype::OBJECT);
    }

    fn field_name(&mut self, generic: u8, name: &str) {
        field_name(&mut self.buf, generic, name);
    }

    /// Appends a string field to the open object.
    pub fn field_str(&mut self, name: &str, value: &str) {
        self.field_name(ctype::STRING_LIKE, name);
        self.type_bits.bit(tb::STRING != 0);
        self.buf.push(ctype::STRING_LIKE);
        append_string_like(&mut self.buf, value.as_bytes());
    }

    /// Appends a sub-document field to the open object.
    pub fn field_document(&mut self, name: &str, value: &Document) {
        self.field_name(ctype::OBJECT, name);
        self.append_document(value);
    }

    /// Appends a field of any type to the open object.
    pub fn field(&mut self, name: &str, value: &Bson) {
        self.field_name(generic_ctype(value), name);
        append_value(&mut self.buf, &mut self.type_bits, value);
    }

    /// Closes the object opened by [`Builder::begin_object`].
    pub fn end_object(&mut self) {
        self.buf.push(0);
    }

    /// Appends already-encoded value bytes and their type bits.
    pub fn append_raw(&mut self, bytes: &[u8], bits: &TypeBits) {
        self.buf.extend_from_slice(bytes);
        self.type_bits.append_all(bits);
    }

    /// Appends the end byte `0x04` that closes a complete key.
    pub fn append_end(&mut self) {
        self.buf.push(ctype::END);
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    pub fn type_bits(&self) -> &TypeBits {
        &self.type_bits
    }

    pub fn finish(self) -> (Vec<u8>, TypeBits) {
        (self.buf, self.type_bits)
    }
}

/// A field's generic CType and name, inside an object.
fn field_name(buf: &mut Vec<u8>, generic: u8, name: &str) {
    buf.push(generic);
    // Field names are C strings: BSON cannot hold a NUL inside one.
    let n = name.as_bytes();
    let end = n.iter().position(|b| *b == 0).unwrap_or(n.len());
    buf.extend_from_slice(&n[..end]);
    buf.push(0);
}

/// The KeyString V1 (ascending) encoding of one BSON value, without type bits and without the
/// end byte. Byte order equals MongoDB's BSON comparison order (no collation), and values that
/// compare equal (int32 1, int64 1, double 1.0, decimal 1.0) give identical bytes; suitable as an
/// ordered storage key for `_id`.
pub fn key_bytes(value: &Bson) -> Vec<u8> {
    let mut buf = Vec::with_capacity(24);
    let mut bits = TypeBits::new();
    append_value(&mut buf, &mut bits, value);
    buf
}

/// [`key_bytes`] of a document, without cloning it into a [`Bson`].
pub fn document_key_bytes(d: &Document) -> Vec<u8> {
    let mut buf = Vec::with_capacity(32);
    let mut bits = TypeBits::new();
    buf.push(ctype::OBJECT);
    append_object_body(&mut buf, &mut bits, d);
    buf
}

/// The generic CType written before a field name inside an object.
pub fn generic_ctype(v: &Bson) -> u8 {
    match v {
        Bson::MinKey => ctype::MIN_KEY,
        Bson::Null => ctype::NULLISH,
        Bson::Undefined => ctype::UNDEFINED,
        Bson::Double(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Decimal128(_) => ctype::NUMERIC,
        Bson::String(_) | Bson::Symbol(_) => ctype::STRING_LIKE,
        Bson::Document(_) => ctype::OBJECT,
        Bson::Array(_) => ctype::ARRAY,
        Bson::Binary(_) => ctype::BIN_DATA,
        Bson::ObjectId(_) => ctype::OID,
        Bson::Boolean(_) => ctype::BOOL,
        Bson::DateTime(_) => ctype::DATE,
        Bson::Timestamp(_) => ctype::TIMESTAMP,
        Bson::RegularExpression(_) => ctype::REGEX,
        Bson::DbPointer(_) => ctype::DBREF,
        Bson::JavaScriptCode(_) => ctype::CODE,
        Bson::JavaScriptCodeWithScope(_) => ctype::CODE_WITH_SCOPE,
        Bson::MaxKey => ctype::MAX_KEY,
    }
}

fn append_value(buf: &mut Vec<u8>, bits: &mut TypeBits, v: &Bson) {
    match v {
        Bson::MinKey | Bson::MaxKey | Bson::Null | Bson::Undefined => buf.push(generic_ctype(v)),
        Bson::Double(d) => append_double(buf, bits, *d),
        Bson::Int32(i) => append_int32(buf, bits, *i),
        Bson::Int64(i) => append_int64(buf, bits, *i),
        Bson::Decimal128(d) => append_decimal(buf, bits, d),
        Bson::String(s) => append_string(buf, bits, s),
        Bson::Symbol(s) => append_symbol(buf, bits, s),
        Bson::Document(d) => {
            buf.push(ctype::OBJECT);
            append_object_body(buf, bits, d);
        }
        Bson::Array(a) => {
            buf.push(ctype::ARRAY);
            for e in a {
                append_value(buf, bits, e);
            }
            buf.push(0);
        }
        Bson::Binary(b) => append_binary(buf, b.subtype, &b.bytes),
        Bson::ObjectId(o) => append_object_id(buf, o),
        Bson::Boolean(b) => append_bool(buf, *b),
        Bson::DateTime(d) => append_date(buf, *d),
        Bson::Timestamp(t) => append_timestamp(buf, *t),
        Bson::RegularExpression(r) => append_regex(buf, r.pattern.as_str(), r.options.as_str()),
        Bson::DbPointer(p) => {
            buf.push(ctype::DBREF);
            let (ns, oid) = db_pointer_parts(p);
            buf.extend_from_slice(&(ns.len() as u32).to_be_bytes());
            buf.extend_from_slice(ns.as_bytes());
            buf.extend_from_slice(&oid);
        }
        Bson::JavaScriptCode(c) => append_code(buf, c),
        Bson::JavaScriptCodeWithScope(c) => {
            append_code_with_scope_code(buf, &c.code);
            append_object_body(buf, bits, &c.scope);
        }
    }
}

// One writer per value type, shared by the encoders of decoded values (above) and of BSON
// bytes (`raw`), so that both write the same bytes.

fn append_int32(buf: &mut Vec<u8>, bits: &mut TypeBits, i: i32) {
    bits.two(tb::INT);
    append_integer(buf, i64::from(i));
}

fn append_int64(buf: &mut Vec<u8>, bits: &mut TypeBits, i: i64) {
    bits.two(tb::LONG);
    append_integer(buf, i);
}

fn append_string(buf: &mut Vec<u8>, bits: &mut TypeBits, s: &str) {
    bits.bit(tb::STRING != 0);
    buf.push(ctype::STRING_LIKE);
    append_string_like(buf, s.as_bytes());
}

fn append_symbol(buf: &mut Vec<u8>, bits: &mut TypeBits, s: &str) {
    bits.bit(tb::SYMBOL != 0);
    buf.push(ctype::STRING_LIKE);
    append_string_like(buf, s.as_bytes());
}

fn append_binary(buf: &mut Vec<u8>, subtype: BinarySubtype, bytes: &[u8]) {
    buf.push(ctype::BIN_DATA);
    let len = bytes.len();
    if len < 0xff {
        buf.push(len as u8);
    } else {
        buf.push(0xff);
        buf.extend_from_slice(&(len as u32).to_be_bytes());
    }
    buf.push(u8::from(subtype));
    buf.extend_from_slice(bytes);
}

fn append_object_id(buf: &mut Vec<u8>, o: &ObjectId) {
    buf.push(ctype::OID);
    buf.extend_from_slice(&o.bytes());
}

fn append_bool(buf: &mut Vec<u8>, b: bool) {
    buf.push(if b {
        ctype::BOOL_TRUE
    } else {
        ctype::BOOL_FALSE
    });
}

fn append_date(buf: &mut Vec<u8>, d: DateTime) {
    buf.push(ctype::DATE);
    let enc = (d.timestamp_millis() as u64) ^ (1u64 << 63);
    buf.extend_from_slice(&enc.to_be_bytes());
}

fn append_timestamp(buf: &mut Vec<u8>, t: Timestamp) {
    buf.push(ctype::TIMESTAMP);
    let v = (u64::from(t.time) << 32) | u64::from(t.increment);
    buf.extend_from_slice(&v.to_be_bytes());
}

fn append_regex(buf: &mut Vec<u8>, pattern: &str, options: &str) {
    buf.push(ctype::REGEX);
    buf.extend_from_slice(pattern.as_bytes());
    buf.push(0);
    buf.extend_from_slice(options.as_bytes());
    buf.push(0);
}

fn append_code(buf: &mut Vec<u8>, code: &str) {
    buf.push(ctype::CODE);
    append_string_like(buf, code.as_bytes());
}

/// The CType and code of a code-with-scope value; its scope's object body follows.
fn append_code_with_scope_code(buf: &mut Vec<u8>, code: &str) {
    buf.push(ctype::CODE_WITH_SCOPE);
    append_string_like(buf, code.as_bytes());
}

fn append_object_body(buf: &mut Vec<u8>, bits: &mut TypeBits, d: &Document) {
    for (name, v) in d {
        buf.push(generic_ctype(v));
        // Field names are C strings: BSON cannot hold a NUL inside one.
        let n = name.as_bytes();
        let end = n.iter().position(|b| *b == 0).unwrap_or(n.len());
        buf.extend_from_slice(&n[..end]);
        buf.push(0);
        append_value(buf, bits, v);
    }
    buf.push(0);
}

/// Bytes with each NUL escaped as `00 FF`, then a terminating `00`.
fn append_string_like(buf: &mut Vec<u8>, s: &[u8]) {
    let mut parts = s.split(|b| *b == 0);
    if let Some(first) = parts.next() {
        buf.extend_from_slice(first);
    }
    for part in parts {
        buf.extend_from_slice(&[0, 0xff]);
        buf.extend_from_slice(part);
    }
    buf.push(0);
}

/// `DbPointer`'s fields are private in the `bson` crate; read them from its raw BSON form.
fn db_pointer_parts(p: &bson::DbPointer) -> (String, [u8; 12]) {
    let mut doc = Document::new();
    doc.insert("p", Bson::DbPointer(p.clone()));
    let Ok(bytes) = doc.to_vec() else {
        return (String::new(), [0; 12]);
    };
    // doc: i32 len, 0x0C, "p\0", i32 strlen (incl. NUL), ns, NUL, 12-byte oid, 0x00.
    let body = bytes.get(7..).unwrap_or(&[]);
    let Some(len_bytes) = body.get(0..4) else {
        return (String::new(), [0; 12]);
    };
    let slen = i32::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]);
    let slen = usize::try_from(slen).unwrap_or(1).max(1);
    let ns = body
        .get(4..4 + slen - 1)
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default();
    let mut oid = [0u8; 12];
    if let Some(o) = body.get(4 + slen..4 + slen + 12) {
        oid.copy_from_slice(o);
    }
    (ns, oid)
}

fn make_db_pointer(ns: &str, oid: [u8; 12]) -> Result<Bson, KeyStringError> {
    if ns.as_bytes().contains(&0) {
        return err("DBRef namespace contains NUL");
    }
    let mut raw = Vec::with_capacity(32 + ns.len());
    let slen = (ns.len() + 1) as i32;
    let total = (4 + 1 + 2 + 4 + ns.len() + 1 + 12 + 1) as i32;
    raw.extend_from_slice(&total.to_le_bytes());
    raw.push(0x0C);
    raw.extend_from_slice(b"p\0");
    raw.extend_from_slice(&slen.to_le_bytes());
    raw.extend_from_slice(ns.as_bytes());
    raw.push(0);
    raw.extend_from_slice(&oid);
    raw.push(0);
    let doc = Document::from_reader(raw.as_slice())
        .map_err(|e| KeyStringError(format!("bad DBRef: {e}")))?;
    doc.get("p")
        .cloned()
        .ok_or_else(|| KeyStringError("bad DBRef".into()))
}

// --- numbers ---------------------------------------------------------------------------------

const MIN_LARGE_DOUBLE: f64 = 9_223_372_036_854_775_808.0; // 2^63
const MAX_INT_FOR_DOUBLE: f64 = 9_007_199_254_740_992.0; // 2^53

fn tiniest_double_with_2bit_dcm() -> f64 {
    f64::from_bits(((1023 - 255) as u64) << 52) // 2^-255
}
fn pow2(e: i32) -> f64 {
    // Exact for normal exponents, which is all that is used here.
    f64::from_bits(((1023 + e) as u64) << 52)
}

fn append_double(buf: &mut Vec<u8>, bits: &mut TypeBits, num: f64) {
    if num == 0.0 && num.is_sign_negative() {
        bits.append_zero_5(tb::V1_NEGATIVE_DOUBLE_ZERO);
    } else {
        bits.two(tb::DOUBLE);
    }
    append_double_without_type_bits(buf, num, dcm::EQUAL_TO_DOUBLE);
}

fn push_u64(buf: &mut Vec<u8>, v: u64, invert: bool) {
    let v = if invert { !v } else { v };
    buf.extend_from_slice(&v.to_be_bytes());
}

pub(crate) fn append_double_without_type_bits(buf: &mut Vec<u8>, num: f64, dcm: u64) {
    let negative = num < 0.0;
    let magnitude = num.abs();
    // NaN fails every comparison, so it lands in this branch too.
    if magnitude.is_nan() || magnitude < 1.0 {
        if magnitude > 0.0 {
            append_small_double(buf, num, dcm);
        } else if num == 0.0 {
            buf.push(ctype::NUMERIC_ZERO);
        } else {
            buf.push(ctype::NUMERIC_NAN);
        }
        return;
    }
    if magnitude < MIN_LARGE_DOUBLE {
        let integer_part = magnitude as u64;
        if integer_part as f64 == magnitude && dcm == dcm::EQUAL_TO_DOUBLE {
            append_preshifted_integer(buf, integer_part << 1, negative);
            return;
        }
        let fractional_bytes = ((integer_part << 1).leading_zeros() / 8) as usize;
        let ct = if negative {
            ctype::NUMERIC_NEGATIVE_8_BYTE_INT + fractional_bytes as u8
        } else {
            ctype::NUMERIC_POSITIVE_8_BYTE_INT - fractional_bytes as u8
        };
        buf.push(ct);
        let mut encoding = (magnitude * pow2(8 * fractional_bytes as i32)) as u64;
        encoding = encoding.wrapping_add((integer_part + 1) << (fractional_bytes * 8));
        encoding |= dcm;
        push_u64(buf, encoding, negative);
    } else {
        append_large_double(buf, num, dcm);
    }
}

fn append_small_double(buf: &mut Vec<u8>, value: f64, dcm: u64) {
    let negative = value < 0.0;
    let magnitude = value.abs();
    buf.push(if negative {
        ctype::NUMERIC_NEGATIVE_SMALL_MAGNITUDE
    } else {
        ctype::NUMERIC_POSITIVE_SMALL_MAGNITUDE
    });
    let encoded = if magnitude >= tiniest_double_with_2bit_dcm() {
        (magnitude.to_bits() << 2) | dcm
    } else {
        let scaled = magnitude * pow2(256);
        let e = (scaled.to_bits() << 1) | u64::from(dcm != dcm::EQUAL_TO_DOUBLE);
        e.wrapping_add(1u64 << 62)
    };
    push_u64(buf, encoded, negative);
}

fn append_large_double(buf: &mut Vec<u8>, value: f64, dcm: u64) {
    buf.push(if value > 0.0 {
        ctype::NUMERIC_POSITIVE_LARGE_MAGNITUDE
    } else {
        ctype::NUMERIC_NEGATIVE_LARGE_MAGNITUDE
    });
    let encoded = if value.is_finite() {
        ((value.to_bits() << 1) & !(1u64 << 63)) | u64::from(dcm != dcm::EQUAL_TO_DOUBLE)
    } else {
        !0u64
    };
    push_u64(buf, encoded, value < 0.0);
}

fn append_integer(buf: &mut Vec<u8>, num: i64) {
    if num == i64::MIN {
        append_large_double(buf, -MIN_LARGE_DOUBLE, dcm::EQUAL_TO_DOUBLE);
        return;
    }
    if num == 0 {
        buf.push(ctype::NUMERIC_ZERO);
        return;
    }
    append_preshifted_integer(buf, num.unsigned_abs() << 1, num < 0);
}

pub(crate) fn append_preshifted_integer(buf: &mut Vec<u8>, value: u64, negative: bool) {
    let bytes_needed = (64 - value.leading_zeros()).div_ceil(8).max(1) as usize;
    let be = value.to_be_bytes();
    let used = &be[8 - bytes_needed..];
    if negative {
        buf.push(ctype::NUMERIC_NEGATIVE_1_BYTE_INT - (bytes_needed as u8 - 1));
        buf.extend(used.iter().map(|b| !b));
    } else {
        buf.push(ctype::NUMERIC_POSITIVE_1_BYTE_INT + (bytes_needed as u8 - 1));
        buf.extend_from_slice(used);
    }
}

fn append_decimal(buf: &mut Vec<u8>, bits: &mut TypeBits, d: &Decimal128) {
    let dec = Dec::from_bson(d);
    decimal::append_decimal(buf, bits, &dec);
}

pub(crate) fn type_bits_decimal(bits: &mut TypeBits, biased_exponent: u32) {
    bits.two(tb::DECIMAL);
    bits.append_decimal_exponent(biased_exponent & tb::STORED_DECIMAL_EXPONENT_MASK);
}

pub(crate) fn type_bits_decimal_special(bits: &mut TypeBits) {
    bits.two(tb::DECIMAL);
}

pub(crate) fn type_bits_decimal_zero(bits: &mut TypeBits, which: u32) {
    bits.append_decimal_zero(which);
}

// ---------------------------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------------------------

/// A bounds-checked cursor over KeyString bytes.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    pub fn u8(&mut self) -> Result<u8, KeyStringError> {
        let b = self
            .buf
            .get(self.pos)
            .copied()
            .ok_or_else(|| KeyStringError("unexpected end of key".into()))?;
        self.pos += 1;
        Ok(b)
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], KeyStringError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| KeyStringError("unexpected end of key".into()))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub(crate) fn u64(&mut self, invert: bool) -> Result<u64, KeyStringError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        let v = u64::from_be_bytes(a);
        Ok(if invert { !v } else { v })
    }

    fn u32_be(&mut self) -> Result<u32, KeyStringError> {
        let s = self.take(4)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }

    /// A C string (no NUL escaping): field names and regexes.
    fn cstring(&mut self) -> Result<&'a [u8], KeyStringError> {
        let rest = self.buf.get(self.pos..).unwrap_or(&[]);
        let n = rest
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| KeyStringError("Failed to find null terminator in string.".into()))?;
        let s = &rest[..n];
        self.pos += n + 1;
        Ok(s)
    }

    /// A string body with `00 FF` escapes for NULs.
    fn string_with_nuls(&mut self) -> Result<Vec<u8>, KeyStringError> {
        let mut out = self.cstring()?.to_vec();
        while self.peek() == Some(0xff) {
            self.pos += 1;
            out.push(0);
            out.extend_from_slice(self.cstring()?);
        }
        Ok(out)
    }
}

fn utf8(bytes: Vec<u8>) -> Result<String, KeyStringError> {
    String::from_utf8(bytes).map_err(|_| KeyStringError("string is not valid UTF-8".into()))
}

/// Decodes one value whose CType byte has already been read.
pub fn decode_value(
    ct: u8,
    r: &mut Reader<'_>,
    bits: &mut TypeBitsReader<'_>,
    depth: u32,
) -> Result<Bson, KeyStringError> {
    if depth > MAX_DEPTH {
        return err("KeyString encoding exceeded maximum allowable BSON nesting depth");
    }
    Ok(match ct {
        ctype::MIN_KEY => Bson::MinKey,
        ctype::MAX_KEY => Bson::MaxKey,
        ctype::NULLISH => Bson::Null,
        ctype::UNDEFINED => Bson::Undefined,
        ctype::BOOL_TRUE => Bson::Boolean(true),
        ctype::BOOL_FALSE => Bson::Boolean(false),
        ctype::DATE => {
            let v = r.u64(false)? ^ (1u64 << 63);
            Bson::DateTime(DateTime::from_millis(v as i64))
        }
        ctype::TIMESTAMP => {
            let v = r.u64(false)?;
            Bson::Timestamp(Timestamp {
                time: (v >> 32) as u32,
                increment: v as u32,
            })
        }
        ctype::OID => {
            let s = r.take(12)?;
            let mut a = [0u8; 12];
            a.copy_from_slice(s);
            Bson::ObjectId(ObjectId::from_bytes(a))
        }
        ctype::STRING_LIKE => {
            let symbol = bits.bit()? == tb::SYMBOL;
            let s = utf8(r.string_with_nuls()?)?;
            if symbol {
                Bson::Symbol(s)
            } else {
                Bson::String(s)
            }
        }
        ctype::CODE => Bson::JavaScriptCode(utf8(r.string_with_nuls()?)?),
        ctype::CODE_WITH_SCOPE => {
            let code = utf8(r.string_with_nuls()?)?;
            let scope = decode_object_body(r, bits, depth + 2)?;
            Bson::JavaScriptCodeWithScope(JavaScriptCodeWithScope { code, scope })
        }
        ctype::BIN_DATA => {
            let mut size = usize::from(r.u8()?);
            if size == 0xff {
                size = r.u32_be()? as usize;
            }
            let subtype = BinarySubtype::from(r.u8()?);
            let bytes = r.take(size)?.to_vec();
            Bson::Binary(Binary { subtype, bytes })
        }
        ctype::REGEX => {
            let pattern = utf8(r.cstring()?.to_vec())?;
            let options = utf8(r.cstring()?.to_vec())?;
            let pattern = pattern
                .try_into()
                .map_err(|_| KeyStringError("bad regex pattern".into()))?;
            let options = options
                .try_into()
                .map_err(|_| KeyStringError("bad regex options".into()))?;
            Bson::RegularExpression(Regex { pattern, options })
        }
        ctype::DBREF => {
            let size = r.u32_be()? as usize;
            let ns = utf8(r.take(size)?.to_vec())?;
            let s = r.take(12)?;
            let mut oid = [0u8; 12];
            oid.copy_from_slice(s);
            make_db_pointer(&ns, oid)?
        }
        ctype::OBJECT => Bson::Document(decode_object_body(r, bits, depth + 1)?),
        ctype::ARRAY => {
            let mut out = Vec::new();
            loop {
                let ct = r.u8()?;
                if ct == 0 {
                    break;
                }
                out.push(decode_value(ct, r, bits, depth + 1)?);
            }
            Bson::Array(out)
        }
        ctype::NUMERIC_NAN..=ctype::NUMERIC_POSITIVE_LARGE_MAGNITUDE => decode_number(ct, r, bits)?,
        other => return err(format!("Unknown type: {other}")),
    })
}

/// A scalar decoded without building a [`Bson`] (the common top-level token fields).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Scalar {
    /// Not a fast-path scalar: decode it with [`decode_value`].
    #[default]
    Other,
    Timestamp(u32, u32),
    Int32(i32),
    Int64(i64),
    Bool(bool),
    Null,
}

impl Scalar {
    pub fn to_bson(self) -> Option<Bson> {
        Some(match self {
            Scalar::Other => return None,
            Scalar::Timestamp(time, increment) => Bson::Timestamp(Timestamp { time, increment }),
            Scalar::Int32(i) => Bson::Int32(i),
            Scalar::Int64(i) => Bson::Int64(i),
            Scalar::Bool(b) => Bson::Boolean(b),
            Scalar::Null => Bson::Null,
        })
    }
}

/// Decodes timestamps, bools, null and integral int32/int64 values quickly; returns
/// `Scalar::Other` (consuming nothing) for anything else, which [`decode_value`] then handles.
/// Agrees exactly with [`decode_value`] where it answers.
pub fn fast_scalar(ct: u8, r: &mut Reader<'_>, bits: &mut TypeBitsReader<'_>) -> Scalar {
    match ct {
        ctype::TIMESTAMP => match r.u64(false) {
            Ok(v) => Scalar::Timestamp((v >> 32) as u32, v as u32),
            Err(_) => Scalar::Other,
        },
        ctype::BOOL_TRUE => Scalar::Bool(true),
        ctype::BOOL_FALSE => Scalar::Bool(false),
        ctype::NULLISH => Scalar::Null,
        ctype::NUMERIC_ZERO => {
            let mut b = bits.clone();
            match b.numeric() {
                Ok(tb::INT) => {
                    *bits = b;
                    Scalar::Int32(0)
                }
                Ok(tb::LONG) => {
                    *bits = b;
                    Scalar::Int64(0)
                }
                _ => Scalar::Other,
            }
        }
        ctype::NUMERIC_NEGATIVE_8_BYTE_INT..=ctype::NUMERIC_NEGATIVE_1_BYTE_INT
        | ctype::NUMERIC_POSITIVE_1_BYTE_INT..=ctype::NUMERIC_POSITIVE_8_BYTE_INT => {
            let negative = ct <= ctype::NUMERIC_NEGATIVE_1_BYTE_INT;
            let n = if negative {
                usize::from(ctype::NUMERIC_NEGATIVE_1_BYTE_INT - ct) + 1
            } else {
                usize::from(ct - ctype::NUMERIC_POSITIVE_1_BYTE_INT) + 1
            };
            let mut b = bits.clone();
            let t = match b.numeric() {
                Ok(t @ (tb::INT | tb::LONG)) => t,
                _ => return Scalar::Other,
            };
            let Some(bytes) = r.buf.get(r.pos..r.pos + n) else {
                return Scalar::Other;
            };
            let mut enc = 0u64;
            for &x in bytes {
                enc = (enc << 8) | u64::from(if negative { !x } else { x });
            }
            if enc & 1 == 1 {
                return Scalar::Other; // fractional: not an integer encoding
            }
            let mag = (enc >> 1) as i64;
            let v = if negative { -mag } else { mag };
            let out = if t == tb::INT {
                match i32::try_from(v) {
                    Ok(i) => Scalar::Int32(i),
                    Err(_) => return Scalar::Other,
                }
            } else {
                Scalar::Int64(v)
            };
            r.pos += n;
            *bits = b;
            out
        }
        _ => Scalar::Other,
    }
}

/// Validates one value whose CType byte has been read, consuming its bytes and type bits,
/// without building it. Accepts exactly what [`decode_value`] accepts.
pub fn skip_value(
    ct: u8,
    r: &mut Reader<'_>,
    bits: &mut TypeBitsReader<'_>,
    depth: u32,
) -> Result<(), KeyStringError> {
    if depth > MAX_DEPTH {
        return err("KeyString encoding exceeded maximum allowable BSON nesting depth");
    }

    fn string_ok(r: &mut Reader<'_>) -> Result<(), KeyStringError> {
        utf8_ok(r.cstring()?)?;
        while r.peek() == Some(0xff) {
            r.pos += 1;
            utf8_ok(r.cstring()?)?;
        }
        Ok(())
    }
    match ct {
        ctype::MIN_KEY
        | ctype::MAX_KEY
        | ctype::NULLISH
        | ctype::UNDEFINED
        | ctype::BOOL_TRUE
        | ctype::BOOL_FALSE => {}
        ctype::DATE | ctype::TIMESTAMP => {
            r.take(8)?;
        }
        ctype::OID => {
            r.take(12)?;
        }
        ctype::STRING_LIKE => {
            bits.bit()?;
            string_ok(r)?;
        }
        ctype::CODE => string_ok(r)?,
        ctype::CODE_WITH_SCOPE => {
            string_ok(r)?;
            skip_object_body(r, bits, depth + 2)?;
        }
        ctype::BIN_DATA => {
            let mut size = usize::from(r.u8()?);
            if size == 0xff {
                size = r.u32_be()? as usize;
            }
            r.u8()?;
            r.take(size)?;
        }
        ctype::REGEX => {
            utf8_ok(r.cstring()?)?;
            utf8_ok(r.cstring()?)?;
        }
        ctype::DBREF => {
            let size = r.u32_be()? as usize;
            let ns = r.take(size)?;
            utf8_ok(ns)?;
            if ns.contains(&0) {
                return err("DBRef namespace contains NUL");
            }
            r.take(12)?;
        }
        ctype::OBJECT => skip_object_body(r, bits, depth + 1)?,
        ctype::ARRAY => loop {
            let ct = r.u8()?;
            if ct == 0 {
                break;
            }
            skip_value(ct, r, bits, depth + 1)?;
        },
        ctype::NUMERIC_NAN..=ctype::NUMERIC_POSITIVE_LARGE_MAGNITUDE => {
            if fast_scalar(ct, r, bits) == Scalar::Other {
                decode_number(ct, r, bits)?;
            }
        }
        other => return err(format!("Unknown type: {other}")),
    }
    Ok(())
}

/// UTF-8 validation with a fast path for the common all-ASCII names and strings.
fn utf8_ok(b: &[u8]) -> Result<(), KeyStringError> {
    if b.is_ascii() || std::str::from_utf8(b).is_ok() {
        Ok(())
    } else {
        err("string is not valid UTF-8")
    }
}

fn skip_object_body(
    r: &mut Reader<'_>,
    bits: &mut TypeBitsReader<'_>,
    depth: u32,
) -> Result<(), KeyStringError> {
    if depth > MAX_DEPTH {
        return err("KeyString encoding exceeded maximum allowable BSON nesting depth");
    }
    loop {
        if r.u8()? == 0 {
            return Ok(());
        }
        utf8_ok(r.cstring()?)?;
        let ct = r.u8()?;
        skip_value(ct, r, bits, depth)?;
    }
}

fn decode_object_body(
    r: &mut Reader<'_>,
    bits: &mut TypeBitsReader<'_>,
    depth: u32,
) -> Result<Document, KeyStringError> {
    if depth > MAX_DEPTH {
        return err("KeyString encoding exceeded maximum allowable BSON nesting depth");
    }
    let mut doc = Document::new();
    loop {
        if r.u8()? == 0 {
            break;
        }
        let name = utf8(r.cstring()?.to_vec())?;
        let ct = r.u8()?;
        let v = decode_value(ct, r, bits, depth)?;
        doc.insert(name, v);
    }
    Ok(doc)
}

fn decode_number(
    ct: u8,
    r: &mut Reader<'_>,
    bits: &mut TypeBitsReader<'_>,
) -> Result<Bson, KeyStringError> {
    match ct {
        ctype::NUMERIC_NAN => match bits.numeric()? {
            tb::DOUBLE => Ok(Bson::Double(f64::NAN)),
            tb::DECIMAL => Ok(Bson::Decimal128(decimal::Dec::nan().to_bson())),
            _ => err("Invalid type bits for numeric NaN"),
        },
        ctype::NUMERIC_ZERO => {
            let zt = bits.zero()?;
            match zt {
                tb::DOUBLE => Ok(Bson::Double(0.0)),
                tb::INT => Ok(Bson::Int32(0)),
                tb::LONG => Ok(Bson::Int64(0)),
                tb::V1_NEGATIVE_DOUBLE_ZERO => Ok(Bson::Double(-0.0)),
                tb::DECIMAL_ZERO_0XXX..=tb::DECIMAL_ZERO_5XXX => {
                    let which = bits.decimal_zero(zt)?;
                    decimal::decimal_zero(which)
                }
                _ => err("Invalid numeric zero type bits"),
            }
        }
        ctype::NUMERIC_NEGATIVE_LARGE_MAGNITUDE | ctype::NUMERIC_POSITIVE_LARGE_MAGNITUDE => {
            let negative = ct == ctype::NUMERIC_NEGATIVE_LARGE_MAGNITUDE;
            let original = bits.numeric()?;
            let mut encoded = r.u64(negative)?;
            if encoded & (1u64 << 63) == 0 {
                let has_continuation = encoded & 1 == 1;
                encoded >>= 1;
                encoded |= 1u64 << 62;
                let mut bin = f64::from_bits(encoded);
                if negative {
                    bin = -bin;
                }
                match original {
                    tb::DOUBLE if !has_continuation => Ok(Bson::Double(bin)),
                    tb::LONG if bin == -MIN_LARGE_DOUBLE && !has_continuation => {
                        Ok(Bson::Int64(i64::MIN))
                    }
                    tb::DECIMAL => decimal::decode_large(bin, negative, has_continuation, r, bits),
                    _ => err("Unexpected type of large number."),
                }
            } else if encoded == !0u64 {
                match original {
                    tb::DOUBLE => Ok(Bson::Double(if negative {
                        f64::NEG_INFINITY
                    } else {
                        f64::INFINITY
                    })),
                    tb::DECIMAL => Ok(Bson::Decimal128(Dec::infinity(negative).to_bson())),
                    _ => err("Unexpected type for infinity."),
                }
            } else {
                if original != tb::DECIMAL {
                    return err("Invalid type bits for decimal number.");
                }
                let hi = encoded & !(1u64 << 63);
                let lo = r.u64(negative)?;
                decimal::decode_huge(hi, lo, negative, bits)
            }
        }
        ctype::NUMERIC_NEGATIVE_SMALL_MAGNITUDE | ctype::NUMERIC_POSITIVE_SMALL_MAGNITUDE => {
            let negative = ct == ctype::NUMERIC_NEGATIVE_SMALL_MAGNITUDE;
            let original = bits.numeric()?;
            let encoded = r.u64(negative)?;
            match encoded >> 62 {
                0 => {
                    if original != tb::DECIMAL {
                        return err("Unexpected type for tiny decimal.");
                    }
                    let lo = r.u64(negative)?;
                    decimal::decode_teeny(encoded, lo, negative, bits)
                }
                1 | 2 => {
                    let has_continuation = encoded & 1 == 1;
                    let scaled = f64::from_bits((encoded - (1u64 << 62)) >> 1);
                    match original {
                        tb::DOUBLE => {
                            if has_continuation {
                                return err("Unexpected decimal continuation.");
                            }
                            let bin = scaled * pow2(-256);
                            Ok(Bson::Double(if negative { -bin } else { bin }))
                        }
                        tb::DECIMAL if has_continuation => {
                            decimal::decode_tiny(scaled, negative, r, bits)
                        }
                        _ => err("Expected decimal continuation."),
                    }
                }
                _ => {
                    let d = encoded & 3;
                    let bin = f64::from_bits(encoded >> 2);
                    match original {
                        tb::DOUBLE => {
                            if d != dcm::EQUAL_TO_DOUBLE {
                                return err("Decimal continuation mismatch.");
                            }
                            Ok(Bson::Double(if negative { -bin } else { bin }))
                        }
                        tb::DECIMAL => decimal::decode_with_dcm(bin, d, negative, false, r, bits),
                        _ => err("Unexpected type for small number, expected decimal."),
                    }
                }
            }
        }
        _ => {
            // 1..8-byte integers, possibly with a fraction.
            let negative = ct <= ctype::NUMERIC_NEGATIVE_1_BYTE_INT;
            let n = if negative {
                usize::from(ctype::NUMERIC_NEGATIVE_1_BYTE_INT - ct) + 1
            } else {
                usize::from(ct - ctype::NUMERIC_POSITIVE_1_BYTE_INT) + 1
            };
            let original = bits.numeric()?;
            let mut encoded_int: u64 = 0;
            for _ in 0..n {
                let b = r.u8()?;
                encoded_int = (encoded_int << 8) | u64::from(if negative { !b } else { b });
            }
            let has_fraction = encoded_int & 1 == 1;
            let integer_part = encoded_int >> 1; // < 2^63
            if !has_fraction {
                let signed = if negative {
                    -(integer_part as i64)
                } else {
                    integer_part as i64
                };
                return match original {
                    tb::DOUBLE => Ok(Bson::Double(signed as f64)),
                    tb::INT => i32::try_from(signed)
                        .map(Bson::Int32)
                        .map_err(|_| KeyStringError("int32 out of range".into())),
                    tb::LONG => Ok(Bson::Int64(signed)),
                    _ => decimal::decode_integer(signed, bits),
                };
            }
            let frac_bytes = 8 - n;
            let mut encoded_fraction = integer_part;
            for _ in 0..frac_bytes {
                let b = r.u8()?;
                encoded_fraction =
                    (encoded_fraction << 8) | u64::from(if negative { !b } else { b });
            }
            let bin = (encoded_fraction & !3u64) as f64 * pow2(-8 * frac_bytes as i32);
            if original == tb::DOUBLE {
                if frac_bytes == 0 || encoded_fraction & 3 != dcm::EQUAL_TO_DOUBLE {
                    return err("Decimal continuation mismatch.");
                }
                return Ok(Bson::Double(if negative { -bin } else { bin }));
            }
            if original != tb::DECIMAL {
                return err("Expected type Decimal.");
            }
            let d = if frac_bytes > 0 {
                encoded_fraction & 3
            } else {
                dcm::CONTINUATION_GREATER_THAN_DOUBLE_15
            };
            if integer_part as f64 > MAX_INT_FOR_DOUBLE
                && d != dcm::EQUAL_TO_DOUBLE
                && d != dcm::EQUAL_TO_DOUBLE_15
            {
                decimal::decode_big_integer_fraction(integer_part, negative, r, bits)
            } else {
                decimal::decode_with_dcm(bin, d, negative, true, r, bits)
            }
        }
    }
}

/// Streams the top-level values of a complete KeyString (values, then the end byte `0x04`,
/// then nothing: a missing end byte or bytes after it are errors; no RecordId is expected).
#[derive(Debug, Clone)]
pub struct ValueStream<'a, 'b> {
    r: Reader<'a>,
    bits: TypeBitsReader<'b>,
    done: bool,
}

impl<'a, 'b> ValueStream<'a, 'b> {
    pub fn new(data: &'a [u8], bits: TypeBitsReader<'b>) -> Self {
        ValueStream {
            r: Reader::new(data),
            bits,
            done: false,
        }
    }

    /// The next value, or `None` once the end byte has been read.
    pub fn next_value(&mut self) -> Result<Option<Bson>, KeyStringError> {
        if self.done {
            return Ok(None);
        }
        let Some(ct) = self.r.peek() else {
            return err("key has no end byte");
        };
        self.r.pos += 1;
        if ct == ctype::END {
            if self.r.remaining() != 0 {
                return err("bytes after the end of the key");
            }
            self.done = true;
            return Ok(None);
        }
        decode_value(ct, &mut self.r, &mut self.bits, 1).map(Some)
    }
}

/// Decodes a whole KeyString made of top-level values followed by the end byte; returns the
/// values (see [`ValueStream`]).
pub fn decode_all(data: &[u8], bits: &mut TypeBitsReader<'_>) -> Result<Vec<Bson>, KeyStringError> {
    let mut stream = ValueStream::new(data, bits.clone());
    let mut out = Vec::new();
    while let Some(v) = stream.next_value()? {
        out.push(v);
    }
    *bits = stream.bits;
    Ok(out)
}

/// Decodes a single value produced by [`key_bytes`] (no end byte) with the given type bits.
pub fn decode_key(data: &[u8], bits: &mut TypeBitsReader<'_>) -> Result<Bson, KeyStringError> {
    let mut r = Reader::new(data);
    let ct = r.u8()?;
    let v = decode_value(ct, &mut r, bits, 1)?;
    if r.remaining() != 0 {
        return err("bytes after the value");
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    /// Streams held inline and spilled to the heap read back the same, serialize by the same
    /// rules, and compare by content.
    #[test]
    fn type_bits_read_back_across_the_inline_limit() {
        for n in [0usize, 1, 7, 8, 9, 127, 128, 129, 200, 1100] {
            for pattern in [0u64, 1, 0x5555, u64::MAX] {
                let one = |i: usize| (pattern >> (i % 64)) & 1 == 1 || i + 1 == n && pattern != 0;
                let mut bits = TypeBits::new();
                for i in 0..n {
                    bits.bit(one(i));
                }
                assert_eq!(bits.len(), n);
                let mut r = bits.reader();
                for i in 0..n {
                    assert_eq!(r.bit().unwrap() == 1, one(i), "bit {i} of {n}");
                }
                let ser = bits.to_bytes();
                if bits.is_all_zeros() {
                    assert!(ser.is_empty());
                    continue;
                }
                let bytes = n.div_ceil(8);
                let mut back = TypeBitsReader::new(&ser).unwrap();
                for i in 0..n {
                    assert_eq!(
                        back.bit().unwrap() == 1,
                        one(i),
                        "serialized bit {i} of {n}"
                    );
                }
                assert!(ser.len() >= bytes);
                let mut again = TypeBits::new();
                again.append_all(&bits);
                assert_eq!(again, bits.clone());
                assert_eq!(again.to_bytes(), ser);
            }
        }
    }

    fn dec(s: &str) -> Bson {
        Bson::Decimal128(Decimal128::from_str(s).unwrap())
    }

    #[test]
    fn integers_match_reference_examples() {
        assert_eq!(key_bytes(&Bson::Int32(1)), [0x2B, 0x02]);
        assert_eq!(key_bytes(&Bson::Int32(2)), [0x2B, 0x04]);
        assert_eq!(key_bytes(&Bson::Int32(128)), [0x2C, 0x01, 0x00]);
        assert_eq!(key_bytes(&Bson::Int32(-1)), [0x27, 0xFD]);
        assert_eq!(key_bytes(&Bson::Int32(0)), [0x29]);
    }

    #[test]
    fn numerically_equal_values_have_identical_bytes() {
        let one = key_bytes(&Bson::Int32(1));
        assert_eq!(key_bytes(&Bson::Int64(1)), one);
        assert_eq!(key_bytes(&Bson::Double(1.0)), one);
        assert_eq!(key_bytes(&dec("1")), one);
        assert_eq!(key_bytes(&dec("1.000")), one);
        assert_eq!(key_bytes(&Bson::Double(-0.0)), key_bytes(&Bson::Int64(0)));
        assert_eq!(key_bytes(&dec("-0E+3")), key_bytes(&Bson::Int64(0)));
        assert_eq!(key_bytes(&dec("2.5")), key_bytes(&Bson::Double(2.5)));
        assert_eq!(key_bytes(&dec("NaN")), key_bytes(&Bson::Double(f64::NAN)));
        assert_eq!(
            key_bytes(&dec("-Infinity")),
            key_bytes(&Bson::Double(f64::NEG_INFINITY))
        );
    }

    #[test]
    fn decimals_round_trip_exactly() {
        for s in [
            "0.1",
            "-0.1",
            "1.23456789012345678901234567890123",
            "1E-6176",
            "9.999E+6144",
            "123456789012345678",
            "12345678901234567.5",
            "-3.14159",
            "1E+400",
            "1E-400",
            "4.9E-324",
            "1.7976931348623157E+308",
            "1.8E+308",
            "0.30000000000000000",
            "-0E-12",
            "1234567890123456789.123",
            "1E-320",
            "2.2250738585072014E-308",
        ] {
            let v = dec(s);
            let mut b = Builder::new();
            b.append(&v);
            let (bytes, tb) = b.finish();
            let tbb = tb.to_bytes();
            let mut rd = TypeBitsReader::new(&tbb).unwrap();
            let back = decode_key(&bytes, &mut rd).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(back, v, "{s}");
        }
    }

    #[test]
    fn decimal_order_matches_numeric_order() {
        let vals = [
            "-1E+400",
            "-2.5",
            "-0.1",
            "0",
            "1E-400",
            "0.1",
            "0.10000000000000001",
            "1",
            "1.5",
            "9007199254740993",
            "1E+19",
            "1E+400",
        ];
        for w in vals.windows(2) {
            assert!(
                key_bytes(&dec(w[0])) < key_bytes(&dec(w[1])),
                "{} < {}",
                w[0],
                w[1]
            );
        }
    }
}
