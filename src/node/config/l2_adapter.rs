//! LMCache's `--l2-adapter` JSON (the MP server's form) read into what it configures on a
//! node: the `fs` adapter's directory and eviction; every other adapter type refused.

use crate::config::defaults::node as d;
use std::path::PathBuf;

/// What one `--l2-adapter` JSON (LMCache's MP-server form) configures on a node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct L2Adapter {
    /// `base_path`: the L2 directory.
    pub(crate) path: PathBuf,
    /// `eviction`: `(lru, trigger_watermark, eviction_ratio)`; `None`: the `--l2-eviction-*`
    /// flags apply.
    pub(crate) eviction: Option<(bool, f64, f64)>,
}

/// The adapter types LMCache 0.5.6 registers that a node does not have (for the error).
const OTHER_ADAPTERS: &str = "aerospike, bigtable, dax, fault_inject, mock, nixl_store, s3, …";

/// Parses LMCache's `--l2-adapter` JSON: `{"type": "fs", "base_path": DIR, …}` with the `fs`
/// adapter's fields (`relative_tmp_dir`, `read_ahead_size`, `use_odirect`: accepted and
/// checked, not used — a node writes through `tmp/` and the page cache) and the common ones
/// (`eviction: {eviction_policy: LRU|noop, trigger_watermark, eviction_ratio}`,
/// `affinity_tag`, `persist_enabled` (must stay true: L2 is what survives a restart),
/// `shared` (must stay false)). Any other `type` is refused, naming what a node has.
///
/// # Errors
/// A message naming the field at fault.
pub(crate) fn parse_l2_adapter(raw: &str) -> Result<L2Adapter, String> {
    let v: serde_json::Value =
        serde_json::from_str(raw).map_err(|e| format!("invalid JSON: {e}"))?;
    let d = v
        .as_object()
        .ok_or_else(|| "expected a JSON object".to_owned())?;
    let kind = d
        .get("type")
        .ok_or_else(|| "missing 'type' field".to_owned())?
        .as_str()
        .ok_or_else(|| "'type' must be a string".to_owned())?;
    if kind != "fs" {
        return Err(format!(
            "adapter type {kind:?} is not available in kvplane node: it has \"fs\" (a local \
             directory); LMCache's other types ({OTHER_ADAPTERS}) are not built"
        ));
    }
    let known = [
        "type",
        "base_path",
        "relative_tmp_dir",
        "read_ahead_size",
        "use_odirect",
        "eviction",
        "affinity_tag",
        "persist_enabled",
        "shared",
        "serde",
    ];
    if let Some(k) = d.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(format!("unknown field {k:?} for the fs adapter"));
    }
    let path = d
        .get("base_path")
        .and_then(serde_json::Value::as_str)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| "base_path must be a non-empty string".to_owned())?;
    if d.get("relative_tmp_dir").is_some_and(|v| !v.is_string()) {
        return Err("relative_tmp_dir must be a string".into());
    }
    if d.get("read_ahead_size")
        .is_some_and(|v| v.as_u64().is_none_or(|n| n == 0))
    {
        return Err("read_ahead_size must be a positive integer".into());
    }
    for flag in ["use_odirect", "persist_enabled", "shared"] {
        if d.get(flag).is_some_and(|v| !v.is_boolean()) {
            return Err(format!("{flag} must be a boolean"));
        }
    }
    if d.get("persist_enabled") == Some(&serde_json::Value::Bool(false)) {
        return Err("persist_enabled: false is not supported (a node's L2 always persists)".into());
    }
    if d.get("shared") == Some(&serde_json::Value::Bool(true)) {
        return Err("shared: true is not supported (a node's L2 directory is its own)".into());
    }
    if d.get("affinity_tag")
        .is_some_and(|v| v.as_str().is_none_or(|s| s.trim().is_empty()))
    {
        return Err("affinity_tag must be a non-empty string".into());
    }
    let eviction = match d.get("eviction") {
        None => None,
        Some(e) => {
            let e = e
                .as_object()
                .ok_or_else(|| "eviction must be an object".to_owned())?;
            let lru = match e.get("eviction_policy").and_then(serde_json::Value::as_str) {
                Some("LRU") => true,
                Some("noop") => false,
                other => {
                    return Err(format!(
                        "eviction.eviction_policy must be 'LRU' or 'noop' on a node, got {other:?}"
                    ))
                }
            };
            let frac = |name: &str, default: f64| -> Result<f64, String> {
                match e.get(name) {
                    None => Ok(default),
                    Some(v) => v
                        .as_f64()
                        .filter(|f| *f > 0.0 && *f <= 1.0)
                        .ok_or_else(|| format!("eviction.{name} must be in (0, 1]")),
                }
            };
            Some((
                lru,
                frac("trigger_watermark", d::EVICTION_TRIGGER_WATERMARK)?,
                frac("eviction_ratio", d::EVICTION_RATIO)?,
            ))
        }
    };
    Ok(L2Adapter {
        path: PathBuf::from(path),
        eviction,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fs_adapter_json_configures_l2() {
        let a = parse_l2_adapter(r#"{"type":"fs","base_path":"/data/l2"}"#).expect("fs");
        assert_eq!(a.path, PathBuf::from("/data/l2"));
        assert_eq!(a.eviction, None);
        let a = parse_l2_adapter(
            r#"{"type":"fs","base_path":"/d","relative_tmp_dir":"t","read_ahead_size":4096,
                "use_odirect":false,"affinity_tag":"x","persist_enabled":true,
                "eviction":{"eviction_policy":"noop","trigger_watermark":0.9}}"#,
        )
        .expect("every fs field");
        assert_eq!(a.eviction, Some((false, 0.9, d::EVICTION_RATIO)));
        for (bad, says) in [
            (r#"{"type":"s3","bucket":"b"}"#, "not available"),
            (r#"{"type":"disk","path":"/d"}"#, "\"fs\""),
            (r#"{"base_path":"/d"}"#, "missing 'type'"),
            (r#"{"type":"fs"}"#, "base_path"),
            (r#"{"type":"fs","base_path":"/d","bogus":1}"#, "bogus"),
            (
                r#"{"type":"fs","base_path":"/d","read_ahead_size":0}"#,
                "read_ahead_size",
            ),
            (r#"{"type":"fs","base_path":"/d","shared":true}"#, "shared"),
            (
                r#"{"type":"fs","base_path":"/d","persist_enabled":false}"#,
                "persist",
            ),
            (
                r#"{"type":"fs","base_path":"/d","eviction":{"eviction_policy":"ARC"}}"#,
                "eviction_policy",
            ),
            (
                r#"{"type":"fs","base_path":"/d","eviction":{"eviction_policy":"LRU","eviction_ratio":2}}"#,
                "eviction_ratio",
            ),
            ("[1]", "object"),
            ("{", "invalid JSON"),
        ] {
            let e = parse_l2_adapter(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
