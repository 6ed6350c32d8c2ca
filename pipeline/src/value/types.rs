//! BSON types as MongoDB ranks and names them: the canonical rank that orders values of
//! different types, the type codes of `$type`, and their aliases (`"double"`, `"objectId"`, ...).
//!
//! Invariants: numbers share one rank, as do strings and symbols; every type has exactly one
//! code and one alias, and [`type_code_of_name`] inverts [`type_name_of_code`].

use bson::Bson;

/// MongoDB's canonical type rank (`canonicalizeBSONType`): values of different ranks compare
/// by rank; numbers share one rank, as do strings and symbols.
pub fn canonical_type(v: &Bson) -> u8 {
    match v {
        Bson::MinKey => 0,
        Bson::Undefined => 1,
        Bson::Null => 5,
        Bson::Double(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Decimal128(_) => 10,
        Bson::String(_) | Bson::Symbol(_) => 15,
        Bson::Document(_) => 20,
        Bson::Array(_) => 25,
        Bson::Binary(_) => 30,
        Bson::ObjectId(_) => 35,
        Bson::Boolean(_) => 40,
        Bson::DateTime(_) => 45,
        Bson::Timestamp(_) => 47,
        Bson::RegularExpression(_) => 50,
        Bson::DbPointer(_) => 55,
        Bson::JavaScriptCode(_) => 60,
        Bson::JavaScriptCodeWithScope(_) => 65,
        Bson::MaxKey => 127,
    }
}

/// The BSON type code (`$type` numbers): double 1, string 2, ..., minKey -1, maxKey 127.
pub fn type_code(v: &Bson) -> i32 {
    match v {
        Bson::Double(_) => 1,
        Bson::String(_) => 2,
        Bson::Document(_) => 3,
        Bson::Array(_) => 4,
        Bson::Binary(_) => 5,
        Bson::Undefined => 6,
        Bson::ObjectId(_) => 7,
        Bson::Boolean(_) => 8,
        Bson::DateTime(_) => 9,
        Bson::Null => 10,
        Bson::RegularExpression(_) => 11,
        Bson::DbPointer(_) => 12,
        Bson::JavaScriptCode(_) => 13,
        Bson::Symbol(_) => 14,
        Bson::JavaScriptCodeWithScope(_) => 15,
        Bson::Int32(_) => 16,
        Bson::Timestamp(_) => 17,
        Bson::Int64(_) => 18,
        Bson::Decimal128(_) => 19,
        Bson::MinKey => -1,
        Bson::MaxKey => 127,
    }
}

/// The type alias MongoDB uses in `$type` and error messages (`"double"`, `"objectId"`, ...).
pub fn type_name(v: &Bson) -> &'static str {
    type_name_of_code(type_code(v)).unwrap_or("unknown")
}

/// The alias of a BSON type code, if it is one.
pub fn type_name_of_code(code: i32) -> Option<&'static str> {
    TYPE_ALIASES
        .iter()
        .find(|(_, c)| *c == code)
        .map(|(name, _)| *name)
}

/// The type code of an alias (`"int"` → 16); `"number"` is not a single type and is absent.
pub fn type_code_of_name(name: &str) -> Option<i32> {
    TYPE_ALIASES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, c)| *c)
}

const TYPE_ALIASES: &[(&str, i32)] = &[
    ("double", 1),
    ("string", 2),
    ("object", 3),
    ("array", 4),
    ("binData", 5),
    ("undefined", 6),
    ("objectId", 7),
    ("bool", 8),
    ("date", 9),
    ("null", 10),
    ("regex", 11),
    ("dbPointer", 12),
    ("javascript", 13),
    ("symbol", 14),
    ("javascriptWithScope", 15),
    ("int", 16),
    ("timestamp", 17),
    ("long", 18),
    ("decimal", 19),
    ("minKey", -1),
    ("maxKey", 127),
];
