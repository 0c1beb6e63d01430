//! Owned by loadcore; see /work/TEAM.md contracts.
