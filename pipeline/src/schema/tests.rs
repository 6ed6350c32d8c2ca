use bson::{Bson, Document, doc};

use super::Schema;
use crate::Matcher;

fn schema(s: Document) -> Schema {
    Schema::parse(&Bson::Document(s.clone())).unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// Each case: schema, document, whether it matches. Also checks that `$jsonSchema` as a query
/// operator agrees, and that a failing document has a non-empty explanation.
fn check(cases: &[(Document, Document, bool)]) {
    for (s, d, want) in cases {
        let parsed = schema(s.clone());
        assert_eq!(parsed.matches(d), *want, "schema {s} on {d}");
        let m = Matcher::parse(&doc! {"$jsonSchema": s.clone()}).unwrap();
        assert_eq!(m.matches(d), *want, "$jsonSchema {s} on {d}");
        let rules = parsed.explain(d);
        let n = rules
            .get_array("schemaRulesNotSatisfied")
            .map(Vec::len)
            .unwrap_or(0);
        assert_eq!(n == 0, *want, "explanation {rules} of {s} on {d}");
    }
}

#[test]
fn bson_type_and_type_use_their_aliases() {
    check(&[
        (
            doc! {"properties": {"a": {"bsonType": "int"}}},
            doc! {"a": 1},
            true,
        ),
        (
            doc! {"properties": {"a": {"bsonType": "int"}}},
            doc! {"a": 1i64},
            false,
        ),
        (
            doc! {"properties": {"a": {"bsonType": "long"}}},
            doc! {"a": 1i64},
            true,
        ),
        (
            doc! {"properties": {"a": {"bsonType": "number"}}},
            doc! {"a": 1.5},
            true,
        ),
        (
            doc! {"properties": {"a": {"bsonType": "number"}}},
            doc! {"a": "1"},
            false,
        ),
        (
            doc! {"properties": {"a": {"bsonType": ["string", "null"]}}},
            doc! {"a": null},
            true,
        ),
        (
            doc! {"properties": {"a": {"bsonType": "objectId"}}},
            doc! {"a": bson::oid::ObjectId::new()},
            true,
        ),
        (
            doc! {"properties": {"a": {"bsonType": "date"}}},
            doc! {"a": bson::DateTime::from_millis(0)},
            true,
        ),
        (
            doc! {"properties": {"a": {"bsonType": "bool"}}},
            doc! {"a": 1},
            false,
        ),
        (
            doc! {"properties": {"a": {"bsonType": "decimal"}}},
            doc! {"a": 1.0},
            false,
        ),
        (
            doc! {"properties": {"a": {"bsonType": "double"}}},
            doc! {"a": 1.0},
            true,
        ),
        // No implicit array traversal.
        (
            doc! {"properties": {"a": {"bsonType": "int"}}},
            doc! {"a": [1]},
            false,
        ),
        // A missing property satisfies its subschema.
        (
            doc! {"properties": {"a": {"bsonType": "int"}}},
            doc! {"b": 1},
            true,
        ),
        (
            doc! {"properties": {"a": {"type": "boolean"}}},
            doc! {"a": true},
            true,
        ),
        (
            doc! {"properties": {"a": {"type": "number"}}},
            doc! {"a": 3i64},
            true,
        ),
        (
            doc! {"properties": {"a": {"type": "object"}}},
            doc! {"a": [1]},
            false,
        ),
        (doc! {"bsonType": "object"}, doc! {"a": 1}, true),
        (doc! {"type": "array"}, doc! {"a": 1}, false),
    ]);
}

#[test]
fn object_keywords() {
    check(&[
        (doc! {"required": ["a", "b"]}, doc! {"a": 1, "b": 2}, true),
        (doc! {"required": ["a", "b"]}, doc! {"a": 1}, false),
        (doc! {"required": ["a"]}, doc! {"a": null}, true),
        // required applies to objects only
        (
            doc! {"properties": {"a": {"required": ["x"]}}},
            doc! {"a": 5},
            true,
        ),
        (
            doc! {"properties": {"a": {"required": ["x"]}}},
            doc! {"a": {"y": 1}},
            false,
        ),
        (
            doc! {"properties": {"a": {"bsonType": "int"}}, "additionalProperties": false},
            doc! {"a": 1},
            true,
        ),
        (
            doc! {"properties": {"a": {"bsonType": "int"}}, "additionalProperties": false},
            doc! {"a": 1, "b": 1},
            false,
        ),
        (
            doc! {"properties": {"a": {}}, "additionalProperties": {"bsonType": "string"}},
            doc! {"a": 1, "b": "x"},
            true,
        ),
        (
            doc! {"properties": {"a": {}}, "additionalProperties": {"bsonType": "string"}},
            doc! {"a": 1, "b": 2},
            false,
        ),
        (
            doc! {"additionalProperties": true},
            doc! {"a": 1, "b": 2},
            true,
        ),
        (
            doc! {"patternProperties": {"^x": {"bsonType": "int"}}},
            doc! {"x1": 1, "y": "s"},
            true,
        ),
        (
            doc! {"patternProperties": {"^x": {"bsonType": "int"}}},
            doc! {"x1": "s"},
            false,
        ),
        (
            doc! {"patternProperties": {"^x": {}}, "additionalProperties": false},
            doc! {"x1": 1},
            true,
        ),
        (
            doc! {"patternProperties": {"^x": {}}, "additionalProperties": false},
            doc! {"x1": 1, "y": 1},
            false,
        ),
        (doc! {"minProperties": 2}, doc! {"a": 1, "b": 1}, true),
        (doc! {"minProperties": 2}, doc! {"a": 1}, false),
        (doc! {"maxProperties": 1}, doc! {"a": 1}, true),
        (doc! {"maxProperties": 1}, doc! {"a": 1, "b": 2}, false),
        (
            doc! {"dependencies": {"a": ["b"]}},
            doc! {"a": 1, "b": 1},
            true,
        ),
        (doc! {"dependencies": {"a": ["b"]}}, doc! {"a": 1}, false),
        (doc! {"dependencies": {"a": ["b"]}}, doc! {"c": 1}, true),
        (
            doc! {"dependencies": {"a": {"required": ["c"]}}},
            doc! {"a": 1},
            false,
        ),
        (
            doc! {"dependencies": {"a": {"required": ["c"]}}},
            doc! {"a": 1, "c": 1},
            true,
        ),
    ]);
}

#[test]
fn numeric_keywords_apply_to_numbers_only() {
    let p = |s: Document| doc! {"properties": {"n": s}};
    check(&[
        (p(doc! {"minimum": 5}), doc! {"n": 5}, true),
        (p(doc! {"minimum": 5}), doc! {"n": 4.9}, false),
        (
            p(doc! {"minimum": 5, "exclusiveMinimum": true}),
            doc! {"n": 5},
            false,
        ),
        (
            p(doc! {"minimum": 5, "exclusiveMinimum": true}),
            doc! {"n": 6i64},
            true,
        ),
        (p(doc! {"maximum": 5}), doc! {"n": 5}, true),
        (p(doc! {"maximum": 5}), doc! {"n": 6}, false),
        (
            p(doc! {"maximum": 5, "exclusiveMaximum": true}),
            doc! {"n": 5},
            false,
        ),
        (p(doc! {"minimum": 5}), doc! {"n": "a"}, true),
        (p(doc! {"minimum": 5}), doc! {"n": f64::NAN}, false),
        (p(doc! {"multipleOf": 3}), doc! {"n": 9}, true),
        (p(doc! {"multipleOf": 3}), doc! {"n": 10}, false),
        (p(doc! {"multipleOf": 0.1}), doc! {"n": 0.3}, true),
        (p(doc! {"multipleOf": 3}), doc! {"n": "x"}, true),
    ]);
}

#[test]
fn string_keywords() {
    let p = |s: Document| doc! {"properties": {"s": s}};
    check(&[
        (p(doc! {"minLength": 2}), doc! {"s": "ab"}, true),
        (p(doc! {"minLength": 2}), doc! {"s": "é"}, false),
        (p(doc! {"maxLength": 2}), doc! {"s": "éé"}, true),
        (p(doc! {"maxLength": 2}), doc! {"s": "abc"}, false),
        (p(doc! {"minLength": 2}), doc! {"s": 1}, true),
        (p(doc! {"pattern": "^a.c$"}), doc! {"s": "abc"}, true),
        (p(doc! {"pattern": "^a.c$"}), doc! {"s": "abd"}, false),
        (p(doc! {"pattern": "b"}), doc! {"s": "abc"}, true),
        (
            p(doc! {"enum": ["x", 1, {"k": 1}]}),
            doc! {"s": {"k": 1}},
            true,
        ),
        (p(doc! {"enum": ["x", 1]}), doc! {"s": 1.0}, true),
        (p(doc! {"enum": ["x", 1]}), doc! {"s": "y"}, false),
    ]);
}

#[test]
fn array_keywords() {
    let p = |s: Document| doc! {"properties": {"a": s}};
    check(&[
        (
            p(doc! {"items": {"bsonType": "int"}}),
            doc! {"a": [1, 2]},
            true,
        ),
        (
            p(doc! {"items": {"bsonType": "int"}}),
            doc! {"a": [1, "x"]},
            false,
        ),
        (
            p(doc! {"items": [{"bsonType": "int"}, {"bsonType": "string"}]}),
            doc! {"a": [1, "x", 3.5]},
            true,
        ),
        (
            p(doc! {"items": [{"bsonType": "int"}, {"bsonType": "string"}]}),
            doc! {"a": ["x"]},
            false,
        ),
        (
            p(doc! {"items": [{"bsonType": "int"}], "additionalItems": false}),
            doc! {"a": [1]},
            true,
        ),
        (
            p(doc! {"items": [{"bsonType": "int"}], "additionalItems": false}),
            doc! {"a": [1, 2]},
            false,
        ),
        (
            p(doc! {"items": [{}], "additionalItems": {"bsonType": "string"}}),
            doc! {"a": [1, "x"]},
            true,
        ),
        (
            p(doc! {"items": [{}], "additionalItems": {"bsonType": "string"}}),
            doc! {"a": [1, 2]},
            false,
        ),
        // additionalItems without a tuple `items` has no effect
        (p(doc! {"additionalItems": false}), doc! {"a": [1, 2]}, true),
        (p(doc! {"minItems": 2}), doc! {"a": [1, 2]}, true),
        (p(doc! {"minItems": 2}), doc! {"a": [1]}, false),
        (p(doc! {"maxItems": 1}), doc! {"a": [1, 2]}, false),
        (p(doc! {"maxItems": 1}), doc! {"a": "not an array"}, true),
        (p(doc! {"uniqueItems": true}), doc! {"a": [1, 2]}, true),
        (p(doc! {"uniqueItems": true}), doc! {"a": [1, 1.0]}, false),
        (p(doc! {"uniqueItems": false}), doc! {"a": [1, 1]}, true),
    ]);
}

#[test]
fn logical_keywords() {
    let p = |s: Document| doc! {"properties": {"a": s}};
    check(&[
        (
            p(doc! {"allOf": [{"bsonType": "int"}, {"minimum": 2}]}),
            doc! {"a": 3},
            true,
        ),
        (
            p(doc! {"allOf": [{"bsonType": "int"}, {"minimum": 2}]}),
            doc! {"a": 1},
            false,
        ),
        (
            p(doc! {"anyOf": [{"bsonType": "int"}, {"bsonType": "string"}]}),
            doc! {"a": "x"},
            true,
        ),
        (
            p(doc! {"anyOf": [{"bsonType": "int"}, {"bsonType": "string"}]}),
            doc! {"a": 1.5},
            false,
        ),
        (
            p(doc! {"oneOf": [{"minimum": 1}, {"maximum": 5}]}),
            doc! {"a": 7},
            true,
        ),
        (
            p(doc! {"oneOf": [{"minimum": 1}, {"maximum": 5}]}),
            doc! {"a": 3},
            false,
        ),
        (p(doc! {"not": {"bsonType": "string"}}), doc! {"a": 3}, true),
        (
            p(doc! {"not": {"bsonType": "string"}}),
            doc! {"a": "x"},
            false,
        ),
        (
            p(doc! {"title": "t", "description": "d", "bsonType": "int"}),
            doc! {"a": 1},
            true,
        ),
    ]);
}

#[test]
fn parse_errors_carry_mongodb_codes() {
    let cases: &[(Bson, i32, &str)] = &[
        (Bson::Int32(1), 14, "$jsonSchema must be an object"),
        (
            doc! {"foo": 1}.into(),
            9,
            "Unknown $jsonSchema keyword: foo",
        ),
        (
            doc! {"properties": {"a": {"foo": 1}}}.into(),
            9,
            "Unknown $jsonSchema keyword: foo",
        ),
        (doc! {"$ref": "#/x"}.into(), 9, "not currently supported"),
        (
            doc! {"format": "email"}.into(),
            9,
            "not currently supported",
        ),
        (doc! {"default": 1}.into(), 9, "not currently supported"),
        (
            doc! {"type": "object", "bsonType": "object"}.into(),
            9,
            "Cannot specify both",
        ),
        (
            doc! {"bsonType": "nope"}.into(),
            2,
            "Unknown type name alias",
        ),
        (doc! {"type": "int"}.into(), 2, "Unknown type name alias"),
        (doc! {"type": "integer"}.into(), 2, "integer"),
        (doc! {"bsonType": 1}.into(), 14, "must be either a string"),
        (doc! {"required": "a"}.into(), 14, "must be an array"),
        (doc! {"required": []}.into(), 2, "cannot be an empty array"),
        (doc! {"required": [1]}.into(), 14, "only strings"),
        (doc! {"required": ["a", "a"]}.into(), 9, "duplicate"),
        (doc! {"enum": []}.into(), 9, "cannot be an empty array"),
        (doc! {"minimum": "x"}.into(), 14, "must be a number"),
        (
            doc! {"exclusiveMinimum": true}.into(),
            9,
            "'minimum' must be a present",
        ),
        (
            doc! {"minimum": 1, "exclusiveMinimum": 1}.into(),
            14,
            "must be a boolean",
        ),
        (
            doc! {"minLength": -1}.into(),
            9,
            "Expected a positive number",
        ),
        (doc! {"minItems": 1.5}.into(), 9, "Expected an integer"),
        (doc! {"multipleOf": 0}.into(), 9, "positive value"),
        (doc! {"pattern": 1}.into(), 14, "must be a string"),
        (doc! {"pattern": "("}.into(), 51091, "Regular expression"),
        (doc! {"properties": 1}.into(), 14, "must be an object"),
        (
            doc! {"items": 1}.into(),
            14,
            "must be an array or an object",
        ),
        (
            doc! {"additionalProperties": 1}.into(),
            14,
            "object or a boolean",
        ),
        (doc! {"anyOf": []}.into(), 2, "non-empty array"),
        (doc! {"not": []}.into(), 14, "must be an object"),
        (doc! {"title": 1}.into(), 14, "must be of type string"),
        (doc! {"uniqueItems": 1}.into(), 14, "must be a boolean"),
        (doc! {"dependencies": {"a": 1}}.into(), 14, "dependency 'a'"),
    ];
    for (s, code, msg) in cases {
        let e = Schema::parse(s).expect_err(&format!("{s} should fail"));
        assert_eq!(e.code, *code, "{s}: {e}");
        assert!(e.errmsg.contains(msg), "{s}: {e}");
        let m = Matcher::parse(&doc! {"$jsonSchema": s.clone()}).expect_err("matcher too");
        assert_eq!(m.code, *code);
    }
}

#[test]
fn explanations_have_mongodb_shape() {
    let s = schema(doc! {
        "bsonType": "object",
        "required": ["name", "age"],
        "properties": {
            "name": {"bsonType": "string", "description": "must be a string"},
            "age": {"bsonType": "int", "minimum": 0},
        },
    });
    let d = doc! {"_id": 1, "name": 5};
    assert!(!s.matches(&d));
    assert_eq!(
        s.explain(&d),
        doc! {
            "operatorName": "$jsonSchema",
            "schemaRulesNotSatisfied": [
                {"operatorName": "required", "specifiedAs": {"required": ["name", "age"]}, "missingProperties": ["age"]},
                {"operatorName": "properties", "propertiesNotSatisfied": [
                    {"propertyName": "name", "description": "must be a string", "details": [
                        {"operatorName": "bsonType", "specifiedAs": {"bsonType": "string"},
                         "reason": "type did not match", "consideredValue": 5, "consideredType": "int"}
                    ]}
                ]},
            ],
        }
    );
    let d = doc! {"_id": 1, "name": "x", "age": -1};
    assert_eq!(
        s.explain(&d)
            .get_array("schemaRulesNotSatisfied")
            .unwrap()
            .clone(),
        vec![Bson::Document(
            doc! {"operatorName": "properties", "propertiesNotSatisfied": [
                {"propertyName": "age", "details": [
                    {"operatorName": "minimum", "specifiedAs": {"minimum": 0}, "reason": "comparison failed", "consideredValue": -1}
                ]}
            ]}
        )]
    );
}

#[test]
fn json_schema_combines_with_other_query_operators() {
    let m = Matcher::parse(
        &doc! {"$jsonSchema": {"required": ["a"]}, "b": {"$gt": 1}, "$or": [{"$jsonSchema": {"properties": {"a": {"bsonType": "int"}}}}]},
    )
    .unwrap();
    assert!(m.matches(&doc! {"a": 1, "b": 2}));
    assert!(!m.matches(&doc! {"a": "x", "b": 2}));
    assert!(!m.matches(&doc! {"b": 2}));
    assert!(m.referenced_paths().is_none());
}

#[test]
fn additional_properties_explanations() {
    let closed = schema(doc! {"properties": {"_id": {}, "a": {}}, "additionalProperties": false});
    assert_eq!(
        closed.explain(&doc! {"_id": 1, "a": 1, "b": 2, "c": 3}),
        doc! {"operatorName": "$jsonSchema", "schemaRulesNotSatisfied": [{
            "operatorName": "additionalProperties",
            "specifiedAs": {"additionalProperties": false},
            "additionalProperties": ["b", "c"],
        }]}
    );
    let typed =
        schema(doc! {"properties": {"_id": {}}, "additionalProperties": {"bsonType": "int"}});
    assert_eq!(
        typed.explain(&doc! {"_id": 1, "a": 1, "b": "x"}),
        doc! {"operatorName": "$jsonSchema", "schemaRulesNotSatisfied": [{
            "operatorName": "additionalProperties",
            "reason": "at least one additional property did not match the subschema",
            "failingProperty": "b",
            "details": [{"operatorName": "bsonType", "specifiedAs": {"bsonType": "int"},
                         "reason": "type did not match", "consideredValue": "x", "consideredType": "string"}],
        }]}
    );
}
