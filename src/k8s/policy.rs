//! PodDisruptionBudgets and PodGroups.

use super::error::{ObjCtx, SnapshotError};
use crate::model::{DisruptionBudget, LabelSelector, NodeSelectorRequirement, SelectorOperator};
use k8s_openapi::api::policy::v1 as policy;
use serde_json::Value;

/// Converts a Kubernetes label selector (`matchLabels`, and `matchExpressions` with the four
/// operators label selectors allow); `field` is its path for errors.
pub(crate) fn label_selector(
    ctx: &ObjCtx<'_>,
    field: &str,
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> Result<LabelSelector, SnapshotError> {
    let mut match_expressions = Vec::new();
    for (i, e) in selector.match_expressions.iter().flatten().enumerate() {
        let operator = match e.operator.as_str() {
            "In" => SelectorOperator::In,
            "NotIn" => SelectorOperator::NotIn,
            "Exists" => SelectorOperator::Exists,
            "DoesNotExist" => SelectorOperator::DoesNotExist,
            other => {
                return Err(ctx.invalid(
                    format!("{field}.matchExpressions[{i}].operator"),
                    other,
                    "expected In, NotIn, Exists or DoesNotExist",
                ))
            }
        };
        match_expressions.push(NodeSelectorRequirement {
            key: e.key.clone(),
            operator,
            values: e.values.clone().unwrap_or_default(),
        });
    }
    Ok(LabelSelector { match_labels: selector.match_labels.clone().unwrap_or_default(), match_expressions })
}

/// Converts a PodDisruptionBudget; `None` for a budget with no selector, which covers no pod.
pub fn convert_pdb(
    k: &policy::PodDisruptionBudget,
    origin: &str,
    warnings: &mut Vec<String>,
) -> Result<Option<DisruptionBudget>, SnapshotError> {
    let namespace = k.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let name = k.metadata.name.clone().unwrap_or_default();
    let ctx = ObjCtx { origin, object: format!("PodDisruptionBudget {namespace}/{name}") };
    let Some(selector) = k.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        warnings.push(ctx.warning("no spec.selector: the budget covers no pod; skipped"));
        return Ok(None);
    };
    let selector = label_selector(&ctx, "spec.selector", selector)?;
    let disruptions_allowed = match k.status.as_ref().and_then(|s| s.disruptions_allowed) {
        Some(n) => u32::try_from(n.max(0)).unwrap_or(0),
        None => {
            warnings.push(ctx.warning(
                "no status.disruptionsAllowed (not read from a live cluster); allowing no disruptions",
            ));
            0
        }
    };
    Ok(Some(DisruptionBudget { id: format!("{namespace}/{name}"), namespace, selector, disruptions_allowed }))
}

/// API versions of PodGroup objects: the scheduler-plugins coscheduling group (current and old
/// name) and Volcano's.
pub const POD_GROUP_API_VERSIONS: &[&str] =
    &["scheduling.x-k8s.io/v1alpha1", "scheduling.sigs.k8s.io/v1alpha1", "scheduling.volcano.sh/v1beta1"];

/// Reads a PodGroup as raw JSON: its `namespace/name` and `spec.minMember`.
pub fn convert_pod_group(value: &Value, origin: &str) -> Result<(String, u32), SnapshotError> {
    let meta = &value["metadata"];
    let namespace = meta["namespace"].as_str().unwrap_or("default");
    let name = meta["name"].as_str().unwrap_or_default();
    let ctx = ObjCtx { origin, object: format!("PodGroup {namespace}/{name}") };
    if name.is_empty() {
        return Err(ctx.invalid("metadata.name", "", "a PodGroup needs a name"));
    }
    let min = &value["spec"]["minMember"];
    let min_member = match min {
        Value::Null => 1,
        v => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| ctx.invalid("spec.minMember", v.to_string(), "expected a non-negative integer"))?,
    };
    Ok((format!("{namespace}/{name}"), min_member))
}
