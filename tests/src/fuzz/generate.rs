//! Structured generation: a plausible command for every name the router lists, then mutations of
//! its arguments (other types, extreme numbers, deep nesting, long dotted paths, huge strings and
//! arrays, unknown and duplicate fields, session / transaction / cluster-time fields).
//!
//! Invariants:
//! * Pure and seeded: [`Generator::case`] is a function of the seed, the iteration number and the
//!   command list alone (each iteration draws from its own `StdRng`, seeded from the run's seed
//!   and the iteration), never of what the server answered. So `--only-iteration K` rebuilds
//!   iteration K exactly without generating the ones before it.
//! * Nothing generated may legitimately stop the run: `shutdown` and the like are never sent;
//!   writes and drops only ever name the fuzz databases ([`WRITE_DBS`]), never `admin`, `config`
//!   or `local`; `setParameter` never sets `logLevel` or `requireApiVersion`; a `getMore` never
//!   follows a tailable or change-stream cursor (it could wait as long as its `maxTimeMS` says).
//! * At most one huge value (string, array, or an oversize document set) per request, so a
//!   frame stays under the 48 MB message limit.

use bson::raw::CString;
use bson::{Binary, Bson, DateTime, Decimal128, JavaScriptCodeWithScope, Regex, Timestamp, doc};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use super::value::{Level, Value};

/// The databases writes and drops may name.
pub const WRITE_DBS: &[&str] = &["fuzz", "fuzz2"];
/// The databases reads may name besides [`WRITE_DBS`].
const READ_ONLY_DBS: &[&str] = &["admin", "config", "local", "test"];
/// Collections commands name (`s` is sharded, `capped` capped, `v` a view on `c`).
const COLLECTIONS: &[&str] = &[
    "c",
    "c",
    "s",
    "s",
    "capped",
    "v",
    "missing",
    "c.sub",
    "system.views",
    "system.profile",
    "$cmd",
    "",
    "ünïcødé",
    "a$b",
];
/// Field names and paths documents and queries use.
const FIELDS: &[&str] = &[
    "_id", "k", "k", "a", "a.b", "s", "sub", "sub.x", "sub.y.0", "arr", "arr.0", "arr.b", "d", "n",
    "x", "loc", "$k", "", "a..b", ".a", "a.", "arr.$", "arr.$[]", "arr.$[e]",
];
/// Commands never sent: they stop the server or freeze it.
const EXCLUDED: &[&str] = &["shutdown", "fsync", "fsyncUnlock", "replSetStepDown"];

/// A command to send as an OP_MSG.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The command name it was generated for (the body's first key may differ after mutation).
    pub name: String,
    /// The body, `$db` included.
    pub body: Vec<(String, Value)>,
    /// Kind-1 document sequences (identifier, documents).
    pub sequences: Vec<(String, Vec<Value>)>,
    /// A command sent first whose cursor id fills [`Value::CursorId`] in the body.
    pub prelude: Option<Vec<(String, Value)>>,
    /// What was mutated, for the failure report.
    pub mutations: Vec<String>,
}

impl Request {
    /// `{body} +sequences (mutations)` in at most about `budget` bytes.
    pub fn render(&self, budget: usize) -> String {
        let mut s = Value::Doc(self.body.clone()).render(budget);
        for (id, docs) in &self.sequences {
            s.push_str(&format!(
                " + sequence {id:?}: {}",
                Value::Array(docs.clone()).render(budget / 2)
            ));
        }
        if let Some(p) = &self.prelude {
            s = format!(
                "prelude {} then {s}",
                Value::Doc(p.clone()).render(budget / 4)
            );
        }
        if !self.mutations.is_empty() {
            s.push_str(&format!("  [mutations: {}]", self.mutations.join("; ")));
        }
        s
    }

    /// An upper bound on the bytes of the body and sequences.
    pub fn size_bound(&self) -> usize {
        Value::Doc(self.body.clone()).encoded_size_bound()
            + self
                .sequences
                .iter()
                .map(|(id, d)| id.len() + Value::Array(d.clone()).encoded_size_bound())
                .sum::<usize>()
    }
}

/// One iteration's work.
#[derive(Debug, Clone, PartialEq)]
pub enum Case {
    /// A structured command, checked for a well-formed reply.
    Command(Request),
    /// Mutated frame bytes, sent on a connection of their own.
    Raw(super::raw::RawCase),
}

/// The seeded generator for one run.
pub struct Generator {
    seed: u64,
    commands: Vec<String>,
    raw_share: f64,
}

impl Generator {
    /// A generator over `commands` (the `listCommands` names; [`EXCLUDED`] ones are dropped).
    pub fn new(seed: u64, commands: &[String]) -> Generator {
        let mut commands: Vec<String> = commands
            .iter()
            .filter(|c| !EXCLUDED.contains(&c.as_str()))
            .cloned()
            .collect();
        commands.sort();
        commands.dedup();
        Generator {
            seed,
            commands,
            raw_share: 0.2,
        }
    }

    /// The commands this generator picks from.
    pub fn commands(&self) -> &[String] {
        &self.commands
    }

    /// The case for `iteration`.
    pub fn case(&self, iteration: u64) -> Case {
        let mut g = Gen {
            rng: StdRng::seed_from_u64(mix(self.seed, iteration)),
            huge_used: false,
        };
        if g.chance(self.raw_share) {
            // Raw mutations start from a modest valid frame: the interesting bytes are the
            // framing, and a 40 MB frame per raw case would slow the run down for nothing.
            g.huge_used = true;
            let base = g.request(&self.commands, 0.3);
            let request_id = iteration as i32;
            Case::Raw(super::raw::mutate(&mut g.rng, &base, request_id))
        } else {
            Case::Command(g.request(&self.commands, 0.8))
        }
    }
}

/// SplitMix64 of the seed and the iteration: independent streams per iteration.
fn mix(seed: u64, iteration: u64) -> u64 {
    let mut z = seed
        .wrapping_add(iteration.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The documents the run starts with in each collection (also what `insert` often adds back).
pub fn seed_documents(n: i32) -> Vec<bson::Document> {
    (0..n)
        .map(|i| {
            doc! {
                "_id": i,
                "k": i % 7,
                "a": {"b": i, "c": [i, i + 1]},
                "s": format!("str{i}"),
                "sub": {"x": i, "y": [1, {"z": i}]},
                "arr": [i, i * 2, {"b": i, "c": "x"}, [1, 2]],
                "d": DateTime::from_millis(1_700_000_000_000 + i64::from(i) * 1000),
                "n": Bson::Null,
                "x": f64::from(i) / 3.0,
                "loc": {"type": "Point", "coordinates": [f64::from(i % 90), f64::from(i % 45)]},
            }
        })
        .collect()
}

/// The generator's state within one iteration.
struct Gen {
    rng: StdRng,
    /// A huge string, array or document set is already in this request.
    huge_used: bool,
}

impl Gen {
    fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p.clamp(0.0, 1.0))
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        items
            .choose(&mut self.rng)
            .unwrap_or_else(|| unreachable!("pick from an empty table"))
    }

    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        self.rng.random_range(lo..=hi)
    }

    fn write_db(&mut self) -> String {
        self.pick(WRITE_DBS).to_string()
    }

    fn read_db(&mut self) -> String {
        if self.chance(0.8) {
            self.write_db()
        } else {
            self.pick(READ_ONLY_DBS).to_string()
        }
    }

    fn coll(&mut self) -> String {
        self.pick(COLLECTIONS).to_string()
    }

    fn field(&mut self) -> String {
        self.pick(FIELDS).to_string()
    }

    /// A command for one of `commands`, mutated with probability `mutate`.
    fn request(&mut self, commands: &[String], mutate: f64) -> Request {
        let name = if commands.is_empty() {
            "ping".to_string()
        } else {
            self.pick(commands).clone()
        };
        let mut t = self.template(&name);
        if self.chance(mutate) {
            let n = self.int(1, 4);
            for _ in 0..n {
                let what = self.mutate(&mut t.body, &name);
                t.mutations.push(what);
            }
        }
        if !t.body.iter().any(|(k, _)| k == "$db") {
            t.body.push(("$db".into(), Value::from(t.db.clone())));
        }
        // A mutation may have named a protected database for a write: put it back.
        if is_write(&name) {
            for (k, v) in t.body.iter_mut() {
                if k == "$db"
                    && matches!(v, Value::Scalar(Bson::String(s)) if !WRITE_DBS.contains(&s.as_str()))
                {
                    *v = Value::from("fuzz");
                }
            }
        }
        Request {
            name,
            body: t.body,
            sequences: t.sequences,
            prelude: t.prelude,
            mutations: t.mutations,
        }
    }

    // ---- values ------------------------------------------------------------------------------

    /// An extreme or awkward number.
    fn extreme_number(&mut self) -> Value {
        let v = match self.int(0, 17) {
            0 => Bson::Int32(i32::MIN),
            1 => Bson::Int32(i32::MAX),
            2 => Bson::Int64(i64::MIN),
            3 => Bson::Int64(i64::MAX),
            4 => Bson::Double(f64::NAN),
            5 => Bson::Double(f64::INFINITY),
            6 => Bson::Double(f64::NEG_INFINITY),
            7 => Bson::Double(-0.0),
            8 => Bson::Double(f64::MAX),
            9 => Bson::Double(f64::MIN_POSITIVE),
            10 => Bson::Double(5e-324),
            11 => Bson::Double(9_007_199_254_740_993.0),
            12 => {
                let d = *self.pick(DECIMALS);
                Bson::Decimal128(decimal(d))
            }
            13 => Bson::Decimal128(Decimal128::from_bytes(self.rng.random())),
            14 => Bson::Int32(-1),
            15 => Bson::Int64(i64::from(i32::MAX) + 1),
            16 => Bson::Double(1e300 * 10.0),
            _ => Bson::Double(-1.5),
        };
        Value::Scalar(v)
    }

    /// A short value of any BSON type.
    fn scalar(&mut self) -> Bson {
        match self.int(0, 24) {
            0 => Bson::Int32(self.int(-3, 100) as i32),
            1 => Bson::Int64(self.int(-3, 1_000_000)),
            2 => Bson::Double(self.int(-100, 100) as f64 / 4.0),
            3 => Bson::String(self.short_string()),
            4 => Bson::Boolean(self.chance(0.5)),
            5 => Bson::Null,
            6 => Bson::Undefined,
            7 => Bson::ObjectId(bson::oid::ObjectId::from_bytes(self.rng.random())),
            8 => Bson::DateTime(DateTime::from_millis(self.rng.random())),
            9 => Bson::Timestamp(Timestamp {
                time: self.rng.random(),
                increment: self.rng.random(),
            }),
            10 => {
                let pattern = self.regex_pattern();
                let options = *self.pick(&["", "i", "ms", "x", "u", "zz"]);
                match (CString::try_from(pattern), CString::try_from(options)) {
                    (Ok(pattern), Ok(options)) => {
                        Bson::RegularExpression(Regex { pattern, options })
                    }
                    _ => Bson::Null,
                }
            }
            11 => Bson::Binary(Binary {
                subtype: self.binary_subtype(),
                bytes: (0..self.int(0, 20)).map(|_| self.rng.random()).collect(),
            }),
            12 => Bson::MinKey,
            13 => Bson::MaxKey,
            14 => Bson::JavaScriptCode("function() { return 1; }".into()),
            15 => Bson::JavaScriptCodeWithScope(JavaScriptCodeWithScope {
                code: "x".into(),
                scope: doc! {"x": 1},
            }),
            16 => Bson::Symbol("sym".into()),
            17 => Bson::Decimal128(decimal("1.5")),
            18 => Bson::JavaScriptCode("while (true) {}".into()),
            19 => Bson::String(self.field()),
            20 => Bson::String(format!("${}", self.field())),
            21 => Bson::String(String::new()),
            _ => match self.extreme_number() {
                Value::Scalar(b) => b,
                _ => Bson::Null,
            },
        }
    }

    fn binary_subtype(&mut self) -> bson::spec::BinarySubtype {
        use bson::spec::BinarySubtype as S;
        match self.int(0, 6) {
            0 => S::Generic,
            1 => S::Uuid,
            2 => S::Function,
            3 => S::Encrypted,
            4 => S::Column,
            5 => S::Vector,
            _ => S::UserDefined(0x80 + self.int(0, 0x7f) as u8),
        }
    }

    fn short_string(&mut self) -> String {
        match self.int(0, 7) {
            0 => String::new(),
            1 => "a\u{0}b".into(),
            2 => "ünï€𝄞".into(),
            3 => "$".into(),
            4 => ".".into(),
            5 => "x".repeat(self.int(1, 300) as usize),
            6 => format!("fuzz{}", self.int(0, 9)),
            _ => "\u{FEFF}\u{202E}".into(),
        }
    }

    fn regex_pattern(&mut self) -> String {
        self.pick(&[
            "^a",
            "(a+)+$",
            "(a|a)*b",
            "[",
            "(?i)str",
            "\\",
            ".*.*.*.*.*.*=.*",
            "(?<n>x)\\k<n>",
            "\\p{L}+",
            "a{1000000}",
            "^(?:(a|b|c)*)*$",
            "",
        ])
        .to_string()
    }

    /// Any value: a scalar, or a small document or array.
    fn value(&mut self, depth: u32) -> Value {
        if depth == 0 || self.chance(0.6) {
            return Value::Scalar(self.scalar());
        }
        match self.int(0, 3) {
            0 => Value::Doc(vec![]),
            1 => Value::Array(vec![]),
            2 => {
                let n = self.int(1, 3);
                Value::Doc(
                    (0..n)
                        .map(|_| (self.field(), self.value(depth - 1)))
                        .collect(),
                )
            }
            _ => {
                let n = self.int(1, 4);
                Value::Array((0..n).map(|_| self.value(depth - 1)).collect())
            }
        }
    }

    /// A value of another type than `v` (or just another value).
    fn other_type(&mut self, v: &Value) -> Value {
        for _ in 0..8 {
            let candidate = self.value(2);
            if candidate.element_type() != v.element_type() {
                return candidate;
            }
        }
        Value::Scalar(Bson::MaxKey)
    }

    /// Nesting levels near and past the limits: just under 100 and 200 (mongod's nesting
    /// limits for expressions and BSON), just over, and up to 100,000.
    fn depth(&mut self) -> u32 {
        match self.int(0, 6) {
            0 => self.int(20, 60) as u32,
            1 => self.int(95, 105) as u32,
            2 => self.int(140, 199) as u32,
            3 => self.int(195, 210) as u32,
            4 => self.int(500, 2000) as u32,
            5 => self.int(10_000, 100_000) as u32,
            _ => self.int(1, 10) as u32,
        }
    }

    /// A deep nesting in a shape the server parses recursively.
    fn deep(&mut self) -> Value {
        let levels = match self.int(0, 11) {
            0 => vec![Level::doc("a")],
            1 => vec![Level::array()],
            2 => vec![Level::doc("$and"), Level::array()],
            3 => vec![Level::doc("$or"), Level::array()],
            4 => vec![Level::doc("$not")],
            5 => vec![Level::doc("$add"), Level::array()],
            6 => vec![Level::doc("$elemMatch")],
            7 => vec![Level::doc("$literal")],
            8 => vec![Level::doc("$cond"), Level::array()],
            9 => vec![Level::doc("$concatArrays"), Level::array()],
            10 => vec![Level::doc("$toString")],
            _ => vec![Level::doc("$let"), Level::doc("in")],
        };
        let bson_levels = self.depth();
        let times = (bson_levels / levels.len() as u32).max(1);
        let leaf = match self.int(0, 3) {
            0 => Value::from(doc! {"k": 1}),
            1 => Value::from("$k"),
            2 => Value::from(1),
            _ => Value::Doc(vec![]),
        };
        Value::Nest {
            levels,
            times,
            leaf: Box::new(leaf),
        }
    }

    /// A dotted path of thousands of components (sometimes `$`-prefixed, as an expression).
    fn long_path(&mut self, dollar: bool) -> String {
        let n = match self.int(0, 3) {
            0 => self.int(100, 300),
            1 => self.int(1000, 5000),
            2 => self.int(20_000, 100_000),
            _ => self.int(2, 50),
        } as usize;
        let long_part = "x".repeat(40);
        let part = *self.pick(&["a", "0", "arr", "$", "$[]", long_part.as_str()]);
        let path = vec![part; n].join(".");
        if dollar { format!("${path}") } else { path }
    }

    /// Whether to make this big value huge: one request in ten that asks, and at most one
    /// huge value per request (a huge request takes seconds on a debug server).
    fn go_huge(&mut self) -> bool {
        if self.huge_used || !self.chance(0.1) {
            return false;
        }
        self.huge_used = true;
        true
    }

    /// A huge string (up to 16 MB) now and then, else a long one (up to 100 kB).
    fn huge_string(&mut self) -> Value {
        let len = if !self.go_huge() {
            self.int(1000, 100_000)
        } else {
            match self.int(0, 3) {
                0 => self.int(1 << 20, 4 << 20),
                1 => self.int(15 << 20, 16 << 20),
                2 => 16 * 1024 * 1024 - self.int(0, 64),
                _ => self.int(100_000, 1_000_000),
            }
        };
        let pattern = self
            .pick(&["a", "ab.", "é", "$", "a.", "(a+)+", "\u{0}"])
            .to_string();
        Value::LongString {
            len: len as u32,
            pattern,
        }
    }

    /// A huge array (or document of many fields, up to 1.5 million) now and then, else a long
    /// one (up to 10,000).
    fn huge_array(&mut self) -> Value {
        let count = if !self.go_huge() {
            self.int(100, 10_000)
        } else {
            match self.int(0, 2) {
                0 => self.int(100_000, 500_000),
                1 => self.int(1_000_000, 1_500_000),
                _ => self.int(10_000, 100_000),
            }
        };
        let item = match self.int(0, 4) {
            0 => Value::from(1),
            1 => Value::from("$k"),
            2 => Value::Doc(vec![("k".into(), Value::from(1))]),
            3 => Value::Array(vec![]),
            _ => Value::Scalar(Bson::Null),
        };
        Value::Repeat {
            count: count as u32,
            item: Box::new(item),
            as_doc: self.chance(0.2),
        }
    }

    // ---- query language -----------------------------------------------------------------------

    /// An aggregation expression.
    fn expr(&mut self, depth: u32) -> Value {
        if depth == 0 || self.chance(0.35) {
            return self.expr_leaf();
        }
        let d = depth - 1;
        let op = *self.pick(&[
            "$concat",
            "$reduce",
            "$range",
            "$regexMatch",
            "$regexFindAll",
            "$sortArray",
            "$map",
            "$filter",
            "$let",
            "$switch",
            "$cond",
            "$dateToString",
            "$dateFromString",
            "$convert",
            "$getField",
            "$setField",
            "$replaceAll",
            "$zip",
            "$function",
            "$dateAdd",
            "$trim",
            "$substrCP",
            "$literal",
            "$firstN",
            "$median",
            "generic",
            "generic",
            "generic",
            "generic",
        ]);
        let v = match op {
            "$concat" => Value::Array((0..self.int(0, 4)).map(|_| self.expr(d)).collect()),
            "$reduce" => Value::Doc(vec![
                ("input".into(), self.array_expr(d)),
                ("initialValue".into(), self.expr(d)),
                (
                    "in".into(),
                    Value::Doc(vec![(
                        self.pick(&["$concat", "$add", "$concatArrays", "$mergeObjects"])
                            .to_string(),
                        Value::Array(vec![Value::from("$$value"), Value::from("$$this")]),
                    )]),
                ),
            ]),
            "$range" => Value::Array(vec![
                self.number_expr(),
                self.number_expr(),
                if self.chance(0.5) {
                    self.number_expr()
                } else {
                    Value::from(1)
                },
            ]),
            "$regexMatch" | "$regexFindAll" => Value::Doc(vec![
                ("input".into(), self.expr(d)),
                (
                    "regex".into(),
                    if self.chance(0.7) {
                        Value::from(self.regex_pattern())
                    } else {
                        self.expr(d)
                    },
                ),
                (
                    "options".into(),
                    Value::from(*self.pick(&["", "i", "mx", "q"])),
                ),
            ]),
            "$sortArray" => Value::Doc(vec![
                ("input".into(), self.array_expr(d)),
                (
                    "sortBy".into(),
                    if self.chance(0.5) {
                        Value::from(*self.pick(&[1, -1, 0, 2]))
                    } else {
                        Value::Doc(vec![(self.field(), Value::from(-1))])
                    },
                ),
            ]),
            "$map" | "$filter" => {
                let mut f = vec![
                    ("input".into(), self.array_expr(d)),
                    (
                        "as".into(),
                        Value::from(*self.pick(&["x", "this", "", "ROOT", "1"])),
                    ),
                ];
                let key = if op == "$map" { "in" } else { "cond" };
                f.push((key.into(), self.expr(d)));
                if op == "$filter" && self.chance(0.3) {
                    f.push(("limit".into(), self.number_expr()));
                }
                Value::Doc(f)
            }
            "$let" => Value::Doc(vec![
                (
                    "vars".into(),
                    Value::Doc(vec![(
                        self.pick(&["x", "y", "CURRENT", "ROOT", "_z", "é"])
                            .to_string(),
                        self.expr(d),
                    )]),
                ),
                ("in".into(), self.expr(d)),
            ]),
            "$switch" => Value::Doc(vec![
                (
                    "branches".into(),
                    Value::Array(
                        (0..self.int(0, 3))
                            .map(|_| {
                                Value::Doc(vec![
                                    ("case".into(), self.expr(d)),
                                    ("then".into(), self.expr(d)),
                                ])
                            })
                            .collect(),
                    ),
                ),
                ("default".into(), self.expr(d)),
            ]),
            "$cond" => Value::Array(vec![self.expr(d), self.expr(d), self.expr(d)]),
            "$dateToString" => Value::Doc(vec![
                (
                    "format".into(),
                    Value::from(*self.pick(&["%Y-%m-%d", "%%%", "%", "%Z%z%j%U", "%Q"])),
                ),
                ("date".into(), self.expr(d)),
                (
                    "timezone".into(),
                    Value::from(*self.pick(&["UTC", "+99:99", "Europe/Paris", "", "-00:00"])),
                ),
            ]),
            "$dateFromString" => Value::Doc(vec![
                ("dateString".into(), self.expr(d)),
                (
                    "format".into(),
                    Value::from(*self.pick(&["%Y-%m-%d", "%", "%G-%V-%u", "%L"])),
                ),
            ]),
            "$convert" => Value::Doc(vec![
                ("input".into(), self.expr(d)),
                (
                    "to".into(),
                    if self.chance(0.8) {
                        Value::from(*self.pick(&[
                            "double", "string", "objectId", "bool", "date", "int", "long",
                            "decimal", "binData", "bogus",
                        ]))
                    } else {
                        self.extreme_number()
                    },
                ),
                ("onError".into(), self.expr_leaf()),
            ]),
            "$getField" => Value::Doc(vec![
                ("field".into(), self.expr(d)),
                ("input".into(), self.expr(d)),
            ]),
            "$setField" => Value::Doc(vec![
                ("field".into(), Value::from(self.field())),
                ("input".into(), Value::from("$$ROOT")),
                ("value".into(), self.expr(d)),
            ]),
            "$replaceAll" => Value::Doc(vec![
                ("input".into(), self.expr(d)),
                ("find".into(), self.expr(d)),
                ("replacement".into(), self.expr(d)),
            ]),
            "$zip" => Value::Doc(vec![
                (
                    "inputs".into(),
                    Value::Array(vec![self.array_expr(d), self.array_expr(d)]),
                ),
                ("useLongestLength".into(), Value::from(self.chance(0.5))),
            ]),
            "$function" => Value::Doc(vec![
                ("body".into(), Value::from("function(x) { return x; }")),
                ("args".into(), Value::Array(vec![self.expr(d)])),
                ("lang".into(), Value::from("js")),
            ]),
            "$dateAdd" => Value::Doc(vec![
                ("startDate".into(), self.expr(d)),
                (
                    "unit".into(),
                    Value::from(*self.pick(&["day", "year", "millisecond", "fortnight"])),
                ),
                ("amount".into(), self.number_expr()),
            ]),
            "$trim" => Value::Doc(vec![
                ("input".into(), self.expr(d)),
                ("chars".into(), self.expr(d)),
            ]),
            "$substrCP" => Value::Array(vec![self.expr(d), self.number_expr(), self.number_expr()]),
            "$literal" => self.value(2),
            "$firstN" => Value::Doc(vec![
                ("n".into(), self.number_expr()),
                ("input".into(), self.array_expr(d)),
            ]),
            "$median" => Value::Doc(vec![
                ("input".into(), self.array_expr(d)),
                ("method".into(), Value::from("approximate")),
            ]),
            _ => {
                let op = *self.pick(GENERIC_OPERATORS);
                let args = match self.int(0, 3) {
                    0 => self.expr(d),
                    _ => Value::Array((0..self.int(0, 3)).map(|_| self.expr(d)).collect()),
                };
                return Value::Doc(vec![(op.to_string(), args)]);
            }
        };
        Value::Doc(vec![(op.to_string(), v)])
    }

    fn expr_leaf(&mut self) -> Value {
        match self.int(0, 3) {
            0 => Value::from(*self.pick(&[
                "$k",
                "$a.b",
                "$arr",
                "$s",
                "$sub",
                "$d",
                "$$ROOT",
                "$$CURRENT",
                "$$NOW",
                "$$CLUSTER_TIME",
                "$$REMOVE",
                "$$this",
                "$$value",
                "$$undefinedVariable",
                "$",
                "$$",
                "$.a",
                "$a..b",
                "$arr.0.b",
            ])),
            1 => self.number_expr(),
            _ => Value::Scalar(self.scalar()),
        }
    }

    fn number_expr(&mut self) -> Value {
        match self.int(0, 3) {
            0 => self.extreme_number(),
            1 => Value::from(*self.pick(&[0, 1, 2, -1, 1000, 100_000_000, 1_000_000_000])),
            2 => Value::from("$k"),
            _ => Value::from(self.int(-10, 10)),
        }
    }

    fn array_expr(&mut self, depth: u32) -> Value {
        match self.int(0, 3) {
            0 => Value::from("$arr"),
            1 => Value::Array((0..self.int(0, 5)).map(|_| self.expr_leaf()).collect()),
            2 => Value::Doc(vec![(
                "$range".into(),
                Value::Array(vec![Value::from(0), self.number_expr()]),
            )]),
            _ => self.expr(depth),
        }
    }

    /// A query filter.
    fn filter(&mut self, depth: u32) -> Value {
        let n = self.int(0, 2);
        let mut f = Vec::new();
        for _ in 0..n {
            f.push(self.predicate(depth));
        }
        Value::Doc(f)
    }

    fn predicate(&mut self, depth: u32) -> (String, Value) {
        let d = depth.saturating_sub(1);
        match self.int(0, 9) {
            0 | 1 => (self.field(), Value::Scalar(self.scalar())),
            2..=4 => {
                let op = *self.pick(&[
                    "$eq",
                    "$ne",
                    "$gt",
                    "$gte",
                    "$lt",
                    "$lte",
                    "$in",
                    "$nin",
                    "$exists",
                    "$type",
                    "$size",
                    "$all",
                    "$mod",
                    "$regex",
                    "$elemMatch",
                    "$not",
                    "$bitsAllSet",
                    "$bitsAnyClear",
                    "$geoWithin",
                    "$near",
                    "$geoIntersects",
                    "$unknownOperator",
                ]);
                let arg = match op {
                    "$in" | "$nin" | "$all" => {
                        Value::Array((0..self.int(0, 4)).map(|_| self.value(1)).collect())
                    }
                    "$mod" => Value::Array(vec![self.number_expr(), self.number_expr()]),
                    "$regex" => Value::from(self.regex_pattern()),
                    "$elemMatch" if depth > 0 => self.filter(d),
                    "$not" => Value::Doc(vec![("$gt".into(), Value::Scalar(self.scalar()))]),
                    "$type" => Value::from(*self.pick(&["string", "number", "bogus", "array"])),
                    "$geoWithin" => Value::from(doc! {"$box": [[0, 0], [10, 10]]}),
                    "$near" => Value::from(
                        doc! {"$geometry": {"type": "Point", "coordinates": [0.0, 0.0]}, "$maxDistance": 1e9},
                    ),
                    "$geoIntersects" => Value::from(
                        doc! {"$geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [0, 0]]]}},
                    ),
                    _ => Value::Scalar(self.scalar()),
                };
                (self.field(), Value::Doc(vec![(op.to_string(), arg)]))
            }
            5 if depth > 0 => {
                let op = self.pick(&["$and", "$or", "$nor"]).to_string();
                let items = (0..self.int(0, 3)).map(|_| self.filter(d)).collect();
                (op, Value::Array(items))
            }
            6 => ("$expr".into(), self.expr(depth.max(1))),
            7 => {
                let (k, v) = match self.int(0, 5) {
                    0 => ("$text", Value::from(doc! {"$search": "str1 -str2 \"x\""})),
                    1 => ("$where", Value::from("this.k > 1")),
                    2 => (
                        "$jsonSchema",
                        Value::from(
                            doc! {"bsonType": "object", "required": ["k"], "properties": {"k": {"minimum": 3}}},
                        ),
                    ),
                    3 => ("$comment", Value::from("fuzz")),
                    4 => ("$sampleRate", self.number_expr()),
                    _ => ("$alwaysTrue", Value::from(1)),
                };
                (k.to_string(), v)
            }
            _ => ("k".into(), Value::from(self.int(0, 7))),
        }
    }

    /// An update document (operators) or, sometimes, a replacement or a pipeline.
    fn update_spec(&mut self, depth: u32) -> Value {
        match self.int(0, 5) {
            0 => Value::from(doc! {"k": 1, "replaced": true}),
            1 => self.pipeline(depth),
            _ => {
                let n = self.int(1, 3);
                let mut ops = Vec::new();
                for _ in 0..n {
                    let op = *self.pick(&[
                        "$set",
                        "$inc",
                        "$push",
                        "$pull",
                        "$addToSet",
                        "$unset",
                        "$rename",
                        "$min",
                        "$max",
                        "$mul",
                        "$currentDate",
                        "$setOnInsert",
                        "$bit",
                        "$pop",
                        "$pullAll",
                        "$unknownUpdateOp",
                    ]);
                    let arg = match op {
                        "$push" | "$addToSet" => Value::Doc(vec![(
                            self.field(),
                            Value::Doc(vec![
                                (
                                    "$each".into(),
                                    Value::Array(
                                        (0..self.int(0, 3)).map(|_| self.value(1)).collect(),
                                    ),
                                ),
                                ("$slice".into(), self.number_expr()),
                                ("$position".into(), self.number_expr()),
                                ("$sort".into(), Value::from(*self.pick(&[1, -1]))),
                            ]),
                        )]),
                        "$rename" => Value::Doc(vec![(self.field(), Value::from(self.field()))]),
                        "$bit" => Value::Doc(vec![(
                            self.field(),
                            Value::Doc(vec![(
                                self.pick(&["and", "or", "xor", "nand"]).to_string(),
                                self.number_expr(),
                            )]),
                        )]),
                        "$currentDate" => Value::Doc(vec![(
                            self.field(),
                            Value::from(doc! {"$type": "timestamp"}),
                        )]),
                        "$inc" | "$mul" | "$min" | "$max" | "$pop" => {
                            Value::Doc(vec![(self.field(), self.number_expr())])
                        }
                        _ => Value::Doc(vec![(self.field(), self.value(2))]),
                    };
                    ops.push((op.to_string(), arg));
                }
                Value::Doc(ops)
            }
        }
    }

    /// An aggregation pipeline of random stages.
    fn pipeline(&mut self, depth: u32) -> Value {
        let n = self.int(0, 5);
        Value::Array((0..n).map(|_| self.stage(depth)).collect())
    }

    fn stage(&mut self, depth: u32) -> Value {
        let d = depth.saturating_sub(1);
        let e = 3;
        let (name, arg): (&str, Value) = match self.int(0, 33) {
            0..=2 => ("$match", self.filter(2)),
            3 => (
                "$project",
                Value::Doc(vec![
                    (self.field(), Value::from(*self.pick(&[0, 1]))),
                    (self.field(), self.expr(e)),
                ]),
            ),
            4 | 5 => (
                *self.pick(&["$addFields", "$set"]),
                Value::Doc(vec![(self.field(), self.expr(e))]),
            ),
            6 => ("$unset", Value::from(self.field())),
            7 | 8 => {
                let acc = *self.pick(&[
                    "$sum",
                    "$push",
                    "$addToSet",
                    "$max",
                    "$first",
                    "$mergeObjects",
                    "$stdDevSamp",
                    "$avg",
                    "$median",
                    "$top",
                    "$topN",
                    "$accumulator",
                    "$count",
                ]);
                let acc_arg = match acc {
                    "$top" | "$topN" => Value::Doc(vec![
                        ("sortBy".into(), Value::from(doc! {"k": 1})),
                        ("output".into(), self.expr(2)),
                        ("n".into(), self.number_expr()),
                    ]),
                    "$median" => Value::Doc(vec![
                        ("input".into(), self.expr(2)),
                        ("method".into(), Value::from("approximate")),
                    ]),
                    "$count" => Value::Doc(vec![]),
                    _ => self.expr(e),
                };
                (
                    "$group",
                    Value::Doc(vec![
                        ("_id".into(), self.expr(2)),
                        ("acc".into(), Value::Doc(vec![(acc.to_string(), acc_arg)])),
                    ]),
                )
            }
            9 => (
                "$sort",
                Value::Doc(vec![(
                    self.field(),
                    if self.chance(0.2) {
                        Value::from(doc! {"$meta": "textScore"})
                    } else {
                        Value::from(*self.pick(&[1, -1, 0, 2]))
                    },
                )]),
            ),
            10 => (*self.pick(&["$limit", "$skip"]), self.number_expr()),
            11 => (
                "$unwind",
                if self.chance(0.5) {
                    Value::from(format!("${}", self.field()))
                } else {
                    Value::Doc(vec![
                        ("path".into(), Value::from("$arr")),
                        ("includeArrayIndex".into(), Value::from(self.field())),
                        ("preserveNullAndEmptyArrays".into(), Value::from(true)),
                    ])
                },
            ),
            12 => {
                let mut f = vec![
                    ("from".into(), Value::from(self.coll())),
                    ("as".into(), Value::from(self.field())),
                ];
                if self.chance(0.5) || depth == 0 {
                    f.push(("localField".into(), Value::from(self.field())));
                    f.push(("foreignField".into(), Value::from(self.field())));
                } else {
                    f.push((
                        "let".into(),
                        Value::Doc(vec![("v".into(), Value::from("$k"))]),
                    ));
                    f.push(("pipeline".into(), self.pipeline(d)));
                }
                ("$lookup", Value::Doc(f))
            }
            13 => (
                "$graphLookup",
                Value::Doc(vec![
                    ("from".into(), Value::from(self.coll())),
                    ("startWith".into(), self.expr(2)),
                    ("connectFromField".into(), Value::from(self.field())),
                    ("connectToField".into(), Value::from(self.field())),
                    ("as".into(), Value::from("g")),
                    ("maxDepth".into(), self.number_expr()),
                    ("depthField".into(), Value::from("depth")),
                ]),
            ),
            14 if depth > 0 => (
                "$facet",
                Value::Doc(vec![
                    ("a".into(), self.pipeline(d)),
                    ("b".into(), self.pipeline(d)),
                ]),
            ),
            15 => (
                "$bucket",
                Value::Doc(vec![
                    ("groupBy".into(), self.expr(2)),
                    (
                        "boundaries".into(),
                        Value::Array((0..self.int(0, 4)).map(|_| self.number_expr()).collect()),
                    ),
                    ("default".into(), Value::from("other")),
                ]),
            ),
            16 => (
                "$bucketAuto",
                Value::Doc(vec![
                    ("groupBy".into(), self.expr(2)),
                    ("buckets".into(), self.number_expr()),
                ]),
            ),
            17 => ("$sortByCount", self.expr(2)),
            18 => ("$count", Value::from(self.field())),
            19 => (
                "$replaceRoot",
                Value::Doc(vec![("newRoot".into(), self.expr(e))]),
            ),
            20 => ("$replaceWith", self.expr(e)),
            21 => (
                "$sample",
                Value::Doc(vec![("size".into(), self.number_expr())]),
            ),
            22 => {
                let mut f = vec![("coll".into(), Value::from(self.coll()))];
                if depth > 0 {
                    f.push(("pipeline".into(), self.pipeline(d)));
                }
                ("$unionWith", Value::Doc(f))
            }
            23 => (
                "$densify",
                Value::Doc(vec![
                    ("field".into(), Value::from(self.field())),
                    (
                        "range".into(),
                        Value::Doc(vec![
                            ("step".into(), self.number_expr()),
                            (
                                "bounds".into(),
                                if self.chance(0.5) {
                                    Value::from("full")
                                } else {
                                    Value::Array(vec![self.number_expr(), self.number_expr()])
                                },
                            ),
                        ]),
                    ),
                ]),
            ),
            24 => (
                "$setWindowFields",
                Value::Doc(vec![
                    ("partitionBy".into(), self.expr(1)),
                    ("sortBy".into(), Value::from(doc! {"k": 1})),
                    (
                        "output".into(),
                        Value::Doc(vec![(
                            "w".into(),
                            Value::Doc(vec![
                                ("$sum".into(), self.expr(1)),
                                (
                                    "window".into(),
                                    Value::Doc(vec![(
                                        "documents".into(),
                                        Value::Array(vec![self.number_expr(), self.number_expr()]),
                                    )]),
                                ),
                            ]),
                        )]),
                    ),
                ]),
            ),
            25 => (
                "$redact",
                Value::Doc(vec![(
                    "$cond".into(),
                    Value::Array(vec![
                        self.expr(2),
                        Value::from("$$DESCEND"),
                        Value::from(*self.pick(&["$$PRUNE", "$$KEEP", "$$BOGUS"])),
                    ]),
                )]),
            ),
            26 => (
                "$out",
                if self.chance(0.5) {
                    Value::from(self.coll())
                } else {
                    Value::Doc(vec![
                        ("db".into(), Value::from(self.write_db())),
                        ("coll".into(), Value::from(self.coll())),
                    ])
                },
            ),
            27 => (
                "$merge",
                Value::Doc(vec![
                    (
                        "into".into(),
                        Value::Doc(vec![
                            ("db".into(), Value::from(self.write_db())),
                            ("coll".into(), Value::from(self.coll())),
                        ]),
                    ),
                    (
                        "whenMatched".into(),
                        if self.chance(0.7) {
                            Value::from(*self.pick(&["replace", "keepExisting", "merge", "fail"]))
                        } else {
                            self.pipeline(0)
                        },
                    ),
                ]),
            ),
            28 => (
                "$changeStream",
                Value::Doc(vec![(
                    "fullDocument".into(),
                    Value::from(*self.pick(&["default", "updateLookup", "whenAvailable", "x"])),
                )]),
            ),
            29 => (
                *self.pick(&[
                    "$collStats",
                    "$indexStats",
                    "$currentOp",
                    "$listSessions",
                    "$planCacheStats",
                    "$listLocalSessions",
                ]),
                Value::Doc(vec![]),
            ),
            30 => (
                "$documents",
                Value::Array((0..self.int(0, 3)).map(|_| self.value(2)).collect()),
            ),
            31 => (
                "$geoNear",
                Value::Doc(vec![
                    (
                        "near".into(),
                        Value::Array(vec![self.number_expr(), self.number_expr()]),
                    ),
                    ("distanceField".into(), Value::from("dist")),
                ]),
            ),
            32 => (
                "$fill",
                Value::Doc(vec![
                    ("sortBy".into(), Value::from(doc! {"k": 1})),
                    (
                        "output".into(),
                        Value::Doc(vec![(
                            self.field(),
                            Value::Doc(vec![(
                                "method".into(),
                                Value::from(*self.pick(&["linear", "locf", "bogus"])),
                            )]),
                        )]),
                    ),
                ]),
            ),
            _ => (
                *self.pick(&["$search", "$unknownStage", "$", "match"]),
                self.value(1),
            ),
        };
        Value::Doc(vec![(name.to_string(), arg)])
    }

    // ---- commands ----------------------------------------------------------------------------

    /// A plausible command called `name` (a generic `{name: <collection or 1>}` for those without
    /// a template).
    fn template(&mut self, name: &str) -> Template {
        let mut t = Template::new(name, self.read_db());
        let c = self.coll();
        match name {
            "find" => {
                t.first(Value::from(c));
                t.maybe(self, 0.7, "filter", |g| g.filter(2));
                t.maybe(self, 0.3, "projection", |g| {
                    Value::Doc(vec![(g.field(), Value::from(*g.pick(&[0, 1])))])
                });
                t.maybe(self, 0.3, "sort", |g| {
                    Value::Doc(vec![(g.field(), Value::from(*g.pick(&[1, -1])))])
                });
                for key in ["skip", "limit", "batchSize"] {
                    t.maybe(self, 0.2, key, |g| g.number_expr());
                }
                t.maybe(self, 0.1, "singleBatch", |g| Value::from(g.chance(0.5)));
                t.maybe(self, 0.1, "hint", |g| {
                    Value::from(*g.pick(&["_id_", "k_1", "nope"]))
                });
                t.maybe(self, 0.1, "collation", |g| g.collation());
                t.maybe(self, 0.1, "let", |g| {
                    Value::Doc(vec![("v".into(), g.expr(2))])
                });
                t.maybe(self, 0.1, "min", |_| Value::from(doc! {"k": 1}));
                t.maybe(self, 0.1, "max", |_| Value::from(doc! {"k": 5}));
                t.maybe(self, 0.1, "returnKey", |_| Value::from(true));
                t.maybe(self, 0.1, "showRecordId", |_| Value::from(true));
                t.maybe(self, 0.1, "tailable", |_| Value::from(true));
                t.maybe(self, 0.1, "awaitData", |_| Value::from(true));
                t.maybe(self, 0.1, "allowPartialResults", |_| Value::from(true));
            }
            "aggregate" => {
                let target = if self.chance(0.15) {
                    Value::from(1)
                } else {
                    Value::from(c)
                };
                t.first(target);
                t.set("pipeline", self.pipeline(2));
                t.set(
                    "cursor",
                    if self.chance(0.5) {
                        Value::Doc(vec![])
                    } else {
                        Value::Doc(vec![("batchSize".into(), self.number_expr())])
                    },
                );
                t.maybe(self, 0.1, "explain", |_| Value::from(true));
                t.maybe(self, 0.1, "allowDiskUse", |_| Value::from(true));
                t.maybe(self, 0.1, "let", |g| {
                    Value::Doc(vec![("v".into(), g.expr(2))])
                });
                t.maybe(self, 0.1, "collation", |g| g.collation());
                t.maybe(self, 0.1, "hint", |_| Value::from(doc! {"_id": 1}));
                if self.pipeline_writes(&t) {
                    t.db = self.write_db();
                }
            }
            "insert" => {
                t.db = self.write_db();
                t.first(Value::from(c));
                let docs: Vec<Value> = if self.chance(0.5) {
                    let base = self.int(0, 1000) as i32;
                    seed_documents(self.int(1, 20) as i32)
                        .into_iter()
                        .map(|mut d| {
                            if let Some(Bson::Int32(id)) = d.get("_id").cloned() {
                                d.insert("_id", id + base);
                            }
                            Value::from(d)
                        })
                        .collect()
                } else {
                    (0..self.int(0, 4))
                        .map(|_| {
                            let mut fields = vec![(g_id(self), Value::Scalar(self.scalar()))];
                            for _ in 0..self.int(0, 3) {
                                fields.push((self.field(), self.value(3)));
                            }
                            Value::Doc(fields)
                        })
                        .collect()
                };
                t.put_documents(self, "documents", docs);
                t.maybe(self, 0.2, "ordered", |g| Value::from(g.chance(0.5)));
                t.maybe(self, 0.1, "bypassDocumentValidation", |_| Value::from(true));
            }
            "update" => {
                t.db = self.write_db();
                t.first(Value::from(c));
                let updates: Vec<Value> = (0..self.int(1, 3))
                    .map(|_| {
                        let mut f = vec![
                            ("q".into(), self.filter(2)),
                            ("u".into(), self.update_spec(1)),
                        ];
                        if self.chance(0.3) {
                            f.push(("upsert".into(), Value::from(true)));
                        }
                        if self.chance(0.4) {
                            f.push(("multi".into(), Value::from(self.chance(0.7))));
                        }
                        if self.chance(0.2) {
                            f.push((
                                "arrayFilters".into(),
                                Value::Array(vec![Value::from(doc! {"e": {"$gt": 1}})]),
                            ));
                        }
                        if self.chance(0.1) {
                            f.push(("collation".into(), self.collation()));
                        }
                        Value::Doc(f)
                    })
                    .collect();
                t.put_documents(self, "updates", updates);
                t.maybe(self, 0.1, "let", |g| {
                    Value::Doc(vec![("v".into(), g.expr(2))])
                });
                t.maybe(self, 0.2, "ordered", |g| Value::from(g.chance(0.5)));
            }
            "delete" => {
                t.db = self.write_db();
                t.first(Value::from(c));
                let deletes: Vec<Value> = (0..self.int(1, 3))
                    .map(|_| {
                        Value::Doc(vec![
                            ("q".into(), self.filter(2)),
                            ("limit".into(), Value::from(*self.pick(&[0, 1, 2]))),
                        ])
                    })
                    .collect();
                t.put_documents(self, "deletes", deletes);
            }
            "findAndModify" => {
                t.db = self.write_db();
                t.first(Value::from(c));
                t.set("query", self.filter(2));
                if self.chance(0.2) {
                    t.set("remove", Value::from(true));
                } else {
                    t.set("update", self.update_spec(1));
                }
                t.maybe(self, 0.3, "sort", |_| Value::from(doc! {"k": -1}));
                t.maybe(self, 0.3, "new", |g| Value::from(g.chance(0.5)));
                t.maybe(self, 0.3, "upsert", |g| Value::from(g.chance(0.5)));
                t.maybe(self, 0.2, "fields", |_| Value::from(doc! {"k": 1}));
                t.maybe(self, 0.1, "arrayFilters", |_| {
                    Value::from(Bson::Array(vec![Bson::Document(doc! {"e": 1})]))
                });
            }
            "count" => {
                t.first(Value::from(c));
                t.maybe(self, 0.6, "query", |g| g.filter(2));
                t.maybe(self, 0.2, "limit", |g| g.number_expr());
                t.maybe(self, 0.2, "skip", |g| g.number_expr());
                t.maybe(self, 0.1, "hint", |_| Value::from("_id_"));
            }
            "distinct" => {
                t.first(Value::from(c));
                t.set("key", Value::from(self.field()));
                t.maybe(self, 0.5, "query", |g| g.filter(2));
            }
            "createIndexes" => {
                t.db = self.write_db();
                t.first(Value::from(c));
                let kind = Value::Scalar(
                    self.pick(&[
                        Bson::Int32(1),
                        Bson::Int32(-1),
                        Bson::String("hashed".into()),
                        Bson::String("text".into()),
                        Bson::String("2dsphere".into()),
                        Bson::String("2d".into()),
                        Bson::Double(0.5),
                        Bson::String("bogus".into()),
                    ])
                    .clone(),
                );
                let key_field = if self.chance(0.2) {
                    "$**".to_string()
                } else {
                    self.field()
                };
                let mut index = vec![
                    ("key".into(), Value::Doc(vec![(key_field, kind)])),
                    ("name".into(), Value::from(format!("i{}", self.int(0, 5)))),
                ];
                for (key, p) in [("unique", 0.2), ("sparse", 0.2), ("hidden", 0.1)] {
                    if self.chance(p) {
                        index.push((key.into(), Value::from(true)));
                    }
                }
                if self.chance(0.2) {
                    index.push(("partialFilterExpression".into(), self.filter(1)));
                }
                if self.chance(0.2) {
                    index.push(("expireAfterSeconds".into(), self.number_expr()));
                }
                if self.chance(0.1) {
                    index.push(("collation".into(), self.collation()));
                }
                t.set("indexes", Value::Array(vec![Value::Doc(index)]));
            }
            "dropIndexes" => {
                t.db = self.write_db();
                t.first(Value::from(c));
                t.set(
                    "index",
                    Value::Scalar(
                        self.pick(&[
                            Bson::String("*".into()),
                            Bson::String("i1".into()),
                            Bson::String("_id_".into()),
                            Bson::Document(doc! {"k": 1}),
                            Bson::Array(vec!["i1".into(), "i2".into()]),
                        ])
                        .clone(),
                    ),
                );
            }
            "listIndexes" => {
                t.first(Value::from(c));
                t.maybe(self, 0.5, "cursor", |g| {
                    Value::Doc(vec![("batchSize".into(), g.number_expr())])
                });
            }
            "collMod" => {
                t.db = self.write_db();
                t.first(Value::from(c));
                match self.int(0, 5) {
                    0 => {
                        t.set("validator", self.filter(2));
                        t.maybe(self, 0.5, "validationLevel", |g| {
                            Value::from(*g.pick(&["off", "strict", "moderate", "bogus"]))
                        });
                        t.maybe(self, 0.5, "validationAction", |g| {
                            Value::from(*g.pick(&["error", "warn", "bogus"]))
                        });
                    }
                    1 => {
                        let index = vec![
                            ("keyPattern".into(), Value::from(doc! {"k": 1})),
                            ("expireAfterSeconds".into(), self.number_expr()),
                            ("hidden".into(), Value::from(self.chance(0.5))),
                        ];
                        t.set("index", Value::Doc(index));
                    }
                    2 => {
                        t.set("viewOn", Value::from(self.coll()));
                        t.set("pipeline", self.pipeline(1));
                    }
                    3 => {
                        t.set("cappedSize", self.number_expr());
                        t.maybe(self, 0.5, "cappedMax", |g| g.number_expr());
                    }
                    4 => t.set(
                        "changeStreamPreAndPostImages",
                        Value::Doc(vec![("enabled".into(), Value::from(self.chance(0.5)))]),
                    ),
                    _ => {}
                }
            }
            "create" => {
                t.db = self.write_db();
                t.first(Value::from(c));
                match self.int(0, 5) {
                    0 => {
                        t.set("capped", Value::from(true));
                        t.set("size", self.number_expr());
                        t.maybe(self, 0.5, "max", |g| g.number_expr());
                    }
                    1 => {
                        t.set("viewOn", Value::from(self.coll()));
                        t.set("pipeline", self.pipeline(1));
                    }
                    2 => t.set("validator", self.filter(2)),
                    3 => t.set(
                        "timeseries",
                        Value::from(
                            doc! {"timeField": "d", "metaField": "k", "granularity": "hours"},
                        ),
                    ),
                    4 => t.set("collation", self.collation()),
                    _ => t.set(
                        "clusteredIndex",
                        Value::from(doc! {"key": {"_id": 1}, "unique": true}),
                    ),
                }
            }
            "drop" => {
                t.db = self.write_db();
                t.first(Value::from(c));
            }
            "dropDatabase" => {
                t.db = self.write_db();
                t.first(Value::from(1));
            }
            "renameCollection" => {
                t.db = "admin".into();
                let from = format!("{}.{}", self.write_db(), c);
                let to = format!("{}.{}", self.write_db(), self.coll());
                t.first(Value::from(from));
                t.set("to", Value::from(to));
                t.maybe(self, 0.3, "dropTarget", |_| Value::from(true));
            }
            "listCollections" | "listDatabases" => {
                if name == "listDatabases" {
                    t.db = "admin".into();
                }
                t.first(Value::from(1));
                t.maybe(self, 0.4, "filter", |g| g.filter(1));
                t.maybe(self, 0.3, "nameOnly", |g| Value::from(g.chance(0.5)));
                t.maybe(self, 0.1, "authorizedCollections", |_| Value::from(true));
            }
            "getMore" | "killCursors" => {
                let prelude_coll = *self.pick(&["c", "s"]);
                t.db = "fuzz".into();
                t.prelude = Some(if self.chance(0.5) {
                    vec![
                        ("find".into(), Value::from(prelude_coll)),
                        ("batchSize".into(), Value::from(1)),
                        ("$db".into(), Value::from("fuzz")),
                    ]
                } else {
                    vec![
                        ("aggregate".into(), Value::from(prelude_coll)),
                        ("pipeline".into(), self.pipeline(1)),
                        ("cursor".into(), Value::from(doc! {"batchSize": 1})),
                        ("$db".into(), Value::from("fuzz")),
                    ]
                });
                if name == "getMore" {
                    t.first(Value::CursorId);
                    t.set("collection", Value::from(prelude_coll));
                    t.maybe(self, 0.4, "batchSize", |g| g.number_expr());
                    t.maybe(self, 0.2, "maxTimeMS", |g| Value::from(g.int(0, 5000)));
                } else {
                    t.first(Value::from(prelude_coll));
                    let mut ids = vec![Value::CursorId];
                    if self.chance(0.5) {
                        ids.push(Value::from(self.rng.random::<i64>()));
                    }
                    t.set("cursors", Value::Array(ids));
                }
            }
            "explain" => {
                let inner_name = *self.pick(&[
                    "find",
                    "aggregate",
                    "count",
                    "distinct",
                    "update",
                    "delete",
                    "findAndModify",
                ]);
                let inner = self.template(inner_name);
                let mut fields = inner.body;
                for (id, docs) in inner.sequences {
                    fields.push((id, Value::Array(docs)));
                }
                t.db = inner.db;
                t.first(Value::Doc(fields));
                t.maybe(self, 0.6, "verbosity", |g| {
                    Value::from(*g.pick(&[
                        "queryPlanner",
                        "executionStats",
                        "allPlansExecution",
                        "bogus",
                    ]))
                });
            }
            "shardCollection" => {
                t.db = "admin".into();
                t.first(Value::from(format!("{}.{}", self.write_db(), c)));
                let kind = Value::Scalar(
                    self.pick(&[
                        Bson::Int32(1),
                        Bson::String("hashed".into()),
                        Bson::Int32(-1),
                    ])
                    .clone(),
                );
                t.set("key", Value::Doc(vec![(self.field(), kind)]));
                t.maybe(self, 0.2, "unique", |_| Value::from(true));
                t.maybe(self, 0.2, "numInitialChunks", |g| g.number_expr());
            }
            "enableSharding" => {
                t.db = "admin".into();
                t.first(Value::from(self.write_db()));
            }
            "validate" | "collStats" => {
                t.first(Value::from(c));
                t.maybe(self, 0.3, "full", |_| Value::from(true));
                t.maybe(self, 0.3, "scale", |g| g.number_expr());
            }
            "dbStats" => {
                t.first(Value::from(1));
                t.maybe(self, 0.5, "scale", |g| g.number_expr());
            }
            "createUser" | "updateUser" => {
                t.db = self.pick(&["fuzz", "admin"]).to_string();
                t.first(Value::from(format!("user{}", self.int(0, 3))));
                t.set("pwd", Value::from(self.short_string()));
                t.set("roles", self.roles());
                t.maybe(self, 0.2, "customData", |g| g.value(2));
                t.maybe(self, 0.2, "mechanisms", |_| {
                    Value::from(Bson::Array(vec!["SCRAM-SHA-256".into(), "BOGUS".into()]))
                });
            }
            "dropUser" | "dropRole" => {
                t.db = self.pick(&["fuzz", "admin"]).to_string();
                let prefix = if name == "dropUser" { "user" } else { "role" };
                t.first(Value::from(format!("{prefix}{}", self.int(0, 3))));
            }
            "usersInfo" | "rolesInfo" => {
                let prefix = if name == "usersInfo" { "user" } else { "role" };
                let which = match self.int(0, 3) {
                    0 => Value::from(1),
                    1 => Value::from(format!("{prefix}{}", self.int(0, 3))),
                    2 => Value::Doc(vec![
                        (
                            prefix.into(),
                            Value::from(format!("{prefix}{}", self.int(0, 3))),
                        ),
                        ("db".into(), Value::from("admin")),
                    ]),
                    _ => Value::Array(vec![Value::from("x"), Value::from(doc! {})]),
                };
                t.first(which);
                t.maybe(self, 0.3, "showPrivileges", |_| Value::from(true));
                t.maybe(self, 0.3, "showCredentials", |_| Value::from(true));
            }
            "grantRolesToUser"
            | "revokeRolesFromUser"
            | "grantRolesToRole"
            | "revokeRolesFromRole" => {
                t.db = self.pick(&["fuzz", "admin"]).to_string();
                let prefix = if name.ends_with("User") {
                    "user"
                } else {
                    "role"
                };
                t.first(Value::from(format!("{prefix}{}", self.int(0, 3))));
                t.set("roles", self.roles());
            }
            "createRole" | "updateRole" | "grantPrivilegesToRole" | "revokePrivilegesFromRole" => {
                t.db = self.pick(&["fuzz", "admin"]).to_string();
                t.first(Value::from(format!("role{}", self.int(0, 3))));
                let resource = match self.int(0, 3) {
                    0 => Value::from(doc! {"db": "fuzz", "collection": "c"}),
                    1 => Value::from(doc! {"cluster": true}),
                    2 => Value::from(doc! {"anyResource": true}),
                    _ => Value::from(doc! {"db": "", "collection": ""}),
                };
                let privileges = Value::Array(vec![Value::Doc(vec![
                    ("resource".into(), resource),
                    (
                        "actions".into(),
                        Value::from(Bson::Array(vec!["find".into(), "bogusAction".into()])),
                    ),
                ])]);
                t.set("privileges", privileges);
                if name.ends_with("Role") && !name.contains("Privileges") {
                    t.set("roles", self.roles());
                }
            }
            "hello" | "isMaster" => {
                t.first(Value::from(1));
                t.maybe(self, 0.4, "client", |g| {
                    Value::Doc(vec![
                        (
                            "driver".into(),
                            Value::from(doc! {"name": "fuzz", "version": "1"}),
                        ),
                        ("os".into(), Value::from(doc! {"type": "Linux"})),
                        (
                            "application".into(),
                            Value::Doc(vec![("name".into(), g.value(1))]),
                        ),
                    ])
                });
                t.maybe(self, 0.3, "compression", |g| {
                    let c = g
                        .pick(&["snappy", "zlib", "zstd", "noop", "lz4"])
                        .to_string();
                    Value::Array(vec![Value::from(c)])
                });
                t.maybe(self, 0.2, "saslSupportedMechs", |_| {
                    Value::from("admin.user0")
                });
                t.maybe(self, 0.2, "speculativeAuthenticate", |g| {
                    Value::Doc(vec![
                        ("saslStart".into(), Value::from(1)),
                        ("mechanism".into(), Value::from("SCRAM-SHA-256")),
                        ("payload".into(), g.binary_payload()),
                        ("db".into(), Value::from("admin")),
                    ])
                });
                t.maybe(self, 0.2, "topologyVersion", |g| {
                    Value::Doc(vec![
                        (
                            "processId".into(),
                            Value::Scalar(Bson::ObjectId(bson::oid::ObjectId::from_bytes(
                                g.rng.random(),
                            ))),
                        ),
                        ("counter".into(), Value::from(g.int(0, 3))),
                    ])
                });
                t.maybe(self, 0.1, "maxAwaitTimeMS", |g| Value::from(g.int(0, 2000)));
                t.maybe(self, 0.1, "loadBalanced", |g| Value::from(g.chance(0.5)));
            }
            "saslStart" => {
                t.db = self.pick(&["admin", "fuzz", "$external"]).to_string();
                t.first(Value::from(1));
                t.set(
                    "mechanism",
                    Value::from(*self.pick(&["SCRAM-SHA-256", "SCRAM-SHA-1", "PLAIN", "BOGUS"])),
                );
                t.set("payload", self.binary_payload());
                t.maybe(self, 0.3, "options", |_| {
                    Value::from(doc! {"skipEmptyExchange": true})
                });
            }
            "saslContinue" => {
                t.db = "admin".into();
                t.first(Value::from(1));
                t.set("conversationId", self.number_expr());
                t.set("payload", self.binary_payload());
            }
            "endSessions" | "killSessions" | "refreshSessions" => {
                let ids = (0..self.int(0, 3))
                    .map(|_| {
                        Value::Doc(vec![(
                            "id".into(),
                            Value::Scalar(Bson::Binary(Binary {
                                subtype: bson::spec::BinarySubtype::Uuid,
                                bytes: (0..16).map(|_| self.rng.random()).collect(),
                            })),
                        )])
                    })
                    .collect();
                t.first(Value::Array(ids));
            }
            "killAllSessions" => {
                t.first(if self.chance(0.5) {
                    Value::Array(vec![])
                } else {
                    Value::from(Bson::Array(vec![Bson::Document(
                        doc! {"user": "user0", "db": "admin"},
                    )]))
                });
            }
            "commitTransaction" | "abortTransaction" => {
                t.db = "admin".into();
                t.first(Value::from(1));
                t.set("lsid", self.lsid());
                t.set("txnNumber", Value::from(self.int(0, 3)));
                t.set("autocommit", Value::from(false));
            }
            "currentOp" => {
                t.db = "admin".into();
                t.first(Value::from(1));
                t.maybe(self, 0.3, "$all", |_| Value::from(true));
                t.maybe(self, 0.3, "$ownOps", |_| Value::from(true));
                t.maybe(self, 0.3, "active", |_| Value::from(true));
            }
            "killOp" => {
                t.db = "admin".into();
                t.first(Value::from(1));
                t.set("op", self.number_expr());
            }
            "getLog" => {
                t.db = "admin".into();
                t.first(Value::from(*self.pick(&[
                    "global",
                    "startupWarnings",
                    "*",
                    "bogus",
                ])));
            }
            "getParameter" => {
                t.db = "admin".into();
                t.first(if self.chance(0.3) {
                    Value::from("*")
                } else if self.chance(0.3) {
                    Value::from(doc! {"showDetails": true, "allParameters": true})
                } else {
                    Value::from(1)
                });
                let p = *self.pick(SETTABLE_PARAMETERS);
                t.set(p, Value::from(1));
            }
            "setParameter" => {
                t.db = "admin".into();
                t.first(Value::from(1));
                let p = *self.pick(SETTABLE_PARAMETERS);
                let v = match p {
                    "cursorTimeoutMillis" => Value::from(self.int(1000, 600_000)),
                    "ttlMonitorSleepSecs" => Value::from(self.int(1, 60)),
                    "featureCompatibilityVersion" => Value::from("7.0"),
                    _ => self.number_expr(),
                };
                t.set(p, v);
            }
            "getClusterParameter" => {
                t.db = "admin".into();
                t.first(Value::from(*self.pick(&[
                    "*",
                    "changeStreamOptions",
                    "bogus",
                ])));
            }
            "setClusterParameter" => {
                t.db = "admin".into();
                let seconds = self.number_expr();
                t.first(Value::Doc(vec![(
                    "changeStreamOptions".into(),
                    Value::Doc(vec![(
                        "preAndPostImages".into(),
                        Value::Doc(vec![("expireAfterSeconds".into(), seconds)]),
                    )]),
                )]));
            }
            "serverStatus" => {
                t.first(Value::from(1));
                t.maybe(self, 0.3, "metrics", |g| Value::from(g.chance(0.5)));
                t.maybe(self, 0.3, "repl", |_| Value::from(0));
            }
            "connectionStatus" => {
                t.first(Value::from(1));
                t.maybe(self, 0.5, "showPrivileges", |_| Value::from(true));
            }
            _ => {
                // No template: `{name: <collection or 1>}`.
                if self.chance(0.5) {
                    t.first(Value::from(c));
                } else {
                    t.first(Value::from(1));
                }
                if EXCLUDED_ADMIN_ONLY.contains(&name) {
                    t.db = "admin".into();
                }
            }
        }
        self.generic_fields(&mut t);
        t
    }

    fn pipeline_writes(&self, t: &Template) -> bool {
        let Some(Value::Array(stages)) = t.get("pipeline") else {
            return false;
        };
        stages
            .iter()
            .any(|s| s.get("$out").is_some() || s.get("$merge").is_some())
    }

    fn collation(&mut self) -> Value {
        Value::Doc(vec![
            (
                "locale".into(),
                Value::from(*self.pick(&["en", "fr_CA", "simple", "zz_ZZ", ""])),
            ),
            ("strength".into(), self.number_expr()),
            ("numericOrdering".into(), Value::from(self.chance(0.5))),
        ])
    }

    fn roles(&mut self) -> Value {
        let mut roles = Vec::new();
        for _ in 0..self.int(0, 3) {
            roles.push(match self.int(0, 2) {
                0 => Value::from(*self.pick(&["read", "readWrite", "root", "bogusRole"])),
                1 => Value::from(doc! {"role": "dbAdmin", "db": "fuzz"}),
                _ => Value::from(format!("role{}", self.int(0, 3))),
            });
        }
        Value::Array(roles)
    }

    fn binary_payload(&mut self) -> Value {
        let bytes: Vec<u8> = match self.int(0, 3) {
            0 => b"n,,n=user0,r=abcdefghijklmnop".to_vec(),
            1 => b"c=biws,r=x,p=AAAA".to_vec(),
            2 => (0..self.int(0, 200)).map(|_| self.rng.random()).collect(),
            _ => Vec::new(),
        };
        Value::Scalar(Bson::Binary(Binary {
            subtype: bson::spec::BinarySubtype::Generic,
            bytes,
        }))
    }

    fn lsid(&mut self) -> Value {
        Value::Doc(vec![(
            "id".into(),
            Value::Scalar(Bson::Binary(Binary {
                subtype: bson::spec::BinarySubtype::Uuid,
                bytes: (0..16).map(|_| self.rng.random()).collect(),
            })),
        )])
    }

    /// Session, transaction, concern, cluster-time and time-limit fields, each now and then.
    fn generic_fields(&mut self, t: &mut Template) {
        if self.chance(0.1) {
            let v = self.lsid();
            t.set("lsid", v);
            if self.chance(0.5) {
                let n = self.number_expr();
                t.set("txnNumber", n);
            }
            if self.chance(0.3) {
                t.set("autocommit", Value::from(false));
                let start = self.chance(0.5);
                t.set("startTransaction", Value::from(start));
            }
        }
        if self.chance(0.1) {
            let mut rc = vec![(
                "level".into(),
                Value::from(*self.pick(&[
                    "local",
                    "majority",
                    "snapshot",
                    "linearizable",
                    "available",
                    "bogus",
                ])),
            )];
            if self.chance(0.5) {
                let key = *self.pick(&["afterClusterTime", "atClusterTime"]);
                rc.push((key.into(), self.timestamp()));
            }
            t.set("readConcern", Value::Doc(rc));
        }
        if self.chance(0.1) {
            let w = match self.int(0, 3) {
                0 => Value::from(0),
                1 => Value::from("majority"),
                2 => Value::from(self.int(2, 50)),
                _ => Value::from("bogusTag"),
            };
            t.set(
                "writeConcern",
                Value::Doc(vec![
                    ("w".into(), w),
                    ("j".into(), Value::from(self.chance(0.5))),
                    ("wtimeout".into(), Value::from(self.int(0, 1000))),
                ]),
            );
        }
        if self.chance(0.08) {
            let ts = self.timestamp();
            let hash: Vec<u8> = (0..20).map(|_| self.rng.random()).collect();
            t.set(
                "$clusterTime",
                Value::Doc(vec![
                    ("clusterTime".into(), ts),
                    (
                        "signature".into(),
                        Value::Doc(vec![
                            (
                                "hash".into(),
                                Value::Scalar(Bson::Binary(Binary {
                                    subtype: bson::spec::BinarySubtype::Generic,
                                    bytes: hash,
                                })),
                            ),
                            ("keyId".into(), Value::from(self.rng.random::<i64>())),
                        ]),
                    ),
                ]),
            );
        }
        if self.chance(0.1) {
            let v = self.number_expr();
            t.set("maxTimeMS", v);
        }
        if self.chance(0.05) {
            t.set("comment", self.value(2));
        }
        if self.chance(0.05) {
            t.set(
                "$readPreference",
                Value::Doc(vec![(
                    "mode".into(),
                    Value::from(*self.pick(&["primary", "secondary", "nearest", "bogus"])),
                )]),
            );
        }
        if self.chance(0.05) {
            t.set("apiVersion", Value::from(*self.pick(&["1", "2", ""])));
            t.set("apiStrict", Value::from(self.chance(0.5)));
        }
    }

    fn timestamp(&mut self) -> Value {
        let time = match self.int(0, 3) {
            0 => 0,
            1 => u32::MAX,
            2 => 1_700_000_000,
            _ => self.rng.random(),
        };
        Value::Scalar(Bson::Timestamp(Timestamp {
            time,
            increment: self.rng.random(),
        }))
    }

    // ---- mutation ----------------------------------------------------------------------------

    /// Applies one mutation to `body` and says what it did.
    fn mutate(&mut self, body: &mut Vec<(String, Value)>, name: &str) -> String {
        let mut root = Value::Doc(std::mem::take(body));
        let slots = slots(&root);
        let path = self.pick(&slots).clone();
        // Weighted: a value of another type most often; moving, renaming or removing the
        // command name (which only earns CommandNotFound) seldom.
        let mut kind = match self.int(0, 39) {
            0..=7 => Mutation::OtherType,
            8..=13 => Mutation::Extreme,
            14..=17 => Mutation::Deep,
            18..=21 => Mutation::LongPath,
            22..=23 => Mutation::HugeString,
            24..=25 => Mutation::HugeArray,
            26..=29 => Mutation::UnknownField,
            30..=32 => Mutation::Remove,
            33..=34 => Mutation::Duplicate,
            35..=36 => Mutation::Empty,
            37 => Mutation::MoveName,
            _ => Mutation::RenameKey,
        };
        let renames = matches!(
            kind,
            Mutation::LongPath | Mutation::Remove | Mutation::RenameKey
        );
        if renames && path == [0] && self.chance(0.8) {
            // Keep the command name; mutate its value instead.
            kind = Mutation::OtherType;
        }
        let at = describe(&root, &path);
        let what = match kind {
            Mutation::OtherType => {
                let old = node(&mut root, &path).clone();
                *node(&mut root, &path) = self.other_type(&old);
                format!("{at}: another type")
            }
            Mutation::Extreme => {
                *node(&mut root, &path) = self.extreme_number();
                format!("{at}: extreme number")
            }
            Mutation::Deep => {
                *node(&mut root, &path) = self.deep();
                format!("{at}: deep nesting")
            }
            Mutation::LongPath => {
                // A long dotted path: as a key where the node is a document field, else as a
                // `$path` string value.
                let dollar = self.chance(0.5);
                let p = self.long_path(dollar);
                if !rename_key(&mut root, &path, p.clone()) {
                    *node(&mut root, &path) = Value::from(p);
                }
                format!("{at}: long dotted path")
            }
            Mutation::HugeString => {
                *node(&mut root, &path) = self.huge_string();
                format!("{at}: huge string")
            }
            Mutation::HugeArray => {
                *node(&mut root, &path) = self.huge_array();
                format!("{at}: huge array")
            }
            Mutation::UnknownField => {
                let key = self
                    .pick(&[
                        "fuzzUnknown",
                        "$unknown",
                        "",
                        "$db",
                        "$",
                        "a.b",
                        "__proto__",
                    ])
                    .to_string();
                let v = self.value(2);
                let target = container_for(&root, &path);
                if let Value::Doc(f) = node(&mut root, &target) {
                    f.push((key, v));
                } else if let Value::Array(items) = node(&mut root, &target) {
                    items.push(v);
                }
                format!("{}: unknown field", describe(&root, &target))
            }
            Mutation::Remove => {
                remove(&mut root, &path);
                format!("{at}: removed")
            }
            Mutation::Duplicate => {
                // The same key twice, the second with another value.
                let v = self.value(2);
                let target = container_for(&root, &path);
                if let (Value::Doc(f), Some(last)) = (node(&mut root, &target), path.last())
                    && let Some((k, _)) = f.get(*last).cloned()
                {
                    f.push((k, v));
                }
                format!("{at}: duplicated key")
            }
            Mutation::Empty => {
                *node(&mut root, &path) = match self.int(0, 2) {
                    0 => Value::Doc(vec![]),
                    1 => Value::Array(vec![]),
                    _ => Value::from(""),
                };
                format!("{at}: emptied")
            }
            Mutation::MoveName => {
                // The command name away from the front: the first key names the command.
                if let Value::Doc(f) = &mut root
                    && f.len() > 1
                {
                    let first = f.remove(0);
                    let i = self.int(0, f.len() as i64) as usize;
                    f.insert(i, first);
                }
                format!("{name}: name moved")
            }
            Mutation::RenameKey => {
                let key = self
                    .pick(&["", "$", ".", "a.b", "$where", "ü", "\u{0}x", "_id"])
                    .to_string();
                if !rename_key(&mut root, &path, key) {
                    *node(&mut root, &path) = Value::Scalar(self.scalar());
                }
                format!("{at}: key renamed")
            }
        };
        if let Value::Doc(f) = root {
            *body = f;
        }
        what
    }
}

/// The ways [`Gen::mutate`] changes a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mutation {
    OtherType,
    Extreme,
    Deep,
    LongPath,
    HugeString,
    HugeArray,
    UnknownField,
    Remove,
    Duplicate,
    Empty,
    MoveName,
    RenameKey,
}

/// Decimal128 extremes and oddities.
const DECIMALS: &[&str] = &[
    "NaN",
    "Infinity",
    "-Infinity",
    "9.999999999999999999999999999999999E+6144",
    "-9.999999999999999999999999999999999E+6144",
    "1E-6176",
    "-0",
    "0E+6111",
    "123456789012345678901234567890123.4",
];

/// Expression operators with positional arguments (plus some that do not exist).
const GENERIC_OPERATORS: &[&str] = &[
    "$add",
    "$subtract",
    "$multiply",
    "$divide",
    "$mod",
    "$abs",
    "$ceil",
    "$floor",
    "$ln",
    "$log",
    "$log10",
    "$sqrt",
    "$pow",
    "$exp",
    "$round",
    "$trunc",
    "$toString",
    "$toInt",
    "$toLong",
    "$toDouble",
    "$toDecimal",
    "$toDate",
    "$toBool",
    "$toObjectId",
    "$type",
    "$isNumber",
    "$isArray",
    "$size",
    "$concatArrays",
    "$setUnion",
    "$setIntersection",
    "$setDifference",
    "$setEquals",
    "$setIsSubset",
    "$allElementsTrue",
    "$anyElementTrue",
    "$reverseArray",
    "$in",
    "$indexOfArray",
    "$indexOfBytes",
    "$indexOfCP",
    "$objectToArray",
    "$arrayToObject",
    "$mergeObjects",
    "$max",
    "$min",
    "$sum",
    "$avg",
    "$stdDevPop",
    "$first",
    "$last",
    "$and",
    "$or",
    "$not",
    "$eq",
    "$ne",
    "$gt",
    "$lt",
    "$cmp",
    "$strcasecmp",
    "$toUpper",
    "$toLower",
    "$ifNull",
    "$split",
    "$substr",
    "$substrBytes",
    "$strLenCP",
    "$strLenBytes",
    "$arrayElemAt",
    "$slice",
    "$rand",
    "$bsonSize",
    "$binarySize",
    "$year",
    "$dayOfWeek",
    "$isoWeek",
    "$millisecond",
    "$tsIncrement",
    "$sin",
    "$atan2",
    "$degreesToRadians",
    "$bitAnd",
    "$bitNot",
    "$meta",
    "$toHashedIndexKey",
    "$unknownOperator",
];

/// Parameters `setParameter` may set without stopping the run (never `logLevel`, whose trace
/// level floods the log, or `requireApiVersion`, which would fail every later command).
const SETTABLE_PARAMETERS: &[&str] = &[
    "cursorTimeoutMillis",
    "ttlMonitorSleepSecs",
    "featureCompatibilityVersion",
    "maxAcceptableLogicalClockDriftSecs",
    "enableTestCommands",
    "authenticationMechanisms",
    "bogusParameter",
];

/// Commands without a template that only run on `admin`.
const EXCLUDED_ADMIN_ONLY: &[&str] = &["listShards", "getCmdLineOpts", "hostInfo"];

/// Commands that write or drop: they only ever name [`WRITE_DBS`].
fn is_write(name: &str) -> bool {
    matches!(
        name,
        "insert"
            | "update"
            | "delete"
            | "findAndModify"
            | "create"
            | "drop"
            | "dropDatabase"
            | "collMod"
            | "createIndexes"
            | "dropIndexes"
    )
}

fn g_id(g: &mut Gen) -> String {
    if g.chance(0.8) {
        "_id".into()
    } else {
        g.field()
    }
}

fn decimal(s: &str) -> Decimal128 {
    s.parse()
        .unwrap_or_else(|_| Decimal128::from_bytes([0; 16]))
}

/// A command under construction.
struct Template {
    db: String,
    name: String,
    body: Vec<(String, Value)>,
    sequences: Vec<(String, Vec<Value>)>,
    prelude: Option<Vec<(String, Value)>>,
    mutations: Vec<String>,
}

impl Template {
    fn new(name: &str, db: String) -> Template {
        Template {
            db,
            name: name.to_string(),
            body: Vec::new(),
            sequences: Vec::new(),
            prelude: None,
            mutations: Vec::new(),
        }
    }

    /// Sets the command-name field (always first).
    fn first(&mut self, v: Value) {
        self.body.retain(|(k, _)| *k != self.name);
        self.body.insert(0, (self.name.clone(), v));
    }

    fn set(&mut self, key: &str, v: Value) {
        match self.body.iter_mut().find(|(k, _)| k == key) {
            Some((_, old)) => *old = v,
            None => self.body.push((key.to_string(), v)),
        }
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.body.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn maybe(&mut self, g: &mut Gen, p: f64, key: &str, f: impl FnOnce(&mut Gen) -> Value) {
        if g.chance(p) {
            let v = f(g);
            self.set(key, v);
        }
    }

    /// `docs` under `key`: in the body, or (as drivers send them) as a kind-1 sequence, and now
    /// and then an oversize set (three documents of 15 MB each, 45 MB in all).
    fn put_documents(&mut self, g: &mut Gen, key: &str, mut docs: Vec<Value>) {
        if !g.huge_used && g.chance(0.01) {
            g.huge_used = true;
            let big = Value::Doc(vec![(
                "big".into(),
                Value::LongString {
                    len: 15_000_000,
                    pattern: "z".into(),
                },
            )]);
            docs = vec![big.clone(), big.clone(), big];
            self.sequences.push((key.to_string(), docs));
            return;
        }
        if g.chance(0.5) {
            self.sequences.push((key.to_string(), docs));
        } else {
            self.set(key, Value::Array(docs));
        }
    }
}

// ---- paths into a value tree ----------------------------------------------------------------

/// Every node under `root` reachable through documents and arrays (as child-index paths), the
/// root's own fields first.
fn slots(root: &Value) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut stack: Vec<(Vec<usize>, &Value)> = vec![(Vec::new(), root)];
    while let Some((path, v)) = stack.pop() {
        let children: Vec<&Value> = match v {
            Value::Doc(f) => f.iter().map(|(_, v)| v).collect(),
            Value::Array(items) => items.iter().collect(),
            _ => Vec::new(),
        };
        for (i, c) in children.into_iter().enumerate() {
            let mut p = path.clone();
            p.push(i);
            out.push(p.clone());
            stack.push((p, c));
        }
    }
    if out.is_empty() {
        out.push(Vec::new());
    }
    out
}

/// The node at `path` (the root for an empty path, or where the path stops being valid).
fn node<'a>(root: &'a mut Value, path: &[usize]) -> &'a mut Value {
    let mut cur = root;
    for &i in path {
        let valid = match &*cur {
            Value::Doc(f) => i < f.len(),
            Value::Array(items) => i < items.len(),
            _ => false,
        };
        if !valid {
            break;
        }
        cur = match cur {
            Value::Doc(f) => &mut f[i].1,
            Value::Array(items) => &mut items[i],
            other => other,
        };
    }
    cur
}

/// The path of the document or array holding `path`'s node.
fn container_for(_root: &Value, path: &[usize]) -> Vec<usize> {
    path[..path.len().saturating_sub(1)].to_vec()
}

/// Renames the field at `path` when its container is a document.
fn rename_key(root: &mut Value, path: &[usize], key: String) -> bool {
    let Some(&last) = path.last() else {
        return false;
    };
    match node(root, &path[..path.len() - 1]) {
        Value::Doc(f) if last < f.len() => {
            f[last].0 = key;
            true
        }
        _ => false,
    }
}

fn remove(root: &mut Value, path: &[usize]) {
    let Some(&last) = path.last() else {
        return;
    };
    match node(root, &path[..path.len() - 1]) {
        Value::Doc(f) if last < f.len() => {
            f.remove(last);
        }
        Value::Array(items) if last < items.len() => {
            items.remove(last);
        }
        _ => {}
    }
}

/// `a.b.0`-style name of the node at `path`.
fn describe(root: &Value, path: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut cur = root;
    for &i in path {
        match cur {
            Value::Doc(f) if i < f.len() => {
                parts.push(f[i].0.chars().take(40).collect::<String>());
                cur = &f[i].1;
            }
            Value::Array(items) if i < items.len() => {
                parts.push(i.to_string());
                cur = &items[i];
            }
            _ => break,
        }
    }
    if parts.is_empty() {
        "(body)".into()
    } else {
        parts.join(".")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commands() -> Vec<String> {
        [
            "find",
            "aggregate",
            "insert",
            "update",
            "delete",
            "getMore",
            "explain",
            "hello",
            "shutdown",
            "ping",
            "createIndexes",
            "setParameter",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn the_same_seed_and_iteration_give_the_same_case() {
        // Compared as bytes: a generated NaN is not equal to itself.
        let a = Generator::new(7, &commands());
        let b = Generator::new(7, &commands());
        for i in 0..300 {
            assert!(bytes(a.case(i)) == bytes(b.case(i)), "iteration {i}");
        }
        let c = Generator::new(8, &commands());
        assert!((0..20).any(|i| bytes(a.case(i)) != bytes(c.case(i))));
    }

    /// The frame a case sends.
    pub(crate) fn bytes(case: Case) -> Vec<u8> {
        match case {
            Case::Command(r) => {
                crate::fuzz::frame::command_frame(&r, 1, Default::default()).unwrap_or_default()
            }
            Case::Raw(r) => r.bytes,
        }
    }

    #[test]
    fn excluded_commands_are_never_generated() {
        let g = Generator::new(1, &commands());
        assert!(!g.commands().iter().any(|c| c == "shutdown"));
        for i in 0..500 {
            if let Case::Command(r) = g.case(i) {
                assert_ne!(r.name, "shutdown");
            }
        }
    }

    #[test]
    fn writes_never_name_a_protected_database() {
        let g = Generator::new(3, &commands());
        for i in 0..500 {
            let Case::Command(r) = g.case(i) else {
                continue;
            };
            if is_write(&r.name) {
                for (k, v) in &r.body {
                    if let (true, Value::Scalar(Bson::String(db))) = (k == "$db", v) {
                        assert!(WRITE_DBS.contains(&db.as_str()), "iteration {i}: {db}");
                    }
                }
            }
        }
    }

    #[test]
    fn requests_stay_under_the_message_limit() {
        let g = Generator::new(11, &commands());
        for i in 0..2000 {
            if let Case::Command(r) = g.case(i) {
                assert!(
                    r.size_bound() < wire::MAX_MESSAGE_SIZE,
                    "iteration {i}: {} bytes",
                    r.size_bound()
                );
            }
        }
    }
}
