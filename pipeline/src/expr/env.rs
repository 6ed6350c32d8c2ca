//! The environment an expression evaluates in ([`Env`]): what is bound outside it, a command's
//! `$$NOW`, `let` variables, collation and `allowDiskUse`, and the other collections'
//! documents for the stages that read them.
//!
//! Invariants: `$$NOW` is read once, when a command's environment is made, so it is one value
//! throughout the command; `let` variables are evaluated once, before any document, seeing
//! `$$NOW` but not each other; the collation is the one every string comparison of the command
//! uses.

use std::sync::Arc;

use bson::{Bson, Document};

use super::{Expr, check_var_name};
use crate::collation::Collation;
use crate::foreign::ForeignSource;
use crate::value::{self, type_name};
use crate::{MongoError, Result};

/// Values bound outside the expression: `$$NOW` and user variables (the command's `let`).
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub now: Option<bson::DateTime>,
    pub vars: Vec<(String, Bson)>,
    /// The other collections' documents `$lookup`, `$unionWith` and `$graphLookup` read.
    pub foreign: Option<Arc<dyn ForeignSource>>,
    /// The command's collation (`None`: simple), which every comparison of strings uses.
    pub collation: Option<Collation>,
    /// The command's `allowDiskUse`: blocking stages may pass their memory limit
    /// ([`crate::agg::MAX_BLOCKING_BYTES`]).
    pub allow_disk_use: bool,
}

impl Env {
    /// The environment of a command with `let`: each variable's expression evaluated once (it
    /// sees `$$NOW`, not documents or the other variables), as MongoDB does before the command
    /// runs. Names follow `$let`'s rules (16866–16868), and a missing value is `$$REMOVE`-like: the variable is not defined.
    pub fn with_let(now: Option<bson::DateTime>, spec: Option<&Document>) -> Result<Env> {
        let mut env = Env {
            now,
            ..Env::default()
        };
        let Some(spec) = spec else {
            return Ok(env);
        };
        let empty = Document::new();
        for (name, value) in spec {
            check_var_name(name)?;
            let parsed = Expr::parse(value)?;
            if let Some(v) = parsed.evaluate_in(&empty, &env)? {
                env.vars.push((name.clone(), v));
            }
        }
        Ok(env)
    }

    /// The environment of a command's `let` field (a document of variables; absent: none)
    /// and `collation` (absent: simple, which a collection's default may then replace), with
    /// `$$NOW` the time it is made.
    pub fn from_command(cmd: &Document) -> Result<Env> {
        let collation = cmd
            .get("collation")
            .map(Collation::parse)
            .transpose()?
            .flatten();
        let now = Some(bson::DateTime::now());
        let env = match cmd.get("let") {
            None => Env::with_let(now, None),
            Some(Bson::Document(spec)) => Env::with_let(now, Some(spec)),
            Some(other) => Err(MongoError::type_mismatch(format!(
                "BSON field 'let' is the wrong type '{}', expected type 'object'",
                type_name(other)
            ))),
        };
        let allow_disk_use = matches!(cmd.get("allowDiskUse"), Some(Bson::Boolean(true)));
        env.map(|env| Env {
            collation,
            allow_disk_use,
            ..env
        })
    }

    /// The environment under `doc`'s `collation` (a command's, or one write statement's), or
    /// the collection's `default` when `doc` has none; an explicit `{locale: "simple"}` is
    /// the simple collation whatever the default.
    pub fn with_collation_of(&self, doc: &Document, default: Option<&Collation>) -> Result<Env> {
        let collation = match doc.get("collation") {
            Some(v) => Collation::parse(v)?,
            None => default.cloned(),
        };
        Ok(Env {
            collation,
            ..self.clone()
        })
    }

    /// MongoDB's order under this environment's collation.
    pub fn compare(&self, a: &Bson, b: &Bson) -> std::cmp::Ordering {
        value::compare_in(a, b, self.collation.as_ref())
    }

    /// MongoDB's equality under this environment's collation.
    pub fn equal(&self, a: &Bson, b: &Bson) -> bool {
        self.compare(a, b).is_eq()
    }

    /// The user variables' names, to parse expressions that use them.
    pub fn names(&self) -> Vec<String> {
        self.vars.iter().map(|(n, _)| n.clone()).collect()
    }
}
