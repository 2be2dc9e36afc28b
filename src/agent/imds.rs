//! Interruption notices from the EC2 instance metadata service, for clusters without the
//! interruption queue: the agent on each node reads IMDSv2 as AWS Node Termination Handler does
//! (`spot/instance-action`, `events/recommendations/rebalance`, `events/maintenance/scheduled`)
//! and marks its Node with the `gpuscale.io/interruption` taint that the controller reads
//! (`planner::interruption::notices_from_taints`).
//!
//! The parsing is pure; [`Imds`] is the HTTP side: a session token (PUT `/latest/api/token`),
//! renewed before it expires and when refused, and GETs with it. A 404 means no notice.

use crate::model::{Notice, NoticeKind};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Where IMDS answers on every EC2 instance.
pub const DEFAULT_ENDPOINT: &str = "169.254.169.254:80";
/// The paths read, under `/latest/meta-data/`.
const SPOT: &str = "spot/instance-action";
const REBALANCE: &str = "events/recommendations/rebalance";
const SCHEDULED: &str = "events/maintenance/scheduled";
/// How long a session token lives (IMDS allows up to six hours).
const TOKEN_TTL_SECONDS: u64 = 21_600;
/// Metadata answers are small (GCE's custom metadata totals at most 512 KiB); anything larger is
/// not a metadata server.
const MAX_BODY_BYTES: usize = 1 << 20;

/// A failed read of the metadata service.
#[derive(Debug, Error)]
pub enum ImdsError {
    /// The service cannot be reached or answered outside HTTP.
    #[error("instance metadata service at {endpoint}: {message}")]
    Unreachable {
        /// host:port.
        endpoint: String,
        /// What failed.
        message: String,
    },
    /// An answer that is not what IMDS sends.
    #[error("instance metadata {path}: {message}")]
    Invalid {
        /// The path read.
        path: String,
        /// What is wrong with the answer.
        message: String,
    },
}

#[derive(Deserialize)]
struct InstanceAction {
    action: String,
    time: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ScheduledEvent {
    code: String,
    state: String,
    not_before: String,
}

fn invalid(path: &str, message: impl ToString) -> ImdsError {
    ImdsError::Invalid { path: path.to_string(), message: message.to_string() }
}

/// The notices in IMDS's answers (`None`: 404, nothing announced) for `instance` at `now`: a spot
/// interruption at the instance action's `time` (terminate, stop or hibernate: the node goes
/// either way), a rebalance recommendation, and each active scheduled event at its `NotBefore`.
pub fn notices_of(
    instance: &str,
    spot: Option<&str>,
    rebalance: Option<&str>,
    scheduled: Option<&str>,
    now: i64,
) -> Result<Vec<Notice>, ImdsError> {
    let mut out = Vec::new();
    let notice = |kind, deadline| Notice { kind, instance: instance.to_string(), issued_at: now, deadline };
    if let Some(body) = spot {
        let a: InstanceAction = serde_json::from_str(body).map_err(|e| invalid(SPOT, e))?;
        let at =
            rfc3339(&a.time).ok_or_else(|| invalid(SPOT, format!("time {:?} is not RFC 3339", a.time)))?;
        tracing::debug!(action = %a.action, at, "spot instance action");
        out.push(notice(NoticeKind::SpotInterruption, Some(at)));
    }
    if rebalance.is_some() {
        out.push(notice(NoticeKind::Rebalance, None));
    }
    if let Some(body) = scheduled {
        let events: Vec<ScheduledEvent> = serde_json::from_str(body).map_err(|e| invalid(SCHEDULED, e))?;
        for e in events.iter().filter(|e| e.state == "active") {
            let at = imds_date(&e.not_before).ok_or_else(|| {
                invalid(SCHEDULED, format!("NotBefore {:?} of {} is not a date", e.not_before, e.code))
            })?;
            out.push(notice(NoticeKind::ScheduledMaintenance, Some(at)));
        }
    }
    Ok(out)
}

/// The notice the Node's taint should say: the one the node goes soonest for (a spot
/// interruption or a scheduled event, by deadline), else a rebalance recommendation.
pub fn most_urgent(notices: &[Notice]) -> Option<&Notice> {
    notices.iter().min_by_key(|n| (n.deadline.unwrap_or(i64::MAX), n.kind))
}

fn rfc3339(s: &str) -> Option<i64> {
    s.parse::<k8s_openapi::jiff::Timestamp>().ok().map(|t| t.as_second())
}

/// IMDS's maintenance dates: `21 Jan 2019 09:00:43 GMT`.
fn imds_date(s: &str) -> Option<i64> {
    let t = k8s_openapi::jiff::fmt::strtime::parse("%d %b %Y %H:%M:%S GMT", s).ok()?;
    t.to_datetime()
        .ok()?
        .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
        .ok()
        .map(|z| z.timestamp().as_second())
}

/// An IMDSv2 client for one instance.
pub struct Imds {
    endpoint: String,
    timeout: Duration,
    token: Option<(String, Instant)>,
    instance: Option<String>,
}

impl Imds {
    /// A client of the service at `endpoint` (host:port; [`DEFAULT_ENDPOINT`] on EC2).
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self { endpoint: endpoint.into(), timeout: Duration::from_secs(2), token: None, instance: None }
    }

    /// The instance's notices now (Unix seconds `now`).
    pub async fn notices(&mut self, now: i64) -> Result<Vec<Notice>, ImdsError> {
        let instance = match &self.instance {
            Some(i) => i.clone(),
            None => {
                let id = self.get("instance-id").await?.ok_or_else(|| invalid("instance-id", "not found"))?;
                let id = id.trim().to_string();
                self.instance = Some(id.clone());
                id
            }
        };
        let spot = self.get(SPOT).await?;
        let rebalance = self.get(REBALANCE).await?;
        let scheduled = self.get(SCHEDULED).await?;
        notices_of(&instance, spot.as_deref(), rebalance.as_deref(), scheduled.as_deref(), now)
    }

    /// GET `/latest/meta-data/<path>` with a session token; `None` on 404. A refused token
    /// (401) is renewed once.
    async fn get(&mut self, path: &str) -> Result<Option<String>, ImdsError> {
        for attempt in 0..2 {
            let token = self.token().await?;
            let (status, body) = self
                .call(Method::GET, &format!("/latest/meta-data/{path}"), ("x-aws-ec2-metadata-token", &token))
                .await?;
            match status {
                StatusCode::OK => return Ok(Some(body)),
                StatusCode::NOT_FOUND => return Ok(None),
                StatusCode::UNAUTHORIZED if attempt == 0 => self.token = None,
                other => return Err(invalid(path, format!("HTTP {other}"))),
            }
        }
        Err(invalid(path, "the session token was refused twice"))
    }

    async fn token(&mut self) -> Result<String, ImdsError> {
        if let Some((t, at)) = &self.token {
            // Renewed a minute before it expires.
            if at.elapsed() < Duration::from_secs(TOKEN_TTL_SECONDS - 60) {
                return Ok(t.clone());
            }
        }
        let ttl = TOKEN_TTL_SECONDS.to_string();
        let (status, body) = self
            .call(Method::PUT, "/latest/api/token", ("x-aws-ec2-metadata-token-ttl-seconds", &ttl))
            .await?;
        if status != StatusCode::OK {
            return Err(invalid("api/token", format!("HTTP {status}")));
        }
        self.token = Some((body.clone(), Instant::now()));
        Ok(body)
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        header: (&str, &str),
    ) -> Result<(StatusCode, String), ImdsError> {
        let answer = call(&self.endpoint, self.timeout, method, path, &[header]).await?;
        Ok((answer.status, answer.body))
    }
}

/// A metadata server's answer.
pub(super) struct Answer {
    pub status: StatusCode,
    pub body: String,
    /// Its `ETag` header (GCE's change notification waits on it).
    pub etag: Option<String>,
}

/// One HTTP/1.1 request to the metadata server at `endpoint` on a fresh connection (it is
/// link-local: a connection costs nothing, and none is left half-used after a timeout).
pub(super) async fn call(
    endpoint: &str,
    timeout: Duration,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Answer, ImdsError> {
    let unreachable = |message: String| ImdsError::Unreachable { endpoint: endpoint.to_string(), message };
    let exchange = async {
        let stream =
            tokio::net::TcpStream::connect(endpoint).await.map_err(|e| unreachable(e.to_string()))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let driver = tokio::spawn(conn);
        let mut request = Request::builder().method(method).uri(path).header(hyper::header::HOST, endpoint);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Empty::<Bytes>::new()).map_err(|e| unreachable(e.to_string()))?;
        let response = sender.send_request(request).await.map_err(|e| unreachable(e.to_string()))?;
        let status = response.status();
        let etag =
            response.headers().get(hyper::header::ETAG).and_then(|v| v.to_str().ok()).map(str::to_string);
        let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|e| invalid(path, e))?
            .to_bytes();
        driver.abort();
        Ok(Answer { status, body: String::from_utf8_lossy(&body).into_owned(), etag })
    };
    tokio::time::timeout(timeout, exchange).await.map_err(|_| unreachable("timed out".into()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_796_637_600; // 2026-12-07T10:00:00Z

    #[test]
    fn the_answers_of_imds_become_notices() {
        // The bodies as AWS documents them (and ec2-metadata-mock serves them).
        let spot = r#"{"action": "terminate", "time": "2026-12-07T10:02:00Z"}"#;
        let rebalance = r#"{"noticeTime": "2026-12-07T09:59:00Z"}"#;
        let scheduled = r#"[
            {"Code": "system-reboot", "Description": "scheduled reboot", "State": "active",
             "EventId": "instance-event-0d59937288b749b32", "NotBefore": "8 Dec 2026 07:00:00 GMT",
             "NotAfter": "8 Dec 2026 09:00:00 GMT"},
            {"Code": "instance-stop", "Description": "done", "State": "completed",
             "EventId": "instance-event-1", "NotBefore": "1 Dec 2026 07:00:00 GMT"}
        ]"#;
        let got = notices_of("i-0abc", Some(spot), Some(rebalance), Some(scheduled), NOW).unwrap();
        let kinds: Vec<(NoticeKind, Option<i64>)> = got.iter().map(|n| (n.kind, n.deadline)).collect();
        assert_eq!(
            kinds,
            vec![
                (NoticeKind::SpotInterruption, Some(NOW + 120)),
                (NoticeKind::Rebalance, None),
                (NoticeKind::ScheduledMaintenance, Some(NOW + 21 * 3600)),
            ]
        );
        assert_eq!(most_urgent(&got).map(|n| n.kind), Some(NoticeKind::SpotInterruption));
        assert!(notices_of("i-0abc", None, None, None, NOW).unwrap().is_empty());
        let only_rebalance = notices_of("i-0abc", None, Some(rebalance), None, NOW).unwrap();
        assert_eq!(most_urgent(&only_rebalance).map(|n| n.kind), Some(NoticeKind::Rebalance));
    }

    #[test]
    fn malformed_answers_name_the_path() {
        let err = notices_of("i", Some("<html>404</html>"), None, None, NOW).unwrap_err();
        assert!(err.to_string().starts_with("instance metadata spot/instance-action:"), "{err}");
        let err = notices_of("i", Some(r#"{"action":"stop","time":"soon"}"#), None, None, NOW).unwrap_err();
        assert!(err.to_string().contains(r#"time "soon""#), "{err}");
        let bad = r#"[{"Code":"system-reboot","State":"active","NotBefore":"tomorrow"}]"#;
        let err = notices_of("i", None, None, Some(bad), NOW).unwrap_err();
        assert!(err.to_string().contains(r#"NotBefore "tomorrow" of system-reboot"#), "{err}");
    }
}
