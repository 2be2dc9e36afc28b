//! Label and field selectors with the real server's grammar: labels `a=b`, `a==b`, `a!=b`,
//! `a in (x,y)`, `a notin (x,y)`, `a`, `!a`, `a>1`, `a<1`; fields `path=v`, `path==v`,
//! `path!=v` over the field labels each resource supports (missing fields compare as "").

use super::resources::ResourceKind;
use serde_json::Value;

/// One label requirement.
#[derive(Clone, Debug, PartialEq)]
pub enum LabelOp {
    /// `key=value` / `key==value`.
    Eq(String),
    /// `key!=value` (also true when the key is absent).
    NotEq(String),
    /// `key in (a,b)`.
    In(Vec<String>),
    /// `key notin (a,b)` (also true when the key is absent).
    NotIn(Vec<String>),
    /// `key`.
    Exists,
    /// `!key`.
    DoesNotExist,
    /// `key>n`.
    Gt(i64),
    /// `key<n`.
    Lt(i64),
}

/// A parsed label selector: all requirements must hold. Empty matches everything.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSelector(pub Vec<(String, LabelOp)>);

fn split_top_level(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c)
            }
            ')' => {
                depth -= 1;
                cur.push(c)
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter().map(|t| t.trim().to_string()).collect()
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 317
        && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63 && v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl LabelSelector {
    /// Parses the `labelSelector` query syntax; the error names the bad requirement.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for term in split_top_level(s) {
            if term.is_empty() {
                return Err(format!("unable to parse requirement: empty term in {s:?}"));
            }
            let bad = |why: &str| format!("unable to parse requirement: {term:?}: {why}");
            if let Some(key) = term.strip_prefix('!') {
                let key = key.trim();
                if !valid_key(key) {
                    return Err(bad("invalid label key"));
                }
                reqs.push((key.to_string(), LabelOp::DoesNotExist));
                continue;
            }
            if let Some(open) = term.find('(') {
                let head = term[..open].trim();
                let close = term.rfind(')').ok_or_else(|| bad("missing ')'"))?;
                if close != term.len() - 1 {
                    return Err(bad("trailing characters after ')'"));
                }
                let (key, op) =
                    head.split_once(char::is_whitespace).ok_or_else(|| bad("expected 'in' or 'notin'"))?;
                let values: Vec<String> = term[open + 1..close]
                    .split(',')
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
                    .collect();
                if values.iter().any(|v| !valid_value(v)) {
                    return Err(bad("invalid label value"));
                }
                let key = key.trim();
                if !valid_key(key) {
                    return Err(bad("invalid label key"));
                }
                let op = match op.trim() {
                    "in" => LabelOp::In(values),
                    "notin" => LabelOp::NotIn(values),
                    other => return Err(bad(&format!("unknown operator {other:?}"))),
                };
                reqs.push((key.to_string(), op));
                continue;
            }
            let (key, op) = if let Some((k, v)) = term.split_once("!=") {
                (k, LabelOp::NotEq(v.trim().to_string()))
            } else if let Some((k, v)) = term.split_once("==") {
                (k, LabelOp::Eq(v.trim().to_string()))
            } else if let Some((k, v)) = term.split_once('=') {
                (k, LabelOp::Eq(v.trim().to_string()))
            } else if let Some((k, v)) = term.split_once('>') {
                (k, LabelOp::Gt(v.trim().parse().map_err(|_| bad("'>' needs an integer"))?))
            } else if let Some((k, v)) = term.split_once('<') {
                (k, LabelOp::Lt(v.trim().parse().map_err(|_| bad("'<' needs an integer"))?))
            } else {
                (term.as_str(), LabelOp::Exists)
            };
            let key = key.trim();
            if !valid_key(key) {
                return Err(bad("invalid label key"));
            }
            if let LabelOp::Eq(v) | LabelOp::NotEq(v) = &op {
                if !valid_value(v) {
                    return Err(bad("invalid label value"));
                }
            }
            reqs.push((key.to_string(), op));
        }
        Ok(Self(reqs))
    }

    /// From a `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`). `None` for a
    /// null selector (which selects nothing, as in policy/v1 PDBs).
    pub fn from_object(sel: &Value) -> Result<Option<Self>, String> {
        if sel.is_null() {
            return Ok(None);
        }
        let mut reqs = Vec::new();
        if let Some(ml) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in ml {
                reqs.push((k.clone(), LabelOp::Eq(v.as_str().unwrap_or_default().to_string())));
            }
        }
        if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
            for e in exprs {
                let key = e.get("key").and_then(Value::as_str).unwrap_or_default().to_string();
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
                    .unwrap_or_default();
                let op = match e.get("operator").and_then(Value::as_str).unwrap_or_default() {
                    "In" => LabelOp::In(values),
                    "NotIn" => LabelOp::NotIn(values),
                    "Exists" => LabelOp::Exists,
                    "DoesNotExist" => LabelOp::DoesNotExist,
                    other => return Err(format!("{other:?} is not a valid label selector operator")),
                };
                reqs.push((key, op));
            }
        }
        Ok(Some(Self(reqs)))
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|(k, op)| match op {
            LabelOp::Eq(v) => get(k) == Some(v.as_str()),
            LabelOp::NotEq(v) => get(k) != Some(v.as_str()),
            LabelOp::In(vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelOp::NotIn(vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            LabelOp::Exists => get(k).is_some(),
            LabelOp::DoesNotExist => get(k).is_none(),
            LabelOp::Gt(n) => get(k).and_then(|x| x.parse::<i64>().ok()).is_some_and(|x| x > *n),
            LabelOp::Lt(n) => get(k).and_then(|x| x.parse::<i64>().ok()).is_some_and(|x| x < *n),
        })
    }
}

/// A parsed field selector: `(path, equal?, value)` terms, all must hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector(pub Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses `fieldSelector`, refusing field labels the resource does not support with the
    /// real server's message.
    pub fn parse(s: &str, res: &ResourceKind) -> Result<Self, String> {
        let mut terms = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(terms));
        }
        for term in s.split(',') {
            let term = term.trim();
            let (path, eq, value) = if let Some((k, v)) = term.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = term.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = term.split_once('=') {
                (k, true, v)
            } else {
                return Err(format!("invalid selector: '{s}'; can't understand '{term}'"));
            };
            let path = path.trim();
            if path != "metadata.name" && path != "metadata.namespace" && !res.field_labels.contains(&path) {
                return Err(format!("field label not supported: {path}"));
            }
            terms.push((path.to_string(), eq, value.trim().to_string()));
        }
        Ok(Self(terms))
    }

    /// Whether the object satisfies every term.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, eq, value)| (field_value(obj, path) == *value) == *eq)
    }
}

/// The string a field label has on an object, "" when absent (as the real server's field sets).
pub fn field_value(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for part in path.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => String::new(),
        // `source` on core events: the component.
        Value::Object(o) => o.get("component").and_then(Value::as_str).unwrap_or_default().to_string(),
        Value::Array(_) => String::new(),
    }
}

/// Label and field selector together.
#[derive(Clone, Debug, Default)]
pub struct Selectors {
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector.
    pub fields: FieldSelector,
}

impl Selectors {
    /// Both selectors hold.
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// No selector given (the real server reports `remainingItemCount` only then).
    pub fn is_empty(&self) -> bool {
        self.labels.0.is_empty() && self.fields.0.is_empty()
    }
}
