//! Dynamic Resource Allocation (`resource.k8s.io/v1`): the devices a node publishes through
//! ResourceSlices, the claims a pod needs allocated, and the allocator that decides whether a
//! node can serve them.
//!
//! The allocator follows kube-scheduler's structured allocator
//! (`k8s.io/dynamic-resource-allocation/structured`, `allocator.go`): claims one after another,
//! each claim's requests in order, each request's `firstAvailable` alternatives in order, devices
//! in slice order, and the first complete solution wins, backtracking when a later request cannot
//! be served. A device is used by at most one claim (no admin access), an `All` request takes
//! every matching device and fails if any is in use, `matchAttribute` constraints must hold over
//! the named requests, and devices that consume shared counters (partitionable GPUs) fit only
//! while their pool's counters last. Class selectors and the request's own selectors must all
//! match (the class's first).

use super::cel::{AttrValue, DeviceView, Program};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// NVIDIA's DRA driver for GPUs and MIG devices.
pub const NVIDIA_GPU_DRIVER: &str = "gpu.nvidia.com";

/// A device one ResourceSlice publishes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DraDevice {
    /// Driver (`spec.driver` of its slice).
    pub driver: String,
    /// Pool (`spec.pool.name`).
    pub pool: String,
    /// Device name, unique in the pool.
    pub name: String,
    /// Attributes by fully qualified name (`gpu.nvidia.com/productName`).
    #[serde(default)]
    pub attributes: BTreeMap<String, AttrValue>,
    /// Capacity in nano-units by fully qualified name (`gpu.nvidia.com/memory`).
    #[serde(default, with = "nano_map")]
    pub capacity: BTreeMap<String, i128>,
    /// Shared counters it consumes, by [`counter_key`] of its pool, in nano-units.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty", with = "nano_map")]
    pub consumes: BTreeMap<String, i128>,
}

impl DraDevice {
    /// `driver/pool/device`, as kube-scheduler names devices.
    pub fn id(&self) -> String {
        format!("{}/{}/{}", self.driver, self.pool, self.name)
    }

    /// What a selector sees.
    pub fn view(&self) -> DeviceView<'_> {
        DeviceView { driver: &self.driver, attributes: &self.attributes, capacity: &self.capacity }
    }

    fn nvidia(&self, attr: &str) -> Option<&AttrValue> {
        (self.driver == NVIDIA_GPU_DRIVER)
            .then(|| self.attributes.get(&format!("{NVIDIA_GPU_DRIVER}/{attr}")))
            .flatten()
    }

    /// A whole GPU of NVIDIA's driver (`type: gpu`).
    pub fn is_gpu(&self) -> bool {
        self.nvidia("type") == Some(&AttrValue::Str("gpu".into()))
    }

    /// A MIG device of NVIDIA's driver (`type: mig`) and its profile (`1g.10gb`).
    pub fn mig_profile(&self) -> Option<&str> {
        if self.nvidia("type") != Some(&AttrValue::Str("mig".into())) {
            return None;
        }
        match self.nvidia("profile") {
            Some(AttrValue::Str(p)) => Some(p),
            _ => Some(""),
        }
    }

    /// The UUID of the physical GPU an NVIDIA device is or lives on (`uuid` of a GPU,
    /// `parentUUID` of a MIG device): what the agent's telemetry names GPUs by.
    pub fn gpu_uuid(&self) -> Option<&str> {
        let attr = if self.is_gpu() { "uuid" } else { "parentUUID" };
        match self.nvidia(attr) {
            Some(AttrValue::Str(s)) => Some(s),
            _ => None,
        }
    }

    /// What share of its physical GPU an NVIDIA device is, in milli-GPU: 1000 for a GPU, a MIG
    /// device its profile's ([`super::mig::profile_milli`]); `None` for other devices.
    pub fn gpu_milli(&self) -> Option<u64> {
        if self.is_gpu() {
            return Some(1000);
        }
        self.mig_profile().map(|p| super::mig::profile_milli(p, None))
    }

    /// `productName` of an NVIDIA device.
    pub fn product_name(&self) -> Option<&str> {
        match self.nvidia("productName") {
            Some(AttrValue::Str(s)) => Some(s),
            _ => None,
        }
    }
}

/// Nano-unit amounts as decimal strings: they exceed JSON's 64-bit integers (80Gi is 8.6e19 nano).
mod nano_map {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::collections::BTreeMap;

    pub fn serialize<S: Serializer>(m: &BTreeMap<String, i128>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(m.iter().map(|(k, v)| (k, v.to_string())))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, i128>, D::Error> {
        BTreeMap::<String, String>::deserialize(d)?
            .into_iter()
            .map(|(k, v)| v.parse().map(|v| (k, v)).map_err(serde::de::Error::custom))
            .collect()
    }
}

/// The key of a shared counter: `driver/pool/counterSet/counter` (counters belong to a pool).
pub fn counter_key(driver: &str, pool: &str, set: &str, counter: &str) -> String {
    format!("{driver}/{pool}/{set}/{counter}")
}

/// A compiled selector and where it was written, for messages.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceSelector {
    /// The expression.
    pub program: Program,
    /// `DeviceClass gpu.nvidia.com spec.selectors[0].cel.expression`.
    pub origin: String,
}

/// How many matching devices a request takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AllocationMode {
    /// `allocationMode: ExactCount` with `count`.
    ExactCount(u32),
    /// `allocationMode: All`: every matching device of the node's pools.
    All,
}

/// One way to serve a request: `exactly`, or one of `firstAvailable`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SubRequest {
    /// Request (or sub-request) name.
    pub name: String,
    /// `deviceClassName`.
    pub class: String,
    /// The class's selectors, then the request's.
    pub selectors: Vec<DeviceSelector>,
    /// Count or all.
    pub mode: AllocationMode,
}

impl SubRequest {
    /// Whether a device matches every selector. A runtime error is no match, as it makes
    /// kube-scheduler fail the node; the snapshot conversion reports such errors once.
    pub fn matches(&self, device: &DraDevice) -> bool {
        let view = device.view();
        self.selectors.iter().all(|s| s.program.matches(&view).unwrap_or(false))
    }
}

/// The GPU a sub-request asks NVIDIA's driver for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuAsk {
    /// A whole GPU (`type: gpu`).
    Whole,
    /// A MIG device (`type: mig`) of this profile; empty when the selectors do not name one.
    Mig(String),
}

/// A device of `driver` that carries only the attributes that say what kind of device it is.
fn probe(driver: &str, kind: &str, profile: Option<&str>) -> DraDevice {
    let attr = |name: &str| format!("{NVIDIA_GPU_DRIVER}/{name}");
    let mut attributes = BTreeMap::from([(attr("type"), AttrValue::Str(kind.into()))]);
    if let Some(p) = profile {
        attributes.insert(attr("profile"), AttrValue::Str(p.into()));
    }
    DraDevice {
        driver: driver.into(),
        pool: String::new(),
        name: String::new(),
        attributes,
        capacity: BTreeMap::new(),
        consumes: BTreeMap::new(),
    }
}

impl SubRequest {
    /// What GPU this asks for, before any device is chosen (quotas count pending pods): the
    /// selectors are matched against probe devices that carry only the driver's `type` and
    /// `profile`. An expression that needs an attribute a probe lacks (`productName`, `memory`)
    /// narrows which GPU, not whether it is one, so it counts as matching; a request whose
    /// selectors would also take another driver's device asks for no GPU in particular.
    pub fn gpu_ask(&self) -> Option<GpuAsk> {
        let fits = |d: &DraDevice| {
            let view = d.view();
            self.selectors.iter().all(|s| s.program.matches(&view).unwrap_or(true))
        };
        if fits(&probe("example.com/not-a-gpu", "other", None)) {
            return None;
        }
        if fits(&probe(NVIDIA_GPU_DRIVER, "gpu", None)) {
            return Some(GpuAsk::Whole);
        }
        if !fits(&probe(NVIDIA_GPU_DRIVER, "mig", None)) {
            return None;
        }
        // A profile the selectors name, if they name one.
        if fits(&probe(NVIDIA_GPU_DRIVER, "mig", Some("no-such-profile"))) {
            return Some(GpuAsk::Mig(String::new()));
        }
        let named = super::mig::all_profiles().find(|p| fits(&probe(NVIDIA_GPU_DRIVER, "mig", Some(p))));
        Some(GpuAsk::Mig(named.unwrap_or_default().to_string()))
    }
}

/// A request of a claim: alternatives tried in order (one for `exactly`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DraRequest {
    /// Request name.
    pub name: String,
    /// `[exactly]` or `firstAvailable`.
    pub alternatives: Vec<SubRequest>,
}

/// `constraints[].matchAttribute`: the devices of these requests (all when empty) share the
/// attribute's value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MatchAttribute {
    /// Request names; empty = every request of the claim.
    pub requests: Vec<String>,
    /// Fully qualified attribute name.
    pub attribute: String,
}

/// A ResourceClaim a pod needs: its own from a template, or a named one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DraClaim {
    /// `namespace/name` of the claim; a claim still to be generated from a template gets a name
    /// of its own pod, so two pods never share it.
    pub key: String,
    /// Requests, in order.
    pub requests: Vec<DraRequest>,
    /// Constraints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<MatchAttribute>,
    /// The node its allocation is bound to (from `status.allocation.nodeSelector`); the pod
    /// may run only there. `None` while unallocated, or allocated from devices any node reaches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_on: Option<String>,
    /// Already allocated (its devices are taken in the node inventories).
    #[serde(default)]
    pub allocated: bool,
    /// How the pods using it share its GPUs, from the driver's opaque config
    /// (`spec.devices.config[].opaque`): NVIDIA's `sharing.strategy`, `TimeSlicing` or `MPS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<String>,
}

/// A claim's hold on a node's devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimHold {
    /// Indices into [`DraInventory::devices`].
    pub devices: Vec<u32>,
    /// Pods in the plan that use it; it is released when the last leaves.
    pub users: u32,
    /// Allocated in the snapshot: never released by the plan.
    pub fixed: bool,
}

/// The DRA devices a node reaches and the claims holding them.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DraInventory {
    /// Devices, in slice order (pool, slice, device).
    pub devices: Vec<DraDevice>,
    /// Shared counters by [`counter_key`], in nano-units.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty", with = "nano_map")]
    pub counters: BTreeMap<String, i128>,
    /// Claims allocated here, by claim key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub claims: BTreeMap<String, ClaimHold>,
}

/// Upper bound on device choices tried per allocation (kube-scheduler's search is exhaustive
/// but aborts on its own time budget; identical devices make failing searches explode).
const SEARCH_BUDGET: usize = 200_000;

impl DraInventory {
    /// No devices.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// Which devices are in use by some claim.
    pub fn used(&self) -> Vec<bool> {
        let mut used = vec![false; self.devices.len()];
        for hold in self.claims.values() {
            for &d in &hold.devices {
                if let Some(u) = used.get_mut(d as usize) {
                    *u = true;
                }
            }
        }
        used
    }

    /// Physical GPUs the devices are or live on (by UUID; a device without one counts as its own
    /// GPU), and the milli-GPU of them that claims hold: a whole GPU 1000, a MIG device its
    /// profile's share. MIG devices make a partitioned GPU partly used, not unused.
    pub fn gpu_use(&self) -> (usize, u64) {
        let used = self.used();
        let mut per_gpu: BTreeMap<String, u64> = BTreeMap::new();
        for (d, used) in self.devices.iter().zip(used) {
            let Some(milli) = d.gpu_milli() else { continue };
            let held = per_gpu.entry(d.gpu_uuid().map_or_else(|| d.id(), str::to_string)).or_default();
            if used {
                *held += milli;
            }
        }
        (per_gpu.len(), per_gpu.values().map(|&m| m.min(1000)).sum())
    }

    /// The milli-GPU claims hold of `devices` (indices into [`Self::devices`]).
    pub fn held_milli(&self, devices: &[u32]) -> u64 {
        let used = self.used();
        let held = devices.iter().filter(|&&d| used.get(d as usize) == Some(&true));
        held.filter_map(|&d| self.devices[d as usize].gpu_milli()).sum::<u64>().min(1000)
    }

    /// Allocates the claims not yet held here, on top of what is held: per claim key, the
    /// devices chosen. `None` when they cannot all be served together.
    pub fn allocate(&self, claims: &[DraClaim]) -> Option<Vec<(String, Vec<u32>)>> {
        let todo: Vec<&DraClaim> =
            claims.iter().filter(|c| !c.allocated && !self.claims.contains_key(&c.key)).collect();
        if todo.is_empty() {
            return Some(Vec::new());
        }
        let mut search = Search::new(self, &todo);
        let mut chosen = vec![Vec::new(); todo.len()];
        if !search.claim(0, &mut chosen) {
            return None;
        }
        Some(
            todo.iter()
                .zip(chosen)
                .map(|(c, d)| (c.key.clone(), d.into_iter().map(|(_, d)| d).collect()))
                .collect(),
        )
    }

    /// Records the allocations [`Self::allocate`] chose and one more user of each claim the pod
    /// shares with pods placed before.
    pub fn hold(&mut self, claims: &[DraClaim], allocations: Vec<(String, Vec<u32>)>) {
        for c in claims {
            if let Some(h) = self.claims.get_mut(&c.key) {
                h.users += 1;
            }
        }
        for (key, devices) in allocations {
            self.claims.insert(key, ClaimHold { devices, users: 1, fixed: false });
        }
    }

    /// The reverse of [`Self::hold`]: a claim no pod uses any more frees its devices.
    pub fn release(&mut self, claims: &[DraClaim]) {
        for c in claims {
            if let Some(h) = self.claims.get_mut(&c.key) {
                h.users = h.users.saturating_sub(1);
                if h.users == 0 && !h.fixed {
                    self.claims.remove(&c.key);
                }
            }
        }
    }
}

/// The backtracking search of one allocation.
struct Search<'a> {
    inv: &'a DraInventory,
    claims: &'a [&'a DraClaim],
    used: Vec<bool>,
    /// Counters consumed so far, by [`counter_key`].
    consumed: BTreeMap<String, i128>,
    /// `matches[claim][request][alternative][device]`.
    matches: Vec<Vec<Vec<Vec<bool>>>>,
    budget: usize,
}

impl<'a> Search<'a> {
    fn new(inv: &'a DraInventory, claims: &'a [&'a DraClaim]) -> Self {
        let matches = claims
            .iter()
            .map(|c| {
                c.requests
                    .iter()
                    .map(|r| {
                        r.alternatives
                            .iter()
                            .map(|a| inv.devices.iter().map(|d| a.matches(d)).collect())
                            .collect()
                    })
                    .collect()
            })
            .collect();
        // Counters consumed by devices already held.
        let used = inv.used();
        let mut consumed = BTreeMap::new();
        for (_, d) in inv.devices.iter().enumerate().filter(|(i, _)| used[*i]) {
            for (key, v) in &d.consumes {
                *consumed.entry(key.clone()).or_insert(0) += v;
            }
        }
        Search { inv, claims, used, consumed, matches, budget: SEARCH_BUDGET }
    }

    /// Claims from `ci` on; `chosen[claim]` collects `(request index, device)`.
    fn claim(&mut self, ci: usize, chosen: &mut [Vec<(usize, u32)>]) -> bool {
        if ci == self.claims.len() {
            return true;
        }
        self.request(ci, 0, chosen)
    }

    fn request(&mut self, ci: usize, ri: usize, chosen: &mut [Vec<(usize, u32)>]) -> bool {
        let claim = self.claims[ci];
        if ri == claim.requests.len() {
            return self.claim(ci + 1, chosen);
        }
        for ai in 0..claim.requests[ri].alternatives.len() {
            let alt = &claim.requests[ri].alternatives[ai];
            match alt.mode {
                AllocationMode::ExactCount(n) => {
                    if self.pick(ci, ri, ai, n, 0, chosen) {
                        return true;
                    }
                }
                AllocationMode::All => {
                    let all: Vec<u32> = (0..self.inv.devices.len() as u32)
                        .filter(|&d| self.matches[ci][ri][ai][d as usize])
                        .collect();
                    if all.is_empty() || all.iter().any(|&d| self.used[d as usize]) {
                        continue;
                    }
                    let mark = chosen[ci].len();
                    if all.iter().all(|&d| self.take(ci, ri, d, chosen)) && self.request(ci, ri + 1, chosen) {
                        return true;
                    }
                    self.untake_to(ci, mark, chosen);
                }
            }
        }
        false
    }

    /// Picks `left` more devices for request `ri` (alternative `ai`), in increasing index from
    /// `from` (combinations: identical choices in another order are not retried).
    fn pick(
        &mut self,
        ci: usize,
        ri: usize,
        ai: usize,
        left: u32,
        from: usize,
        chosen: &mut [Vec<(usize, u32)>],
    ) -> bool {
        if left == 0 {
            return self.request(ci, ri + 1, chosen);
        }
        for d in from..self.inv.devices.len() {
            if self.budget == 0 {
                return false;
            }
            self.budget -= 1;
            if self.used[d] || !self.matches[ci][ri][ai][d] {
                continue;
            }
            let mark = chosen[ci].len();
            if self.take(ci, ri, d as u32, chosen) && self.pick(ci, ri, ai, left - 1, d + 1, chosen) {
                return true;
            }
            self.untake_to(ci, mark, chosen);
        }
        false
    }

    /// Takes a device for a request if it is free, its counters last and the claim's
    /// constraints still hold; on `false` nothing (or only what `untake_to` undoes) changed.
    fn take(&mut self, ci: usize, ri: usize, d: u32, chosen: &mut [Vec<(usize, u32)>]) -> bool {
        let dev = &self.inv.devices[d as usize];
        if self.used[d as usize] {
            return false;
        }
        let claim = self.claims[ci];
        let rname = &claim.requests[ri].name;
        for c in &claim.constraints {
            if !c.requests.is_empty() && !c.requests.contains(rname) {
                continue;
            }
            let Some(value) = dev.attributes.get(&c.attribute) else {
                return false;
            };
            let same = chosen[ci]
                .iter()
                .filter(|(r, _)| c.requests.is_empty() || c.requests.contains(&claim.requests[*r].name));
            if same
                .into_iter()
                .any(|(_, o)| self.inv.devices[*o as usize].attributes.get(&c.attribute) != Some(value))
            {
                return false;
            }
        }
        for (key, v) in &dev.consumes {
            let have = self.inv.counters.get(key).copied().unwrap_or(0);
            if self.consumed.get(key).copied().unwrap_or(0) + v > have {
                return false;
            }
        }
        for (key, v) in &dev.consumes {
            *self.consumed.entry(key.clone()).or_insert(0) += v;
        }
        self.used[d as usize] = true;
        chosen[ci].push((ri, d));
        true
    }

    fn untake_to(&mut self, ci: usize, mark: usize, chosen: &mut [Vec<(usize, u32)>]) {
        while chosen[ci].len() > mark {
            let (_, d) = chosen[ci].pop().expect("len > mark");
            self.used[d as usize] = false;
            let dev = &self.inv.devices[d as usize];
            for (key, v) in &dev.consumes {
                if let Some(c) = self.consumed.get_mut(key) {
                    *c -= v;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cel::parse_quantity_nanos;

    pub(crate) fn gpu(pool: &str, i: u32, product: &str, mem: &str) -> DraDevice {
        let d = NVIDIA_GPU_DRIVER;
        DraDevice {
            driver: d.into(),
            pool: pool.into(),
            name: format!("gpu-{i}"),
            attributes: BTreeMap::from([
                (format!("{d}/type"), AttrValue::Str("gpu".into())),
                (format!("{d}/productName"), AttrValue::Str(product.into())),
                (format!("{d}/index"), AttrValue::Int(i64::from(i))),
                (format!("{d}/numa"), AttrValue::Int(i64::from(i / 4))),
            ]),
            capacity: BTreeMap::from([(format!("{d}/memory"), parse_quantity_nanos(mem).unwrap())]),
            consumes: BTreeMap::new(),
        }
    }

    fn sel(expr: &str) -> DeviceSelector {
        DeviceSelector { program: Program::compile(expr).unwrap(), origin: "test".into() }
    }

    fn sub(name: &str, selectors: &[&str], mode: AllocationMode) -> SubRequest {
        let mut s = vec![sel(
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        )];
        s.extend(selectors.iter().map(|e| sel(e)));
        SubRequest { name: name.into(), class: "gpu.nvidia.com".into(), selectors: s, mode }
    }

    fn claim(key: &str, requests: Vec<DraRequest>) -> DraClaim {
        DraClaim {
            key: key.into(),
            requests,
            constraints: vec![],
            allocated_on: None,
            allocated: false,
            sharing: None,
        }
    }

    fn req(name: &str, alts: Vec<SubRequest>) -> DraRequest {
        DraRequest { name: name.into(), alternatives: alts }
    }

    fn node(n: u32) -> DraInventory {
        DraInventory {
            devices: (0..n).map(|i| gpu("node-a", i, "NVIDIA H100 80GB HBM3", "80Gi")).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn counts_take_the_lowest_free_devices_and_fail_when_too_few_are_free() {
        let mut inv = node(4);
        let c = claim("ns/a", vec![req("gpus", vec![sub("gpus", &[], AllocationMode::ExactCount(3))])]);
        let got = inv.allocate(std::slice::from_ref(&c)).unwrap();
        assert_eq!(got, vec![("ns/a".to_string(), vec![0, 1, 2])]);
        inv.hold(std::slice::from_ref(&c), got);
        let d = claim("ns/b", vec![req("gpus", vec![sub("gpus", &[], AllocationMode::ExactCount(2))])]);
        assert_eq!(inv.allocate(std::slice::from_ref(&d)), None);
        // A shared claim already held is not allocated twice; releasing the last user frees it.
        assert_eq!(inv.allocate(std::slice::from_ref(&c)), Some(vec![]));
        inv.release(std::slice::from_ref(&c));
        assert_eq!(inv.gpu_use(), (4, 0));
    }

    #[test]
    fn search_backtracks_when_an_earlier_request_took_the_only_device_a_later_one_matches() {
        let mut inv = node(2);
        inv.devices[1] = gpu("node-a", 1, "NVIDIA A100-SXM4-80GB", "80Gi");
        let c = claim(
            "ns/a",
            vec![
                req("any", vec![sub("any", &[], AllocationMode::ExactCount(1))]),
                req(
                    "a100",
                    vec![sub(
                        "a100",
                        &["device.attributes['gpu.nvidia.com'].productName.matches('A100')"],
                        AllocationMode::ExactCount(1),
                    )],
                ),
            ],
        );
        assert_eq!(inv.allocate(&[c]).unwrap()[0].1, vec![0, 1]);
    }

    #[test]
    fn first_available_falls_back_in_order_and_all_needs_every_match_free() {
        let inv = node(4);
        let c = claim(
            "ns/a",
            vec![req(
                "gpus",
                vec![
                    sub("eight", &[], AllocationMode::ExactCount(8)),
                    sub("four", &[], AllocationMode::ExactCount(4)),
                ],
            )],
        );
        assert_eq!(inv.allocate(&[c]).unwrap()[0].1, vec![0, 1, 2, 3]);
        let all = claim("ns/all", vec![req("gpus", vec![sub("gpus", &[], AllocationMode::All)])]);
        assert_eq!(inv.allocate(std::slice::from_ref(&all)).unwrap()[0].1, vec![0, 1, 2, 3]);
        let mut busy = inv.clone();
        busy.claims.insert("ns/x".into(), ClaimHold { devices: vec![2], users: 1, fixed: true });
        assert_eq!(busy.allocate(&[all]), None);
    }

    #[test]
    fn match_attribute_keeps_devices_on_one_numa_node() {
        let inv = node(8);
        let mut c = claim("ns/a", vec![req("gpus", vec![sub("gpus", &[], AllocationMode::ExactCount(2))])]);
        c.constraints.push(MatchAttribute { requests: vec![], attribute: "gpu.nvidia.com/numa".into() });
        let mut busy = inv.clone();
        // GPUs 0..3 on NUMA 0, 4..7 on NUMA 1: with 1, 2, 3 taken, GPU 0 has no partner there.
        busy.claims.insert("ns/x".into(), ClaimHold { devices: vec![1, 2, 3], users: 1, fixed: true });
        assert_eq!(busy.allocate(&[c]).unwrap()[0].1, vec![4, 5]);
    }

    #[test]
    fn shared_counters_bound_partitionable_devices() {
        let mut inv = node(0);
        for (i, slices) in [(0u32, 4i128), (1, 4)] {
            let mut d = gpu("node-a", i, "NVIDIA A100-SXM4-40GB", "20Gi");
            d.name = format!("gpu-0-mig-4g-{i}");
            d.consumes.insert(counter_key(NVIDIA_GPU_DRIVER, "node-a", "gpu-0", "memorySlices"), slices);
            inv.devices.push(d);
        }
        let key = counter_key(NVIDIA_GPU_DRIVER, "node-a", "gpu-0", "memorySlices");
        inv.counters.insert(key.clone(), 7);
        let c = claim("ns/a", vec![req("gpus", vec![sub("gpus", &[], AllocationMode::ExactCount(2))])]);
        assert_eq!(inv.allocate(std::slice::from_ref(&c)), None);
        inv.counters.insert(key, 8);
        assert!(inv.allocate(&[c]).is_some());
    }

    /// What a request asks for, judged from NVIDIA's DeviceClasses and the request's selectors.
    #[test]
    fn gpu_asks_follow_the_class_and_the_request_selectors() {
        let class = |kind: &str| {
            sel(&format!(
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == '{kind}'"
            ))
        };
        let ask = |selectors: Vec<DeviceSelector>| {
            SubRequest { name: "r".into(), class: "c".into(), selectors, mode: AllocationMode::ExactCount(1) }
                .gpu_ask()
        };
        assert_eq!(ask(vec![class("gpu")]), Some(GpuAsk::Whole));
        let h100 = sel("device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'");
        assert_eq!(ask(vec![class("gpu"), h100]), Some(GpuAsk::Whole), "a model narrows which GPU");
        assert_eq!(ask(vec![class("mig")]), Some(GpuAsk::Mig(String::new())));
        let two_g = sel("device.attributes['gpu.nvidia.com'].profile == '2g.10gb'");
        assert_eq!(ask(vec![class("mig"), two_g]), Some(GpuAsk::Mig("2g.10gb".into())));
        // A class that takes any device, or another driver's: no GPU in particular.
        assert_eq!(ask(vec![]), None);
        assert_eq!(ask(vec![sel("device.driver == 'dra.example.com'")]), None);
        assert_eq!(ask(vec![class("gpu"), sel("device.attributes['gpu.nvidia.com'].type == 'mig'")]), None);
    }
}
