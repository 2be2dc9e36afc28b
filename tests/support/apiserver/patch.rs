//! Patch semantics: JSON merge patch (RFC 7386), JSON patch (RFC 6902, via `json-patch`), and
//! strategic merge patch for the built-in types.
//!
//! Strategic merge follows the patch strategies declared on the Go types for the lists a
//! controller touches (see [`list_strategy`]); every other list is replaced whole, as the real
//! server does for lists without a strategy. In particular `spec.taints` of a Node and
//! `spec.tolerations` of a Pod are *atomic* in Kubernetes: a strategic patch carrying one taint
//! replaces all taints. Supported directives: `$patch: replace|delete` on maps and list items,
//! `$deleteFromPrimitiveList/<field>`, `$retainKeys`; `$setElementOrder/<field>` is accepted and
//! ignored (merged items keep their stored order, new ones are appended).

use serde_json::{Map, Value};

/// How a list at a field path merges under strategic merge patch and server-side apply.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ListStrategy {
    /// Replace the whole list (no patch strategy / `listType=atomic`).
    Atomic,
    /// Merge object items by this key.
    MergeByKey(&'static str),
    /// Union of primitive values (`patchStrategy=merge` on a list of strings).
    PrimitiveSet,
}

/// The strategy of the list at `path` (field names joined by '.', list levels skipped), from
/// the `patchStrategy`/`patchMergeKey` tags of the Kubernetes Go types.
pub fn list_strategy(path: &str) -> ListStrategy {
    use ListStrategy::*;
    match path {
        "metadata.ownerReferences" => MergeByKey("uid"),
        "metadata.finalizers" => PrimitiveSet,
        "spec.containers" | "spec.initContainers" | "spec.ephemeralContainers" => MergeByKey("name"),
        "spec.containers.env" | "spec.initContainers.env" => MergeByKey("name"),
        "spec.containers.ports" | "spec.initContainers.ports" => MergeByKey("containerPort"),
        "spec.containers.volumeMounts" | "spec.initContainers.volumeMounts" => MergeByKey("mountPath"),
        "spec.volumes" | "spec.imagePullSecrets" => MergeByKey("name"),
        "spec.podCIDRs" => PrimitiveSet,
        "status.conditions" | "status.addresses" => MergeByKey("type"),
        "status.containerStatuses" | "status.initContainerStatuses" => MergeByKey("name"),
        "spec.ports" => MergeByKey("port"),
        _ => Atomic,
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// Strategic merge patch of `patch` into `target` (both whole objects).
pub fn strategic_merge(target: &mut Value, patch: &Value) -> Result<(), String> {
    let Value::Object(p) = patch else {
        return Err("strategic merge patch must be a JSON object".into());
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    smp_map(target.as_object_mut().expect("object"), p, "")
}

/// A copy of a patch value with directives removed, for inserting where nothing was.
fn strip_directives(v: &Value, path: &str) -> Result<Value, String> {
    match v {
        Value::Object(m) => {
            let mut out = Map::new();
            smp_map(&mut out, m, path)?;
            Ok(Value::Object(out))
        }
        Value::Array(items) => Ok(Value::Array(
            items
                .iter()
                .filter(|i| i.get("$patch").is_none())
                .map(|i| strip_directives(i, path))
                .collect::<Result<_, _>>()?,
        )),
        other => Ok(other.clone()),
    }
}

fn smp_map(target: &mut Map<String, Value>, patch: &Map<String, Value>, path: &str) -> Result<(), String> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            target.clear();
            for (k, v) in patch.iter().filter(|(k, _)| k.as_str() != "$patch") {
                target.insert(k.clone(), strip_directives(v, &join(path, k))?);
            }
            return Ok(());
        }
        Some("delete") => {
            target.clear();
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => return Err(format!("unknown patch type {other:?} at {path:?}")),
    }
    if let Some(keep) = patch.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        target.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (k, v) in patch {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let drop: Vec<&Value> = v.as_array().map(|a| a.iter().collect()).unwrap_or_default();
            if let Some(Value::Array(items)) = target.get_mut(field) {
                items.retain(|i| !drop.contains(&i));
            }
            continue;
        }
        let sub = join(path, k);
        match v {
            Value::Null => {
                target.remove(k);
            }
            Value::Object(pm) => {
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    target.remove(k);
                    continue;
                }
                match target.get_mut(k) {
                    Some(Value::Object(tm)) => smp_map(tm, pm, &sub)?,
                    _ => {
                        let mut fresh = Map::new();
                        smp_map(&mut fresh, pm, &sub)?;
                        target.insert(k.clone(), Value::Object(fresh));
                    }
                }
            }
            Value::Array(pitems) => match (list_strategy(&sub), target.get_mut(k)) {
                (ListStrategy::MergeByKey(key), Some(Value::Array(titems))) => {
                    merge_list_by_key(titems, pitems, key, &sub)?
                }
                (ListStrategy::PrimitiveSet, Some(Value::Array(titems))) => {
                    for i in pitems {
                        if !titems.contains(i) {
                            titems.push(i.clone());
                        }
                    }
                }
                _ => {
                    target.insert(k.clone(), strip_directives(v, &sub)?);
                }
            },
            other => {
                target.insert(k.clone(), other.clone());
            }
        }
    }
    Ok(())
}

fn merge_list_by_key(target: &mut Vec<Value>, patch: &[Value], key: &str, path: &str) -> Result<(), String> {
    if patch.iter().any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace")) {
        *target = patch
            .iter()
            .filter(|i| i.get("$patch").is_none())
            .map(|i| strip_directives(i, path))
            .collect::<Result<_, _>>()?;
        return Ok(());
    }
    for item in patch {
        let Value::Object(pm) = item else {
            return Err(format!("{path}: list items must be objects with merge key {key:?}, got {item}"));
        };
        let Some(kv) = pm.get(key) else {
            return Err(format!("map: {item} does not contain declared merge key: {key}"));
        };
        let pos = target.iter().position(|t| t.get(key) == Some(kv));
        if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(p) = pos {
                target.remove(p);
            }
            continue;
        }
        match pos {
            Some(p) => {
                if let Value::Object(tm) = &mut target[p] {
                    smp_map(tm, pm, path)?;
                }
            }
            None => target.push(strip_directives(item, path)?),
        }
    }
    Ok(())
}

/// Removes from `target` the fields a field manager applied before (`previous`) and no longer
/// applies (`current`): the part of server-side apply that makes omitted fields disappear.
/// Lists merged by key lose the items whose key disappeared; atomic values are replaced by the
/// merge that follows anyway.
pub fn remove_unapplied(target: &mut Value, previous: &Value, current: &Value, path: &str) {
    let (Value::Object(t), Value::Object(prev)) = (target, previous) else {
        return;
    };
    let cur = current.as_object();
    for (k, pv) in prev {
        if path.is_empty() && (k == "apiVersion" || k == "kind") {
            continue;
        }
        if path == "metadata" && (k == "name" || k == "namespace") {
            continue;
        }
        let sub = join(path, k);
        match cur.and_then(|c| c.get(k)) {
            None => {
                t.remove(k);
            }
            Some(cv) => {
                if let (Value::Object(_), Some(tv)) = (pv, t.get_mut(k)) {
                    remove_unapplied(tv, pv, cv, &sub);
                } else if let (ListStrategy::MergeByKey(key), Value::Array(pitems), Value::Array(citems)) =
                    (list_strategy(&sub), pv, cv)
                {
                    if let Some(Value::Array(titems)) = t.get_mut(k) {
                        for pi in pitems {
                            let Some(kv) = pi.get(key) else { continue };
                            match citems.iter().find(|c| c.get(key) == Some(kv)) {
                                None => titems.retain(|t| t.get(key) != Some(kv)),
                                Some(ci) => {
                                    if let Some(ti) = titems.iter_mut().find(|t| t.get(key) == Some(kv)) {
                                        remove_unapplied(ti, pi, ci, &sub);
                                    }
                                }
                            }
                        }
                    }
                } else if let (ListStrategy::PrimitiveSet, Value::Array(pitems), Value::Array(citems)) =
                    (list_strategy(&sub), pv, cv)
                {
                    if let Some(Value::Array(titems)) = t.get_mut(k) {
                        titems.retain(|x| !pitems.contains(x) || citems.contains(x));
                    }
                }
            }
        }
    }
}
