//! Sort specifications (`{a: 1, b: -1}`) and the comparator they define.
