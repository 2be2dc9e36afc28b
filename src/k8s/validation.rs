//! The API server's syntax checks on object metadata (apimachinery's `validation` package): a
//! snapshot may hold objects written by hand or by another tool that a real server would refuse,
//! and a plan built on them says nothing true about the cluster they describe. The loader warns
//! for each such field; it does not refuse the snapshot, because the planner can still read it.

use super::error::ObjCtx;
use crate::model::names::{dns1123_label, dns1123_subdomain, label_value, qualified_name};
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Largest total size of an object's annotations (`TotalAnnotationSizeLimitB`).
const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

/// The warning for a field a real API server would refuse.
fn refused(ctx: &ObjCtx, field: &str, value: &str, why: &str) -> String {
    ctx.warning(format!("{field} {value:?}: a real API server refuses this object: {why}"))
}

/// The metadata checks `ValidateObjectMeta` makes on `meta`, as warnings; `namespaced` objects
/// also have their namespace checked.
pub(crate) fn check_meta(ctx: &ObjCtx, meta: &ObjectMeta, namespaced: bool, warnings: &mut Vec<String>) {
    let mut refuse =
        |field: String, value: &str, why: String| warnings.push(refused(ctx, &field, value, &why));
    if let Some(name) = &meta.name {
        if let Err(why) = dns1123_subdomain(name) {
            refuse("metadata.name".into(), name, why);
        }
    }
    if let Some(ns) = meta.namespace.as_ref().filter(|_| namespaced) {
        if let Err(why) = dns1123_label(ns) {
            refuse("metadata.namespace".into(), ns, why);
        }
    }
    for (k, v) in meta.labels.iter().flatten() {
        if let Err(why) = qualified_name(k) {
            refuse("metadata.labels key".into(), k, why);
        }
        if let Err(why) = label_value(v) {
            refuse(format!("metadata.labels[{k}]"), v, why);
        }
    }
    let mut size = 0;
    for (k, v) in meta.annotations.iter().flatten() {
        // The server checks annotation keys lower-cased: upper case is allowed there.
        if let Err(why) = qualified_name(&k.to_ascii_lowercase()) {
            refuse("metadata.annotations key".into(), k, why);
        }
        size += k.len() + v.len();
    }
    if size > ANNOTATIONS_MAX_BYTES {
        refuse(
            "metadata.annotations".into(),
            &format!("{size} bytes"),
            format!("may not be more than {ANNOTATIONS_MAX_BYTES} bytes"),
        );
    }
}

/// `validateNodeTaints`' syntax checks: the key is a qualified name, the value a label value.
pub(crate) fn check_taint(ctx: &ObjCtx, index: usize, taint: &Taint, warnings: &mut Vec<String>) {
    let mut refuse = |field: &str, value: &str, why: String| {
        warnings.push(refused(ctx, &format!("spec.taints[{index}].{field}"), value, &why))
    };
    if let Err(why) = qualified_name(&taint.key) {
        refuse("key", &taint.key, why);
    }
    if let Some(Err(why)) = taint.value.as_deref().map(label_value) {
        refuse("value", taint.value.as_deref().unwrap_or_default(), why);
    }
}
