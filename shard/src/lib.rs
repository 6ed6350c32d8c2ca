//! A Tributary shard: a mongod-like store of documents, catalog and oplog in redb, with a
//! hybrid logical clock and a single group-committing writer.
