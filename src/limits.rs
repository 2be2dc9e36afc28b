//! Every bound on a count or size that comes from input, in one table.
//!
//! gpuscale reads objects any tenant of a shared cluster can create (Pods, ProvisioningRequests,
//! ResourceClaims, DeviceClasses) and files people pass around (snapshots, provider configs, its
//! own config). Whatever in them sets a count (pods to plan, devices, GPUs) or a size (labels,
//! expressions, nesting) is bounded here, and checked while the input is decoded, before anything
//! is allocated for it: a value past a bound is an error naming the file (or object), the field
//! and the value, never an allocation sized by the attacker.
//!
//! Where the Kubernetes API server has a limit of its own, the bound is that limit and its doc
//! comment names it (so anything a real cluster accepts is accepted here); where it has none
//! (a CRD's `int32`, label counts), the bound is gpuscale's, stated with the reason.

/// Largest Kubernetes object in bytes, as text: the API server refuses request bodies over
/// 3 MiB (`k8s.io/apiserver` `MaxRequestBodyBytes` = 3 * 1024 * 1024), and etcd stores at most
/// 1.5 MiB per value, so no real object is larger.
pub const MAX_OBJECT_BYTES: usize = 3 * 1024 * 1024;

/// Most labels on one object. The API server has no count limit of its own (only the syntax of
/// each key and value, [`MAX_LABEL_KEY_NAME_BYTES`] and [`MAX_LABEL_VALUE_BYTES`], and the object
/// size); real objects carry tens, Node Feature Discovery nodes a few hundred.
pub const MAX_LABELS: usize = 4096;

/// Longest label key name part (after the `prefix/`): apimachinery `qualifiedNameMaxLength`.
pub const MAX_LABEL_KEY_NAME_BYTES: usize = 63;

/// Longest label key prefix: a DNS subdomain (apimachinery `DNS1123SubdomainMaxLength`).
pub const MAX_LABEL_KEY_PREFIX_BYTES: usize = 253;

/// Longest label value: apimachinery `LabelValueMaxLength`.
pub const MAX_LABEL_VALUE_BYTES: usize = 63;

/// Largest total size of one object's annotations, keys and values: apimachinery
/// `TotalAnnotationSizeLimitB` (256 KiB).
pub const MAX_ANNOTATION_BYTES: usize = 256 * 1024;

/// Most annotations on one object: bounded by [`MAX_ANNOTATION_BYTES`] (each costs at least a
/// one-byte key), stated as a count so the decoder can stop counting early.
pub const MAX_ANNOTATIONS: usize = MAX_ANNOTATION_BYTES;

/// Most objects in one List or one file: a 5,000-node cluster at the 110-pod kubelet default
/// holds 550,000 pods; Kubernetes' scalability envelope is 150,000 pods.
pub const MAX_LIST_ITEMS: usize = 1_000_000;

/// Most pod sets in a ProvisioningRequest: the CRD's `spec.podSets` `maxItems: 32`.
pub const MAX_POD_SETS: usize = 32;

/// Most pods one ProvisioningRequest pod set (`spec.podSets[].count`) may ask for. The CRD
/// accepts any positive `int32`; each pod is planned as a pending pod, so the bound is the
/// pods a cluster of the largest node group ([`MAX_GROUP_SIZE`]) can run at one pod per node.
pub const MAX_PODS_PER_POD_SET: u32 = MAX_GROUP_SIZE;

/// Most pods one ProvisioningRequest asks for over all its pod sets.
pub const MAX_PODS_PER_REQUEST: u32 = MAX_GROUP_SIZE;

/// Largest node group a provider config may declare: GKE's 15,000-node cluster limit, the
/// largest any managed Kubernetes supports.
pub const MAX_GROUP_SIZE: u32 = 15_000;

/// Most GPUs on one node or in one instance type (`instanceSpec.gpus`, a Node's
/// `nvidia.com/gpu`): the largest machines have 8 (p5, a3) or 16 (p4de-style HGX with two
/// boards); 64 leaves room for any chassis.
pub const MAX_GPUS_PER_NODE: u32 = 64;

/// Most time-slicing replicas (or GKE shared clients) one GPU may be advertised as: NVIDIA's
/// device plugin and GKE document far smaller numbers (GKE: 48).
pub const MAX_GPU_REPLICAS: u32 = 1024;

/// Most vCPUs in one `instanceSpec`: the largest instances have under 1,000 (u7in: 896).
pub const MAX_VCPUS_PER_NODE: u32 = 4096;

/// Most memory in one `instanceSpec`, in GiB: the largest instances have 32 TiB.
pub const MAX_MEMORY_GIB_PER_NODE: f64 = 65_536.0;

/// Highest price of one instance in dollars per hour: the dearest on-demand instances cost
/// about $400/h; a price of $10,000/h or more is a typo (or 1e308), not a price.
pub const MAX_PRICE_USD_PER_HOUR: f64 = 10_000.0;

/// Most devices in one ResourceSlice: `resource.k8s.io/v1` `ResourceSliceMaxDevices` (128).
pub const MAX_DEVICES_PER_SLICE: usize = 128;

/// Most attributes and capacities of one device: `resource.k8s.io/v1`
/// `ResourceSliceMaxAttributesAndCapacitiesPerDevice` (32).
pub const MAX_ATTRIBUTES_PER_DEVICE: usize = 32;

/// Most requests in one ResourceClaim: `resource.k8s.io/v1` `DeviceRequestsMaxSize` (32).
pub const MAX_DEVICE_REQUESTS: usize = 32;

/// Most subrequests of one `firstAvailable` request: `resource.k8s.io/v1`
/// `FirstAvailableDeviceRequestMaxSize` (8).
pub const MAX_FIRST_AVAILABLE: usize = 8;

/// Most devices one claim request may ask for (`exactly.count`): the allocation of a whole
/// claim has at most `resource.k8s.io/v1` `AllocationResultsMaxSize` (32) devices.
pub const MAX_DEVICES_PER_CLAIM: u32 = 32;

/// Most selectors of one DeviceClass or request: `resource.k8s.io/v1` `DeviceSelectorsMaxSize`.
pub const MAX_SELECTORS: usize = 32;

/// Most constraints of one claim: `resource.k8s.io/v1` `DeviceConstraintsMaxSize` (32).
pub const MAX_CONSTRAINTS: usize = 32;

/// Longest CEL selector expression in bytes: `resource.k8s.io/v1`
/// `CELSelectorExpressionMaxLength` (10 Ki).
pub const MAX_CEL_EXPRESSION_BYTES: usize = 10 * 1024;

/// Deepest nesting of a CEL expression (parentheses, unary operators, calls, lists, chains of
/// binary operators): cel-go's parser refuses expressions nested deeper than its
/// `maxRecursionDepth` option (default 250), which Kubernetes keeps.
pub const MAX_CEL_NESTING: usize = 250;

/// Deepest nesting of mappings and lists in a snapshot document: serde_json's own recursion
/// limit, so a YAML snapshot (transcoded to JSON as it is read) nests as deep as a JSON one may.
pub const MAX_DOCUMENT_NESTING: usize = 128;

/// What YAML aliases may add to a snapshot beyond twice its size (a few anchors of defaults
/// reused, as manifests do); a file whose aliases expand past it is refused as a "billion laughs".
pub const MAX_ALIAS_EXPANSION_SLACK: usize = 1 << 20;

/// Largest provider config file (they are kilobytes).
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

// The bounds agree with each other, checked when the crate compiles: a pod set of the most pods
// is within the request bound, the annotation count follows from the byte bound, a node of the
// most GPUs is within the scheduler's per-node view, and a config file may hold an object.
const _: () = {
    assert!(MAX_PODS_PER_POD_SET <= MAX_PODS_PER_REQUEST);
    assert!(MAX_ANNOTATIONS == MAX_ANNOTATION_BYTES);
    assert!(MAX_CONFIG_BYTES as usize > MAX_OBJECT_BYTES);
};
