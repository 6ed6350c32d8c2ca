//! Shared helpers for the integration tests: starting clusters and connecting drivers.
