//! A user named in the config (`[lc] user`): a uid, or a login name to be looked up on the
//! host. The name is checked here for its form only (the control crate reads no files); the
//! agent resolves it once at start and refuses a name the host does not know.

use std::fmt;

use super::ValueError;

/// The longest login name accepted (Linux's `LOGIN_NAME_MAX` is 256; useradd stops at 32).
pub const MAX_USER_NAME: usize = 32;

/// A user by uid or by login name.
///
/// Refused at construction: the empty name, a name longer than [`MAX_USER_NAME`] bytes, one
/// starting with `-`, or holding anything but ASCII letters, digits, `_`, `.`, `-` (and one
/// trailing `$`, Samba's machine accounts); uid 4294967295, which is `(uid_t) -1` ("no
/// change" to setresuid, no one's uid). A name of digits only is read as that uid.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UserSpec {
    Uid(u32),
    Name(String),
}

impl UserSpec {
    /// Validates a uid.
    pub fn uid(uid: u32) -> Result<UserSpec, ValueError> {
        if uid == u32::MAX {
            return Err(ValueError::new(
                "user",
                uid.to_string(),
                "uid 4294967295 is (uid_t) -1, no one's uid",
            ));
        }
        Ok(UserSpec::Uid(uid))
    }

    /// Validates a login name (digits only: that uid).
    pub fn name(name: &str) -> Result<UserSpec, ValueError> {
        let bad = |reason: &str| ValueError::new("user", name, reason);
        if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) {
            let uid = name
                .parse::<u32>()
                .map_err(|_| bad("a uid is at most 4294967294"))?;
            return UserSpec::uid(uid);
        }
        if name.is_empty() {
            return Err(bad("must not be empty; give a login name or a uid"));
        }
        if name.len() > MAX_USER_NAME {
            return Err(bad("longer than 32 bytes: not a login name"));
        }
        if name.starts_with('-') {
            return Err(bad("a login name does not start with `-`"));
        }
        let body = name.strip_suffix('$').unwrap_or(name);
        if !body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        {
            return Err(bad(
                "a login name holds only ASCII letters, digits, `_`, `.` and `-`",
            ));
        }
        Ok(UserSpec::Name(name.to_owned()))
    }
}

impl fmt::Display for UserSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UserSpec::Uid(u) => write!(f, "uid {u}"),
            UserSpec::Name(n) => f.write_str(n),
        }
    }
}

impl serde::Serialize for UserSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            UserSpec::Uid(u) => s.serialize_u32(*u),
            UserSpec::Name(n) => s.serialize_str(n),
        }
    }
}

/// Read back validated, from a TOML integer (a uid) or string (a name, or a uid in digits).
/// The error is the reason alone: the config loader names the key and the value.
impl<'de> serde::Deserialize<'de> for UserSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = UserSpec;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a login name (\"memcache\") or a uid (999)")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<UserSpec, E> {
                UserSpec::name(v).map_err(|e| E::custom(e.reason))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<UserSpec, E> {
                let uid = u32::try_from(v).map_err(|_| E::custom("a uid is in 0..=4294967294"))?;
                UserSpec::uid(uid).map_err(|e| E::custom(e.reason))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<UserSpec, E> {
                let uid = u32::try_from(v).map_err(|_| E::custom("a uid is in 0..=4294967294"))?;
                UserSpec::uid(uid).map_err(|e| E::custom(e.reason))
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_uids_are_read_and_bad_ones_refused() {
        assert_eq!(
            UserSpec::name("memcache"),
            Ok(UserSpec::Name("memcache".into()))
        );
        assert_eq!(UserSpec::name("host$"), Ok(UserSpec::Name("host$".into())));
        assert_eq!(UserSpec::name("65534"), Ok(UserSpec::Uid(65534)));
        for bad in [
            "",
            "-x",
            "a b",
            "a/b",
            "é",
            "a$b",
            "4294967295",
            "99999999999",
        ] {
            assert!(UserSpec::name(bad).is_err(), "{bad:?} accepted");
        }
        assert!(UserSpec::name(&"a".repeat(33)).is_err());
        assert!(UserSpec::uid(u32::MAX).is_err());
        assert_eq!(UserSpec::uid(0), Ok(UserSpec::Uid(0)));
    }
}
