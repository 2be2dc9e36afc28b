//! `docs/configuration.md` documents exactly the fields the config types accept, with their
//! defaults.
//!
//! The type side comes from the types themselves, through serde, so that it cannot drift: a
//! config with one element in every list and every optional section present is deserialised and
//! serialised back. Every key of the result is a field (maps whose keys are the user's, such as
//! `priceOverrides`, are filled with a `<placeholder>` key that stays in the path); a key the input
//! did not have shows the field's default; a key whose removal from the input makes
//! deserialisation fail is required. A field added to a type appears here without anyone listing
//! it, and the test fails until the document has a row for it; a row for a field the types do not
//! have (renamed, removed, misspelt) fails as well, and so does a default the document states
//! wrongly. (The crate has no JSON-schema derive; a hand-kept list of field names would be one
//! more thing to drift.)

use gpuscale::config::GpuscaleConfig;
use gpuscale::providers::config::ConfigFile;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// What the types say about one field.
#[derive(Debug, Clone, PartialEq)]
enum Field {
    /// Deserialisation fails without it.
    Required,
    /// Its value when absent (`null`: none).
    Default(Value),
    /// Optional, but every input gave it (one of several alternatives, such as `gpuSharing.mig`):
    /// the document may say what it likes about the default.
    Optional,
}

/// One place a key was seen: the JSON pointer of its object in the input, whether the input had
/// the key, and its value after the round trip.
struct Seen {
    parent: Option<String>,
    key: String,
    given: bool,
    value: Value,
}

fn walk(
    out: &Value,
    input: Option<&Value>,
    pointer: Option<String>,
    path: &str,
    seen: &mut Vec<(String, Seen)>,
) {
    match out {
        Value::Object(map) => {
            for (k, v) in map {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                let child_input = input.and_then(|i| i.get(k));
                if !k.starts_with('<') {
                    let s = Seen {
                        parent: pointer.clone(),
                        key: k.clone(),
                        given: child_input.is_some(),
                        value: v.clone(),
                    };
                    seen.push((p.clone(), s));
                }
                let child_pointer = child_input.and(pointer.as_ref()).map(|ptr| format!("{ptr}/{k}"));
                walk(v, child_input, child_pointer, &p, seen);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                let child_input = input.and_then(|x| x.get(i));
                let child_pointer = child_input.and(pointer.as_ref()).map(|ptr| format!("{ptr}/{i}"));
                walk(v, child_input, child_pointer, &format!("{path}[]"), seen);
            }
        }
        _ => {}
    }
}

/// Every field of `T` reachable from `inputs`, by dotted path (`accounts[].nodeGroups[].name`).
fn fields_of<T: DeserializeOwned + Serialize>(inputs: &[Value]) -> BTreeMap<String, Field> {
    let mut seen = Vec::new();
    for input in inputs {
        let typed: T = serde_json::from_value(input.clone())
            .unwrap_or_else(|e| panic!("test input does not deserialise: {e}\n{input:#}"));
        let out = serde_json::to_value(&typed).expect("serialises");
        let mut here = Vec::new();
        walk(&out, Some(input), Some(String::new()), "", &mut here);
        for (path, s) in here {
            // Required: the input gave the key and does not deserialise without it.
            let required = s.given && {
                let mut cut = input.clone();
                let parent = cut.pointer_mut(s.parent.as_deref().expect("given keys have a parent"));
                parent.and_then(Value::as_object_mut).expect("parent object").remove(&s.key);
                serde_json::from_value::<T>(cut).is_err()
            };
            seen.push((path, s, required));
        }
    }
    let mut fields: BTreeMap<String, Field> = BTreeMap::new();
    for (path, s, required) in seen {
        let new = if required {
            Field::Required
        } else if s.given {
            Field::Optional
        } else {
            Field::Default(s.value)
        };
        let merged = match (fields.get(&path), new) {
            (None, f) => f,
            (Some(Field::Required), _) | (_, Field::Required) => Field::Required,
            (Some(Field::Default(a)), Field::Default(b)) => {
                assert_eq!(a, &b, "{path}: two different defaults in the test inputs");
                Field::Default(b)
            }
            (Some(Field::Default(a)), Field::Optional) => Field::Default(a.clone()),
            (Some(Field::Optional), f) => f,
        };
        fields.insert(path, merged);
    }
    fields
}

/// Provider config files: a bare account, one with a minimal node group, and one with every
/// optional section and both forms of GPU sharing.
fn provider_fields() -> BTreeMap<String, Field> {
    fields_of::<ConfigFile>(&[json!({
        "accounts": [
            {"name": "bare", "provider": "gcp"},
            {"name": "minimal", "provider": "simulated",
             "nodeGroups": [{"name": "g", "instanceType": "g6.xlarge", "maxSize": 1}]},
            {"name": "full", "provider": "aws",
             "credentials": {},
             "rateLimit": {"requestsPerSecond": 1.0},
             "retry": {},
             "backoff": {},
             "discovery": {},
             "priceOverrides": {"<instanceType>": {}},
             "simulation": {},
             "nodeGroups": [
                 {"name": "g", "instanceType": "x", "maxSize": 1,
                  "instanceSpec": {"vcpu": 1, "memoryGiB": 1.0, "price": {}},
                  "gpuSharing": {"mig": "all-1g.5gb"},
                  "taints": [{"key": "k", "effect": "NoSchedule"}],
                  "price": {},
                  "dra": {}},
                 {"name": "h", "instanceType": "g6.xlarge", "maxSize": 1,
                  "gpuSharing": {"timeSlicing": {"replicas": 2}}}
             ]}
        ]
    })])
}

/// The gpuscale config file: empty, with an empty `tenancy:`, and with a tenant, a quota, a cohort
/// and a default spread constraint.
fn gpuscale_fields() -> BTreeMap<String, Field> {
    fields_of::<GpuscaleConfig>(&[
        json!({}),
        json!({"tenancy": {}}),
        json!({
            "planner": {"defaultSpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}
            ]},
            "tenancy": {
                "cohorts": [{"name": "c"}],
                "tenants": [{"name": "t", "quotas": {"<kind>": {"nominal": 1.0}}}, {"name": "u"}]
            }
        }),
    ])
}

/// A documented field: its path and the text of its default cell.
#[derive(Debug)]
struct Row {
    path: String,
    default: String,
    line: usize,
}

/// The rows of the field tables under the `## ` heading that contains `section`. A `### ` heading
/// with a backticked path (`### \`accounts[].nodeGroups[]\``) prefixes the rows below it; the
/// first column holds the field in backticks, the third its default.
fn documented(doc: &str, section: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut inside = false;
    let mut prefix = String::new();
    for (i, line) in doc.lines().enumerate() {
        if let Some(h) = line.strip_prefix("## ") {
            inside = h.to_lowercase().contains(section);
            prefix.clear();
            continue;
        }
        if !inside {
            continue;
        }
        if let Some(h) = line.strip_prefix("### ") {
            prefix = h.split('`').nth(1).unwrap_or_default().to_string();
            continue;
        }
        let Some(cells) = line.strip_prefix('|') else { continue };
        let cells: Vec<&str> = cells.split('|').map(str::trim).collect();
        let Some(field) = cells[0].strip_prefix('`').and_then(|c| c.strip_suffix('`')) else { continue };
        assert!(cells.len() >= 4, "docs/configuration.md:{}: a field row has four columns", i + 1);
        let path = if prefix.is_empty() { field.to_string() } else { format!("{prefix}.{field}") };
        rows.push(Row { path, default: cells[2].to_string(), line: i + 1 });
    }
    rows
}

/// What the default column must say for a field.
fn expected_cell(field: &Field) -> Option<String> {
    match field {
        Field::Required => Some("required".into()),
        Field::Default(Value::Null) => Some("none".into()),
        Field::Default(Value::Object(_)) => Some("`{}`".into()),
        Field::Default(v) => Some(format!("`{}`", yaml_of(v))),
        Field::Optional => None,
    }
}

/// A value as one would write it in YAML flow style.
fn yaml_of(v: &Value) -> String {
    match v {
        Value::String(s) if s.is_empty() => "\"\"".into(),
        Value::String(s) => s.clone(),
        Value::Array(items) => format!("[{}]", items.iter().map(yaml_of).collect::<Vec<_>>().join(", ")),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter().map(|(k, v)| format!("{k}: {}", yaml_of(v))).collect::<Vec<_>>().join(", ")
        ),
        other => other.to_string(),
    }
}

/// Whether the document's default cell states `field`'s default: `required`, `none`, or the value
/// in backticks as YAML (numbers compare as numbers, so `600` documents `600.0`).
fn cell_matches(cell: &str, field: &Field) -> bool {
    match field {
        Field::Required => cell == "required",
        Field::Default(Value::Null) => cell == "none",
        // A section: `{}` stands for its fields' defaults, each documented and checked below it.
        Field::Default(Value::Object(_)) if cell == "`{}`" => true,
        Field::Default(v) => {
            let Some(text) = cell.strip_prefix('`').and_then(|c| c.strip_suffix('`')) else { return false };
            let Ok(stated) = serde_yaml::from_str::<Value>(text) else { return false };
            same(&stated, v)
        }
        Field::Optional => true,
    }
}

fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, a)| y.get(k).is_some_and(|b| same(a, b)))
        }
        _ => a == b,
    }
}

fn compare(section: &str, types: &BTreeMap<String, Field>) {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md"))
        .expect("docs/configuration.md");
    let rows = documented(&doc, section);
    let mut problems = Vec::new();
    let mut documented_paths = BTreeMap::new();
    for row in &rows {
        if let Some(first) = documented_paths.insert(row.path.clone(), row.line) {
            problems
                .push(format!("line {}: `{}` is documented twice (also line {first})", row.line, row.path));
        }
        match types.get(&row.path) {
            None => problems.push(format!("line {}: `{}` is no field of the {section}", row.line, row.path)),
            Some(field) if !cell_matches(&row.default, field) => problems.push(format!(
                "line {}: `{}` default is {:?}, the types say {}",
                row.line,
                row.path,
                row.default,
                expected_cell(field).unwrap_or_default()
            )),
            Some(_) => {}
        }
    }
    for (path, field) in types {
        if !documented_paths.contains_key(path) {
            problems.push(format!(
                "undocumented field of the {section}: `{path}`, default {}",
                expected_cell(field).unwrap_or_else(|| "(optional)".into())
            ));
        }
    }
    assert!(problems.is_empty(), "docs/configuration.md disagrees with the types:\n{}", problems.join("\n"));
}

#[test]
fn configuration_md_documents_every_provider_config_field_and_no_other() {
    let fields = provider_fields();
    // The walk sees the deep fields, so an empty result would mean the test checks nothing.
    for path in
        ["accounts[].nodeGroups[].instanceSpec.memoryGiB", "accounts[].priceOverrides.<instanceType>.spot"]
    {
        assert!(fields.contains_key(path), "{path} not found: {:?}", fields.keys());
    }
    assert_eq!(fields["accounts[].nodeGroups[].maxSize"], Field::Required);
    assert_eq!(fields["accounts[].retry.maxAttempts"], Field::Default(json!(5)));
    assert_eq!(fields["accounts[].region"], Field::Default(Value::Null));
    assert_eq!(fields["accounts[].nodeGroups[].gpuSharing.mig"], Field::Optional);
    compare("provider config", &fields);
}

#[test]
fn configuration_md_documents_every_gpuscale_config_field_and_no_other() {
    let fields = gpuscale_fields();
    assert_eq!(fields["planner.seed"], Field::Default(json!(42)));
    assert_eq!(fields["telemetry.idleWindow"], Field::Default(json!("1h")));
    assert_eq!(fields["tenancy"], Field::Default(Value::Null));
    assert_eq!(fields["tenancy.tenants[].quotas.<kind>.nominal"], Field::Required);
    assert_eq!(fields["tenancy.tenants[].weight"], Field::Default(json!(1.0)));
    compare("gpuscale config", &fields);
}

#[test]
fn the_checker_rejects_missing_unknown_and_wrong_rows() {
    let types = BTreeMap::from([
        ("a".to_string(), Field::Required),
        ("b".to_string(), Field::Default(json!(600.0))),
        ("c".to_string(), Field::Default(Value::Null)),
    ]);
    let doc = "## Thing config\n\n### `x`\n\n| field | type | default | what |\n|---|---|---|---|\n\
               | `a` | int | required | . |\n| `b` | float | `600` | . |\n| `zz` | int | none | . |\n";
    let rows = documented(doc, "thing config");
    let paths: Vec<&str> = rows.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, ["x.a", "x.b", "x.zz"]);
    assert!(cell_matches(&rows[0].default, &types["a"]));
    assert!(cell_matches(&rows[1].default, &types["b"]), "600 documents 600.0");
    assert!(!cell_matches("`601`", &types["b"]));
    assert!(!cell_matches("`600`", &types["c"]));
    assert!(cell_matches("none", &types["c"]));
    assert!(!cell_matches("none", &types["a"]));
    let section = Field::Default(json!({"x": 1}));
    assert!(cell_matches("`{}`", &section) && cell_matches("`{x: 1}`", &section));
    assert!(!cell_matches("`{x: 2}`", &section) && !cell_matches("none", &section));
}
