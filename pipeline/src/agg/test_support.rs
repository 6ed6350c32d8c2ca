//! Helpers the stage tests share: run one stage, or the error code it parses or runs to.

use bson::Document;

use crate::agg::Pipeline;

pub fn run(stage: Document, input: Vec<Document>) -> Vec<Document> {
    Pipeline::parse(std::slice::from_ref(&stage))
        .unwrap_or_else(|e| panic!("{stage}: {e}"))
        .run(input)
        .unwrap_or_else(|e| panic!("{stage}: {e}"))
}

pub fn parse_code(stage: Document) -> i32 {
    match Pipeline::parse(std::slice::from_ref(&stage)) {
        Ok(_) => panic!("{stage} parsed"),
        Err(e) => e.code,
    }
}

pub fn run_code(stage: Document, input: Vec<Document>) -> i32 {
    match Pipeline::parse(std::slice::from_ref(&stage)).map(|p| p.run(input)) {
        Ok(Err(e)) => e.code,
        other => panic!("{stage}: expected a runtime error, got {other:?}"),
    }
}
