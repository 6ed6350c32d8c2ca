//! Aggregation expressions (`$add`, `$concat`, `$cond`, field paths, `$$ROOT`, ...).
