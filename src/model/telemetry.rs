//! Node GPU telemetry: what the `gpuscale agent` measures on a node (utilisation, memory, ECC,
//! health, MIG layout) and the compact node annotation that carries it to the controller.
//!
//! The agent keeps the idle history (since when each GPU has been below the idle threshold) and
//! publishes it in the annotation, so the controller reads one object per node and needs no
//! history of its own. Everything here is pure: time is passed in as Unix seconds.

use super::catalog::GpuCatalog;
use super::device::GpuMode;
use super::node::Node;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use thiserror::Error;

/// Node annotation the agent writes and the controller reads.
pub const TELEMETRY_ANNOTATION: &str = "gpuscale.io/gpu-telemetry";

/// Version of the annotation encoding this build writes and reads.
pub const TELEMETRY_VERSION: u64 = 1;

/// One MIG instance as measured on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MigSample {
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
    /// First memory slice, when the source reports it (NVML's safe API does not).
    pub start: Option<u8>,
    /// Utilisation in percent, when known (NVML reports none for MIG devices).
    pub utilization_pct: Option<u8>,
}

/// One physical GPU as measured.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuSample {
    /// NVML index.
    pub index: u8,
    /// GPU UUID (`GPU-…`).
    pub uuid: String,
    /// Model: the catalog's canonical name when known, else the driver's name.
    pub model: String,
    /// Compute utilisation in percent over the driver's last sample period; `None` when the
    /// driver does not report it (e.g. MIG mode).
    pub utilization_pct: Option<u8>,
    /// Device memory in use, bytes.
    pub memory_used_bytes: u64,
    /// Device memory, bytes.
    pub memory_total_bytes: u64,
    /// Volatile (since driver load) uncorrected ECC errors.
    pub ecc_errors: u64,
    /// False when the GPU reports a fault (uncorrected ECC errors, pending page retirement,
    /// unreadable state).
    pub healthy: bool,
    /// MIG instances; empty when MIG is off.
    pub mig: Vec<MigSample>,
    /// Unix seconds since which the GPU has been continuously idle, if it is idle now.
    pub idle_since: Option<u64>,
}

impl GpuSample {
    /// Seconds the GPU has been idle as of the sample.
    pub fn idle_for(&self, sampled_at: u64) -> Option<u64> {
        self.idle_since.map(|s| sampled_at.saturating_sub(s))
    }
}

/// Telemetry of one node at one instant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct NodeTelemetry {
    /// When the sample was taken, Unix seconds.
    pub sampled_at: u64,
    /// Physical GPUs, by index.
    pub gpus: Vec<GpuSample>,
}

/// Why a telemetry annotation could not be read. Names the node, the annotation and the field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("node {node}: annotation {annotation}: {field}: {reason}")]
pub struct TelemetryDecodeError {
    /// Node name.
    pub node: String,
    /// Annotation key.
    pub annotation: &'static str,
    /// Path of the bad field, e.g. `g[1].ut`.
    pub field: String,
    /// What is wrong, with the bad value.
    pub reason: String,
}

impl NodeTelemetry {
    /// The annotation value: compact JSON with short keys, versioned. About 150 bytes per GPU,
    /// so an 8-GPU node stays well under 2 KB.
    ///
    /// Keys: `v` version, `t` sampled_at, `g` GPUs with `i` index, `u` UUID, `m` model, `ut`
    /// utilisation %, `mu`/`mt` memory used/total bytes, `e` ECC errors, `h` healthy (0/1), `is`
    /// idle since, `mig` as `[profile, start|null, utilisation|null]` triples. Absent optional
    /// keys mean none/zero.
    pub fn encode(&self) -> String {
        let gpus: Vec<Value> = self
            .gpus
            .iter()
            .map(|g| {
                let mut o = Map::new();
                o.insert("i".into(), json!(g.index));
                o.insert("u".into(), json!(g.uuid));
                o.insert("m".into(), json!(g.model));
                if let Some(u) = g.utilization_pct {
                    o.insert("ut".into(), json!(u));
                }
                o.insert("mu".into(), json!(g.memory_used_bytes));
                o.insert("mt".into(), json!(g.memory_total_bytes));
                if g.ecc_errors > 0 {
                    o.insert("e".into(), json!(g.ecc_errors));
                }
                o.insert("h".into(), json!(u8::from(g.healthy)));
                if let Some(s) = g.idle_since {
                    o.insert("is".into(), json!(s));
                }
                if !g.mig.is_empty() {
                    let mig: Vec<Value> =
                        g.mig.iter().map(|m| json!([m.profile, m.start, m.utilization_pct])).collect();
                    o.insert("mig".into(), Value::Array(mig));
                }
                Value::Object(o)
            })
            .collect();
        json!({ "v": TELEMETRY_VERSION, "t": self.sampled_at, "g": gpus }).to_string()
    }

    /// Parses an annotation value written by [`NodeTelemetry::encode`]; `node` names the node in
    /// errors. Unknown keys are ignored (later versions may add some); a different version is an
    /// error.
    pub fn decode(node: &str, text: &str) -> Result<Self, TelemetryDecodeError> {
        let err = |field: &str, reason: String| TelemetryDecodeError {
            node: node.to_string(),
            annotation: TELEMETRY_ANNOTATION,
            field: field.to_string(),
            reason,
        };
        let root: Value =
            serde_json::from_str(text).map_err(|e| err("(value)", format!("invalid JSON: {e}")))?;
        let Value::Object(root) = root else {
            return Err(err("(value)", format!("expected a JSON object, got {}", short(&root))));
        };
        let r = Fields { obj: &root, path: String::new(), err: &err };
        let version = r.u64("v")?;
        if version != TELEMETRY_VERSION {
            return Err(err(
                "v",
                format!("unsupported version {version} (this gpuscale reads version {TELEMETRY_VERSION})"),
            ));
        }
        let sampled_at = r.u64("t")?;
        let list = match root.get("g") {
            Some(Value::Array(a)) => a,
            Some(other) => return Err(err("g", format!("expected an array, got {}", short(other)))),
            None => return Err(err("g", "missing".into())),
        };
        let mut gpus = Vec::with_capacity(list.len());
        for (k, item) in list.iter().enumerate() {
            let path = format!("g[{k}]");
            let Value::Object(obj) = item else {
                return Err(err(&path, format!("expected an object, got {}", short(item))));
            };
            let f = Fields { obj, path: path.clone(), err: &err };
            let index = f.u64("i")?;
            let index =
                u8::try_from(index).map_err(|_| err(&f.at("i"), format!("{index} is not a GPU index")))?;
            let utilization_pct = f.opt_pct("ut")?;
            let healthy = match f.u64("h")? {
                0 => false,
                1 => true,
                other => return Err(err(&f.at("h"), format!("expected 0 or 1, got {other}"))),
            };
            let mut mig = Vec::new();
            match obj.get("mig") {
                None | Some(Value::Null) => {}
                Some(Value::Array(items)) => {
                    for (j, m) in items.iter().enumerate() {
                        let mp = format!("{path}.mig[{j}]");
                        let bad = |what: &str| err(&mp, format!("{what}, got {}", short(m)));
                        let Some(a) = m.as_array().filter(|a| a.len() == 3) else {
                            return Err(bad("expected [profile, start, utilisation]"));
                        };
                        let profile = a[0]
                            .as_str()
                            .filter(|s| !s.is_empty())
                            .ok_or_else(|| bad("expected a MIG profile name as the first element"))?;
                        let start = match &a[1] {
                            Value::Null => None,
                            v => Some(
                                v.as_u64()
                                    .and_then(|s| u8::try_from(s).ok())
                                    .filter(|&s| s < 8)
                                    .ok_or_else(|| bad("expected a start slot 0..7 or null"))?,
                            ),
                        };
                        let utilization_pct = match &a[2] {
                            Value::Null => None,
                            v => Some(
                                v.as_u64()
                                    .filter(|&u| u <= 100)
                                    .ok_or_else(|| bad("expected a utilisation 0..100 or null"))?
                                    as u8,
                            ),
                        };
                        mig.push(MigSample { profile: profile.to_string(), start, utilization_pct });
                    }
                }
                Some(other) => {
                    return Err(err(&f.at("mig"), format!("expected an array, got {}", short(other))))
                }
            }
            gpus.push(GpuSample {
                index,
                uuid: f.str("u")?,
                model: f.str("m")?,
                utilization_pct,
                memory_used_bytes: f.u64("mu")?,
                memory_total_bytes: f.u64("mt")?,
                ecc_errors: f.opt_u64("e")?.unwrap_or(0),
                healthy,
                mig,
                idle_since: f.opt_u64("is")?,
            });
        }
        Ok(Self { sampled_at, gpus })
    }

    /// Whether the sample is recent enough to act on: an agent that stopped publishing must not
    /// keep a GPU looking idle forever.
    pub fn is_fresh(&self, now: u64, max_age_secs: u64) -> bool {
        now.saturating_sub(self.sampled_at) <= max_age_secs
    }

    /// Whether `self` differs from `older` enough to be worth a new annotation write: a different
    /// set of GPUs, models, health, ECC counts, MIG layout or idle state, utilisation moved by
    /// 20 points or more, or memory in use by 10% of the GPU's memory or more. Small jitter is not
    /// worth an API-server write; the agent refreshes on a timer anyway.
    pub fn materially_differs(&self, older: &NodeTelemetry) -> bool {
        if self.gpus.len() != older.gpus.len() {
            return true;
        }
        self.gpus.iter().zip(&older.gpus).any(|(a, b)| {
            let util = |g: &GpuSample| g.utilization_pct.map(i16::from);
            let util_moved = match (util(a), util(b)) {
                (Some(x), Some(y)) => (x - y).abs() >= 20,
                (x, y) => x.is_some() != y.is_some(),
            };
            let mig_shape =
                |g: &GpuSample| g.mig.iter().map(|m| (m.profile.clone(), m.start)).collect::<Vec<_>>();
            a.index != b.index
                || a.uuid != b.uuid
                || a.model != b.model
                || a.healthy != b.healthy
                || a.ecc_errors != b.ecc_errors
                || a.idle_since != b.idle_since
                || a.memory_total_bytes != b.memory_total_bytes
                || mig_shape(a) != mig_shape(b)
                || util_moved
                || a.memory_used_bytes.abs_diff(b.memory_used_bytes) * 10 >= a.memory_total_bytes.max(1)
        })
    }
}

/// Field access with errors that carry the field path.
struct Fields<'a, E: Fn(&str, String) -> TelemetryDecodeError> {
    obj: &'a Map<String, Value>,
    path: String,
    err: &'a E,
}

impl<E: Fn(&str, String) -> TelemetryDecodeError> Fields<'_, E> {
    fn at(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn opt_u64(&self, key: &str) -> Result<Option<u64>, TelemetryDecodeError> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                (self.err)(&self.at(key), format!("expected a non-negative integer, got {}", short(v)))
            }),
        }
    }

    fn u64(&self, key: &str) -> Result<u64, TelemetryDecodeError> {
        self.opt_u64(key)?.ok_or_else(|| (self.err)(&self.at(key), "missing".into()))
    }

    fn opt_pct(&self, key: &str) -> Result<Option<u8>, TelemetryDecodeError> {
        match self.opt_u64(key)? {
            None => Ok(None),
            Some(v) if v <= 100 => Ok(Some(v as u8)),
            Some(v) => Err((self.err)(&self.at(key), format!("utilisation {v} is not a percentage"))),
        }
    }

    fn str(&self, key: &str) -> Result<String, TelemetryDecodeError> {
        match self.obj.get(key) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(v) => Err((self.err)(&self.at(key), format!("expected a string, got {}", short(v)))),
            None => Err((self.err)(&self.at(key), "missing".into())),
        }
    }
}

/// A bad value for an error message, cut short.
fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s
    }
}

/// Tracks, across samples, since when each GPU has been idle: utilisation known and below the
/// threshold (every MIG instance's too, where reported) at every sample since then. A GPU whose
/// utilisation the driver does not report is never called idle. Kept by the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleTracker {
    threshold_pct: u8,
    since: BTreeMap<String, u64>,
}

impl IdleTracker {
    /// A tracker that calls a GPU idle below `threshold_pct` percent utilisation.
    pub fn new(threshold_pct: u8) -> Self {
        Self { threshold_pct, since: BTreeMap::new() }
    }

    /// Folds a new sample in and fills each GPU's `idle_since`. GPUs that left the node are
    /// forgotten.
    pub fn observe(&mut self, sample: &mut NodeTelemetry) {
        let now = sample.sampled_at;
        let mut next = BTreeMap::new();
        for g in &mut sample.gpus {
            let below = |u: Option<u8>| u.is_some_and(|u| u < self.threshold_pct);
            let mig_busy = g.mig.iter().any(|m| m.utilization_pct.is_some_and(|u| u >= self.threshold_pct));
            let idle = g.healthy && below(g.utilization_pct) && !mig_busy;
            g.idle_since = if idle {
                let since = self.since.get(&g.uuid).copied().unwrap_or(now).min(now);
                next.insert(g.uuid.clone(), since);
                Some(since)
            } else {
                None
            };
        }
        self.since = next;
    }
}

/// The `telemetry:` section of the config file: how the controller uses agent telemetry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TelemetrySettings {
    /// A GPU allocated to pods but idle at least this long is reported (`30m`, `2h`, `90s`, or
    /// seconds).
    #[serde(serialize_with = "duration_text::serialize", deserialize_with = "duration_text::idle_window")]
    pub idle_window: u64,
    /// Telemetry older than this is ignored (the agent may be gone).
    #[serde(serialize_with = "duration_text::serialize", deserialize_with = "duration_text::max_age")]
    pub max_age: u64,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self { idle_window: 3600, max_age: 600 }
    }
}

/// Parses `90s`, `30m`, `2h`, `1d`, `1h30m` or plain seconds into seconds.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(secs);
    }
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in t.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(format!("{text:?}: unknown unit {c:?} (use s, m, h or d)")),
        };
        let n: u64 = digits.parse().map_err(|_| format!("{text:?}: expected a number before {c:?}"))?;
        total =
            n.checked_mul(unit).and_then(|v| total.checked_add(v)).ok_or(format!("{text:?}: too long"))?;
        digits.clear();
    }
    if !digits.is_empty() {
        return Err(format!("{text:?}: missing unit after {digits}"));
    }
    Ok(total)
}

/// Writes seconds as the shortest `1h30m`-style text.
pub fn format_duration(secs: u64) -> String {
    if secs == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    let mut rest = secs;
    for (unit, name) in [(86_400, 'd'), (3600, 'h'), (60, 'm'), (1, 's')] {
        if rest >= unit {
            out.push_str(&format!("{}{name}", rest / unit));
            rest %= unit;
        }
    }
    out
}

mod duration_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(secs: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_duration(*secs))
    }

    pub fn idle_window<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        field(d, "telemetry.idleWindow")
    }

    pub fn max_age<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        field(d, "telemetry.maxAge")
    }

    fn field<'de, D: Deserializer<'de>>(d: D, name: &str) -> Result<u64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Text {
            Secs(u64),
            Text(String),
        }
        match Text::deserialize(d)? {
            Text::Secs(s) => Ok(s),
            Text::Text(t) => {
                super::parse_duration(&t).map_err(|e| serde::de::Error::custom(format!("{name}: {e}")))
            }
        }
    }
}

/// Readiness check for the controller: does a node's telemetry show the GPUs its group's template
/// promises (count, model, MIG layout, health)? `Err` says what is missing or different.
pub fn telemetry_confirms(node: &Node, expected: &Node) -> Result<(), String> {
    let Some(t) = &node.telemetry else {
        return Err(format!("node {} has no {TELEMETRY_ANNOTATION} annotation yet", node.name));
    };
    if t.gpus.len() != expected.gpus.len() {
        return Err(format!(
            "node {}: the agent sees {} GPU(s), the template has {}",
            node.name,
            t.gpus.len(),
            expected.gpus.len()
        ));
    }
    let canonical = |m: &str| GpuCatalog.resolve(m).map_or(m.to_string(), |s| s.name.to_string());
    let want_model = expected.gpu_model.as_deref().map(canonical);
    for (g, want) in t.gpus.iter().zip(&expected.gpus) {
        if let Some(want_model) = &want_model {
            if &canonical(&g.model) != want_model {
                return Err(format!(
                    "node {}: GPU {} is a {}, expected {want_model}",
                    node.name, g.index, g.model
                ));
            }
        }
        if !g.healthy {
            return Err(format!(
                "node {}: GPU {} ({}) is unhealthy ({} uncorrected ECC errors)",
                node.name, g.index, g.uuid, g.ecc_errors
            ));
        }
        let mut have: Vec<(&str, Option<u8>)> = g.mig.iter().map(|m| (m.profile.as_str(), m.start)).collect();
        let mut need: Vec<(&str, Option<u8>)> = match &want.mode {
            GpuMode::Mig { instances, dynamic: false } => {
                instances.iter().map(|i| (i.placement.profile.as_str(), Some(i.placement.start))).collect()
            }
            _ => Vec::new(),
        };
        if matches!(want.mode, GpuMode::Mig { dynamic: true, .. }) {
            continue;
        }
        // Starts are compared only where the agent knows them.
        if have.iter().any(|(_, s)| s.is_none()) {
            have.iter_mut().for_each(|h| h.1 = None);
            need.iter_mut().for_each(|n| n.1 = None);
        }
        have.sort();
        need.sort();
        if have != need {
            let show = |v: &[(&str, Option<u8>)]| {
                if v.is_empty() {
                    "MIG off".to_string()
                } else {
                    v.iter().map(|(p, _)| *p).collect::<Vec<_>>().join(",")
                }
            };
            return Err(format!(
                "node {}: GPU {} has MIG layout [{}], expected [{}]",
                node.name,
                g.index,
                show(&have),
                show(&need)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::device::{GpuDevice, MigInstance};
    use crate::model::mig::MigPlacement;

    fn gpu(i: u8, util: Option<u8>) -> GpuSample {
        GpuSample {
            index: i,
            uuid: format!("GPU-6f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a{i:02}"),
            model: "A100-80GB".into(),
            utilization_pct: util,
            memory_used_bytes: 1_234_567_890,
            memory_total_bytes: 85_899_345_920,
            ecc_errors: 0,
            healthy: true,
            mig: vec![],
            idle_since: None,
        }
    }

    fn eight() -> NodeTelemetry {
        let mut t =
            NodeTelemetry { sampled_at: 1_764_700_000, gpus: (0..8).map(|i| gpu(i, Some(97))).collect() };
        t.gpus[3].idle_since = Some(1_764_690_000);
        t.gpus[3].utilization_pct = Some(0);
        t.gpus[5].ecc_errors = 2;
        t.gpus[5].healthy = false;
        t.gpus[7].utilization_pct = None;
        t.gpus[7].mig = vec![
            MigSample { profile: "3g.40gb".into(), start: Some(0), utilization_pct: None },
            MigSample { profile: "1g.10gb".into(), start: None, utilization_pct: Some(40) },
        ];
        t
    }

    #[test]
    fn annotation_round_trips_and_stays_small() {
        let t = eight();
        let text = t.encode();
        assert!(text.len() < 2048, "{} bytes: {text}", text.len());
        assert!(text.contains("\"v\":1"), "{text}");
        assert_eq!(NodeTelemetry::decode("gpu-1", &text).unwrap(), t);
        let empty = NodeTelemetry { sampled_at: 5, gpus: vec![] };
        assert_eq!(NodeTelemetry::decode("n", &empty.encode()).unwrap(), empty);
    }

    #[test]
    fn malformed_annotations_name_node_annotation_and_field() {
        let cases = [
            ("not json", "(value)", "invalid JSON"),
            ("[1,2]", "(value)", "expected a JSON object"),
            (r#"{"v":2,"t":1,"g":[]}"#, "v", "unsupported version 2"),
            (r#"{"v":1,"g":[]}"#, "t", "missing"),
            (r#"{"v":1,"t":1,"g":{}}"#, "g", "expected an array"),
            (
                r#"{"v":1,"t":1,"g":[{"i":0,"u":"x","m":"T4","ut":130,"mu":0,"mt":1,"h":1}]}"#,
                "g[0].ut",
                "130",
            ),
            (r#"{"v":1,"t":1,"g":[{"i":0,"u":"x","m":"T4","mu":-1,"mt":1,"h":1}]}"#, "g[0].mu", "-1"),
            (r#"{"v":1,"t":1,"g":[{"i":0,"u":"x","m":"T4","mu":0,"mt":1,"h":2}]}"#, "g[0].h", "0 or 1"),
            (r#"{"v":1,"t":1,"g":[{"i":0,"m":"T4","mu":0,"mt":1,"h":1}]}"#, "g[0].u", "missing"),
            (
                r#"{"v":1,"t":1,"g":[{"i":0,"u":"x","m":"T4","mu":0,"mt":1,"h":1,"mig":[["1g.10gb",9,null]]}]}"#,
                "g[0].mig[0]",
                "start slot",
            ),
        ];
        for (text, field, reason) in cases {
            let e = NodeTelemetry::decode("gpu-node-7", text).unwrap_err();
            assert_eq!(e.field, field, "{text}: {e}");
            let msg = e.to_string();
            assert!(
                msg.contains("gpu-node-7") && msg.contains(TELEMETRY_ANNOTATION) && msg.contains(reason),
                "{text}: {msg}"
            );
        }
    }

    #[test]
    fn unknown_keys_are_ignored() {
        let text =
            r#"{"v":1,"t":9,"x":"later","g":[{"i":1,"u":"GPU-a","m":"L4","mu":5,"mt":10,"h":1,"new":[]}]}"#;
        let t = NodeTelemetry::decode("n", text).unwrap();
        assert_eq!(t.sampled_at, 9);
        assert_eq!(t.gpus[0].index, 1);
        assert_eq!(t.gpus[0].utilization_pct, None);
    }

    #[test]
    fn idle_tracker_keeps_the_start_of_continuous_idleness() {
        let mut tracker = IdleTracker::new(5);
        let sample = |t: u64, utils: [Option<u8>; 3]| NodeTelemetry {
            sampled_at: t,
            gpus: utils.iter().enumerate().map(|(i, u)| gpu(i as u8, *u)).collect(),
        };
        let mut s = sample(100, [Some(0), Some(50), None]);
        tracker.observe(&mut s);
        assert_eq!(s.gpus.iter().map(|g| g.idle_since).collect::<Vec<_>>(), [Some(100), None, None]);
        let mut s = sample(115, [Some(4), Some(2), None]);
        tracker.observe(&mut s);
        assert_eq!(s.gpus.iter().map(|g| g.idle_since).collect::<Vec<_>>(), [Some(100), Some(115), None]);
        assert_eq!(s.gpus[0].idle_for(s.sampled_at), Some(15));
        // A busy sample resets the GPU; idleness starts again afterwards.
        let mut s = sample(130, [Some(5), Some(0), None]);
        tracker.observe(&mut s);
        assert_eq!(s.gpus.iter().map(|g| g.idle_since).collect::<Vec<_>>(), [None, Some(115), None]);
        let mut s = sample(145, [Some(0), Some(0), None]);
        tracker.observe(&mut s);
        assert_eq!(s.gpus[0].idle_since, Some(145));
        // A busy MIG instance makes the GPU busy; an unhealthy GPU is never idle.
        let mut s = sample(160, [Some(0), Some(0), None]);
        s.gpus[0].mig = vec![MigSample { profile: "1g.10gb".into(), start: None, utilization_pct: Some(80) }];
        s.gpus[1].healthy = false;
        tracker.observe(&mut s);
        assert_eq!(s.gpus.iter().map(|g| g.idle_since).collect::<Vec<_>>(), [None, None, None]);
    }

    #[test]
    fn material_changes() {
        let a = eight();
        let mut b = a.clone();
        b.sampled_at += 15;
        b.gpus[0].utilization_pct = Some(90);
        b.gpus[1].memory_used_bytes += 1 << 30;
        assert!(!b.materially_differs(&a), "jitter is not material");
        b.gpus[0].utilization_pct = Some(50);
        assert!(b.materially_differs(&a));
        let mut c = a.clone();
        c.gpus[2].idle_since = Some(1);
        assert!(c.materially_differs(&a));
        let mut d = a.clone();
        d.gpus.pop();
        assert!(d.materially_differs(&a));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Ok(90));
        assert_eq!(parse_duration("1h30m"), Ok(5400));
        assert_eq!(parse_duration("600"), Ok(600));
        assert_eq!(parse_duration("2d"), Ok(172_800));
        assert!(parse_duration("5x").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("30").is_ok() && parse_duration("1h30").is_err());
        assert_eq!(format_duration(5400), "1h30m");
        let s: TelemetrySettings = serde_yaml::from_str("idleWindow: 45m\nmaxAge: 300\n").unwrap();
        assert_eq!(s, TelemetrySettings { idle_window: 2700, max_age: 300 });
        assert!(serde_yaml::from_str::<TelemetrySettings>("idleWindow: soon\n").is_err());
    }

    #[test]
    fn readiness_compares_count_model_health_and_mig() {
        let mig_gpu = |i: u8, profiles: &[(&str, u8)]| GpuDevice {
            mode: GpuMode::Mig {
                instances: profiles
                    .iter()
                    .map(|(p, s)| MigInstance {
                        placement: MigPlacement { profile: p.to_string(), start: *s },
                        used: false,
                    })
                    .collect(),
                dynamic: false,
            },
            ..GpuDevice::standard(i, 81920)
        };
        let expected = Node {
            name: "template".into(),
            gpu_model: Some("A100-80GB".into()),
            gpus: vec![GpuDevice::standard(0, 81920), mig_gpu(1, &[("3g.40gb", 0), ("4g.40gb", 4)])],
            ..Default::default()
        };
        let mut node = Node { name: "gpu-1".into(), ..Default::default() };
        assert!(telemetry_confirms(&node, &expected).unwrap_err().contains("no gpuscale.io/gpu-telemetry"));
        let mut t = NodeTelemetry { sampled_at: 1, gpus: vec![gpu(0, Some(0)), gpu(1, None)] };
        t.gpus[0].model = "NVIDIA A100-SXM4-80GB".into();
        t.gpus[1].mig = vec![
            MigSample { profile: "4g.40gb".into(), start: None, utilization_pct: None },
            MigSample { profile: "3g.40gb".into(), start: None, utilization_pct: None },
        ];
        node.telemetry = Some(t.clone());
        assert_eq!(telemetry_confirms(&node, &expected), Ok(()));
        let mut wrong = t.clone();
        wrong.gpus[1].mig.pop();
        node.telemetry = Some(wrong);
        assert!(telemetry_confirms(&node, &expected).unwrap_err().contains("MIG layout [4g.40gb]"));
        let mut wrong = t.clone();
        wrong.gpus[0].model = "H100-80GB".into();
        node.telemetry = Some(wrong);
        assert!(telemetry_confirms(&node, &expected).unwrap_err().contains("expected A100-80GB"));
        let mut wrong = t.clone();
        wrong.gpus.pop();
        node.telemetry = Some(wrong);
        assert!(telemetry_confirms(&node, &expected).unwrap_err().contains("sees 1 GPU(s)"));
        let mut wrong = t;
        wrong.gpus[0].healthy = false;
        node.telemetry = Some(wrong);
        assert!(telemetry_confirms(&node, &expected).unwrap_err().contains("unhealthy"));
    }
}
