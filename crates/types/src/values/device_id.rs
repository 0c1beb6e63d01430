//! Block device numbers (`MAJOR:MINOR`), as the io controller's files name devices.

use std::fmt;
use std::str::FromStr;

use super::ValueError;

/// A block device number. Written and read as `"MAJOR:MINOR"` (`"8:0"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceId {
    pub major: u32,
    pub minor: u32,
}

impl DeviceId {
    pub fn new(major: u32, minor: u32) -> Self {
        DeviceId { major, minor }
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

impl FromStr for DeviceId {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        let bad = || ValueError::new("device number", s, "expected MAJOR:MINOR, e.g. \"8:0\"");
        let (major, minor) = s.trim().split_once(':').ok_or_else(bad)?;
        Ok(DeviceId {
            major: major.parse().map_err(|_| bad())?,
            minor: minor.parse().map_err(|_| bad())?,
        })
    }
}

impl serde::Serialize for DeviceId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `"8:0"`, or the `{major, minor}` map that state files written before this type held.
impl<'de> serde::Deserialize<'de> for DeviceId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = DeviceId;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a block device number \"MAJOR:MINOR\", e.g. \"8:0\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<DeviceId, E> {
                v.parse().map_err(|e: ValueError| E::custom(e.reason))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<DeviceId, A::Error> {
                let (mut major, mut minor) = (None, None);
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "major" => major = Some(map.next_value()?),
                        "minor" => minor = Some(map.next_value()?),
                        other => {
                            return Err(serde::de::Error::unknown_field(other, &["major", "minor"]))
                        }
                    }
                }
                Ok(DeviceId {
                    major: major.ok_or_else(|| serde::de::Error::missing_field("major"))?,
                    minor: minor.ok_or_else(|| serde::de::Error::missing_field("minor"))?,
                })
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_major_minor() {
        let d: DeviceId = "8:16".parse().unwrap();
        assert_eq!(d, DeviceId::new(8, 16));
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"8:16\"");
        let old: DeviceId = serde_json::from_str(r#"{"major": 8, "minor": 16}"#).unwrap();
        assert_eq!(old, d);
        for bad in ["sda", "8", "8:x", "-1:0"] {
            assert!(bad
                .parse::<DeviceId>()
                .unwrap_err()
                .to_string()
                .contains(bad));
        }
        let err = serde_json::from_str::<DeviceId>("\"sda\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("MAJOR:MINOR"), "{err}");
    }
}
