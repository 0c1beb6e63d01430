//! A group named in the config (`[[be]] group`): a gid, or a group name to be looked up on the
//! host (`/etc/group`). Checked here for its form only, as a login name is ([`UserSpec`]); the
//! agent resolves it once at start and refuses a name the host does not know.

use std::fmt;

use super::{UserSpec, ValueError};

/// A group by gid or by name. The same forms as [`UserSpec`]: a name of digits only is that
/// gid; gid 4294967295 (`(gid_t) -1`, "no change") is refused.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupSpec {
    Gid(u32),
    Name(String),
}

impl GroupSpec {
    /// Validates a gid.
    pub fn gid(gid: u32) -> Result<GroupSpec, ValueError> {
        if gid == u32::MAX {
            return Err(ValueError::new(
                "group",
                gid.to_string(),
                "gid 4294967295 is (gid_t) -1, no one's gid",
            ));
        }
        Ok(GroupSpec::Gid(gid))
    }

    /// Validates a group name (digits only: that gid), by the login name's rule.
    pub fn name(name: &str) -> Result<GroupSpec, ValueError> {
        match UserSpec::name(name) {
            Ok(UserSpec::Uid(g)) => GroupSpec::gid(g),
            Ok(UserSpec::Name(n)) => Ok(GroupSpec::Name(n)),
            Err(e) => Err(ValueError::new(
                "group",
                name,
                e.reason
                    .replace("login name", "group name")
                    .replace("uid", "gid"),
            )),
        }
    }
}

impl fmt::Display for GroupSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupSpec::Gid(g) => write!(f, "gid {g}"),
            GroupSpec::Name(n) => f.write_str(n),
        }
    }
}

impl serde::Serialize for GroupSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            GroupSpec::Gid(g) => s.serialize_u32(*g),
            GroupSpec::Name(n) => s.serialize_str(n),
        }
    }
}

/// Read back validated, from a TOML integer (a gid) or string (a name, or a gid in digits).
impl<'de> serde::Deserialize<'de> for GroupSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = GroupSpec;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a group name (\"video\") or a gid (44)")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<GroupSpec, E> {
                GroupSpec::name(v).map_err(|e| E::custom(e.reason))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<GroupSpec, E> {
                let g = u32::try_from(v).map_err(|_| E::custom("a gid is in 0..=4294967294"))?;
                GroupSpec::gid(g).map_err(|e| E::custom(e.reason))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<GroupSpec, E> {
                let g = u32::try_from(v).map_err(|_| E::custom("a gid is in 0..=4294967294"))?;
                GroupSpec::gid(g).map_err(|e| E::custom(e.reason))
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names_and_gids_are_read_and_bad_ones_refused() {
        assert_eq!(
            GroupSpec::name("video"),
            Ok(GroupSpec::Name("video".into()))
        );
        assert_eq!(GroupSpec::name("44"), Ok(GroupSpec::Gid(44)));
        for bad in ["", "-x", "a b", "a/b", "4294967295"] {
            assert!(GroupSpec::name(bad).is_err(), "{bad:?} accepted");
        }
        assert!(GroupSpec::gid(u32::MAX).is_err());
        assert_eq!(GroupSpec::gid(0).unwrap().to_string(), "gid 0");
    }
}
