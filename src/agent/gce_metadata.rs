//! Interruption notices from the GCE metadata server: preemption of a Spot (or preemptible) VM
//! (`instance/preempted` turns `TRUE`, about 30 s before the VM stops) and host maintenance that
//! will terminate it (`instance/maintenance-event` turns `TERMINATE_ON_HOST_MAINTENANCE`; GPU VMs
//! cannot live-migrate, and Compute Engine announces their maintenance an hour ahead). The agent
//! waits on the server's change notification (`wait_for_change=true` with the last ETag) on the
//! instance directory, which holds both, as Google's docs advise instead of polling.
//!
//! The parsing is pure; [`GceMetadata`] is the HTTP side, on [`super::imds::call`]'s client.

use super::imds::{call, ImdsError};
use crate::model::{Notice, NoticeKind};
use hyper::{Method, StatusCode};
use serde::Deserialize;
use std::time::Duration;

/// Where the metadata server answers on every GCE VM (`metadata.google.internal`).
pub const DEFAULT_ENDPOINT: &str = "169.254.169.254:80";
/// The instance directory, read whole (`recursive=true`): preemption and maintenance in one.
const INSTANCE: &str = "/computeMetadata/v1/instance/";
/// How long one wait for a change lasts on the server; the client waits a little longer.
const WAIT_SECONDS: u64 = 60;
/// Notice of a preemption: the VM stops 30 s after `preempted` turns `TRUE`.
const PREEMPTION_NOTICE_SECONDS: i64 = 30;
/// Notice of a terminating host maintenance of a GPU VM: an hour.
const MAINTENANCE_NOTICE_SECONDS: i64 = 3600;

/// The instance directory's fields read (camel-cased, as `recursive=true` returns them).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Instance {
    #[serde(default)]
    id: Option<serde_json::Value>,
    #[serde(default)]
    preempted: Option<String>,
    #[serde(default)]
    maintenance_event: Option<String>,
}

/// The notices in the instance directory `body` read at `now` (Unix seconds).
pub fn notices_of(body: &str, now: i64) -> Result<Vec<Notice>, ImdsError> {
    let instance: Instance = serde_json::from_str(body)
        .map_err(|e| ImdsError::Invalid { path: INSTANCE.into(), message: e.to_string() })?;
    let id = match instance.id {
        Some(serde_json::Value::String(s)) => s,
        Some(v) => v.to_string(),
        None => String::new(),
    };
    let notice =
        |kind, after| Notice { kind, instance: id.clone(), issued_at: now, deadline: Some(now + after) };
    let mut out = Vec::new();
    if instance.preempted.as_deref().is_some_and(|p| p.eq_ignore_ascii_case("TRUE")) {
        out.push(notice(NoticeKind::SpotInterruption, PREEMPTION_NOTICE_SECONDS));
    }
    // `MIGRATE_ON_HOST_MAINTENANCE` moves the VM with its work; only termination is a notice.
    if instance.maintenance_event.as_deref().is_some_and(|m| m.starts_with("TERMINATE")) {
        out.push(notice(NoticeKind::ScheduledMaintenance, MAINTENANCE_NOTICE_SECONDS));
    }
    Ok(out)
}

/// A client of one VM's metadata server that waits for changes.
pub struct GceMetadata {
    endpoint: String,
    /// The ETag of the last answer: the next read waits until the directory differs from it.
    etag: Option<String>,
}

impl GceMetadata {
    /// A client of the server at `endpoint` (host:port; [`DEFAULT_ENDPOINT`] on GCE).
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self { endpoint: endpoint.into(), etag: None }
    }

    /// The VM's notices: at once on the first read, then when the instance directory changes
    /// (or after the server's wait ends with no change, the same notices again).
    pub async fn notices(&mut self, now: impl Fn() -> i64) -> Result<Vec<Notice>, ImdsError> {
        let path = match &self.etag {
            None => format!("{INSTANCE}?recursive=true"),
            Some(etag) => format!(
                "{INSTANCE}?recursive=true&wait_for_change=true&timeout_sec={WAIT_SECONDS}&last_etag={}",
                etag.replace(|c: char| !c.is_ascii_alphanumeric(), "")
            ),
        };
        let wait = Duration::from_secs(if self.etag.is_some() { WAIT_SECONDS + 5 } else { 2 });
        let answer = call(&self.endpoint, wait, Method::GET, &path, &[("Metadata-Flavor", "Google")]).await?;
        if answer.status != StatusCode::OK {
            // (A 503 while the server restarts, a 403 without the header: read afresh next time.)
            self.etag = None;
            return Err(ImdsError::Invalid {
                path: INSTANCE.into(),
                message: format!("HTTP {}", answer.status),
            });
        }
        self.etag = answer.etag;
        notices_of(&answer.body, now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_796_637_600;

    #[test]
    fn preemption_and_terminating_maintenance_are_notices() {
        let body = |preempted: &str, maintenance: &str| {
            format!(
                r#"{{"id": 4521308723406113211, "name": "gke-gpu-pool-1", "preempted": "{preempted}",
                    "maintenanceEvent": "{maintenance}", "scheduling": {{"preemptible": "TRUE"}}}}"#
            )
        };
        let kinds = |b: String| {
            notices_of(&b, NOW)
                .unwrap()
                .iter()
                .map(|n| (n.kind, n.deadline, n.instance.clone()))
                .collect::<Vec<_>>()
        };
        assert!(kinds(body("FALSE", "NONE")).is_empty());
        assert!(kinds(body("FALSE", "MIGRATE_ON_HOST_MAINTENANCE")).is_empty());
        assert_eq!(
            kinds(body("TRUE", "NONE")),
            vec![(NoticeKind::SpotInterruption, Some(NOW + 30), "4521308723406113211".to_string())]
        );
        assert_eq!(
            kinds(body("FALSE", "TERMINATE_ON_HOST_MAINTENANCE")),
            vec![(NoticeKind::ScheduledMaintenance, Some(NOW + 3600), "4521308723406113211".to_string())]
        );
        let err = notices_of("<html>", NOW).unwrap_err().to_string();
        assert!(err.starts_with("instance metadata /computeMetadata/v1/instance/:"), "{err}");
    }
}
