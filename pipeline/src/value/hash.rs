//! The 64-bit hash of a value, shared by hashed shard keys (the router's routing) and hashed
//! indexes (the shard's index entries), so both place a value alike.
//!
//! Invariant: values that compare equal across numeric types (`1`, `1.0`, `NumberLong(1)`)
//! hash alike; the hash of a value never changes (chunks and index entries depend on it).

use bson::Bson;
use md5::{Digest, Md5};

use super::canonical_type;

/// The 64-bit hash of a value for hashed shard keys: MD5 over a canonical encoding, in the
/// manner of MongoDB's `BSONElementHasher` (numbers hash by value, so `1`, `1.0` and
/// `NumberLong(1)` route alike). The first eight digest bytes, little-endian.
pub fn hash_value(v: &Bson) -> i64 {
    let mut h = Md5::new();
    h.update(0_i32.to_le_bytes()); // seed
    hash_into(&mut h, v);
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_le_bytes(first)
}

fn hash_into(h: &mut Md5, v: &Bson) {
    // Values that compare equal across types (1, 1.0, NumberLong(1)) share a canonical type.
    h.update([canonical_type(v)]);
    match v {
        Bson::Int32(i) => h.update(i64::from(*i).to_le_bytes()),
        Bson::Int64(i) => h.update(i.to_le_bytes()),
        Bson::Double(d) => {
            if d.fract() == 0.0 && *d >= i64::MIN as f64 && *d < i64::MAX as f64 {
                h.update((*d as i64).to_le_bytes())
            } else {
                h.update(d.to_bits().to_le_bytes())
            }
        }
        Bson::String(s) | Bson::Symbol(s) => {
            h.update(s.as_bytes());
            h.update([0]);
        }
        Bson::Document(d) => {
            for (k, v) in d {
                h.update(k.as_bytes());
                h.update([0]);
                hash_into(h, v);
            }
        }
        Bson::Array(a) => a.iter().for_each(|v| hash_into(h, v)),
        Bson::Binary(b) => {
            h.update([u8::from(b.subtype)]);
            h.update(&b.bytes);
        }
        Bson::ObjectId(o) => h.update(o.bytes()),
        Bson::Boolean(b) => h.update([u8::from(*b)]),
        Bson::DateTime(d) => h.update(d.timestamp_millis().to_le_bytes()),
        Bson::Timestamp(t) => {
            h.update(t.time.to_le_bytes());
            h.update(t.increment.to_le_bytes());
        }
        Bson::RegularExpression(r) => {
            h.update(r.pattern.as_str().as_bytes());
            h.update([0]);
            h.update(r.options.as_str().as_bytes());
        }
        other => h.update(other.to_string().as_bytes()),
    }
}
