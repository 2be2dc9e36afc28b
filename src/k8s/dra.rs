//! DRA objects (`resource.k8s.io/v1`) into the model: ResourceSlices become the devices of the
//! nodes they reach, allocated ResourceClaims take their devices, and each pod's
//! `spec.resourceClaims` become the claims it needs (generated from templates per pod, named ones
//! shared by every pod naming them), with the DeviceClass selectors folded into each request.
//!
//! Pool handling follows kube-scheduler's `GatherPools`: only the slices of a pool's newest
//! generation count; a pool that repeats a device name is invalid and offers nothing. Bad input
//! names the object and field: selectors that do not compile and malformed slices are errors;
//! a missing class, claim or template blocks the pod with kube-scheduler's reason and a warning.

use super::error::{ObjCtx, SnapshotError};
use super::ConvertedNode;
use crate::model::cel::{parse_quantity_nanos, AttrValue, Program, Semver};
use crate::model::dra::{
    counter_key, AllocationMode, ClaimHold, DeviceSelector, DraClaim, DraDevice, DraRequest, MatchAttribute,
    SubRequest, NVIDIA_GPU_DRIVER,
};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::resource::v1 as resource;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A pod's DRA references, kept from its decoding until every claim and template is known.
#[derive(Debug, Clone)]
pub(super) struct PodClaims {
    namespace: String,
    name: String,
    claims: Vec<core::PodResourceClaim>,
    /// `status.resourceClaimStatuses`: pod claim name → generated claim name.
    generated: BTreeMap<String, Option<String>>,
    /// `(field, claim name)` of every container's `resources.claims`.
    container_refs: Vec<(String, String)>,
}

impl PodClaims {
    /// The pod's references, `None` when it has none.
    pub fn of(pod: &core::Pod) -> Option<PodClaims> {
        let spec = pod.spec.as_ref()?;
        let claims = spec.resource_claims.clone().unwrap_or_default();
        if claims.is_empty() {
            return None;
        }
        let generated = pod
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref())
            .into_iter()
            .flatten()
            .map(|s| (s.name.clone(), s.resource_claim_name.clone()))
            .collect();
        let mut container_refs = Vec::new();
        for (kind, list) in
            [("containers", Some(&spec.containers)), ("initContainers", spec.init_containers.as_ref())]
        {
            for (c, container) in list.into_iter().flatten().enumerate() {
                let refs = container.resources.as_ref().and_then(|r| r.claims.as_ref());
                for (i, r) in refs.into_iter().flatten().enumerate() {
                    container_refs
                        .push((format!("spec.{kind}[{c}].resources.claims[{i}].name"), r.name.clone()));
                }
            }
        }
        Some(PodClaims {
            namespace: pod.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            name: pod.metadata.name.clone().unwrap_or_default(),
            claims,
            generated,
            container_refs,
        })
    }
}

/// A device and the nodes it reaches, with its pool's shared counters.
type Placed = (Vec<usize>, DraDevice, Vec<(String, i128)>);

/// One way to serve a request as the API writes it: field path, name, class, allocation mode,
/// count, selectors.
type Alternative<'a> =
    (String, String, &'a str, Option<&'a String>, Option<i64>, Option<&'a Vec<resource::DeviceSelector>>);

/// The DRA objects of a snapshot.
#[derive(Default)]
pub(super) struct Dra {
    /// DeviceClasses by name: their compiled selectors.
    classes: BTreeMap<String, Vec<DeviceSelector>>,
    slices: Vec<(String, Box<resource::ResourceSlice>)>,
    /// ResourceClaims by `namespace/name`.
    claims: BTreeMap<String, (String, Box<resource::ResourceClaim>)>,
    /// ResourceClaimTemplates by `namespace/name`.
    templates: BTreeMap<String, (String, Box<resource::ResourceClaimTemplate>)>,
    /// Every device published, for the "nothing matches" check.
    all_devices: Vec<DraDevice>,
    /// Where each claim is allocated, by claim key: its node, if bound to one.
    allocated_on: BTreeMap<String, Option<String>>,
    /// Selector runtime errors already reported, by selector origin.
    reported: BTreeSet<String>,
}

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!("{}/{}", meta.namespace.as_deref().unwrap_or("default"), meta.name.as_deref().unwrap_or_default())
}

/// The GPU sharing strategy NVIDIA's driver is configured with in a claim's opaque config
/// (`GpuConfig`/`MigDeviceConfig` `sharing.strategy`: `TimeSlicing` or `MPS`). Another strategy
/// is warned about and ignored: the driver would refuse the claim at prepare time.
fn sharing_of(
    ctx: &ObjCtx<'_>,
    base: &str,
    spec: &resource::ResourceClaimSpec,
    warnings: &mut Vec<String>,
) -> Option<String> {
    let configs = spec.devices.as_ref().and_then(|d| d.config.as_ref());
    let mut out = None;
    for (i, c) in configs.into_iter().flatten().enumerate() {
        let Some(opaque) = c.opaque.as_ref().filter(|o| o.driver == NVIDIA_GPU_DRIVER) else { continue };
        let params = &opaque.parameters.0;
        if !matches!(params["kind"].as_str(), Some("GpuConfig" | "MigDeviceConfig")) {
            continue;
        }
        match params["sharing"]["strategy"].as_str() {
            None => {}
            Some(s @ ("TimeSlicing" | "MPS")) => out = Some(s.to_string()),
            Some(other) => warnings.push(ctx.warning(format!(
                "{base}.config[{i}].opaque.parameters.sharing.strategy: {other:?} is not a sharing strategy of {NVIDIA_GPU_DRIVER} (TimeSlicing, MPS); ignored"
            ))),
        }
    }
    out
}

/// Compiles `selectors[]` at `base`: an expression that does not compile is an error naming it.
fn selectors(
    ctx: &ObjCtx<'_>,
    base: &str,
    list: Option<&Vec<resource::DeviceSelector>>,
) -> Result<Vec<DeviceSelector>, SnapshotError> {
    let mut out = Vec::new();
    for (i, s) in list.into_iter().flatten().enumerate() {
        let field = format!("{base}.selectors[{i}].cel.expression");
        let Some(cel) = &s.cel else {
            return Err(ctx.invalid(
                format!("{base}.selectors[{i}]"),
                "",
                "a selector without `cel` (not supported)",
            ));
        };
        let program = Program::compile(&cel.expression).map_err(|e| {
            ctx.invalid(
                &field,
                super::bounds::preview(&cel.expression),
                format!("CEL expression not supported: {e}"),
            )
        })?;
        out.push(DeviceSelector { program, origin: format!("{} {field}", ctx.object) });
    }
    Ok(out)
}

impl Dra {
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
            && self.slices.is_empty()
            && self.claims.is_empty()
            && self.templates.is_empty()
    }

    pub fn add_class(&mut self, origin: &str, k: resource::DeviceClass) -> Result<(), SnapshotError> {
        let name = k.metadata.name.clone().unwrap_or_default();
        let ctx = ObjCtx { origin, object: format!("DeviceClass {name}") };
        let compiled = selectors(&ctx, "spec", k.spec.as_ref().and_then(|s| s.selectors.as_ref()))?;
        self.classes.insert(name, compiled);
        Ok(())
    }

    pub fn add_slice(&mut self, origin: &str, k: resource::ResourceSlice) {
        self.slices.push((origin.to_string(), Box::new(k)));
    }

    pub fn add_claim(&mut self, origin: &str, k: resource::ResourceClaim) {
        self.claims.insert(key_of(&k.metadata), (origin.to_string(), Box::new(k)));
    }

    pub fn add_template(&mut self, origin: &str, k: resource::ResourceClaimTemplate) {
        self.templates.insert(key_of(&k.metadata), (origin.to_string(), Box::new(k)));
    }

    /// Gives each node the devices of the slices that reach it and the claims allocated there;
    /// a Ready node waiting only for a device plugin that publishes GPUs through DRA is Ready.
    pub fn supply(
        &mut self,
        nodes: &mut [ConvertedNode],
        warnings: &mut Vec<String>,
    ) -> Result<(), SnapshotError> {
        // Pools: only the newest generation's slices count (GatherPools).
        let mut newest: BTreeMap<(String, String), i64> = BTreeMap::new();
        for (_, s) in &self.slices {
            let g = newest.entry((s.spec.driver.clone(), s.spec.pool.name.clone())).or_insert(i64::MIN);
            *g = (*g).max(s.spec.pool.generation);
        }
        let mut order: Vec<usize> = (0..self.slices.len())
            .filter(|&i| {
                let s = &self.slices[i].1.spec;
                newest.get(&(s.driver.clone(), s.pool.name.clone())) == Some(&s.pool.generation)
            })
            .collect();
        order.sort_by(|&a, &b| {
            let (sa, sb) = (&self.slices[a].1, &self.slices[b].1);
            (&sa.spec.driver, &sa.spec.pool.name, &sa.metadata.name).cmp(&(
                &sb.spec.driver,
                &sb.spec.pool.name,
                &sb.metadata.name,
            ))
        });
        let by_name: HashMap<String, usize> =
            nodes.iter().enumerate().map(|(i, n)| (n.node.name.clone(), i)).collect();
        let mut seen: BTreeMap<(String, String), (BTreeSet<String>, i64)> = BTreeMap::new();
        let mut invalid: BTreeSet<(String, String)> = BTreeSet::new();
        let mut placed: Vec<Placed> = Vec::new();
        for &si in &order {
            let (origin, slice) = &self.slices[si];
            let spec = &slice.spec;
            let ctx = ObjCtx {
                origin,
                object: format!("ResourceSlice {}", slice.metadata.name.as_deref().unwrap_or_default()),
            };
            if spec.driver.is_empty() {
                return Err(ctx.invalid("spec.driver", "", "a ResourceSlice needs a driver"));
            }
            if spec.pool.name.is_empty() {
                return Err(ctx.invalid("spec.pool.name", "", "a ResourceSlice needs a pool name"));
            }
            let pool = (spec.driver.clone(), spec.pool.name.clone());
            let entry = seen.entry(pool.clone()).or_insert_with(|| (BTreeSet::new(), 0));
            entry.1 += 1;
            let per_device = spec.per_device_node_selection == Some(true);
            let slice_nodes = if per_device {
                None
            } else {
                Some(reach(
                    &ctx,
                    "spec",
                    spec.node_name.as_ref(),
                    spec.node_selector.as_ref(),
                    spec.all_nodes,
                    nodes,
                    &by_name,
                    warnings,
                )?)
            };
            let counters: Vec<(String, i128)> = spec
                .shared_counters
                .iter()
                .flatten()
                .enumerate()
                .flat_map(|(i, set)| set.counters.iter().map(move |(c, v)| (i, set, c, v)))
                .map(|(i, set, c, v)| {
                    let field = format!("spec.sharedCounters[{i}].counters[{c}].value");
                    let q = parse_quantity_nanos(&v.value.0)
                        .ok_or_else(|| ctx.invalid(&field, &v.value.0, "not a quantity"))?;
                    Ok((counter_key(&spec.driver, &spec.pool.name, &set.name, c), q))
                })
                .collect::<Result<_, SnapshotError>>()?;
            for (di, d) in spec.devices.iter().flatten().enumerate() {
                let base = format!("spec.devices[{di}]");
                if !entry.0.insert(d.name.clone()) {
                    warnings.push(ctx.warning(format!(
                        "{base}.name: device {} appears twice in pool {}/{}; the pool is invalid and offers no device (as kube-scheduler)",
                        d.name, pool.0, pool.1
                    )));
                    invalid.insert(pool.clone());
                }
                let targets = match &slice_nodes {
                    Some(t) => t.clone(),
                    None => reach(
                        &ctx,
                        &base,
                        d.node_name.as_ref(),
                        d.node_selector.as_ref(),
                        d.all_nodes,
                        nodes,
                        &by_name,
                        warnings,
                    )?,
                };
                let device = device(&ctx, &base, &spec.driver, &spec.pool.name, d)?;
                placed.push((targets, device, counters.clone()));
            }
        }
        for (pool, (_, count)) in &seen {
            let want = order
                .iter()
                .map(|&i| &self.slices[i].1.spec)
                .find(|s| (&s.driver, &s.pool.name) == (&pool.0, &pool.1));
            if let Some(s) = want.filter(|s| *count < s.pool.resource_slice_count) {
                warnings.push(format!(
                    "ResourceSlice pool {}/{} generation {}: {count} of {} slices in the snapshot; planned with the devices present",
                    pool.0, pool.1, s.pool.generation, s.pool.resource_slice_count
                ));
            }
        }
        // Devices by id, for the claims' allocations.
        let mut where_is: HashMap<String, Vec<(usize, u32)>> = HashMap::new();
        for (targets, device, counters) in placed {
            if invalid.contains(&(device.driver.clone(), device.pool.clone())) {
                continue;
            }
            for &n in &targets {
                let inv = &mut nodes[n].node.dra;
                for (k, v) in &counters {
                    inv.counters.insert(k.clone(), *v);
                }
                where_is.entry(device.id()).or_default().push((n, inv.devices.len() as u32));
                inv.devices.push(device.clone());
            }
            self.all_devices.push(device);
        }
        // Claims' allocations take their devices.
        for (key, (origin, claim)) in &self.claims {
            let Some(alloc) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
                continue;
            };
            let ctx = ObjCtx { origin, object: format!("ResourceClaim {key}") };
            let pinned = alloc.node_selector.as_ref().and_then(pinned_node);
            let mut holds: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
            for (i, r) in alloc.devices.iter().flat_map(|d| d.results.iter().flatten()).enumerate() {
                let id = format!("{}/{}/{}", r.driver, r.pool, r.device);
                match where_is.get(&id) {
                    Some(at) => at
                        .iter()
                        .filter(|(n, _)| pinned.as_ref().is_none_or(|p| p == &nodes[*n].node.name))
                        .for_each(|(n, d)| holds.entry(*n).or_default().push(*d)),
                    None => warnings.push(ctx.warning(format!(
                        "status.allocation.devices.results[{i}]: device {id} is in no ResourceSlice of the snapshot"
                    ))),
                }
            }
            for (n, devices) in holds {
                nodes[n].node.dra.claims.insert(key.clone(), ClaimHold { devices, users: 1, fixed: true });
            }
            self.allocated_on.insert(key.clone(), pinned);
        }
        for n in nodes.iter_mut() {
            let dra_gpus = n.node.dra.devices.iter().any(|d| d.is_gpu() || d.mig_profile().is_some());
            if dra_gpus && n.awaiting_device_plugin_only {
                // Its GPUs are published as DRA devices, not as `nvidia.com/gpu`: Ready, and no
                // device-plugin GPU for `nvidia.com/gpu` pods.
                n.node.state = crate::model::NodeState::Ready;
                n.node.lifecycle.gpus_held = None;
                n.node.gpus.clear();
            }
        }
        Ok(())
    }

    /// The claims a pod needs, or why it cannot be scheduled (a missing claim, template or
    /// class), in kube-scheduler's words.
    pub fn claims_for(
        &mut self,
        origin: &str,
        pod: &PodClaims,
        warnings: &mut Vec<String>,
    ) -> Result<Result<Vec<DraClaim>, String>, SnapshotError> {
        let ns = &pod.namespace;
        let ctx = ObjCtx { origin, object: format!("Pod {ns}/{}", pod.name) };
        let names: BTreeSet<&str> = pod.claims.iter().map(|c| c.name.as_str()).collect();
        for (field, name) in &pod.container_refs {
            if !names.contains(name.as_str()) {
                warnings.push(ctx.warning(format!("{field}: {name} is not in spec.resourceClaims")));
            }
        }
        let hint = if self.is_empty() {
            " (the snapshot has no resource.k8s.io objects: add resourceclaims,resourceclaimtemplates,resourceslices,deviceclasses to `kubectl get`)"
        } else {
            ""
        };
        let mut out = Vec::new();
        for (i, c) in pod.claims.iter().enumerate() {
            let blocked = |warnings: &mut Vec<String>, field: String, what: String| {
                warnings.push(ctx.warning(format!("{field}: {what}; the pod cannot be scheduled{hint}")));
                Ok(Err(what))
            };
            let generated = pod.generated.get(&c.name).cloned().flatten();
            let (key, spec, claim_ctx) = match (&c.resource_claim_name, &c.resource_claim_template_name) {
                (Some(n), _) => {
                    let key = format!("{ns}/{n}");
                    match self.claims.get(&key) {
                        Some((o, k)) => (
                            key.clone(),
                            k.spec.clone().unwrap_or_default(),
                            (o.clone(), format!("ResourceClaim {key}")),
                        ),
                        None => {
                            return blocked(
                                warnings,
                                format!("spec.resourceClaims[{i}].resourceClaimName"),
                                format!("resourceclaim \"{n}\" not found"),
                            )
                        }
                    }
                }
                (None, Some(t)) => {
                    let existing = generated
                        .as_ref()
                        .map(|g| format!("{ns}/{g}"))
                        .filter(|k| self.claims.contains_key(k));
                    match existing {
                        Some(key) => {
                            let (o, k) = &self.claims[&key];
                            (
                                key.clone(),
                                k.spec.clone().unwrap_or_default(),
                                (o.clone(), format!("ResourceClaim {key}")),
                            )
                        }
                        None => {
                            let tkey = format!("{ns}/{t}");
                            match self.templates.get(&tkey) {
                                // Not generated yet: the pod's own claim, shared with no one.
                                Some((o, k)) => (
                                    format!("{ns}/{}#{}", pod.name, c.name),
                                    k.spec.as_ref().and_then(|s| s.spec.clone()).unwrap_or_default(),
                                    (o.clone(), format!("ResourceClaimTemplate {tkey}")),
                                ),
                                None => {
                                    return blocked(
                                        warnings,
                                        format!("spec.resourceClaims[{i}].resourceClaimTemplateName"),
                                        format!("resourceclaimtemplate \"{t}\" not found"),
                                    )
                                }
                            }
                        }
                    }
                }
                (None, None) => {
                    warnings.push(ctx.warning(format!(
                        "spec.resourceClaims[{i}]: neither resourceClaimName nor resourceClaimTemplateName; ignored"
                    )));
                    continue;
                }
            };
            let base = if claim_ctx.1.starts_with("ResourceClaimTemplate") {
                "spec.spec.devices"
            } else {
                "spec.devices"
            };
            let cctx = ObjCtx { origin: &claim_ctx.0, object: claim_ctx.1.clone() };
            let requests = match self.requests(&cctx, base, &spec, warnings)? {
                Ok(r) => r,
                Err(what) => return blocked(warnings, format!("spec.resourceClaims[{i}]"), what),
            };
            let constraints = spec
                .devices
                .as_ref()
                .and_then(|d| d.constraints.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|c| {
                    c.match_attribute.as_ref().map(|a| MatchAttribute {
                        requests: c.requests.clone().unwrap_or_default(),
                        attribute: a.clone(),
                    })
                })
                .collect();
            let allocated_on = self.allocated_on.get(&key);
            out.push(DraClaim {
                key: key.clone(),
                allocated: allocated_on.is_some(),
                allocated_on: allocated_on.cloned().flatten(),
                requests,
                constraints,
                sharing: sharing_of(&cctx, base, &spec, warnings),
            });
        }
        Ok(Ok(out))
    }

    /// A claim's requests with their classes' selectors, or the missing class.
    fn requests(
        &mut self,
        ctx: &ObjCtx<'_>,
        base: &str,
        spec: &resource::ResourceClaimSpec,
        warnings: &mut Vec<String>,
    ) -> Result<Result<Vec<DraRequest>, String>, SnapshotError> {
        let mut out = Vec::new();
        for (ri, r) in spec.devices.iter().flat_map(|d| d.requests.iter().flatten()).enumerate() {
            let rbase = format!("{base}.requests[{ri}]");
            let mut alternatives = Vec::new();
            let subs: Vec<Alternative<'_>> = match (&r.exactly, &r.first_available) {
                (Some(e), _) => vec![(
                    format!("{rbase}.exactly"),
                    r.name.clone(),
                    e.device_class_name.as_str(),
                    e.allocation_mode.as_ref(),
                    e.count,
                    e.selectors.as_ref(),
                )],
                (None, Some(list)) => list
                    .iter()
                    .enumerate()
                    .map(|(si, s)| {
                        (
                            format!("{rbase}.firstAvailable[{si}]"),
                            s.name.clone(),
                            s.device_class_name.as_str(),
                            s.allocation_mode.as_ref(),
                            s.count,
                            s.selectors.as_ref(),
                        )
                    })
                    .collect(),
                (None, None) => {
                    return Err(ctx.invalid(&rbase, &r.name, "a request needs `exactly` or `firstAvailable`"))
                }
            };
            for (field, name, class, mode, count, own) in subs {
                let Some(class_selectors) = self.classes.get(class) else {
                    return Ok(Err(format!(
                        "resource class {class} does not exist ({} {field}.deviceClassName)",
                        ctx.object
                    )));
                };
                let mode = match mode.map(String::as_str) {
                    None | Some("ExactCount") => {
                        let n = count.unwrap_or(1);
                        let max = crate::limits::MAX_DEVICES_PER_CLAIM;
                        AllocationMode::ExactCount(
                            u32::try_from(n).ok().filter(|n| (1..=max).contains(n)).ok_or_else(|| {
                                ctx.invalid(
                                    format!("{field}.count"),
                                    n.to_string(),
                                    format!("a count between 1 and {max} (resource.k8s.io/v1 AllocationResultsMaxSize)"),
                                )
                            })?,
                        )
                    }
                    Some("All") => AllocationMode::All,
                    Some(other) => {
                        return Err(ctx.invalid(
                            format!("{field}.allocationMode"),
                            other,
                            "ExactCount or All",
                        ))
                    }
                };
                let mut sel = class_selectors.clone();
                sel.extend(selectors(ctx, &field, own)?);
                let sub = SubRequest { name, class: class.to_string(), selectors: sel, mode };
                self.check_selectors(&sub, warnings);
                alternatives.push(sub);
            }
            out.push(DraRequest { name: r.name.clone(), alternatives });
        }
        Ok(Ok(out))
    }

    /// Reports, once per selector, a runtime error on some published device (kube-scheduler
    /// fails a node where that happens; so does the plan, without the error it would be silent),
    /// and requests no published device matches (a class of a driver no slice publishes).
    fn check_selectors(&mut self, sub: &SubRequest, warnings: &mut Vec<String>) {
        for s in &sub.selectors {
            if self.reported.contains(&s.origin) {
                continue;
            }
            for d in &self.all_devices {
                if let Err(e) = s.program.matches(&d.view()) {
                    warnings.push(format!(
                        "{}: on device {}: CEL runtime error: {e}; that device's node is not used for it",
                        s.origin,
                        d.id()
                    ));
                    self.reported.insert(s.origin.clone());
                    break;
                }
            }
        }
        let origin =
            sub.selectors.last().map(|s| s.origin.clone()).unwrap_or_else(|| format!("class {}", sub.class));
        let key = format!("none-match {origin} {}", sub.class);
        if !self.all_devices.is_empty()
            && !self.reported.contains(&key)
            && !self.all_devices.iter().any(|d| sub.matches(d))
        {
            warnings.push(format!(
                "request {} (DeviceClass {}): no device of the snapshot's ResourceSlices matches (unknown driver or attribute?)",
                sub.name, sub.class
            ));
            self.reported.insert(key);
        }
    }
}

/// The node an allocation's node selector names (`metadata.name In [node]`), as the allocator
/// writes it for node-local devices.
fn pinned_node(sel: &core::NodeSelector) -> Option<String> {
    let term = sel.node_selector_terms.first()?;
    let f = term.match_fields.iter().flatten().find(|f| f.key == "metadata.name" && f.operator == "In")?;
    match f.values.as_deref() {
        Some([one]) => Some(one.clone()),
        _ => None,
    }
}

/// The nodes a slice (or a device of a per-device slice) reaches: exactly one of `nodeName`,
/// `nodeSelector`, `allNodes`.
#[allow(clippy::too_many_arguments)]
fn reach(
    ctx: &ObjCtx<'_>,
    base: &str,
    node_name: Option<&String>,
    selector: Option<&core::NodeSelector>,
    all: Option<bool>,
    nodes: &[ConvertedNode],
    by_name: &HashMap<String, usize>,
    warnings: &mut Vec<String>,
) -> Result<Vec<usize>, SnapshotError> {
    match (node_name, selector, all == Some(true)) {
        (Some(n), None, false) => Ok(match by_name.get(n) {
            Some(&i) => vec![i],
            None => {
                warnings.push(ctx.warning(format!(
                    "{base}.nodeName: Node {n} is not in the snapshot; its devices are not planned"
                )));
                vec![]
            }
        }),
        (None, Some(sel), false) => {
            let terms = super::pod::node_selector_terms(ctx, &format!("{base}.nodeSelector"), sel, warnings)?;
            Ok((0..nodes.len())
                .filter(|&i| {
                    let mut labels = nodes[i].node.labels.clone();
                    labels.insert(crate::model::HOSTNAME_LABEL.into(), nodes[i].node.name.clone());
                    terms.iter().any(|t| t.iter().all(|r| r.matches(&labels)))
                })
                .collect())
        }
        (None, None, true) => Ok((0..nodes.len()).collect()),
        _ => Err(ctx.invalid(
            base,
            format!(
                "nodeName={:?} nodeSelector={} allNodes={:?}",
                node_name,
                if selector.is_some() { "set" } else { "unset" },
                all
            ),
            "exactly one of nodeName, nodeSelector, allNodes (or perDeviceNodeSelection) must be set",
        )),
    }
}

/// A device of a slice, its attribute and capacity names qualified by the driver's domain.
fn device(
    ctx: &ObjCtx<'_>,
    base: &str,
    driver: &str,
    pool: &str,
    d: &resource::Device,
) -> Result<DraDevice, SnapshotError> {
    let qualify = |n: &str| if n.contains('/') { n.to_string() } else { format!("{driver}/{n}") };
    let mut attributes = BTreeMap::new();
    for (name, a) in d.attributes.iter().flatten() {
        let field = format!("{base}.attributes[{name}]");
        let value = match (a.bool, a.int, &a.string, &a.version) {
            (Some(b), None, None, None) => AttrValue::Bool(b),
            (None, Some(i), None, None) => AttrValue::Int(i),
            (None, None, Some(s), None) => AttrValue::Str(s.clone()),
            (None, None, None, Some(v)) => AttrValue::Version(
                Semver::parse(v)
                    .ok_or_else(|| ctx.invalid(format!("{field}.version"), v, "not a semantic version"))?,
            ),
            _ => return Err(ctx.invalid(&field, "", "exactly one of bool, int, string, version")),
        };
        attributes.insert(qualify(name), value);
    }
    let mut capacity = BTreeMap::new();
    for (name, c) in d.capacity.iter().flatten() {
        let field = format!("{base}.capacity[{name}].value");
        let q = parse_quantity_nanos(&c.value.0)
            .ok_or_else(|| ctx.invalid(&field, &c.value.0, "not a quantity"))?;
        capacity.insert(qualify(name), q);
    }
    let mut consumes = BTreeMap::new();
    for (i, c) in d.consumes_counters.iter().flatten().enumerate() {
        for (name, v) in &c.counters {
            let field = format!("{base}.consumesCounters[{i}].counters[{name}].value");
            let q = parse_quantity_nanos(&v.value.0)
                .ok_or_else(|| ctx.invalid(&field, &v.value.0, "not a quantity"))?;
            consumes.insert(counter_key(driver, pool, &c.counter_set, name), q);
        }
    }
    if d.name.is_empty() {
        return Err(ctx.invalid(format!("{base}.name"), "", "a device needs a name"));
    }
    Ok(DraDevice {
        driver: driver.into(),
        pool: pool.into(),
        name: d.name.clone(),
        attributes,
        capacity,
        consumes,
    })
}
