//! Collection validators: parsing a `validator` (any query document, `$jsonSchema` and `$expr`
//! included) with the restrictions MongoDB puts on validators, and explaining why a document
//! fails one, in the shape of MongoDB 7.0's `errInfo.details`.
//!
//! Invariants: a validator that parses here never fails to parse at write time; `$where`,
//! `$text` and the geo-near operators are refused (`QueryFeatureNotAllowed`, 224) wherever they
//! sit; [`Validator::explain`] is only meaningful for a document [`Validator::matches`] refuses
//! and never fails (an unexplainable clause is reported with its operator name only).

use bson::{Bson, Document, doc};
use wire::ErrorCode;

use crate::expr::{Env, Expr};
use crate::matcher::Matcher;
use crate::schema::Schema;
use crate::value;
use crate::{MongoError, Result};

/// A parsed validator.
#[derive(Debug, Clone)]
pub struct Validator {
    spec: Document,
    matcher: Matcher,
}

impl Validator {
    /// Parses a validator, refusing what MongoDB refuses in one.
    pub fn parse(spec: &Document) -> Result<Validator> {
        check_allowed(spec)?;
        Ok(Validator {
            spec: spec.clone(),
            matcher: Matcher::parse(spec)?,
        })
    }

    /// Whether the validator accepts every document (`{}`).
    pub fn is_empty(&self) -> bool {
        self.spec.is_empty()
    }

    /// Whether `doc` passes, `$$NOW` being `now`. An evaluation error (e.g. inside `$expr`)
    /// fails it.
    pub fn matches(&self, doc: &Document, now: bson::DateTime) -> bool {
        self.matcher
            .try_matches_in(doc, &env_at(now))
            .unwrap_or(false)
    }

    /// `errInfo.details` for a document that fails the validator.
    pub fn explain(&self, doc: &Document, now: bson::DateTime) -> Document {
        let env = env_at(now);
        let clauses = clauses(&self.spec);
        if clauses.len() == 1 {
            return clauses
                .into_iter()
                .next()
                .map(|c| explain_clause(&c, doc, &env))
                .unwrap_or_default();
        }
        let failing = failing_clauses(&clauses, doc, &env);
        doc! {"operatorName": "$and", "clausesNotSatisfied": failing}
    }
}

fn env_at(now: bson::DateTime) -> Env {
    Env {
        now: Some(now),
        ..Env::default()
    }
}

fn not_allowed(what: &str) -> MongoError {
    MongoError::new(
        ErrorCode::QUERY_FEATURE_NOT_ALLOWED,
        format!("{what} not allowed in this context"),
    )
}

/// Refuses `$where`, `$text`, `$near`, `$nearSphere` and `$geoNear` anywhere in a filter.
fn check_allowed(filter: &Document) -> Result<()> {
    for (k, v) in filter {
        match k.as_str() {
            "$where" => return Err(not_allowed("$where is")),
            "$text" => return Err(not_allowed("$text is")),
            "$and" | "$or" | "$nor" => {
                if let Bson::Array(items) = v {
                    for i in items {
                        if let Bson::Document(d) = i {
                            check_allowed(d)?;
                        }
                    }
                }
            }
            _ if !k.starts_with('$') => check_field(v)?,
            _ => {}
        }
    }
    Ok(())
}

fn check_field(v: &Bson) -> Result<()> {
    let Bson::Document(ops) = v else {
        return Ok(());
    };
    for (op, arg) in ops {
        match op.as_str() {
            "$near" | "$nearSphere" | "$geoNear" => {
                return Err(not_allowed("$geoNear, $near, and $nearSphere are"));
            }
            "$elemMatch" => {
                if let Bson::Document(d) = arg {
                    check_allowed(d)?;
                    check_field(arg)?;
                }
            }
            "$not" => check_field(arg)?,
            _ => {}
        }
    }
    Ok(())
}

/// One clause of a filter: a top-level operator, or one operator on one path.
#[derive(Debug, Clone)]
enum Clause {
    Top(String, Bson),
    /// `path`, the operator (`$eq` for a literal), its argument, and whether it was written as
    /// a literal (`{a: 5}` rather than `{a: {$eq: 5}}`).
    Field {
        path: String,
        op: String,
        arg: Bson,
        literal: bool,
    },
}

fn clauses(filter: &Document) -> Vec<Clause> {
    let mut out = Vec::new();
    for (k, v) in filter {
        if k == "$comment" {
            continue;
        }
        if k.starts_with('$') {
            out.push(Clause::Top(k.clone(), v.clone()));
            continue;
        }
        match v {
            Bson::Document(ops) if ops.keys().next().is_some_and(|o| o.starts_with('$')) => {
                for (op, arg) in ops {
                    if op == "$options" {
                        continue;
                    }
                    out.push(Clause::Field {
                        path: k.clone(),
                        op: op.clone(),
                        arg: arg.clone(),
                        literal: false,
                    });
                }
            }
            other => out.push(Clause::Field {
                path: k.clone(),
                op: if matches!(other, Bson::RegularExpression(_)) {
                    "$regex".into()
                } else {
                    "$eq".into()
                },
                arg: other.clone(),
                literal: true,
            }),
        }
    }
    out
}

fn clause_filter(c: &Clause) -> Document {
    match c {
        Clause::Top(k, v) => doc! {k.clone(): v.clone()},
        Clause::Field {
            path,
            arg,
            literal: true,
            ..
        } => doc! {path.clone(): arg.clone()},
        Clause::Field { path, op, arg, .. } => doc! {path.clone(): {op.clone(): arg.clone()}},
    }
}

fn clause_matches(c: &Clause, doc: &Document, env: &Env) -> bool {
    Matcher::parse(&clause_filter(c))
        .and_then(|m| m.try_matches_in(doc, env))
        .unwrap_or(false)
}

fn failing_clauses(clauses: &[Clause], doc: &Document, env: &Env) -> Vec<Bson> {
    clauses
        .iter()
        .enumerate()
        .filter(|(_, c)| !clause_matches(c, doc, env))
        .map(|(i, c)| {
            Bson::Document(doc! {"index": i as i32, "details": explain_clause(c, doc, env)})
        })
        .collect()
}

fn sub_clauses(v: &Bson) -> Vec<Document> {
    match v {
        Bson::Array(items) => items
            .iter()
            .filter_map(|i| i.as_document().cloned())
            .collect(),
        _ => Vec::new(),
    }
}

fn explain_clause(c: &Clause, doc: &Document, env: &Env) -> Document {
    match c {
        Clause::Top(op, v) => match op.as_str() {
            "$jsonSchema" => Schema::parse(v)
                .map(|s| s.explain(doc))
                .unwrap_or_else(|_| doc! {"operatorName": "$jsonSchema"}),
            "$expr" => {
                let result = Expr::parse(v)
                    .and_then(|e| e.evaluate_in(doc, env))
                    .map(|r| r.unwrap_or(Bson::Null));
                let mut d = doc! {
                    "operatorName": "$expr",
                    "specifiedAs": {"$expr": v.clone()},
                    "reason": "expression did not match",
                };
                match result {
                    Ok(r) => d.insert("expressionResult", r),
                    Err(e) => d.insert("expressionError", e.errmsg),
                };
                d
            }
            "$and" | "$or" | "$nor" => {
                let children: Vec<Clause> = sub_clauses(v)
                    .into_iter()
                    .map(|d| Clause::Top("$and".into(), Bson::Array(vec![Bson::Document(d)])))
                    .collect();
                let listed: Vec<Bson> = sub_clauses(v)
                    .iter()
                    .zip(children.iter())
                    .enumerate()
                    .filter(|(_, (_, c))| {
                        // $and/$or list their failing children, $nor its matching ones.
                        clause_matches(c, doc, env) == (op == "$nor")
                    })
                    .map(|(i, (d, _))| {
                        let inner = clauses(d);
                        let details = if op == "$nor" {
                            doc! {"operatorName": "$nor", "reason": "child expression matched"}
                        } else if inner.len() == 1 {
                            explain_clause(&inner[0], doc, env)
                        } else {
                            doc! {"operatorName": "$and", "clausesNotSatisfied": failing_clauses(&inner, doc, env)}
                        };
                        Bson::Document(doc! {"index": i as i32, "details": details})
                    })
                    .collect();
                doc! {"operatorName": op.clone(), "clausesNotSatisfied": listed}
            }
            other => doc! {"operatorName": other, "specifiedAs": {other: v.clone()}},
        },
        Clause::Field { path, op, arg, .. } => {
            let mut d = doc! {"operatorName": op.clone(), "specifiedAs": clause_filter(c)};
            let found = value::get_path(doc, path);
            let negated = matches!(op.as_str(), "$ne" | "$nin" | "$not")
                || (op == "$exists" && !value::truthy(arg));
            match found {
                None if !negated => {
                    d.insert("reason", "field was missing");
                }
                _ => {
                    d.insert("reason", reason(op, arg));
                    if let Some(v) = found {
                        d.insert("consideredValue", v.clone());
                        if op == "$type" {
                            d.insert("consideredType", value::type_name(v));
                        }
                    }
                }
            }
            d
        }
    }
}

fn reason(op: &str, arg: &Bson) -> &'static str {
    match op {
        "$eq" | "$gt" | "$gte" | "$lt" | "$lte" => "comparison failed",
        "$ne" => "comparison succeeded",
        "$in" => "no matching value found in array",
        "$nin" => "matching value found in array",
        "$exists" if value::truthy(arg) => "path does not exist",
        "$exists" => "path exists",
        "$type" => "type did not match",
        "$regex" => "regular expression did not match",
        "$size" => "array length was not equal to given size",
        "$all" => "array did not contain all specified values",
        "$elemMatch" => "array did not satisfy the child predicate",
        "$mod" => "$mod did not evaluate to expected remainder",
        "$bitsAllSet" | "$bitsAnySet" | "$bitsAllClear" | "$bitsAnyClear" => {
            "bitwise operator failed to match"
        }
        "$not" => "child expression matched",
        _ => "expression did not match",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> bson::DateTime {
        bson::DateTime::from_millis(1_700_000_000_000)
    }

    #[test]
    fn validators_refuse_where_text_and_geo_near_with_224() {
        for v in [
            doc! {"$where": "this.a == 1"},
            doc! {"$text": {"$search": "x"}},
            doc! {"loc": {"$near": [0, 0]}},
            doc! {"$or": [{"loc": {"$nearSphere": [0, 0]}}]},
            doc! {"a": {"$elemMatch": {"$where": "1"}}},
        ] {
            let e = Validator::parse(&v).expect_err(&format!("{v}"));
            assert_eq!(e.code, 224, "{v}: {e}");
            assert_eq!(e.code_name, "QueryFeatureNotAllowed");
        }
        assert_eq!(
            Validator::parse(&doc! {"a": {"$foo": 1}}).unwrap_err().code,
            2
        );
    }

    #[test]
    fn a_single_clause_is_explained_directly() {
        let v = Validator::parse(&doc! {"a": {"$gt": 5}}).unwrap();
        assert!(!v.matches(&doc! {"a": 3}, now()));
        assert_eq!(
            v.explain(&doc! {"a": 3}, now()),
            doc! {"operatorName": "$gt", "specifiedAs": {"a": {"$gt": 5}}, "reason": "comparison failed", "consideredValue": 3}
        );
        assert_eq!(
            v.explain(&doc! {}, now()),
            doc! {"operatorName": "$gt", "specifiedAs": {"a": {"$gt": 5}}, "reason": "field was missing"}
        );
    }

    #[test]
    fn several_clauses_list_the_failing_ones_under_and() {
        let v = Validator::parse(&doc! {"a": 1, "b": {"$type": "string"}}).unwrap();
        let d = doc! {"a": 1, "b": 2};
        assert!(!v.matches(&d, now()));
        assert_eq!(
            v.explain(&d, now()),
            doc! {"operatorName": "$and", "clausesNotSatisfied": [{"index": 1, "details": {
            "operatorName": "$type", "specifiedAs": {"b": {"$type": "string"}},
            "reason": "type did not match", "consideredValue": 2, "consideredType": "int"}}]}
        );
    }

    #[test]
    fn expr_and_or_clauses_are_explained() {
        let v = Validator::parse(&doc! {"$expr": {"$gt": ["$a", "$b"]}}).unwrap();
        let d = doc! {"a": 1, "b": 2};
        assert!(!v.matches(&d, now()));
        let e = v.explain(&d, now());
        assert_eq!(e.get_str("operatorName").unwrap(), "$expr");
        assert!(!e.get_bool("expressionResult").unwrap());
        let v = Validator::parse(&doc! {"$or": [{"a": 1}, {"b": 1}]}).unwrap();
        let e = v.explain(&doc! {"a": 2}, now());
        assert_eq!(e.get_str("operatorName").unwrap(), "$or");
        assert_eq!(e.get_array("clausesNotSatisfied").unwrap().len(), 2);
        assert!(v.matches(&doc! {"b": 1}, now()));
        let re = bson::Regex {
            pattern: "^x".try_into().unwrap(),
            options: "".try_into().unwrap(),
        };
        let v = Validator::parse(&doc! {"s": Bson::RegularExpression(re.clone())}).unwrap();
        assert_eq!(
            v.explain(&doc! {"s": "y"}, now()),
            doc! {"operatorName": "$regex", "specifiedAs": {"s": Bson::RegularExpression(re)},
            "reason": "regular expression did not match", "consideredValue": "y"}
        );
    }

    #[test]
    fn now_is_the_write_time() {
        let v = Validator::parse(&doc! {"$expr": {"$lte": ["$at", "$$NOW"]}}).unwrap();
        let at = |ms| doc! {"at": bson::DateTime::from_millis(ms)};
        assert!(v.matches(&at(1_600_000_000_000), now()));
        assert!(!v.matches(&at(1_800_000_000_000), now()));
    }

    #[test]
    fn json_schema_clauses_explain_their_rules() {
        let v = Validator::parse(&doc! {"$jsonSchema": {"required": ["x"]}}).unwrap();
        assert!(!v.matches(&doc! {"_id": 1}, now()));
        assert_eq!(
            v.explain(&doc! {"_id": 1}, now()),
            doc! {"operatorName": "$jsonSchema", "schemaRulesNotSatisfied": [
                {"operatorName": "required", "specifiedAs": {"required": ["x"]}, "missingProperties": ["x"]}
            ]}
        );
    }
}
