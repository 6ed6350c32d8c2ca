//! Typed access to command fields, with MongoDB's errors for wrong types
//! (`TypeMismatch` 14, naming the field and the command as mongod does).

use bson::{Bson, Document};
use wire::{ErrorCode, MongoError, Result};

pub(crate) struct Args<'a> {
    cmd: &'a Document,
    command: &'a str,
}

impl<'a> Args<'a> {
    pub fn new(cmd: &'a Document, command: &'a str) -> Self {
        Args { cmd, command }
    }

    fn mismatch(&self, field: &str, wanted: &str, got: &Bson) -> MongoError {
        MongoError::new(
            ErrorCode::TYPE_MISMATCH,
            format!(
                "BSON field '{}.{field}' is the wrong type '{}', expected type '{wanted}'",
                self.command,
                type_name(got)
            ),
        )
    }

    /// The command's target: the string value of the first field (a collection name).
    pub fn collection(&self) -> Result<&'a str> {
        match self.cmd.get(self.command) {
            Some(Bson::String(s)) if !s.is_empty() => Ok(s),
            Some(Bson::String(_)) => Err(MongoError::new(
                ErrorCode::INVALID_NAMESPACE,
                format!("Invalid namespace specified for command '{}'", self.command),
            )),
            Some(other) => Err(MongoError::new(
                ErrorCode::INVALID_NAMESPACE,
                format!("collection name has invalid type {}", type_name(other)),
            )),
            None => Err(MongoError::failed_to_parse(format!(
                "command {} is missing its target",
                self.command
            ))),
        }
    }

    pub fn opt_doc(&self, field: &str) -> Result<Option<&'a Document>> {
        match self.cmd.get(field) {
            None | Some(Bson::Null) => Ok(None),
            Some(Bson::Document(d)) => Ok(Some(d)),
            Some(other) => Err(self.mismatch(field, "object", other)),
        }
    }

    pub fn doc(&self, field: &str) -> Result<&'a Document> {
        self.opt_doc(field)?.ok_or_else(|| self.missing(field))
    }

    pub fn opt_array(&self, field: &str) -> Result<Option<&'a Vec<Bson>>> {
        match self.cmd.get(field) {
            None => Ok(None),
            Some(Bson::Array(a)) => Ok(Some(a)),
            Some(other) => Err(self.mismatch(field, "array", other)),
        }
    }

    pub fn array(&self, field: &str) -> Result<&'a Vec<Bson>> {
        self.opt_array(field)?.ok_or_else(|| self.missing(field))
    }

    /// An array whose elements must all be documents.
    pub fn documents(&self, field: &str) -> Result<Vec<&'a Document>> {
        self.array(field)?
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Bson::Document(d) => Ok(d),
                other => Err(self.mismatch(&format!("{field}.{i}"), "object", other)),
            })
            .collect()
    }

    pub fn opt_bool(&self, field: &str) -> Result<Option<bool>> {
        match self.cmd.get(field) {
            None | Some(Bson::Null) => Ok(None),
            Some(Bson::Boolean(b)) => Ok(Some(*b)),
            Some(Bson::Int32(i)) => Ok(Some(*i != 0)),
            Some(Bson::Int64(i)) => Ok(Some(*i != 0)),
            Some(Bson::Double(d)) => Ok(Some(*d != 0.0)),
            Some(other) => Err(self.mismatch(field, "bool", other)),
        }
    }

    pub fn opt_i64(&self, field: &str) -> Result<Option<i64>> {
        match self.cmd.get(field) {
            None | Some(Bson::Null) => Ok(None),
            Some(Bson::Int32(i)) => Ok(Some(i64::from(*i))),
            Some(Bson::Int64(i)) => Ok(Some(*i)),
            Some(Bson::Double(d)) if d.fract() == 0.0 => Ok(Some(*d as i64)),
            Some(other) => Err(self.mismatch(field, "long", other)),
        }
    }

    pub fn opt_str(&self, field: &str) -> Result<Option<&'a str>> {
        match self.cmd.get(field) {
            None => Ok(None),
            Some(Bson::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.mismatch(field, "string", other)),
        }
    }

    fn missing(&self, field: &str) -> MongoError {
        MongoError::with_code(
            40414,
            format!(
                "BSON field '{}.{field}' is missing but a required field",
                self.command
            ),
        )
    }
}

pub(crate) use pipeline::value::type_name;
