//! Kubernetes `Pod` → [`model::Workload`]: effective requests, GPU demand in every spelling
//! (device plugin, MIG, time-slicing, HAMi, KAI), placement constraints, gang and tenant.

use super::error::{ObjCtx, SnapshotError};
use super::quantity;
use crate::model::{
    GpuCatalog, GpuDemand, LabelSelector, NodeSelectorRequirement, OwnerKind, PodAffinityTerm, PodIdentity,
    Preferences, Resources, SelectorOperator, SpreadConstraint, TaintEffect, Toleration, TolerationOperator,
    Workload,
};
use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use std::collections::BTreeMap;

/// HAMi's record of the GPUs a bound pod got: `uuid,type,mem,cores:` per device, `;` per
/// container.
pub const HAMI_ALLOCATED: &str = "hami.io/vgpu-devices-allocated";

/// A converted pod plus what pod accounting and late resolution need.
#[derive(Debug, Clone)]
pub struct ConvertedPod {
    /// The workload.
    pub workload: Workload,
    /// GPU UUIDs HAMi allocated to the pod, when bound through HAMi.
    pub gpu_uuids: Vec<String>,
    /// HAMi `nvidia.com/gpumem-percentage`, resolved to MiB once the node's GPU is known.
    pub gpumem_percentage: Option<u32>,
}

/// Effective requests of a pod: resource name → amount (milli-CPU for `cpu`, whole counts for
/// extended resources, base units otherwise), with the field each resource was first read from.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EffectiveRequests {
    /// Amounts.
    pub amounts: BTreeMap<String, u64>,
    /// Field path where each resource was first seen, for errors.
    pub fields: BTreeMap<String, String>,
}

/// Whether kube-scheduler's NodeResourcesFit checks `name` as a plain count against the node and
/// nothing else models it: not CPU, memory or pods, and not a GPU form (`nvidia.com/*`, which
/// [`crate::model::GpuDemand`] and the node's GPU devices model with their sharing semantics).
pub(crate) fn is_other_resource(name: &str) -> bool {
    !matches!(name, "cpu" | "memory" | "pods") && !name.starts_with("nvidia.com/")
}

fn is_extended(name: &str) -> bool {
    name.contains('/') && !name.starts_with("kubernetes.io/") && !name.contains(".kubernetes.io/")
}

fn parse_resource(ctx: &ObjCtx<'_>, field: &str, name: &str, q: &K8sQuantity) -> Result<u64, SnapshotError> {
    let parsed = if name == "cpu" {
        quantity::milli(&q.0)
    } else if is_extended(name) {
        quantity::count(&q.0)
    } else {
        quantity::units(&q.0)
    };
    parsed.map_err(|e| ctx.quantity(field, &q.0, e))
}

/// A container's requests after API-server defaulting: a resource with a limit but no request
/// requests its limit.
fn container_requests(
    ctx: &ObjCtx<'_>,
    c: &k8s::Container,
    prefix: &str,
    fields: &mut BTreeMap<String, String>,
) -> Result<BTreeMap<String, u64>, SnapshotError> {
    let mut out = BTreeMap::new();
    let Some(res) = &c.resources else {
        return Ok(out);
    };
    let requests = res.requests.clone().unwrap_or_default();
    for (name, q) in &requests {
        let field = format!("{prefix}.resources.requests.{name}");
        out.insert(name.clone(), parse_resource(ctx, &field, name, q)?);
        fields.entry(name.clone()).or_insert(field);
    }
    // The API server refuses a request without an equal limit for resources that cannot be
    // overcommitted (extended resources such as GPUs, and huge pages): such a pod never exists.
    let no_limits = BTreeMap::new();
    let limits = res.limits.as_ref().unwrap_or(&no_limits);
    for (name, q) in requests.iter().filter(|(n, _)| is_extended(n) || n.starts_with("hugepages-")) {
        let field = format!("{prefix}.resources.requests.{name}");
        match limits.get(name) {
            None => {
                return Err(ctx.invalid(
                    field,
                    &q.0,
                    format!("{name} cannot be overcommitted: its limit must be set and equal the request"),
                ))
            }
            Some(l) if parse_resource(ctx, &field, name, l)? != out[name] => {
                return Err(ctx.invalid(
                    field,
                    &q.0,
                    format!("{name} cannot be overcommitted: the request must equal the limit {}", l.0),
                ))
            }
            Some(_) => {}
        }
    }
    // Every limit is a quantity the API server parses, whether or not a request names the
    // resource too; a limit alone is the request, and a request may not exceed its limit.
    for (name, q) in limits {
        let field = format!("{prefix}.resources.limits.{name}");
        let limit = parse_resource(ctx, &field, name, q)?;
        match requests.get(name) {
            None => {
                out.insert(name.clone(), limit);
                fields.entry(name.clone()).or_insert(field);
            }
            Some(r) if out[name] > limit => {
                return Err(ctx.invalid(
                    format!("{prefix}.resources.requests.{name}"),
                    &r.0,
                    format!("the request may not exceed the limit {} (the API server refuses this pod)", q.0),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(out)
}

fn add_into(acc: &mut BTreeMap<String, u64>, other: &BTreeMap<String, u64>) {
    for (k, v) in other {
        *acc.entry(k.clone()).or_default() += v;
    }
}

fn max_into(acc: &mut BTreeMap<String, u64>, other: &BTreeMap<String, u64>) {
    for (k, v) in other {
        let e = acc.entry(k.clone()).or_default();
        *e = (*e).max(*v);
    }
}

/// The Kubernetes formula (`resourcehelper.PodRequests`): the larger of the containers' sum and
/// each init container's need (restartable sidecars run alongside everything started after
/// them), plus pod overhead; pod-level `spec.resources` replaces CPU and memory when set.
pub(crate) fn effective_requests(
    ctx: &ObjCtx<'_>,
    spec: &k8s::PodSpec,
) -> Result<EffectiveRequests, SnapshotError> {
    let mut fields = BTreeMap::new();
    let mut sum = BTreeMap::new();
    for (i, c) in spec.containers.iter().enumerate() {
        let r = container_requests(ctx, c, &format!("spec.containers[{i}]"), &mut fields)?;
        add_into(&mut sum, &r);
    }
    let mut sidecars: BTreeMap<String, u64> = BTreeMap::new();
    let mut init_max: BTreeMap<String, u64> = BTreeMap::new();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let r = container_requests(ctx, c, &format!("spec.initContainers[{i}]"), &mut fields)?;
        if c.restart_policy.as_deref() == Some("Always") {
            add_into(&mut sum, &r);
            add_into(&mut sidecars, &r);
            max_into(&mut init_max, &sidecars);
        } else {
            let mut need = r;
            add_into(&mut need, &sidecars);
            max_into(&mut init_max, &need);
        }
    }
    max_into(&mut sum, &init_max);
    if let Some(pod_level) = spec.resources.as_ref().and_then(|r| r.requests.as_ref()) {
        for name in ["cpu", "memory"] {
            if let Some(q) = pod_level.get(name) {
                let field = format!("spec.resources.requests.{name}");
                sum.insert(name.to_string(), parse_resource(ctx, &field, name, q)?);
                fields.insert(name.to_string(), field);
            }
        }
    }
    for (name, q) in spec.overhead.iter().flatten() {
        let field = format!("spec.overhead.{name}");
        let v = parse_resource(ctx, &field, name, q)?;
        *sum.entry(name.clone()).or_default() += v;
        fields.entry(name.clone()).or_insert(field);
    }
    Ok(EffectiveRequests { amounts: sum, fields })
}

/// Translates GPU resources and KAI annotations into one [`GpuDemand`]. Mixed or contradictory
/// requests and unknown `nvidia.com/*` resources are errors: guessing would misplace the pod.
pub(crate) fn gpu_demand(
    ctx: &ObjCtx<'_>,
    requests: &EffectiveRequests,
    annotations: &BTreeMap<String, String>,
) -> Result<(GpuDemand, Option<u32>), SnapshotError> {
    let field =
        |k: &str| requests.fields.get(k).cloned().unwrap_or_else(|| format!("resources.requests.{k}"));
    let mut whole = 0u64;
    let mut shared = 0u64;
    let mut mig: Vec<(String, u64)> = Vec::new();
    let mut hami: BTreeMap<&str, u64> = BTreeMap::new();
    for (name, &v) in &requests.amounts {
        let Some(rest) = name.strip_prefix("nvidia.com/") else {
            continue;
        };
        if v == 0 {
            continue;
        }
        match rest {
            "gpu" => whole = v,
            "gpu.shared" => shared = v,
            "gpumem" | "gpumem-percentage" | "gpucores" => {
                hami.insert(rest, v);
            }
            _ if rest.starts_with("mig-") => mig.push((rest["mig-".len()..].to_string(), v)),
            _ => return Err(ctx.invalid(field(name), v.to_string(), format!("unknown GPU resource {name}"))),
        }
    }
    let kai_keys = ["gpu-fraction", "gpu-memory", "gpu-fraction-num-devices"];
    let kai: BTreeMap<&str, &String> =
        kai_keys.iter().filter_map(|k| annotations.get(*k).map(|v| (*k, v))).collect();
    let ann = |k: &str| format!("metadata.annotations[{k}]");
    let u32_of = |f: String, v: u64| u32::try_from(v).map_err(|_| ctx.invalid(f, v.to_string(), "too large"));

    let mut kinds = Vec::new();
    if whole > 0 && hami.is_empty() {
        kinds.push(field("nvidia.com/gpu"));
    }
    if shared > 0 {
        kinds.push(field("nvidia.com/gpu.shared"));
    }
    for (p, _) in &mig {
        kinds.push(field(&format!("nvidia.com/mig-{p}")));
    }
    if !hami.is_empty() {
        kinds.push(field(&format!("nvidia.com/{}", hami.keys().next().copied().unwrap_or("gpumem"))));
    }
    if !kai.is_empty() {
        kinds.push(ann(kai.keys().next().copied().unwrap_or("gpu-fraction")));
    }
    if kinds.len() > 1 {
        return Err(ctx.invalid(
            kinds[1].clone(),
            kinds.join(" + "),
            format!("mixed GPU requests: {} together with {}", kinds[1], kinds[0]),
        ));
    }

    if !hami.is_empty() {
        if whole == 0 {
            let k = hami.keys().next().copied().unwrap_or("gpumem");
            return Err(ctx.invalid(
                field(&format!("nvidia.com/{k}")),
                hami[k].to_string(),
                "HAMi nvidia.com/gpumem, gpumem-percentage and gpucores need nvidia.com/gpu (the number of GPUs)",
            ));
        }
        if hami.contains_key("gpumem") && hami.contains_key("gpumem-percentage") {
            return Err(ctx.invalid(
                field("nvidia.com/gpumem-percentage"),
                hami["gpumem-percentage"].to_string(),
                "nvidia.com/gpumem and nvidia.com/gpumem-percentage contradict each other",
            ));
        }
        for k in ["gpucores", "gpumem-percentage"] {
            if let Some(&v) = hami.get(k) {
                if v > 100 {
                    return Err(ctx.invalid(
                        field(&format!("nvidia.com/{k}")),
                        v.to_string(),
                        "a percentage must be at most 100",
                    ));
                }
            }
        }
        let cores = hami.get("gpucores").copied().unwrap_or(0) as u32;
        return Ok((
            GpuDemand::Fraction {
                count: u32_of(field("nvidia.com/gpu"), whole)?,
                milli: cores * 10,
                memory_mib: hami.get("gpumem").copied().unwrap_or(0),
            },
            hami.get("gpumem-percentage").map(|&p| p as u32),
        ));
    }
    if !kai.is_empty() {
        let count = match kai.get("gpu-fraction-num-devices") {
            None => 1,
            Some(v) => v.trim().parse::<u32>().ok().filter(|&n| n > 0).ok_or_else(|| {
                ctx.invalid(ann("gpu-fraction-num-devices"), v.as_str(), "expected a positive integer")
            })?,
        };
        return match (kai.get("gpu-fraction"), kai.get("gpu-memory")) {
            (Some(_), Some(m)) => Err(ctx.invalid(
                ann("gpu-memory"),
                m.as_str(),
                "gpu-fraction and gpu-memory contradict each other",
            )),
            (Some(f), None) => {
                let milli = quantity::Quantity::parse(f)
                    .and_then(|q| q.scaled_ceil(3))
                    .ok()
                    .filter(|m| (1..=1000).contains(m))
                    .ok_or_else(|| {
                        ctx.invalid(ann("gpu-fraction"), f.as_str(), "expected a fraction in (0, 1]")
                    })?;
                Ok((GpuDemand::Fraction { count, milli: milli as u32, memory_mib: 0 }, None))
            }
            (None, Some(m)) => {
                let mib = m.trim().parse::<u64>().ok().filter(|&v| v > 0).ok_or_else(|| {
                    ctx.invalid(ann("gpu-memory"), m.as_str(), "expected a positive number of MiB")
                })?;
                Ok((GpuDemand::Fraction { count, milli: 0, memory_mib: mib }, None))
            }
            (None, None) => Err(ctx.invalid(
                ann("gpu-fraction-num-devices"),
                kai["gpu-fraction-num-devices"].as_str(),
                "gpu-fraction-num-devices needs gpu-fraction or gpu-memory",
            )),
        };
    }
    let demand = if whole > 0 {
        GpuDemand::Whole { count: u32_of(field("nvidia.com/gpu"), whole)? }
    } else if shared > 0 {
        GpuDemand::Shared { count: u32_of(field("nvidia.com/gpu.shared"), shared)? }
    } else if let Some((profile, n)) = mig.into_iter().next() {
        let f = field(&format!("nvidia.com/mig-{profile}"));
        GpuDemand::Mig { count: u32_of(f, n)?, profile }
    } else {
        GpuDemand::None
    };
    Ok((demand, None))
}

fn selector_operator(ctx: &ObjCtx<'_>, field: &str, op: &str) -> Result<SelectorOperator, SnapshotError> {
    Ok(match op {
        "In" => SelectorOperator::In,
        "NotIn" => SelectorOperator::NotIn,
        "Exists" => SelectorOperator::Exists,
        "DoesNotExist" => SelectorOperator::DoesNotExist,
        "Gt" => SelectorOperator::Gt,
        "Lt" => SelectorOperator::Lt,
        other => return Err(ctx.invalid(field, other, "unknown selector operator")),
    })
}

/// A label selector, with `matchLabelKeys` (`In` the pod's own value) and `mismatchLabelKeys`
/// (`NotIn` it) merged in, as kube-scheduler merges them; `None` selects nothing.
fn label_selector(
    ctx: &ObjCtx<'_>,
    field: &str,
    selector: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    match_keys: &[String],
    mismatch_keys: &[String],
    own: &BTreeMap<String, String>,
) -> Result<Option<LabelSelector>, SnapshotError> {
    let Some(sel) = selector else { return Ok(None) };
    let mut out = super::policy::label_selector(ctx, field, sel)?;
    for (keys, operator) in [(match_keys, SelectorOperator::In), (mismatch_keys, SelectorOperator::NotIn)] {
        for k in keys {
            if let Some(v) = own.get(k) {
                out.match_expressions.push(NodeSelectorRequirement {
                    key: k.clone(),
                    operator,
                    values: vec![v.clone()],
                });
            }
        }
    }
    Ok(Some(out))
}

/// Required pod affinity and anti-affinity terms. Namespaces: the listed ones, the pod's own when
/// neither a list nor a `namespaceSelector` is given, every namespace for an empty selector or one
/// on `kubernetes.io/metadata.name` (evaluated); other namespace selectors need namespace labels a
/// snapshot lacks, so they count every namespace, with a warning.
fn pod_affinity_terms(
    ctx: &ObjCtx<'_>,
    field: &str,
    terms: Option<&Vec<k8s::PodAffinityTerm>>,
    namespace: &str,
    own: &BTreeMap<String, String>,
    warnings: &mut Vec<String>,
) -> Result<Vec<PodAffinityTerm>, SnapshotError> {
    let mut out = Vec::new();
    for (i, t) in terms.into_iter().flatten().enumerate() {
        let f = format!("{field}[{i}]");
        let Some(selector) = label_selector(
            ctx,
            &format!("{f}.labelSelector"),
            t.label_selector.as_ref(),
            t.match_label_keys.as_deref().unwrap_or_default(),
            t.mismatch_label_keys.as_deref().unwrap_or_default(),
            own,
        )?
        else {
            continue; // a term without a selector selects no pod
        };
        let mut namespaces = t.namespaces.clone().unwrap_or_default();
        match &t.namespace_selector {
            None if namespaces.is_empty() => namespaces.push(namespace.to_string()),
            None => {}
            Some(ns) => {
                let by_name = ns.match_expressions.is_none()
                    && ns
                        .match_labels
                        .as_ref()
                        .is_some_and(|m| m.len() == 1 && m.contains_key("kubernetes.io/metadata.name"));
                if by_name {
                    namespaces.extend(ns.match_labels.as_ref().unwrap().values().cloned());
                } else if ns.match_labels.as_ref().is_some_and(|m| !m.is_empty())
                    || ns.match_expressions.as_ref().is_some_and(|e| !e.is_empty())
                {
                    warnings.push(ctx.warning(format!(
                        "{f}.namespaceSelector needs namespace labels the snapshot does not have; counting every namespace"
                    )));
                    namespaces.clear();
                } else {
                    namespaces.clear(); // `{}`: every namespace
                }
            }
        }
        out.push(PodAffinityTerm { selector, namespaces, topology_key: t.topology_key.clone() });
    }
    Ok(out)
}

/// Topology spread constraints whose `whenUnsatisfiable` is `when` (`DoNotSchedule` ones
/// filter, `ScheduleAnyway` ones only score).
fn spread_constraints(
    ctx: &ObjCtx<'_>,
    spec: &k8s::PodSpec,
    own: &BTreeMap<String, String>,
    when: &str,
) -> Result<Vec<SpreadConstraint>, SnapshotError> {
    let mut out = Vec::new();
    for (i, c) in spec.topology_spread_constraints.iter().flatten().enumerate() {
        if c.when_unsatisfiable != when {
            continue;
        }
        let f = format!("spec.topologySpreadConstraints[{i}]");
        let selector = label_selector(
            ctx,
            &format!("{f}.labelSelector"),
            c.label_selector.as_ref(),
            c.match_label_keys.as_deref().unwrap_or_default(),
            &[],
            own,
        )?
        .unwrap_or(LabelSelector {
            // No selector counts no pods: the constraint is met everywhere.
            match_labels: BTreeMap::from([("gpuscale.io/no-pod-has-this".to_string(), String::new())]),
            match_expressions: Vec::new(),
        });
        let max_skew = u32::try_from(c.max_skew).ok().filter(|s| *s > 0).ok_or_else(|| {
            ctx.invalid(format!("{f}.maxSkew"), c.max_skew.to_string(), "must be a positive integer")
        })?;
        out.push(SpreadConstraint {
            max_skew,
            topology_key: c.topology_key.clone(),
            selector,
            min_domains: c.min_domains.and_then(|m| u32::try_from(m).ok()).unwrap_or(1).max(1),
            honor_node_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
            honor_node_taints: c.node_taints_policy.as_deref() == Some("Honor"),
        });
    }
    Ok(out)
}

fn affinity_terms(
    ctx: &ObjCtx<'_>,
    spec: &k8s::PodSpec,
    warnings: &mut Vec<String>,
) -> Result<Vec<Vec<NodeSelectorRequirement>>, SnapshotError> {
    let Some(required) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
    else {
        return Ok(Vec::new());
    };
    node_selector_terms(
        ctx,
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
        required,
        warnings,
    )
}

/// A pod's preferred node-affinity terms with their weights (terms of weight 0 or with no
/// requirement score nothing, as in kube-scheduler, and are left out).
fn preferred_node_affinity(
    ctx: &ObjCtx<'_>,
    spec: &k8s::PodSpec,
    warnings: &mut Vec<String>,
) -> Result<Vec<(u32, Vec<NodeSelectorRequirement>)>, SnapshotError> {
    let preferred = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.preferred_during_scheduling_ignored_during_execution.as_ref());
    let mut out = Vec::new();
    for (i, p) in preferred.into_iter().flatten().enumerate() {
        let base = format!("spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[{i}]");
        let weight = u32::try_from(p.weight)
            .ok()
            .filter(|w| (1..=100).contains(w))
            .ok_or_else(|| ctx.invalid(format!("{base}.weight"), p.weight.to_string(), "must be 1 to 100"))?;
        let reqs = node_selector_term(ctx, &format!("{base}.preference"), &p.preference, warnings)?;
        if !reqs.is_empty() {
            out.push((weight, reqs));
        }
    }
    Ok(out)
}

/// A NodeSelector's terms (a pod's required node affinity, a PersistentVolume's node affinity)
/// as requirements on node labels; `matchFields` on `metadata.name` become hostname ones.
pub(crate) fn node_selector_terms(
    ctx: &ObjCtx<'_>,
    base: &str,
    required: &k8s::NodeSelector,
    warnings: &mut Vec<String>,
) -> Result<Vec<Vec<NodeSelectorRequirement>>, SnapshotError> {
    let mut terms = Vec::new();
    for (t, term) in required.node_selector_terms.iter().enumerate() {
        let reqs = node_selector_term(ctx, &format!("{base}.nodeSelectorTerms[{t}]"), term, warnings)?;
        if reqs.is_empty() {
            // An empty term matches no node in Kubernetes; dropping it keeps the other terms.
            warnings
                .push(ctx.warning(format!("node affinity term {t} is empty and matches no node; ignored")));
            continue;
        }
        terms.push(reqs);
    }
    Ok(terms)
}

/// One node selector term (at `base`) as requirements on node labels.
fn node_selector_term(
    ctx: &ObjCtx<'_>,
    base: &str,
    term: &k8s::NodeSelectorTerm,
    warnings: &mut Vec<String>,
) -> Result<Vec<NodeSelectorRequirement>, SnapshotError> {
    let mut reqs = Vec::new();
    for (i, e) in term.match_expressions.iter().flatten().enumerate() {
        let f = format!("{base}.matchExpressions[{i}].operator");
        reqs.push(NodeSelectorRequirement {
            key: e.key.clone(),
            operator: selector_operator(ctx, &f, &e.operator)?,
            values: e.values.clone().unwrap_or_default(),
        });
    }
    for (i, e) in term.match_fields.iter().flatten().enumerate() {
        if e.key == "metadata.name" {
            // DaemonSet pods and local volumes pin by node name; nodes carry it as hostname label.
            let f = format!("{base}.matchFields[{i}].operator");
            reqs.push(NodeSelectorRequirement {
                key: crate::model::HOSTNAME_LABEL.into(),
                operator: selector_operator(ctx, &f, &e.operator)?,
                values: e.values.clone().unwrap_or_default(),
            });
        } else {
            warnings.push(ctx.warning(format!(
                "ignoring node affinity on field {} (only metadata.name is supported)",
                e.key
            )));
        }
    }
    Ok(reqs)
}

fn tolerations(ctx: &ObjCtx<'_>, spec: &k8s::PodSpec) -> Result<Vec<Toleration>, SnapshotError> {
    spec.tolerations
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, t)| {
            let operator = match t.operator.as_deref() {
                None | Some("") | Some("Equal") => TolerationOperator::Equal,
                Some("Exists") => TolerationOperator::Exists,
                Some(other) => {
                    return Err(ctx.invalid(
                        format!("spec.tolerations[{i}].operator"),
                        other,
                        "expected Equal or Exists",
                    ))
                }
            };
            let effect = match t.effect.as_deref() {
                None | Some("") => None,
                Some("NoSchedule") => Some(TaintEffect::NoSchedule),
                Some("PreferNoSchedule") => Some(TaintEffect::PreferNoSchedule),
                Some("NoExecute") => Some(TaintEffect::NoExecute),
                Some(other) => {
                    return Err(ctx.invalid(
                        format!("spec.tolerations[{i}].effect"),
                        other,
                        "expected NoSchedule, PreferNoSchedule or NoExecute",
                    ))
                }
            };
            Ok(Toleration {
                key: t.key.clone().unwrap_or_default(),
                operator,
                value: t.value.clone().unwrap_or_default(),
                effect,
            })
        })
        .collect()
}

fn owner_kind(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> OwnerKind {
    let refs = meta.owner_references.as_deref().unwrap_or_default();
    let owner = refs.iter().find(|r| r.controller == Some(true)).or_else(|| refs.first());
    match owner.map(|r| r.kind.as_str()) {
        None => OwnerKind::None,
        Some("ReplicaSet") => OwnerKind::ReplicaSet,
        Some("StatefulSet") => OwnerKind::StatefulSet,
        Some("Job") => OwnerKind::Job,
        Some("DaemonSet") => OwnerKind::DaemonSet,
        Some("Node") => OwnerKind::Node,
        Some(other) => OwnerKind::Other(other.to_string()),
    }
}

/// The host ports of the pod's containers and sidecars (restartable init containers), as
/// kube-scheduler's NodePorts filter collects them.
fn host_ports(spec: &k8s::PodSpec) -> Vec<crate::model::HostPort> {
    let sidecars =
        spec.init_containers.iter().flatten().filter(|c| c.restart_policy.as_deref() == Some("Always"));
    spec.containers
        .iter()
        .chain(sidecars)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = u16::try_from(p.host_port?).ok().filter(|p| *p > 0)?;
            Some(crate::model::HostPort {
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                ip: p.host_ip.clone().unwrap_or_default(),
                port,
            })
        })
        .collect()
}

/// Gang name (without namespace) and its own size hint, from the conventions of the
/// coscheduling plugin, Volcano, LeaderWorkerSet, JobSet and Kubeflow, in that order.
fn gang_of(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Option<(String, Option<u32>)> {
    if let Some(g) = labels.get("scheduling.x-k8s.io/pod-group") {
        return Some((g.clone(), None));
    }
    if let Some(g) = annotations.get("scheduling.k8s.io/group-name") {
        return Some((g.clone(), None));
    }
    if let Some(name) = labels.get("leaderworkerset.sigs.k8s.io/name") {
        let index = labels
            .get("leaderworkerset.sigs.k8s.io/group-index")
            .map_or_else(String::new, |i| format!("-{i}"));
        let size = annotations.get("leaderworkerset.sigs.k8s.io/size").and_then(|s| s.parse().ok());
        return Some((format!("{name}{index}"), size));
    }
    if let Some(name) = labels.get("jobset.sigs.k8s.io/jobset-name") {
        return Some((name.clone(), None));
    }
    labels.get("training.kubeflow.org/job-name").map(|name| (name.clone(), None))
}

/// GPU models accepted through HAMi's `nvidia.com/use-gputype` (substring match, as HAMi does).
fn use_gpu_types(value: &str) -> Vec<String> {
    let mut models = Vec::new();
    for token in value.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let t = token.to_ascii_uppercase();
        for m in GpuCatalog.models() {
            let hit = m.name.to_ascii_uppercase().contains(&t)
                || m.aliases.iter().any(|a| a.to_ascii_uppercase().contains(&t));
            if hit && !models.iter().any(|x: &String| x == m.name) {
                models.push(m.name.to_string());
            }
        }
    }
    models
}

/// Why a pending pod is not demand although it waits: kube-scheduler does not try a pod with
/// scheduling gates until every gate is removed (Kueue gates the pods it has not admitted yet),
/// nor one being deleted (`skipPodSchedule`); scaling for either would buy nodes nobody
/// schedules onto, as Cluster Autoscaler and Karpenter also hold. `None` for bound pods.
fn not_schedulable_yet(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    spec: &k8s::PodSpec,
) -> Option<String> {
    if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        return None;
    }
    if let Some(gates) = spec.scheduling_gates.as_deref().filter(|g| !g.is_empty()) {
        let names: Vec<&str> = gates.iter().map(|g| g.name.as_str()).collect();
        return Some(format!(
            "scheduling gated ({}): kube-scheduler leaves it until its gates are removed",
            names.join(", ")
        ));
    }
    meta.deletion_timestamp.as_ref().map(|_| {
        "being deleted (metadata.deletionTimestamp is set): kube-scheduler does not schedule it".into()
    })
}

/// Cluster Autoscaler's pod annotation: `"true"` lets a pod go despite local storage or
/// `kube-system`, `"false"` keeps its node.
const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";

/// The pod's volumes whose data an eviction loses (`hostPath`, an `emptyDir` not in memory), less
/// those `cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes` lists (comma-separated).
fn local_storage(spec: &k8s::PodSpec, annotations: &BTreeMap<String, String>) -> Vec<String> {
    let listed: Vec<&str> = annotations
        .get("cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes")
        .map(|v| v.split(',').map(str::trim).collect())
        .unwrap_or_default();
    spec.volumes
        .iter()
        .flatten()
        .filter(|v| {
            v.host_path.is_some()
                || v.empty_dir.as_ref().is_some_and(|e| e.medium.as_deref() != Some("Memory"))
        })
        .filter(|v| !listed.contains(&v.name.as_str()))
        .map(|v| v.name.clone())
        .collect()
}

/// Converts a Pod; `None` for pods that no longer need resources (Succeeded, Failed).
/// `pod_groups` maps `namespace/name` of PodGroup objects to their `minMember`.
pub fn convert_pod(
    k: &k8s::Pod,
    origin: &str,
    pod_groups: &BTreeMap<String, u32>,
    warnings: &mut Vec<String>,
) -> Result<Option<ConvertedPod>, SnapshotError> {
    let meta = &k.metadata;
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let name = meta.name.clone().unwrap_or_default();
    let ctx = ObjCtx { origin, object: format!("Pod {namespace}/{name}") };
    if name.is_empty() {
        return Err(ctx.invalid("metadata.name", "", "a pod needs a name"));
    }
    super::validation::check_meta(&ctx, meta, true, warnings);
    let bound = k.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    match k.status.as_ref().and_then(|s| s.phase.as_deref()) {
        None | Some("Pending" | "Running") => {}
        Some("Succeeded" | "Failed") => return Ok(None),
        // The kubelet of its node stopped reporting: the pod may still run there, so it holds its
        // room, a drain waits for it and scale-down moves it.
        Some("Unknown") if bound => {}
        Some(other) => {
            warnings.push(ctx.warning(format!("phase {other}; skipped")));
            return Ok(None);
        }
    }
    let Some(spec) = k.spec.as_ref() else {
        return Err(ctx.invalid("spec", "missing or null", "a Pod needs a spec"));
    };
    if spec.containers.is_empty() {
        return Err(ctx.invalid("spec.containers", "[]", "a Pod needs at least one container"));
    }
    if k.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && spec.node_name.as_deref().unwrap_or_default().is_empty()
    {
        return Err(ctx.invalid(
            "spec.nodeName",
            "",
            "a Running pod is bound to a node; this one names none",
        ));
    }
    let labels = meta.labels.clone().unwrap_or_default();
    let annotations = meta.annotations.clone().unwrap_or_default();

    let requests = effective_requests(&ctx, spec)?;
    let (gpu, gpumem_percentage) = gpu_demand(&ctx, &requests, &annotations)?;
    let amount = |k: &str| requests.amounts.get(k).copied().unwrap_or(0);

    let is = |k: &str, v: &str| annotations.get(k).is_some_and(|x| x.eq_ignore_ascii_case(v));
    let eviction_blocked = if is("karpenter.sh/do-not-disrupt", "true") {
        Some("karpenter.sh/do-not-disrupt=true".to_string())
    } else if is(SAFE_TO_EVICT, "false") {
        Some("cluster-autoscaler.kubernetes.io/safe-to-evict=false".to_string())
    } else {
        None
    };

    let local_storage = local_storage(spec, &annotations);

    let (gang, gang_min_members) = match gang_of(&labels, &annotations) {
        Some((g, size)) => {
            let id = format!("{namespace}/{g}");
            let min = pod_groups.get(&id).copied().or(size);
            (Some(id), min)
        }
        None => (None, None),
    };
    let tenant = labels
        .get("gpuscale.io/tenant")
        .or_else(|| labels.get("kueue.x-k8s.io/queue-name"))
        .cloned()
        .unwrap_or_else(|| namespace.clone());
    let gpu_uuids = annotations
        .get(HAMI_ALLOCATED)
        .map(|v| {
            v.split([';', ':'])
                .filter_map(|d| d.split(',').next())
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();

    let labels_for_terms = labels.clone();
    let pod_affinity = spec.affinity.as_ref().and_then(|a| a.pod_affinity.as_ref());
    let anti_affinity = pod_affinity_terms(
        &ctx,
        "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution",
        spec.affinity
            .as_ref()
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()),
        &namespace,
        &labels,
        warnings,
    )?;
    let workload = Workload {
        id: format!("{namespace}/{name}"),
        requests: Resources { cpu_milli: amount("cpu"), memory_bytes: amount("memory") },
        gpu,
        gpu_models: annotations.get("nvidia.com/use-gputype").map(|v| use_gpu_types(v)).unwrap_or_default(),
        priority: spec.priority.unwrap_or(0),
        tenant: Some(tenant),
        gang,
        node_selector: spec.node_selector.clone().unwrap_or_default(),
        affinity_terms: affinity_terms(&ctx, spec, warnings)?,
        tolerations: tolerations(&ctx, spec)?,
        node_name: spec.node_name.clone().filter(|n| !n.is_empty()),
        labels,
        owner: owner_kind(meta),
        eviction_blocked,
        safe_to_evict: is(SAFE_TO_EVICT, "true"),
        local_storage,
        gang_min_members,
        scheduler: spec.scheduler_name.clone().filter(|s| s != crate::model::DEFAULT_SCHEDULER),
        volumes: Vec::new(),
        volume_blocked: not_schedulable_yet(meta, spec),
        dra_claims: Vec::new(),
        gang_topology_key: annotations
            .get("gpuscale.io/gang-topology")
            .or_else(|| annotations.get("kueue.x-k8s.io/podset-required-topology"))
            .cloned(),
        created_at: meta.creation_timestamp.as_ref().map(|t| t.0.as_second()),
        devices: None,
        reclaim_idle: is("gpuscale.io/reclaim-idle", "true"),
        extended: requests
            .amounts
            .iter()
            .filter(|(k, v)| **v > 0 && is_other_resource(k))
            .map(|(k, v)| (k.clone(), *v))
            .collect(),
        host_ports: host_ports(spec),
        pod_affinity: pod_affinity_terms(
            &ctx,
            "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution",
            pod_affinity.and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()),
            &namespace,
            &labels_for_terms,
            warnings,
        )?,
        spread: spread_constraints(&ctx, spec, &labels_for_terms, "DoNotSchedule")?,
        preferences: Preferences {
            node_affinity: preferred_node_affinity(&ctx, spec, warnings)?,
            spread: spread_constraints(&ctx, spec, &labels_for_terms, "ScheduleAnyway")?,
        },
        identity: Some(std::sync::Arc::new(PodIdentity {
            namespace: namespace.clone(),
            labels: labels_for_terms.clone(),
            anti_affinity,
        })),
        consumes: annotations
            .get(crate::model::provisioning::CONSUME_ANNOTATION)
            .or_else(|| annotations.get(crate::model::provisioning::CONSUME_ANNOTATION_LEGACY))
            .map(|r| format!("{namespace}/{r}")),
        terminating: meta.deletion_timestamp.is_some(),
        nominated_node: k
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.clone())
            .filter(|n| !n.is_empty()),
    };
    Ok(Some(ConvertedPod { workload, gpu_uuids, gpumem_percentage }))
}
