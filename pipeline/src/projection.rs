//! `find` projections.
