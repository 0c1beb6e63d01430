//! Owned by policy.
