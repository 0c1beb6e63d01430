//! Every problem of a config document at once: each refused value is set aside and the read
//! retried, so one bad key does not hide the next ([`every_refusal`]).

use super::*;
use serde::Deserialize;

/// Every problem of a document whose typed read failed with `first`: each refused value is
/// set aside (its key removed, so its default stands in) and the read retried, until the
/// rest reads; then the values the read accepted are validated too, so a bad `policy.kind`
/// does not hide a bad `lc.slo.target_us`. A refusal that names no value (an unknown key, a
/// missing one) stops the retries: the other sections are then read one by one instead.
pub(super) fn every_refusal(doc: toml::Table, first: PathError) -> ConfigError {
    use serde_path_to_error::Segment;
    let mut problems = Problems::default();
    let mut value = toml::Value::Table(doc.clone());
    let mut result: Result<Config, PathError> = Err(first);
    let mut set_aside: Vec<Vec<String>> = Vec::new();
    // Each round sets one key aside: bounded by the document's size.
    for _ in 0..1000 {
        let err = match result {
            Ok(mut config) => {
                if config.lcs.is_empty() {
                    if !config.kubernetes.discover {
                        problems.push(invalid("lc", "", MISSING_LC));
                    }
                    config.lcs.push(kubernetes::holder(false));
                }
                config.normalize();
                if let Err(e) = config.validate() {
                    // What a set-aside key's default or stand-in caused is dropped: that key
                    // is already named.
                    let dotted: Vec<String> = set_aside.iter().map(|k| dotted(k)).collect();
                    for p in e.problems() {
                        if !dotted.iter().any(|k| caused_by(p, k)) {
                            problems.push(p.clone());
                        }
                    }
                }
                break;
            }
            Err(e) => e,
        };
        let path: Vec<Segment> = err.path().iter().cloned().collect();
        // A required key set aside is missed: a stand-in of the type it wants takes its place.
        if let Some(field) = missing_field(err.inner()) {
            let mut full = path.clone();
            full.push(Segment::Map { key: field });
            if set_aside.contains(&keys(&full)) {
                match stand_in(&value, &full) {
                    Some((v, r)) => {
                        value = v;
                        result = r;
                        continue;
                    }
                    None => break,
                }
            }
        }
        let first_section = path.first().and_then(|s| match s {
            Segment::Map { key } => Some(key.clone()),
            _ => None,
        });
        let refused = refused_value("", &value, err);
        let removable = matches!(refused, ConfigError::Invalid { .. });
        let named = refused.to_string();
        problems.push(refused);
        if !removable || !remove_at(&mut value, &path) {
            // The sections the refusal did not stop in, one by one.
            for (name, v) in &doc {
                let stopped_here = first_section.as_deref() == Some(name.as_str())
                    || named.contains(&format!("`{name}`"));
                if !stopped_here {
                    problems.check(read_section(name, v));
                }
            }
            break;
        }
        set_aside.push(keys(&path));
        result = serde_path_to_error::deserialize::<_, Config>(value.clone());
    }
    match problems.into_result() {
        Err(e) => e,
        Ok(()) => unreachable!("a failed read leaves at least one problem"),
    }
}

/// A path's segments, comparable (`Segment` is not).
fn keys(path: &[serde_path_to_error::Segment]) -> Vec<String> {
    path.iter()
        .map(|s| match s {
            serde_path_to_error::Segment::Map { key } => key.clone(),
            serde_path_to_error::Segment::Seq { index } => format!("[{index}]"),
            other => format!("{other:?}"),
        })
        .collect()
}

/// `keys` as the config names a key: `lc.load.peak_qps`, `be[0].cgroup`.
/// Whether problem `p` is about the set-aside key `k`: keyed by it (or below it), or naming it
/// (`policy.kind = "hybrid" needs …`, `… of lc.load.peak_qps`). A one-word key (a section,
/// `be = 5`) is looked for as a key only: found as a word, it took every message saying "must
/// be" with it, and `lc.slo.target_us = -5` went unnamed (fifth hostile pass).
fn caused_by(p: &ConfigError, k: &str) -> bool {
    if let ConfigError::Invalid { key, .. } = p {
        if key == k || key.starts_with(&format!("{k}.")) || key.starts_with(&format!("{k}[")) {
            return true;
        }
    }
    let text = p.to_string();
    if k.contains(['.', '[']) {
        return text.contains(k);
    }
    [
        format!("{k} ="),
        format!("{k}."),
        format!("{k}["),
        format!("[{k}"),
    ]
    .iter()
    .any(|named| text.contains(named.as_str()))
}

fn dotted(keys: &[String]) -> String {
    let mut out = String::new();
    for k in keys {
        if !out.is_empty() && !k.starts_with('[') {
            out.push('.');
        }
        out.push_str(k);
    }
    out
}

type PathError = serde_path_to_error::Error<toml::de::Error>;

/// `missing field `name``: the name.
fn missing_field(e: &toml::de::Error) -> Option<String> {
    let rest = e.message().strip_prefix("missing field `")?;
    Some(rest.split('`').next()?.to_string())
}

/// The document with a value at `path` that the typed read takes there (tried in turn: a
/// number, a string, a flag, a list, a table), and the read's result with it.
fn stand_in(
    value: &toml::Value,
    path: &[serde_path_to_error::Segment],
) -> Option<(toml::Value, Result<Config, PathError>)> {
    let (last, parents) = path.split_last()?;
    let serde_path_to_error::Segment::Map { key } = last else {
        return None;
    };
    let candidates = [
        toml::Value::Integer(1),
        toml::Value::Float(1.0),
        toml::Value::String("headroom-stand-in".into()),
        toml::Value::Boolean(false),
        toml::Value::Array(Vec::new()),
        toml::Value::Table(toml::Table::new()),
    ];
    for c in candidates {
        let mut v = value.clone();
        let mut at = &mut v;
        for segment in parents {
            at = match segment {
                serde_path_to_error::Segment::Map { key } => at.get_mut(key.as_str())?,
                serde_path_to_error::Segment::Seq { index } => at.get_mut(*index)?,
                _ => return None,
            };
        }
        at.as_table_mut()?.insert(key.clone(), c);
        let r = serde_path_to_error::deserialize::<_, Config>(v.clone());
        let refused_here = match &r {
            Ok(_) => false,
            Err(e) => {
                let p: Vec<_> = e.path().iter().cloned().collect();
                keys(&p) == keys(path)
                    || (keys(&p) == keys(parents) && missing_field(e.inner()).as_ref() == Some(key))
            }
        };
        if !refused_here {
            return Some((v, r));
        }
    }
    None
}

/// Removes the key `path` leads to (a table's entry); false when it leads elsewhere.
fn remove_at(root: &mut toml::Value, path: &[serde_path_to_error::Segment]) -> bool {
    use serde_path_to_error::Segment;
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut at = root;
    for segment in parents {
        let next = match segment {
            Segment::Map { key } => at.get_mut(key.as_str()),
            Segment::Seq { index } => at.get_mut(*index),
            _ => None,
        };
        match next {
            Some(v) => at = v,
            None => return false,
        }
    }
    match (last, at.as_table_mut()) {
        (Segment::Map { key }, Some(t)) => t.remove(key).is_some(),
        _ => false,
    }
}

/// `lc` read on its own (a table or an array of tables).
#[derive(Deserialize)]
#[serde(transparent)]
#[allow(dead_code)] // read only for its refusals
struct Lcs(#[serde(with = "lc::lc_list")] Vec<LcConfig>);

/// Reads one top-level section on its own, for the refusals a whole-document read stopped
/// before. Keys are prefixed with the section's name; the messages carry no line.
fn read_section(name: &str, value: &toml::Value) -> Result<(), ConfigError> {
    fn read<T: serde::de::DeserializeOwned>(
        name: &str,
        value: &toml::Value,
    ) -> Result<(), ConfigError> {
        serde_path_to_error::deserialize::<_, T>(value.clone())
            .map(drop)
            .map_err(|e| refused_value(name, value, e))
    }
    match name {
        "lc" => read::<Lcs>(name, value),
        "be" => read::<Vec<BeConfig>>(name, value),
        "policy" => read::<PolicyConfig>(name, value),
        "safety" => read::<SafetyConfig>(name, value),
        "api" => read::<ApiConfig>(name, value),
        "sensors" => read::<SensorsConfig>(name, value),
        "egress" => read::<EgressConfig>(name, value),
        "actuators" => read::<ActuatorsConfig>(name, value),
        "kubernetes" => read::<KubernetesConfig>(name, value),
        _ => Err(ConfigError::Parse(format!(
            "unknown field `{name}`, expected one of `lc`, `be`, `policy`, `safety`, `api`, `sensors`, `egress`, `actuators`, `kubernetes`"
        ))),
    }
}

/// A typed read that failed: when the path leads to a value in the document, the error is
/// `key = value: reason` like every other refusal; otherwise toml's own message (with its line).
/// `prefix` is the key of `root` in the document ("" for the document itself).
fn refused_value(
    prefix: &str,
    root: &toml::Value,
    e: serde_path_to_error::Error<toml::de::Error>,
) -> ConfigError {
    use serde_path_to_error::Segment;
    let path = e.path().to_string();
    let key = match (prefix, path.as_str()) {
        (p, ".") => p.to_string(),
        ("", path) => path.to_string(),
        (p, path) if path.starts_with('[') => format!("{p}{path}"),
        (p, path) => format!("{p}.{path}"),
    };
    let mut at = Some(root);
    for segment in e.path().iter() {
        at = match (segment, at) {
            (Segment::Map { key }, Some(v)) => v.get(key.as_str()),
            (Segment::Seq { index }, Some(v)) => v.get(*index),
            _ => None,
        };
        if at.is_none() {
            break;
        }
    }
    let inner = e.into_inner();
    match at {
        Some(v) if !v.is_table() => ConfigError::Invalid {
            key,
            value: v.to_string(),
            reason: inner.message().to_string(),
        },
        _ if prefix.is_empty() => ConfigError::Parse(inner.to_string()),
        _ => ConfigError::Parse(format!("{key}: {inner}")),
    }
}
