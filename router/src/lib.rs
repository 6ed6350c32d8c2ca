//! The Tributary router.
