//! The bounds of [`crate::limits`] checked on an object before it is decoded.
//!
//! Each check is a serde pass over the object (its JSON text, or its JSON value) that reads only
//! the counts and sizes the limits name (labels, annotations, pod set counts, devices, claim
//! requests, selector expressions) and skips everything else without allocating; it stops at the
//! first value past its bound. So an object with a million labels or a pod set of 2^31 pods is
//! refused after reading it once, before anything is built from it. A field of the wrong type is
//! left to the full decode, whose message names it.

// The structs' fields are checked by being deserialized; nothing reads them afterwards.
#![allow(dead_code, reason = "fields exist to be deserialized and checked, not read")]

use crate::limits::*;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;

/// Starts the message of a bound's error (a decode error without it is a type mismatch).
const MARK: &str = "\u{1}bound\u{1}";
/// Separates the value from the reason in a bound's message.
const SEP: char = '\u{2}';

/// A value past a bound: the field path, the value and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Field path, e.g. `spec.podSets[0].count`.
    pub field: String,
    /// The offending value (a count, a size, the start of an expression).
    pub value: String,
    /// The bound and where it comes from.
    pub reason: String,
}

fn bound<E: de::Error>(value: impl fmt::Display, reason: impl fmt::Display) -> E {
    E::custom(format!("{MARK}{value}{SEP}{reason}"))
}

/// Checks the object of `kind` that `de` reads; `None` when it is within every bound (or has a
/// field of the wrong type, which the full decode reports).
pub(crate) fn check<'de, D: Deserializer<'de>>(kind: &str, de: D) -> Option<Violation> {
    let result = match kind {
        "ProvisioningRequest" => run::<Object<RequestSpec>, _>(de),
        "ResourceSlice" => run::<Object<SliceSpec>, _>(de),
        "ResourceClaim" => run::<Object<ClaimSpec>, _>(de),
        "ResourceClaimTemplate" => run::<Object<TemplateSpec>, _>(de),
        "DeviceClass" => run::<Object<ClassSpec>, _>(de),
        _ => run::<Object<IgnoredAny>, _>(de),
    };
    let (path, message) = result.err()?;
    let rest = message.strip_prefix(MARK)?;
    let (value, reason) = rest.split_once(SEP)?;
    // serde_json appends the position; the field path says where.
    let reason = reason.split(" at line ").next().unwrap_or(reason);
    Some(Violation { field: path, value: value.to_string(), reason: reason.to_string() })
}

fn run<'de, T: Deserialize<'de>, D: Deserializer<'de>>(de: D) -> Result<(), (String, String)> {
    serde_path_to_error::deserialize::<_, T>(de)
        .map(drop)
        .map_err(|e| (e.path().to_string(), e.inner().to_string()))
}

/// Checks JSON text of an object of `kind` (a List item as read).
pub(crate) fn check_text(kind: &str, text: &str) -> Option<Violation> {
    if text.len() > MAX_OBJECT_BYTES {
        return Some(Violation {
            field: "(object)".into(),
            value: format!("{} bytes", text.len()),
            reason: format!(
                "larger than {MAX_OBJECT_BYTES} bytes, the most the API server accepts for one object"
            ),
        });
    }
    check(kind, &mut serde_json::Deserializer::from_str(text))
}

/// Checks a parsed object of `kind`.
pub(crate) fn check_value(kind: &str, value: &serde_json::Value) -> Option<Violation> {
    check(kind, value)
}

#[derive(Deserialize)]
struct Object<S> {
    metadata: Option<Meta>,
    spec: Option<S>,
}

#[derive(Deserialize)]
struct Meta {
    labels: Option<Labels>,
    annotations: Option<Annotations>,
}

/// The length of a string, read without keeping it.
struct Len(usize);

impl<'de> Deserialize<'de> for Len {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Len;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Len, E> {
                Ok(Len(s.len()))
            }
        }
        d.deserialize_str(V)
    }
}

/// A map of at most `max` entries, its keys and values not kept; `bytes` sums their lengths
/// when they are strings.
fn bounded_map<'de, A: MapAccess<'de>>(
    mut map: A,
    max: usize,
    what: &str,
    max_bytes: Option<usize>,
) -> Result<(), A::Error> {
    let (mut n, mut bytes) = (0usize, 0usize);
    while let Some(k) = map.next_key::<Len>()? {
        n += 1;
        if n > max {
            return Err(bound(format!("more than {max} {what}"), format!("at most {max} {what} per object")));
        }
        match max_bytes {
            Some(limit) => {
                bytes += k.0 + map.next_value::<Len>()?.0;
                if bytes > limit {
                    return Err(bound(
                        format!("more than {limit} bytes"),
                        format!("{what} may total at most {limit} bytes (the API server's limit)"),
                    ));
                }
            }
            None => {
                map.next_value::<IgnoredAny>()?;
            }
        }
    }
    Ok(())
}

struct Labels;

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Labels;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Labels, A::Error> {
                bounded_map(map, MAX_LABELS, "labels", None).map(|_| Labels)
            }
        }
        d.deserialize_map(V)
    }
}

struct Annotations;

impl<'de> Deserialize<'de> for Annotations {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Annotations;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Annotations, A::Error> {
                bounded_map(map, MAX_ANNOTATIONS, "annotations", Some(MAX_ANNOTATION_BYTES))
                    .map(|_| Annotations)
            }
        }
        d.deserialize_map(V)
    }
}

/// A list of at most `MAX` elements of `T`, each checked; kept only where [`Named::KEEP`] says.
struct Bounded<T, const MAX: usize> {
    items: Vec<T>,
}

/// What a list's elements are called in messages.
trait Named {
    const WHAT: &'static str;
    const WHY: &'static str;
    /// Keep the element (only small ones are kept, to check sums).
    const KEEP: bool = false;
}

impl<'de, T: Deserialize<'de> + Named, const MAX: usize> Deserialize<'de> for Bounded<T, MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T, const MAX: usize>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de> + Named, const MAX: usize> Visitor<'de> for V<T, MAX> {
            type Value = Bounded<T, MAX>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                let mut n = 0usize;
                while let Some(item) = seq.next_element::<T>()? {
                    n += 1;
                    if n > MAX {
                        return Err(bound(
                            format!("more than {MAX} {}", T::WHAT),
                            format!("at most {MAX} {} ({})", T::WHAT, T::WHY),
                        ));
                    }
                    if T::KEEP {
                        items.push(item);
                    }
                }
                Ok(Bounded { items })
            }
        }
        d.deserialize_seq(V::<T, MAX>(std::marker::PhantomData))
    }
}

// ---- ProvisioningRequest ----

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestSpec {
    pod_sets: Option<PodSets>,
}

struct PodSets;

impl<'de> Deserialize<'de> for PodSets {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let sets = Bounded::<PodSetCount, MAX_POD_SETS>::deserialize(d)?;
        let total: u64 = sets.items.iter().map(|s| s.count.map_or(0, |c| c.0)).sum();
        if total > u64::from(MAX_PODS_PER_REQUEST) {
            return Err(bound(
                format!("{total} pods"),
                format!("at most {MAX_PODS_PER_REQUEST} pods in one ProvisioningRequest (gpuscale's bound)"),
            ));
        }
        Ok(PodSets)
    }
}

#[derive(Deserialize)]
struct PodSetCount {
    count: Option<Count<{ MAX_PODS_PER_POD_SET as u64 }>>,
}

impl Named for PodSetCount {
    const WHAT: &'static str = "pod sets";
    const WHY: &'static str = "the ProvisioningRequest CRD's maxItems";
    const KEEP: bool = true;
}

/// An integer count of at most `MAX` (a negative one is left to the full decode's checks).
#[derive(Clone, Copy)]
struct Count<const MAX: u64>(u64);

impl<'de, const MAX: u64> Deserialize<'de> for Count<MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = i64::deserialize(d)?;
        if n > MAX as i64 {
            return Err(bound(n, format!("more than {MAX}, gpuscale's bound for this count")));
        }
        Ok(Count(n.max(0) as u64))
    }
}

// ---- ResourceSlice ----

#[derive(Deserialize)]
struct SliceSpec {
    devices: Option<Bounded<SliceDevice, MAX_DEVICES_PER_SLICE>>,
}

#[derive(Deserialize)]
struct SliceDevice {
    attributes: Option<Attributes>,
    capacity: Option<Attributes>,
}

impl Named for SliceDevice {
    const WHAT: &'static str = "devices";
    const WHY: &'static str = "resource.k8s.io/v1 ResourceSliceMaxDevices";
}

struct Attributes;

impl<'de> Deserialize<'de> for Attributes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Attributes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Attributes, A::Error> {
                bounded_map(map, MAX_ATTRIBUTES_PER_DEVICE, "attributes or capacities of a device", None)
                    .map(|_| Attributes)
            }
        }
        d.deserialize_map(V)
    }
}

// ---- DeviceClass, ResourceClaim, ResourceClaimTemplate ----

#[derive(Deserialize)]
struct ClassSpec {
    selectors: Option<Bounded<Selector, MAX_SELECTORS>>,
}

#[derive(Deserialize)]
struct Selector {
    cel: Option<Cel>,
}

impl Named for Selector {
    const WHAT: &'static str = "selectors";
    const WHY: &'static str = "resource.k8s.io/v1 DeviceSelectorsMaxSize";
}

#[derive(Deserialize)]
struct Cel {
    expression: Option<Expression>,
}

/// A CEL expression within the API server's length, and compiling within its nesting bound.
struct Expression;

impl<'de> Deserialize<'de> for Expression {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Expression;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Expression, E> {
                if s.len() > MAX_CEL_EXPRESSION_BYTES {
                    return Err(bound(
                        format!("{} bytes", s.len()),
                        format!(
                            "a CEL expression of at most {MAX_CEL_EXPRESSION_BYTES} bytes \
                             (resource.k8s.io/v1 CELSelectorExpressionMaxLength)"
                        ),
                    ));
                }
                match crate::model::cel::Program::compile(s) {
                    Err(e) if e.0.contains("nested deeper") => Err(bound(preview(s), e.0)),
                    // Other compile errors are the conversion's to report, with the same field.
                    _ => Ok(Expression),
                }
            }
        }
        d.deserialize_str(V)
    }
}

/// The start of a long value, for a message.
pub(crate) fn preview(s: &str) -> String {
    match s.char_indices().nth(60) {
        Some((cut, _)) => format!("{}… ({} bytes)", &s[..cut], s.len()),
        None => s.to_string(),
    }
}

#[derive(Deserialize)]
struct ClaimSpec {
    devices: Option<ClaimDevices>,
}

#[derive(Deserialize)]
struct TemplateSpec {
    spec: Option<ClaimSpec>,
}

#[derive(Deserialize)]
struct ClaimDevices {
    requests: Option<Bounded<Request, MAX_DEVICE_REQUESTS>>,
    constraints: Option<Bounded<Constraint, MAX_CONSTRAINTS>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    exactly: Option<Exact>,
    first_available: Option<Bounded<Exact, MAX_FIRST_AVAILABLE>>,
}

impl Named for Request {
    const WHAT: &'static str = "requests";
    const WHY: &'static str = "resource.k8s.io/v1 DeviceRequestsMaxSize";
}

#[derive(Deserialize)]
struct Exact {
    count: Option<Count<{ MAX_DEVICES_PER_CLAIM as u64 }>>,
    selectors: Option<Bounded<Selector, MAX_SELECTORS>>,
}

impl Named for Exact {
    const WHAT: &'static str = "subrequests";
    const WHY: &'static str = "resource.k8s.io/v1 FirstAvailableDeviceRequestMaxSize";
}

struct Constraint;

impl<'de> Deserialize<'de> for Constraint {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(d).map(|_| Constraint)
    }
}

impl Named for Constraint {
    const WHAT: &'static str = "constraints";
    const WHY: &'static str = "resource.k8s.io/v1 DeviceConstraintsMaxSize";
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn both(kind: &str, v: serde_json::Value) -> Option<Violation> {
        let from_value = check_value(kind, &v);
        let from_text = check_text(kind, &v.to_string());
        assert_eq!(from_value, from_text, "text and value checks agree");
        from_value
    }

    #[test]
    fn pod_set_counts_are_bounded_per_set_and_per_request() {
        let req = |counts: &[i64]| {
            let sets: Vec<_> =
                counts.iter().map(|c| json!({"count": c, "podTemplateRef": {"name": "t"}})).collect();
            json!({"kind": "ProvisioningRequest", "spec": {"podSets": sets}})
        };
        assert_eq!(both("ProvisioningRequest", req(&[MAX_PODS_PER_POD_SET as i64])), None);
        assert_eq!(both("ProvisioningRequest", req(&[4, MAX_PODS_PER_REQUEST as i64 - 4])), None);
        let v = both("ProvisioningRequest", req(&[1, 2147483647])).unwrap();
        assert_eq!((v.field.as_str(), v.value.as_str()), ("spec.podSets[1].count", "2147483647"));
        let half = i64::from(MAX_PODS_PER_REQUEST / 2 + 1);
        let v = both("ProvisioningRequest", req(&[half, half])).unwrap();
        assert_eq!(v.field, "spec.podSets");
        assert!(v.reason.contains("in one ProvisioningRequest"), "{v:?}");
        let v = both("ProvisioningRequest", req(&[1; MAX_POD_SETS + 1])).unwrap();
        assert!(v.value.contains("more than 32 pod sets"), "{v:?}");
        // A count of the wrong type is the full decode's to report.
        assert_eq!(both("ProvisioningRequest", json!({"spec": {"podSets": [{"count": "x"}]}})), None);
    }

    #[test]
    fn labels_annotations_devices_and_selectors_are_bounded() {
        let labels: serde_json::Map<_, _> = (0..=MAX_LABELS).map(|i| (format!("k{i}"), json!("v"))).collect();
        let v = both("Node", json!({"metadata": {"labels": labels}})).unwrap();
        assert_eq!(v.field, "metadata.labels");
        let big = "x".repeat(MAX_ANNOTATION_BYTES);
        let v = both("Pod", json!({"metadata": {"annotations": {"a": big}}})).unwrap();
        assert_eq!(v.field, "metadata.annotations");
        assert!(v.reason.contains("262144 bytes"), "{v:?}");
        let devices: Vec<_> = (0..=MAX_DEVICES_PER_SLICE).map(|i| json!({"name": format!("d{i}")})).collect();
        let v = both("ResourceSlice", json!({"spec": {"devices": devices}})).unwrap();
        assert_eq!(v.field, "spec.devices");
        let deep = format!("{}true{}", "(".repeat(3000), ")".repeat(3000));
        let claim = json!({"spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "c", "selectors": [{"cel": {"expression": deep}}]}}]}}});
        let v = both("ResourceClaim", claim.clone()).unwrap();
        assert_eq!(v.field, "spec.devices.requests[0].exactly.selectors[0].cel.expression");
        assert!(v.value.ends_with("(6004 bytes)") && v.reason.contains("nested deeper"), "{v:?}");
        let v = both("ResourceClaimTemplate", json!({"spec": claim})).unwrap();
        assert_eq!(v.field, "spec.spec.devices.requests[0].exactly.selectors[0].cel.expression");
        let count = json!({"spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "c", "count": 4294967296u64}}]}}});
        let v = both("ResourceClaim", count).unwrap();
        assert_eq!(
            (v.field.as_str(), v.value.as_str()),
            ("spec.devices.requests[0].exactly.count", "4294967296")
        );
        let class = json!({"spec": {"selectors": [{"cel": {"expression": "x".repeat(MAX_CEL_EXPRESSION_BYTES + 1)}}]}});
        let v = both("DeviceClass", class).unwrap();
        assert_eq!(v.value, format!("{} bytes", MAX_CEL_EXPRESSION_BYTES + 1));
        // Within every bound: nothing to say.
        let ok = json!({"metadata": {"labels": {"a": "b"}, "annotations": {"c": "d"}}, "spec": {"selectors": [{"cel": {"expression": "device.driver == 'x'"}}]}});
        assert_eq!(both("DeviceClass", ok), None);
    }
}
