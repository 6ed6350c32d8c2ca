//! `$jsonSchema`: MongoDB 7.0's subset of JSON Schema draft 4 plus `bsonType`, as a query
//! operator (`find`, `$match`) and as (part of) a collection validator.
//!
//! A schema is parsed once into a tree of [`Rule`]s; evaluation walks the tree against a value
//! and either stops at the first failure (matching) or collects MongoDB's `errInfo` details for
//! every failing rule (explaining a validation failure). Both go through [`failures`], so a
//! document matches exactly when its explanation is empty.
//!
//! Semantics (invariants the tests check):
//! * JSON Schema, not query, semantics: no implicit array traversal (`bsonType: "int"` fails on
//!   `[1]`); a missing property satisfies its `properties` subschema.
//! * Restriction keywords apply only to values of their type: `minimum` to numbers, `minLength`
//!   to strings, `minItems` to arrays, `required` / `minProperties` to objects; any other type
//!   satisfies them.
//! * Parse errors carry MongoDB's codes: unknown keywords and unsupported ones (`$ref`,
//!   `format`, `default`, ...) are `FailedToParse` (9); wrongly typed arguments `TypeMismatch`.

use bson::{Bson, Document, doc};
use wire::ErrorCode;

use crate::re::Re;
use crate::value;
use crate::{MongoError, Result};

/// A parsed `$jsonSchema`.
#[derive(Debug, Clone)]
pub struct Schema {
    root: Node,
    spec: Document,
}

#[derive(Debug, Clone)]
struct Node {
    rules: Vec<Rule>,
    title: Option<String>,
    description: Option<String>,
}

/// One keyword (or a keyword pair such as `minimum` + `exclusiveMinimum`) with its spec, which
/// error details show as `specifiedAs`.
#[derive(Debug, Clone)]
struct Rule {
    kind: Kind,
    spec: Document,
}

#[derive(Debug, Clone)]
enum Kind {
    Type {
        keyword: &'static str,
        codes: Vec<i32>,
        number: bool,
    },
    Required(Vec<String>),
    Properties(Vec<(String, Node)>),
    PatternProperties(Vec<(Re, Node)>),
    AdditionalProperties {
        known: Vec<String>,
        patterns: Vec<Re>,
        allowed: Additional,
    },
    MinProperties(i64),
    MaxProperties(i64),
    Enum(Vec<Bson>),
    Minimum {
        limit: Bson,
        exclusive: bool,
    },
    Maximum {
        limit: Bson,
        exclusive: bool,
    },
    MultipleOf(f64),
    MinLength(i64),
    MaxLength(i64),
    Pattern(Re),
    Items(Box<Node>),
    ItemsTuple(Vec<Node>),
    AdditionalItems {
        from: usize,
        allowed: Additional,
    },
    MinItems(i64),
    MaxItems(i64),
    UniqueItems,
    AllOf(Vec<Node>),
    AnyOf(Vec<Node>),
    OneOf(Vec<Node>),
    Not(Box<Node>),
    Dependencies(Vec<(String, Dependency)>),
}

#[derive(Debug, Clone)]
enum Additional {
    Allowed,
    Forbidden,
    Schema(Box<Node>),
}

#[derive(Debug, Clone)]
enum Dependency {
    Properties(Vec<String>),
    Schema(Node),
}

const KEYWORDS: &[&str] = &[
    "additionalItems",
    "additionalProperties",
    "allOf",
    "anyOf",
    "bsonType",
    "dependencies",
    "description",
    "enum",
    "exclusiveMaximum",
    "exclusiveMinimum",
    "items",
    "maxItems",
    "maxLength",
    "maxProperties",
    "maximum",
    "minItems",
    "minLength",
    "minProperties",
    "minimum",
    "multipleOf",
    "not",
    "oneOf",
    "pattern",
    "patternProperties",
    "properties",
    "required",
    "title",
    "type",
    "uniqueItems",
];

/// Keywords of JSON Schema that MongoDB names as unsupported rather than unknown.
const UNSUPPORTED: &[&str] = &["$ref", "$schema", "default", "definitions", "format", "id"];

/// Deeper schemas are refused before they can exhaust the stack.
const MAX_SCHEMA_DEPTH: usize = 150;

fn type_mismatch(msg: String) -> MongoError {
    MongoError::new(ErrorCode::TYPE_MISMATCH, msg)
}

fn failed_to_parse(msg: String) -> MongoError {
    MongoError::failed_to_parse(msg)
}

impl Schema {
    /// Parses the argument of `$jsonSchema`.
    pub fn parse(arg: &Bson) -> Result<Schema> {
        let Bson::Document(spec) = arg else {
            return Err(type_mismatch("$jsonSchema must be an object".into()));
        };
        Ok(Schema {
            root: parse_node(spec, 0)?,
            spec: spec.clone(),
        })
    }

    /// Whether the document satisfies the schema.
    pub fn matches(&self, doc: &Document) -> bool {
        failures(&self.root, &Bson::Document(doc.clone()), false).is_empty()
    }

    /// Whether a value (an array element, inside `$elemMatch`) satisfies the schema.
    pub fn matches_value(&self, v: &Bson) -> bool {
        failures(&self.root, v, false).is_empty()
    }

    /// The `details` MongoDB reports for a document failing the schema:
    /// `{operatorName: "$jsonSchema", title?, description?, schemaRulesNotSatisfied: [...]}`.
    pub fn explain(&self, doc: &Document) -> Document {
        let mut out = doc! {"operatorName": "$jsonSchema"};
        if let Some(t) = &self.root.title {
            out.insert("title", t.clone());
        }
        if let Some(d) = &self.root.description {
            out.insert("description", d.clone());
        }
        let rules = failures(&self.root, &Bson::Document(doc.clone()), true);
        out.insert("schemaRulesNotSatisfied", docs(rules));
        out
    }

    /// The schema as given.
    pub fn spec(&self) -> &Document {
        &self.spec
    }
}

fn docs(v: Vec<Document>) -> Vec<Bson> {
    v.into_iter().map(Bson::Document).collect()
}

// ---------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------

fn parse_node(schema: &Document, depth: usize) -> Result<Node> {
    if depth > MAX_SCHEMA_DEPTH {
        return Err(MongoError::bad_value(format!(
            "$jsonSchema exceeded maximum nesting depth of {MAX_SCHEMA_DEPTH}"
        )));
    }
    for k in schema.keys() {
        if UNSUPPORTED.contains(&k.as_str()) {
            return Err(failed_to_parse(format!(
                "$jsonSchema keyword '{k}' is not currently supported"
            )));
        }
        if !KEYWORDS.contains(&k.as_str()) {
            return Err(failed_to_parse(format!("Unknown $jsonSchema keyword: {k}")));
        }
    }
    if schema.contains_key("type") && schema.contains_key("bsonType") {
        return Err(failed_to_parse(
            "Cannot specify both $jsonSchema keywords 'type' and 'bsonType'".into(),
        ));
    }
    for (max, excl) in [
        ("maximum", "exclusiveMaximum"),
        ("minimum", "exclusiveMinimum"),
    ] {
        if let Some(e) = schema.get(excl) {
            if !matches!(e, Bson::Boolean(_)) {
                return Err(type_mismatch(format!(
                    "$jsonSchema keyword '{excl}' must be a boolean"
                )));
            }
            if !schema.contains_key(max) {
                return Err(failed_to_parse(format!(
                    "$jsonSchema keyword '{max}' must be a present if {excl} is present"
                )));
            }
        }
    }
    let text = |k: &str| -> Result<Option<String>> {
        match schema.get(k) {
            None => Ok(None),
            Some(Bson::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(type_mismatch(format!(
                "$jsonSchema keyword '{k}' must be of type string"
            ))),
        }
    };
    let mut node = Node {
        rules: Vec::new(),
        title: text("title")?,
        description: text("description")?,
    };
    let spec_of = |k: &str, v: &Bson| doc! {k: v.clone()};
    for (k, v) in schema {
        let kind = match k.as_str() {
            "type" | "bsonType" => parse_type(k, v)?,
            "required" => Kind::Required(parse_names(k, v)?),
            "properties" => {
                let props = keyword_doc(k, v)?;
                let mut out = Vec::with_capacity(props.len());
                for (name, sub) in props {
                    let Bson::Document(sub) = sub else {
                        return Err(type_mismatch(format!(
                            "Nested schema for $jsonSchema property '{name}' must be an object"
                        )));
                    };
                    out.push((name.clone(), parse_node(sub, depth + 1)?));
                }
                Kind::Properties(out)
            }
            "patternProperties" => Kind::PatternProperties(parse_patterns(v, depth)?),
            "additionalProperties" => {
                let known = match schema.get("properties") {
                    Some(Bson::Document(p)) => p.keys().cloned().collect(),
                    _ => Vec::new(),
                };
                let patterns = match schema.get("patternProperties") {
                    Some(p) => parse_patterns(p, depth)?
                        .into_iter()
                        .map(|(re, _)| re)
                        .collect(),
                    None => Vec::new(),
                };
                Kind::AdditionalProperties {
                    known,
                    patterns,
                    allowed: parse_additional(k, v, depth)?,
                }
            }
            "minProperties" => Kind::MinProperties(non_negative(k, v)?),
            "maxProperties" => Kind::MaxProperties(non_negative(k, v)?),
            "enum" => {
                let Bson::Array(items) = v else {
                    return Err(type_mismatch(format!(
                        "$jsonSchema keyword '{k}' must be an array"
                    )));
                };
                if items.is_empty() {
                    return Err(failed_to_parse(format!(
                        "$jsonSchema keyword '{k}' cannot be an empty array"
                    )));
                }
                if has_duplicates(items) {
                    return Err(failed_to_parse(format!(
                        "$jsonSchema keyword '{k}' array cannot contain duplicate values"
                    )));
                }
                Kind::Enum(items.clone())
            }
            "minimum" | "maximum" => {
                if !value::is_number(v) {
                    return Err(type_mismatch(format!(
                        "$jsonSchema keyword '{k}' must be a number"
                    )));
                }
                let excl = if k == "minimum" {
                    "exclusiveMinimum"
                } else {
                    "exclusiveMaximum"
                };
                let exclusive = schema.get_bool(excl).unwrap_or(false);
                let mut spec = spec_of(k, v);
                if let Some(e) = schema.get(excl) {
                    spec.insert(excl, e.clone());
                }
                let kind = if k == "minimum" {
                    Kind::Minimum {
                        limit: v.clone(),
                        exclusive,
                    }
                } else {
                    Kind::Maximum {
                        limit: v.clone(),
                        exclusive,
                    }
                };
                node.rules.push(Rule { kind, spec });
                continue;
            }
            "exclusiveMinimum" | "exclusiveMaximum" | "title" | "description" => continue,
            "multipleOf" => {
                if !value::is_number(v) {
                    return Err(type_mismatch(format!(
                        "$jsonSchema keyword '{k}' must be a number"
                    )));
                }
                let m = value::as_f64(v).unwrap_or(f64::NAN);
                if m.is_nan() || m <= 0.0 {
                    return Err(failed_to_parse(format!(
                        "$jsonSchema keyword '{k}' must have a positive value"
                    )));
                }
                Kind::MultipleOf(m)
            }
            "minLength" => Kind::MinLength(non_negative(k, v)?),
            "maxLength" => Kind::MaxLength(non_negative(k, v)?),
            "pattern" => {
                let Bson::String(p) = v else {
                    return Err(type_mismatch(format!(
                        "$jsonSchema keyword '{k}' must be a string"
                    )));
                };
                Kind::Pattern(Re::new(p, "")?)
            }
            "items" => match v {
                Bson::Document(sub) => Kind::Items(Box::new(parse_node(sub, depth + 1)?)),
                Bson::Array(subs) => {
                    let mut out = Vec::with_capacity(subs.len());
                    for s in subs {
                        let Bson::Document(s) = s else {
                            return Err(type_mismatch(format!(
                                "$jsonSchema keyword '{k}' requires that each element of the array is an object, but found a {}",
                                value::type_name(s)
                            )));
                        };
                        out.push(parse_node(s, depth + 1)?);
                    }
                    Kind::ItemsTuple(out)
                }
                other => {
                    return Err(type_mismatch(format!(
                        "$jsonSchema keyword '{k}' must be an array or an object, not {}",
                        value::type_name(other)
                    )));
                }
            },
            "additionalItems" => {
                let allowed = parse_additional(k, v, depth)?;
                match schema.get("items") {
                    // Only a tuple `items` leaves room for additional items.
                    Some(Bson::Array(tuple)) => Kind::AdditionalItems {
                        from: tuple.len(),
                        allowed,
                    },
                    _ => continue,
                }
            }
            "minItems" => Kind::MinItems(non_negative(k, v)?),
            "maxItems" => Kind::MaxItems(non_negative(k, v)?),
            "uniqueItems" => {
                let Bson::Boolean(b) = v else {
                    return Err(type_mismatch(format!(
                        "$jsonSchema keyword '{k}' must be a boolean"
                    )));
                };
                if !b {
                    continue;
                }
                Kind::UniqueItems
            }
            "allOf" | "anyOf" | "oneOf" => {
                let subs = parse_schema_array(k, v, depth)?;
                match k.as_str() {
                    "allOf" => Kind::AllOf(subs),
                    "anyOf" => Kind::AnyOf(subs),
                    _ => Kind::OneOf(subs),
                }
            }
            "not" => {
                let Bson::Document(sub) = v else {
                    return Err(type_mismatch(format!(
                        "$jsonSchema keyword '{k}' must be an object"
                    )));
                };
                Kind::Not(Box::new(parse_node(sub, depth + 1)?))
            }
            "dependencies" => {
                let deps = keyword_doc(k, v)?;
                let mut out = Vec::with_capacity(deps.len());
                for (prop, dep) in deps {
                    let d = match dep {
                        Bson::Document(sub) => Dependency::Schema(parse_node(sub, depth + 1)?),
                        Bson::Array(_) => Dependency::Properties(parse_names(
                            &format!("dependencies.{prop}"),
                            dep,
                        )?),
                        other => {
                            return Err(type_mismatch(format!(
                                "Expected elements of $jsonSchema keyword 'dependencies' to be an object or an array, but dependency '{prop}' is of type {}",
                                value::type_name(other)
                            )));
                        }
                    };
                    out.push((prop.clone(), d));
                }
                Kind::Dependencies(out)
            }
            _ => continue,
        };
        node.rules.push(Rule {
            kind,
            spec: spec_of(k, v),
        });
    }
    Ok(node)
}

fn keyword_doc<'a>(k: &str, v: &'a Bson) -> Result<&'a Document> {
    match v {
        Bson::Document(d) => Ok(d),
        _ => Err(type_mismatch(format!(
            "$jsonSchema keyword '{k}' must be an object"
        ))),
    }
}

fn parse_type(k: &str, v: &Bson) -> Result<Kind> {
    let names: Vec<&str> = match v {
        Bson::String(s) => vec![s.as_str()],
        Bson::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for i in items {
                let Bson::String(s) = i else {
                    return Err(type_mismatch(format!(
                        "$jsonSchema keyword '{k}' array elements must be strings"
                    )));
                };
                if out.contains(&s.as_str()) {
                    return Err(failed_to_parse(format!(
                        "$jsonSchema keyword '{k}' has duplicate value: {s}"
                    )));
                }
                out.push(s.as_str());
            }
            out
        }
        _ => {
            return Err(type_mismatch(format!(
                "$jsonSchema keyword '{k}' must be either a string or an array of strings"
            )));
        }
    };
    if names.is_empty() {
        return Err(failed_to_parse(format!(
            "$jsonSchema keyword '{k}' must name at least one type"
        )));
    }
    let (mut codes, mut number) = (Vec::new(), false);
    for name in names {
        if name == "number" {
            number = true;
            continue;
        }
        let code = if k == "type" {
            match name {
                "object" => Some(3),
                "array" => Some(4),
                "boolean" => Some(8),
                "string" => Some(2),
                "null" => Some(10),
                "integer" => {
                    return Err(MongoError::bad_value(
                        "$jsonSchema type 'integer' is not currently supported.",
                    ));
                }
                _ => None,
            }
        } else {
            value::type_code_of_name(name)
        };
        match code {
            Some(c) => codes.push(c),
            None => {
                return Err(MongoError::bad_value(format!(
                    "Unknown type name alias: {name}"
                )));
            }
        }
    }
    Ok(Kind::Type {
        keyword: if k == "type" { "type" } else { "bsonType" },
        codes,
        number,
    })
}

/// `required` and property-list dependencies: a non-empty array of distinct strings.
fn parse_names(k: &str, v: &Bson) -> Result<Vec<String>> {
    let Bson::Array(items) = v else {
        return Err(type_mismatch(format!(
            "$jsonSchema keyword '{k}' must be an array"
        )));
    };
    if items.is_empty() {
        return Err(MongoError::bad_value(format!(
            "$jsonSchema keyword '{k}' cannot be an empty array"
        )));
    }
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for i in items {
        let Bson::String(s) = i else {
            return Err(type_mismatch(format!(
                "$jsonSchema keyword '{k}' must contain only strings"
            )));
        };
        if out.contains(s) {
            return Err(failed_to_parse(format!(
                "$jsonSchema keyword '{k}' array cannot contain duplicate values"
            )));
        }
        out.push(s.clone());
    }
    Ok(out)
}

fn parse_patterns(v: &Bson, depth: usize) -> Result<Vec<(Re, Node)>> {
    let pats = keyword_doc("patternProperties", v)?;
    let mut out = Vec::with_capacity(pats.len());
    for (p, sub) in pats {
        let Bson::Document(sub) = sub else {
            return Err(type_mismatch(format!(
                "Nested schema for $jsonSchema patternProperties '{p}' must be an object"
            )));
        };
        out.push((Re::new(p, "")?, parse_node(sub, depth + 1)?));
    }
    Ok(out)
}

fn parse_additional(k: &str, v: &Bson, depth: usize) -> Result<Additional> {
    match v {
        Bson::Boolean(true) => Ok(Additional::Allowed),
        Bson::Boolean(false) => Ok(Additional::Forbidden),
        Bson::Document(sub) => Ok(Additional::Schema(Box::new(parse_node(sub, depth + 1)?))),
        other => Err(type_mismatch(format!(
            "$jsonSchema keyword '{k}' must be either an object or a boolean, but got a {}",
            value::type_name(other)
        ))),
    }
}

fn parse_schema_array(k: &str, v: &Bson, depth: usize) -> Result<Vec<Node>> {
    let Bson::Array(items) = v else {
        return Err(type_mismatch(format!(
            "$jsonSchema keyword '{k}' must be an array"
        )));
    };
    if items.is_empty() {
        return Err(MongoError::bad_value(format!(
            "$jsonSchema keyword '{k}' must be a non-empty array"
        )));
    }
    let mut out = Vec::with_capacity(items.len());
    for i in items {
        let Bson::Document(sub) = i else {
            return Err(type_mismatch(format!(
                "$jsonSchema keyword '{k}' must be an array of objects, but found an element of type {}",
                value::type_name(i)
            )));
        };
        out.push(parse_node(sub, depth + 1)?);
    }
    Ok(out)
}

/// A length or count argument: a non-negative integral number.
fn non_negative(k: &str, v: &Bson) -> Result<i64> {
    if !value::is_number(v) {
        return Err(failed_to_parse(format!("Expected a number in: {k}: {v}")));
    }
    let Some(n) = value::as_i64_exact(v) else {
        return Err(failed_to_parse(format!("Expected an integer: {k}: {v}")));
    };
    if n < 0 {
        return Err(failed_to_parse(format!(
            "Expected a positive number in: {k}: {n}"
        )));
    }
    Ok(n)
}

fn has_duplicates(items: &[Bson]) -> bool {
    items
        .iter()
        .enumerate()
        .any(|(i, a)| items[..i].iter().any(|b| value::equal(a, b)))
}

// ---------------------------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------------------------

/// The failing rules of `node` for `v`. With `explain == false` it stops at the first failure
/// and returns one placeholder (callers only test emptiness); with `explain == true` it returns
/// MongoDB's detail document of every failing rule.
fn failures(node: &Node, v: &Bson, explain: bool) -> Vec<Document> {
    let mut out = Vec::new();
    for rule in &node.rules {
        if let Some(detail) = check_rule(rule, v, explain) {
            out.push(detail);
            if !explain {
                break;
            }
        }
    }
    out
}

fn satisfied(node: &Node, v: &Bson) -> bool {
    failures(node, v, false).is_empty()
}

/// `{operatorName, specifiedAs, ...fields}`.
fn detail(rule: &Rule, name: &str, fields: Document) -> Document {
    let mut d = doc! {"operatorName": name, "specifiedAs": rule.spec.clone()};
    d.extend(fields);
    d
}

fn type_matches(codes: &[i32], number: bool, v: &Bson) -> bool {
    (number && value::is_number(v)) || codes.contains(&value::type_code(v))
}

fn is_multiple(x: f64, m: f64) -> bool {
    if !x.is_finite() {
        return false;
    }
    let q = x / m;
    // Tolerate the binary rounding of decimal fractions (0.3 is a multiple of 0.1).
    (q - q.round()).abs() <= 1e-9 * q.abs().max(1.0)
}

/// The detail of `rule` when `v` fails it, or `None`.
fn check_rule(rule: &Rule, v: &Bson, explain: bool) -> Option<Document> {
    let fail = |name: &str, fields: Document| Some(detail(rule, name, fields));
    let placeholder = || Some(Document::new());
    let object = match v {
        Bson::Document(d) => Some(d),
        _ => None,
    };
    let number = value::is_number(v).then(|| value::as_f64(v).unwrap_or(f64::NAN));
    let string = match v {
        Bson::String(s) => Some(s.as_str()),
        _ => None,
    };
    let array = match v {
        Bson::Array(a) => Some(a.as_slice()),
        _ => None,
    };
    match &rule.kind {
        Kind::Type {
            keyword,
            codes,
            number,
        } => {
            if type_matches(codes, *number, v) {
                return None;
            }
            fail(
                keyword,
                doc! {"reason": "type did not match", "consideredValue": v.clone(), "consideredType": value::type_name(v)},
            )
        }
        Kind::Required(names) => {
            let d = object?;
            let missing: Vec<&String> = names.iter().filter(|n| !d.contains_key(n)).collect();
            if missing.is_empty() {
                return None;
            }
            fail(
                "required",
                doc! {"missingProperties": missing.into_iter().cloned().collect::<Vec<_>>()},
            )
        }
        Kind::Properties(props) => {
            let d = object?;
            let mut bad = Vec::new();
            for (name, sub) in props {
                let Some(pv) = d.get(name) else { continue };
                let f = failures(sub, pv, explain);
                if f.is_empty() {
                    continue;
                }
                if !explain {
                    return placeholder();
                }
                let mut entry = doc! {"propertyName": name};
                if let Some(t) = &sub.title {
                    entry.insert("title", t.clone());
                }
                if let Some(desc) = &sub.description {
                    entry.insert("description", desc.clone());
                }
                entry.insert("details", docs(f));
                bad.push(Bson::Document(entry));
            }
            if bad.is_empty() {
                return None;
            }
            Some(doc! {"operatorName": "properties", "propertiesNotSatisfied": bad})
        }
        Kind::PatternProperties(pats) => {
            let d = object?;
            let mut bad = Vec::new();
            for (name, pv) in d {
                for (re, sub) in pats {
                    if !re.is_match(name) {
                        continue;
                    }
                    let f = failures(sub, pv, explain);
                    if f.is_empty() {
                        continue;
                    }
                    if !explain {
                        return placeholder();
                    }
                    bad.push(Bson::Document(doc! {
                        "propertyName": name,
                        "regexMatched": re.regex().as_str(),
                        "details": docs(f),
                    }));
                }
            }
            if bad.is_empty() {
                return None;
            }
            Some(doc! {"operatorName": "patternProperties", "details": bad})
        }
        Kind::AdditionalProperties {
            known,
            patterns,
            allowed,
        } => {
            let d = object?;
            let extra = d
                .iter()
                .filter(|(k, _)| !known.contains(k) && !patterns.iter().any(|re| re.is_match(k)));
            match allowed {
                Additional::Allowed => None,
                Additional::Forbidden => {
                    let names: Vec<String> = extra.map(|(k, _)| k.clone()).collect();
                    if names.is_empty() {
                        return None;
                    }
                    fail("additionalProperties", doc! {"additionalProperties": names})
                }
                Additional::Schema(sub) => {
                    for (k, pv) in extra {
                        let f = failures(sub, pv, explain);
                        if !f.is_empty() {
                            return Some(doc! {
                                "operatorName": "additionalProperties",
                                "reason": "at least one additional property did not match the subschema",
                                "failingProperty": k,
                                "details": docs(f),
                            });
                        }
                    }
                    None
                }
            }
        }
        Kind::MinProperties(n) | Kind::MaxProperties(n) => {
            let d = object?;
            let count = d.len() as i64;
            let min = matches!(rule.kind, Kind::MinProperties(_));
            if (min && count >= *n) || (!min && count <= *n) {
                return None;
            }
            fail(
                if min {
                    "minProperties"
                } else {
                    "maxProperties"
                },
                doc! {"reason": "specified number of properties was not satisfied", "numberOfProperties": count as i32},
            )
        }
        Kind::Enum(items) => {
            if items.iter().any(|i| value::equal(i, v)) {
                return None;
            }
            fail(
                "enum",
                doc! {"reason": "value was not found in enum", "consideredValue": v.clone()},
            )
        }
        Kind::Minimum { limit, exclusive } | Kind::Maximum { limit, exclusive } => {
            number?;
            let ord = value::compare(v, limit);
            let min = matches!(rule.kind, Kind::Minimum { .. });
            let ok = match (min, exclusive) {
                (true, false) => ord.is_ge(),
                (true, true) => ord.is_gt(),
                (false, false) => ord.is_le(),
                (false, true) => ord.is_lt(),
            };
            // NaN satisfies no bound.
            if ok && !number.is_some_and(f64::is_nan) {
                return None;
            }
            fail(
                if min { "minimum" } else { "maximum" },
                doc! {"reason": "comparison failed", "consideredValue": v.clone()},
            )
        }
        Kind::MultipleOf(m) => {
            let x = number?;
            if is_multiple(x, *m) {
                return None;
            }
            fail(
                "multipleOf",
                doc! {"reason": "considered value is not a multiple of the specified value", "consideredValue": v.clone()},
            )
        }
        Kind::MinLength(n) | Kind::MaxLength(n) => {
            let s = string?;
            let len = s.chars().count() as i64;
            let min = matches!(rule.kind, Kind::MinLength(_));
            if (min && len >= *n) || (!min && len <= *n) {
                return None;
            }
            fail(
                if min { "minLength" } else { "maxLength" },
                doc! {"reason": "specified string length was not satisfied", "consideredValue": v.clone()},
            )
        }
        Kind::Pattern(re) => {
            if re.is_match(string?) {
                return None;
            }
            fail(
                "pattern",
                doc! {"reason": "regular expression did not match", "consideredValue": v.clone()},
            )
        }
        Kind::Items(sub) => {
            for (i, item) in array?.iter().enumerate() {
                let f = failures(sub, item, explain);
                if !f.is_empty() {
                    return Some(doc! {
                        "operatorName": "items",
                        "reason": "At least one item did not match the sub-schema",
                        "itemIndex": i as i32,
                        "details": docs(f),
                    });
                }
            }
            None
        }
        Kind::ItemsTuple(subs) => {
            for (i, (item, sub)) in array?.iter().zip(subs).enumerate() {
                let f = failures(sub, item, explain);
                if !f.is_empty() {
                    return Some(doc! {
                        "operatorName": "items",
                        "details": [{"index": i as i32, "details": docs(f)}],
                    });
                }
            }
            None
        }
        Kind::AdditionalItems { from, allowed } => {
            let items = array?;
            let extra = items.get(*from..).unwrap_or(&[]);
            match allowed {
                Additional::Allowed => None,
                Additional::Forbidden if extra.is_empty() => None,
                Additional::Forbidden => fail(
                    "additionalItems",
                    doc! {"reason": "found additional items", "additionalItems": extra.to_vec()},
                ),
                Additional::Schema(sub) => {
                    for (i, item) in extra.iter().enumerate() {
                        let f = failures(sub, item, explain);
                        if !f.is_empty() {
                            return Some(doc! {
                                "operatorName": "additionalItems",
                                "reason": "At least one additional item did not match the sub-schema",
                                "itemIndex": (from + i) as i32,
                                "details": docs(f),
                            });
                        }
                    }
                    None
                }
            }
        }
        Kind::MinItems(n) | Kind::MaxItems(n) => {
            let items = array?;
            let len = items.len() as i64;
            let min = matches!(rule.kind, Kind::MinItems(_));
            if (min && len >= *n) || (!min && len <= *n) {
                return None;
            }
            fail(
                if min { "minItems" } else { "maxItems" },
                doc! {"reason": "array did not match specified length", "consideredValue": v.clone()},
            )
        }
        Kind::UniqueItems => {
            let items = array?;
            let dup = items
                .iter()
                .enumerate()
                .find(|(i, a)| items[..*i].iter().any(|b| value::equal(a, b)))?;
            fail(
                "uniqueItems",
                doc! {"reason": "found a duplicate item", "consideredValue": v.clone(), "duplicatedValue": dup.1.clone()},
            )
        }
        Kind::AllOf(subs) | Kind::AnyOf(subs) => {
            let all = matches!(rule.kind, Kind::AllOf(_));
            let mut bad = Vec::new();
            let mut any_ok = false;
            for (i, sub) in subs.iter().enumerate() {
                let f = failures(sub, v, explain && (all || !any_ok));
                if f.is_empty() {
                    any_ok = true;
                    if !all {
                        return None;
                    }
                } else {
                    if all && !explain {
                        return placeholder();
                    }
                    bad.push(Bson::Document(doc! {"index": i as i32, "details": docs(f)}));
                }
            }
            if (all && bad.is_empty()) || (!all && any_ok) {
                return None;
            }
            if !explain {
                return placeholder();
            }
            Some(
                doc! {"operatorName": if all { "allOf" } else { "anyOf" }, "schemasNotSatisfied": bad},
            )
        }
        Kind::OneOf(subs) => {
            let mut matching = Vec::new();
            let mut bad = Vec::new();
            for (i, sub) in subs.iter().enumerate() {
                let f = failures(sub, v, explain);
                if f.is_empty() {
                    matching.push(Bson::Int32(i as i32));
                } else {
                    bad.push(Bson::Document(doc! {"index": i as i32, "details": docs(f)}));
                }
            }
            match matching.len() {
                1 => None,
                0 => Some(doc! {"operatorName": "oneOf", "schemasNotSatisfied": bad}),
                _ => Some(doc! {
                    "operatorName": "oneOf",
                    "reason": "more than one subschema matched",
                    "matchingSchemaIndexes": matching,
                }),
            }
        }
        Kind::Not(sub) => {
            if !satisfied(sub, v) {
                return None;
            }
            fail("not", doc! {"reason": "child expression matched"})
        }
        Kind::Dependencies(deps) => {
            let d = object?;
            let mut bad = Vec::new();
            for (prop, dep) in deps {
                if !d.contains_key(prop) {
                    continue;
                }
                match dep {
                    Dependency::Properties(names) => {
                        let missing: Vec<String> = names
                            .iter()
                            .filter(|n| !d.contains_key(n.as_str()))
                            .cloned()
                            .collect();
                        if !missing.is_empty() {
                            bad.push(Bson::Document(
                                doc! {"conditionalProperty": prop, "missingProperties": missing},
                            ));
                        }
                    }
                    Dependency::Schema(sub) => {
                        let f = failures(sub, v, explain);
                        if !f.is_empty() {
                            bad.push(Bson::Document(
                                doc! {"conditionalProperty": prop, "details": docs(f)},
                            ));
                        }
                    }
                }
                if !explain && !bad.is_empty() {
                    return placeholder();
                }
            }
            if bad.is_empty() {
                return None;
            }
            Some(doc! {"operatorName": "dependencies", "failingDependencies": bad})
        }
    }
}

#[cfg(test)]
mod tests;
