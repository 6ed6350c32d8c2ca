//! Collations: MongoDB's `collation` documents, parsed into an ICU collator (ICU4X's
//! `icu_collator`, pure Rust, with its compiled CLDR tables), for commands, collections and
//! indexes.
//!
//! Invariants:
//! * `None` is the simple (binary) collation: `{locale: "simple"}` parses to `None`, so there
//!   is exactly one representation of it.
//! * [`Collation::spec`] is the normalized document MongoDB reports (every field, defaults
//!   filled in for the locale, `version`), and two collations are equal exactly when their
//!   specs are: the planner uses an index for string bounds only under an equal collation.
//! * [`Collation::key`] maps a string to a string whose binary order is the collation's order
//!   (the ICU sort key, one character per byte), so `compare(key(a), key(b)) ==
//!   compare_str(a, b)`; [`Collation::fold`] applies it to every string inside a value (not to
//!   field names), which is how grouping, `distinct` and collated index keys see values.
//! * What this ICU cannot do is refused with BadValue rather than approximated: `backwards`
//!   other than the locale's own setting (ICU4X fixes it per locale: on only for `fr_CA`).
//!   `normalization: false` is accepted and compares as `true` does (ICU4X always
//!   normalizes, which only makes non-FCD input compare correctly).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use bson::{Bson, Document, doc};
use icu_collator::options::{AlternateHandling, CaseLevel, CollatorOptions, MaxVariable, Strength};
use icu_collator::preferences::{CollationCaseFirst, CollationNumericOrdering};
use icu_collator::{CollatorBorrowed, CollatorPreferences};
use wire::{ErrorCode, MongoError};

use crate::Result;

/// The ICU version MongoDB 7.0 reports in a collation's `version`.
pub const ICU_VERSION: &str = "57.1";

/// The locales MongoDB supports (ICU locale IDs), besides `simple`.
const LOCALES: &[&str] = &[
    "af",
    "sq",
    "am",
    "ar",
    "hy",
    "as",
    "az",
    "bn",
    "be",
    "bs",
    "bs_Cyrl",
    "bg",
    "my",
    "ca",
    "chr",
    "zh",
    "zh_Hant",
    "hr",
    "cs",
    "da",
    "nl",
    "dz",
    "en",
    "en_US",
    "en_US_POSIX",
    "eo",
    "et",
    "ee",
    "fo",
    "fil",
    "fi",
    "fi_FI",
    "fr",
    "fr_CA",
    "gl",
    "ka",
    "de",
    "de_AT",
    "el",
    "gu",
    "ha",
    "haw",
    "he",
    "hi",
    "hu",
    "is",
    "ig",
    "smn",
    "id",
    "ga",
    "it",
    "ja",
    "kl",
    "kn",
    "kk",
    "km",
    "kok",
    "ko",
    "ky",
    "lk",
    "lo",
    "lv",
    "li",
    "lt",
    "dsb",
    "lb",
    "mk",
    "ms",
    "ml",
    "mt",
    "mr",
    "mn",
    "ne",
    "se",
    "nb",
    "nn",
    "or",
    "om",
    "ps",
    "fa",
    "fa_AF",
    "pl",
    "pt",
    "pa",
    "ro",
    "ru",
    "sr",
    "sr_Latn",
    "si",
    "sk",
    "sl",
    "es",
    "sw",
    "sv",
    "ta",
    "te",
    "th",
    "bo",
    "to",
    "tr",
    "uk",
    "hsb",
    "ur",
    "ug",
    "vi",
    "wae",
    "cy",
    "yi",
    "yo",
    "zu",
];

/// `@collation=` variants MongoDB accepts, with their BCP 47 `-u-co-` names.
const VARIANTS: &[(&str, &str)] = &[
    ("big5han", "big5han"),
    ("compat", "compat"),
    ("dictionary", "dict"),
    ("eor", "eor"),
    ("gb2312han", "gb2312"),
    ("phonebook", "phonebk"),
    ("phonetic", "phonetic"),
    ("pinyin", "pinyin"),
    ("search", "search"),
    ("searchjl", "searchjl"),
    ("stroke", "stroke"),
    ("traditional", "trad"),
    ("unihan", "unihan"),
    ("zhuyin", "zhuyin"),
];

const FIELDS: &[&str] = &[
    "locale",
    "caseLevel",
    "caseFirst",
    "strength",
    "numericOrdering",
    "alternate",
    "maxVariable",
    "normalization",
    "backwards",
    "version",
];

/// A non-simple collation: its normalized spec and the collator built from it. Cheap to clone.
#[derive(Clone)]
pub struct Collation(Arc<Inner>);

struct Inner {
    spec: Document,
    collator: CollatorBorrowed<'static>,
}

impl fmt::Debug for Collation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Collation({})", self.0.spec)
    }
}

impl PartialEq for Collation {
    fn eq(&self, other: &Collation) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.spec == other.0.spec
    }
}

impl Collation {
    /// Parses a `collation` field's value; `Ok(None)` is the simple collation.
    pub fn parse(v: &Bson) -> Result<Option<Collation>> {
        let Bson::Document(d) = v else {
            return Err(MongoError::type_mismatch(format!(
                "BSON field 'collation' is the wrong type '{}', expected type 'object'",
                crate::value::types::type_name(v)
            )));
        };
        Collation::parse_doc(d)
    }

    /// Parses a collation document; `Ok(None)` is the simple collation. Collators are built
    /// once per distinct document (catalogs parse their indexes' collations on every write).
    pub fn parse_doc(d: &Document) -> Result<Option<Collation>> {
        static CACHE: Mutex<BTreeMap<String, Collation>> = Mutex::new(BTreeMap::new());
        let text = d.to_string();
        if let Some(c) = CACHE.lock().ok().and_then(|m| m.get(&text).cloned()) {
            return Ok(Some(c));
        }
        let parsed = Collation::build(d)?;
        if let (Some(c), Ok(mut cache)) = (&parsed, CACHE.lock()) {
            if cache.len() >= 1024 {
                cache.clear();
            }
            cache.insert(text, c.clone());
        }
        Ok(parsed)
    }

    fn build(d: &Document) -> Result<Option<Collation>> {
        if let Some(unknown) = d.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(MongoError::with_code(
                40415,
                format!("BSON field 'collation.{unknown}' is an unknown field."),
            ));
        }
        let locale = match d.get("locale") {
            None => {
                return Err(MongoError::with_code(
                    40414,
                    "BSON field 'collation.locale' is missing but a required field",
                ));
            }
            Some(Bson::String(s)) => s.as_str(),
            Some(other) => return Err(wrong_type("locale", other, "string")),
        };
        if locale == "simple" {
            if d.len() > 1 {
                return Err(MongoError::bad_value(
                    "If 'locale' is set to 'simple', then no other fields may be set",
                ));
            }
            return Ok(None);
        }
        let Some(bcp47) = bcp47_of(locale) else {
            return Err(MongoError::bad_value(format!(
                "Field 'locale' is invalid in: {}",
                wire::capped::for_message(d)
            )));
        };
        let Ok(icu_locale) = bcp47.parse::<icu_locale_core::Locale>() else {
            return Err(MongoError::bad_value(format!(
                "Field 'locale' is invalid in: {}",
                wire::capped::for_message(d)
            )));
        };
        let strength = match d.get("strength") {
            None => 3,
            Some(v) => match crate::value::number::as_i64_exact(v) {
                Some(n) if n < 1 => {
                    return Err(MongoError::with_code(
                        51024,
                        "BSON field 'strength' value must be >= 1, actual value '0'"
                            .replace("'0'", &format!("'{n}'")),
                    ));
                }
                Some(n) if n > 5 => {
                    return Err(MongoError::with_code(
                        51024,
                        format!("BSON field 'strength' value must be <= 5, actual value '{n}'"),
                    ));
                }
                Some(n) => n,
                None => return Err(wrong_type("strength", v, "int")),
            },
        };
        let case_level = flag(d, "caseLevel")?;
        let numeric = flag(d, "numericOrdering")?;
        let case_first = choice(d, "caseFirst", &["upper", "lower", "off"])?;
        let alternate = choice(d, "alternate", &["non-ignorable", "shifted"])?;
        let max_variable = choice(d, "maxVariable", &["punct", "space"])?;
        let normalization = flag(d, "normalization")?.unwrap_or(false);
        if let Some(v) = d.get("version") {
            match v {
                Bson::String(s) if s == ICU_VERSION => {}
                Bson::String(s) => {
                    return Err(MongoError::new(
                        ErrorCode::INCOMPATIBLE_COLLATION_VERSION,
                        format!(
                            "Requested collation version {s} but the only available collator version was {ICU_VERSION}. Requested collation spec: {d}"
                        ),
                    ));
                }
                other => return Err(wrong_type("version", other, "string")),
            }
        }

        let mut prefs = CollatorPreferences::from(&icu_locale);
        prefs.case_first = case_first.map(|c| match c {
            "upper" => CollationCaseFirst::Upper,
            "lower" => CollationCaseFirst::Lower,
            _ => CollationCaseFirst::False,
        });
        if let Some(n) = numeric {
            prefs.numeric_ordering = Some(if n {
                CollationNumericOrdering::True
            } else {
                CollationNumericOrdering::False
            });
        }
        let mut options = CollatorOptions::default();
        options.strength = Some(match strength {
            1 => Strength::Primary,
            2 => Strength::Secondary,
            3 => Strength::Tertiary,
            4 => Strength::Quaternary,
            _ => Strength::Identical,
        });
        options.case_level = case_level.map(|on| if on { CaseLevel::On } else { CaseLevel::Off });
        options.alternate_handling = alternate.map(|a| match a {
            "shifted" => AlternateHandling::Shifted,
            _ => AlternateHandling::NonIgnorable,
        });
        options.max_variable = max_variable.map(|m| match m {
            "space" => MaxVariable::Space,
            _ => MaxVariable::Punctuation,
        });
        let collator = CollatorBorrowed::try_new(prefs, options).map_err(|e| {
            MongoError::bad_value(format!(
                "Field 'locale' is invalid in: {} ({e})",
                wire::capped::for_message(d)
            ))
        })?;
        let resolved = collator.resolved_options();

        // ICU4X turns the backward secondary level on from the locale alone.
        let locale_backwards = locale.split('@').next() == Some("fr_CA");
        if let Some(b) = flag(d, "backwards")?
            && b != locale_backwards
        {
            return Err(MongoError::bad_value(format!(
                "Collation option 'backwards: {b}' is not supported for locale '{locale}': \
                 this server's ICU sets the backward secondary level from the locale only"
            )));
        }
        let spec = doc! {
            "locale": locale,
            "caseLevel": resolved.case_level == CaseLevel::On,
            "caseFirst": match resolved.case_first {
                CollationCaseFirst::Upper => "upper",
                CollationCaseFirst::Lower => "lower",
                _ => "off",
            },
            "strength": strength as i32,
            "numericOrdering": resolved.numeric == CollationNumericOrdering::True,
            "alternate": match resolved.alternate_handling {
                AlternateHandling::Shifted => "shifted",
                _ => "non-ignorable",
            },
            "maxVariable": match resolved.max_variable {
                MaxVariable::Space => "space",
                _ => "punct",
            },
            "normalization": normalization,
            "backwards": locale_backwards,
            "version": ICU_VERSION,
        };
        Ok(Some(Collation(Arc::new(Inner { spec, collator }))))
    }

    /// The normalized collation document (what `listIndexes` and `listCollections` show).
    pub fn spec(&self) -> &Document {
        &self.0.spec
    }

    /// The collation's order on two strings.
    pub fn compare_str(&self, a: &str, b: &str) -> Ordering {
        self.0.collator.compare(a, b)
    }

    /// A string whose binary (UTF-8) order is the collation's order of `s`: the ICU sort key,
    /// one code point per byte (code points below 256 keep their order in UTF-8).
    pub fn key(&self, s: &str) -> String {
        let mut bytes = Vec::with_capacity(s.len() * 2);
        let Ok(()) = self.0.collator.write_sort_key_to(s, &mut bytes);
        bytes.into_iter().map(char::from).collect()
    }

    /// `v` with every string (and symbol) inside it replaced by its [`key`](Collation::key):
    /// values that are equal under the collation fold to binary-equal values.
    pub fn fold(&self, v: &Bson) -> Bson {
        match v {
            Bson::String(s) | Bson::Symbol(s) => Bson::String(self.key(s)),
            Bson::Document(d) => {
                Bson::Document(d.iter().map(|(k, v)| (k.clone(), self.fold(v))).collect())
            }
            Bson::Array(a) => Bson::Array(a.iter().map(|v| self.fold(v)).collect()),
            other => other.clone(),
        }
    }
}

/// Whether a value has a string anywhere inside it (the values a collation can change).
pub fn has_string(v: &Bson) -> bool {
    match v {
        Bson::String(_) | Bson::Symbol(_) => true,
        Bson::Document(d) => d.values().any(has_string),
        Bson::Array(a) => a.iter().any(has_string),
        _ => false,
    }
}

/// The `spec` of an optional collation, `{locale: "simple"}` for none.
pub fn spec_of(c: Option<&Collation>) -> Document {
    c.map_or_else(|| doc! { "locale": "simple" }, |c| c.spec().clone())
}

/// A MongoDB locale ID (`en_US`, `de@collation=phonebook`) as a BCP 47 tag, if supported.
fn bcp47_of(locale: &str) -> Option<String> {
    let (base, keywords) = match locale.split_once('@') {
        Some((base, kw)) => (base, Some(kw)),
        None => (locale, None),
    };
    if !LOCALES.contains(&base) {
        return None;
    }
    let mut tag = base.replace('_', "-");
    if tag == "en-US-POSIX" {
        // ICU's `en_US_POSIX` is BCP 47's `en-US-u-va-posix`.
        tag = "en-US-u-va-posix".to_string();
    }
    if let Some(kw) = keywords {
        let variant = kw.strip_prefix("collation=")?;
        let (_, co) = VARIANTS.iter().find(|(name, _)| *name == variant)?;
        if tag.contains("-u-") {
            tag.push_str(&format!("-co-{co}"));
        } else {
            tag.push_str(&format!("-u-co-{co}"));
        }
    }
    Some(tag)
}

fn wrong_type(field: &str, v: &Bson, expected: &str) -> MongoError {
    MongoError::type_mismatch(format!(
        "BSON field 'collation.{field}' is the wrong type '{}', expected type '{expected}'",
        crate::value::types::type_name(v)
    ))
}

fn flag(d: &Document, field: &str) -> Result<Option<bool>> {
    match d.get(field) {
        None => Ok(None),
        Some(Bson::Boolean(b)) => Ok(Some(*b)),
        Some(other) => Err(wrong_type(field, other, "bool")),
    }
}

fn choice<'a>(d: &'a Document, field: &str, allowed: &[&str]) -> Result<Option<&'a str>> {
    match d.get(field) {
        None => Ok(None),
        Some(Bson::String(s)) if allowed.contains(&s.as_str()) => Ok(Some(s.as_str())),
        Some(Bson::String(s)) => Err(MongoError::bad_value(format!(
            "Enumeration value '{s}' for field 'collation.{field}' is not a valid value."
        ))),
        Some(other) => Err(wrong_type(field, other, "string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(d: Document) -> Collation {
        Collation::parse_doc(&d)
            .expect("valid collation")
            .expect("not simple")
    }

    #[test]
    fn strength_decides_what_differences_count() {
        let primary = c(doc! {"locale": "en", "strength": 1});
        let secondary = c(doc! {"locale": "en_US", "strength": 2});
        let tertiary = c(doc! {"locale": "en"});
        assert_eq!(primary.compare_str("cote", "Côté"), Ordering::Equal);
        assert_eq!(secondary.compare_str("ping", "PING"), Ordering::Equal);
        assert_ne!(secondary.compare_str("cote", "côte"), Ordering::Equal);
        assert_ne!(tertiary.compare_str("ping", "PING"), Ordering::Equal);
        // Unlike binary order, case and accents sort after the base letters.
        assert_eq!(tertiary.compare_str("b", "Z"), Ordering::Less);
    }

    #[test]
    fn case_level_numeric_ordering_and_case_first() {
        let case_level = c(doc! {"locale": "en", "strength": 1, "caseLevel": true});
        assert_ne!(case_level.compare_str("a", "A"), Ordering::Equal);
        assert_eq!(case_level.compare_str("a", "á"), Ordering::Equal);
        let numeric = c(doc! {"locale": "en", "numericOrdering": true});
        assert_eq!(numeric.compare_str("a10", "a9"), Ordering::Greater);
        let plain = c(doc! {"locale": "en"});
        assert_eq!(plain.compare_str("a10", "a9"), Ordering::Less);
        let upper = c(doc! {"locale": "en", "caseFirst": "upper"});
        assert_eq!(upper.compare_str("A", "a"), Ordering::Less);
        let lower = c(doc! {"locale": "en", "caseFirst": "lower"});
        assert_eq!(lower.compare_str("A", "a"), Ordering::Greater);
    }

    #[test]
    fn keys_order_like_the_collator() {
        let coll = c(doc! {"locale": "en", "numericOrdering": true, "strength": 2});
        let words = ["a9", "A10", "b", "Ä", "côte", "cote", "z", "", "ß", "ss"];
        for x in words {
            for y in words {
                assert_eq!(
                    coll.key(x).as_bytes().cmp(coll.key(y).as_bytes()),
                    coll.compare_str(x, y),
                    "{x} vs {y}"
                );
            }
        }
        assert_eq!(
            coll.fold(&Bson::Array(vec!["PING".into(), 1.into()])),
            coll.fold(&Bson::Array(vec!["ping".into(), 1.into()]))
        );
    }

    #[test]
    fn spec_is_normalized_and_simple_is_none() {
        assert!(
            Collation::parse_doc(&doc! {"locale": "simple"})
                .expect("simple parses")
                .is_none()
        );
        let spec = c(doc! {"locale": "fr_CA"}).spec().clone();
        assert_eq!(
            spec,
            doc! {"locale": "fr_CA", "caseLevel": false, "caseFirst": "off", "strength": 3,
            "numericOrdering": false, "alternate": "non-ignorable", "maxVariable": "punct",
            "normalization": false, "backwards": true, "version": "57.1"}
        );
        assert_eq!(
            c(doc! {"locale": "en", "strength": 2}),
            c(doc! {"strength": 2, "locale": "en"})
        );
        assert_ne!(
            c(doc! {"locale": "en"}),
            c(doc! {"locale": "en", "strength": 2})
        );
        // Variants select the tailoring.
        let phonebook = c(doc! {"locale": "de@collation=phonebook"});
        let standard = c(doc! {"locale": "de"});
        assert_eq!(phonebook.compare_str("Müller", "Muff"), Ordering::Less);
        assert_eq!(standard.compare_str("Müller", "Muff"), Ordering::Greater);
    }

    #[test]
    fn bad_collations_get_mongodb_errors() {
        let code = |d: Bson| Collation::parse(&d).expect_err("refused").code;
        assert_eq!(code(Bson::Int32(1)), 14);
        assert_eq!(code(doc! {}.into()), 40414);
        assert_eq!(code(doc! {"locale": "en", "bogus": 1}.into()), 40415);
        assert_eq!(code(doc! {"locale": "xx"}.into()), 2);
        assert_eq!(code(doc! {"locale": "en_us"}.into()), 2);
        assert_eq!(code(doc! {"locale": "simple", "strength": 2}.into()), 2);
        assert_eq!(code(doc! {"locale": "en", "strength": 0}.into()), 51024);
        assert_eq!(code(doc! {"locale": "en", "strength": 6}.into()), 51024);
        assert_eq!(code(doc! {"locale": "en", "strength": "2"}.into()), 14);
        assert_eq!(code(doc! {"locale": "en", "caseFirst": "title"}.into()), 2);
        assert_eq!(code(doc! {"locale": "en", "backwards": true}.into()), 2);
        assert_eq!(code(doc! {"locale": "en", "version": "1.0"}.into()), 161);
    }
}
