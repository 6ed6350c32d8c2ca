//! Aggregation stages over documents.
