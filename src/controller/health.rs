//! The controller's HTTP endpoints: `/metrics`, `/healthz` and `/readyz`.
//!
//! `/healthz` is the liveness probe: it fails only when this replica is the leader and its loop
//! has not completed within the staleness window (a wedged loop is fixed by a restart; a standby
//! replica runs no loop and stays alive). `/readyz` is the readiness probe: the reflector caches
//! have synced, so the snapshot the loop sees is complete, and the status ConfigMaps are being
//! written (after [`STATUS_FAILURES_UNREADY`] failed writes in a row the replica turns unready,
//! so that a refused or failing status write shows in `kubectl get pods`, not only in a counter).

use super::metrics::Metrics;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Content type of OpenMetrics text.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Failed status writes in a row after which `/readyz` fails: one failure is a blip the next
/// loop repairs, three loops' worth is a fault someone must fix (RBAC, quota, webhook).
pub const STATUS_FAILURES_UNREADY: u32 = 3;

/// Liveness and readiness state, shared by the loop (writer) and the HTTP server (reader).
/// Times are nanoseconds since `base`, so that they fit atomics; `0` means never.
#[derive(Debug)]
pub struct Health {
    base: Instant,
    staleness: Duration,
    synced: AtomicBool,
    leader: AtomicBool,
    leader_since: AtomicU64,
    last_loop: AtomicU64,
    status_failures: AtomicU32,
    status_error: Mutex<String>,
}

impl Health {
    /// State of a process that just started: not synced, not leader. `staleness` is how long the
    /// leader's loop may go without completing before `/healthz` fails.
    pub fn new(staleness: Duration) -> Self {
        Health {
            base: Instant::now(),
            staleness,
            synced: AtomicBool::new(false),
            leader: AtomicBool::new(false),
            leader_since: AtomicU64::new(0),
            last_loop: AtomicU64::new(0),
            status_failures: AtomicU32::new(0),
            status_error: Mutex::new(String::new()),
        }
    }

    fn offset(&self, at: Instant) -> u64 {
        // +1 keeps a time at `base` distinct from "never".
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX - 1) + 1
    }

    /// Marks the reflector caches as synced (or not, after a watch was lost for good).
    pub fn set_synced(&self, synced: bool) {
        self.synced.store(synced, Ordering::Release);
    }

    /// Records gaining or losing the leader lease at `now`; gaining it starts the staleness
    /// window, so that a new leader gets a full window for its first loop.
    pub fn set_leader(&self, leader: bool, now: Instant) {
        if leader && !self.leader.load(Ordering::Acquire) {
            self.leader_since.store(self.offset(now), Ordering::Release);
        }
        self.leader.store(leader, Ordering::Release);
    }

    /// Records a completed loop at `now`.
    pub fn loop_completed(&self, now: Instant) {
        self.last_loop.store(self.offset(now), Ordering::Release);
    }

    /// True when the caches have synced.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// True when this replica holds the lease.
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Acquire)
    }

    /// Liveness at `now`: `Err` says why the process should be restarted.
    pub fn live(&self, now: Instant) -> Result<(), String> {
        if !self.is_leader() {
            return Ok(());
        }
        let since = self.last_loop.load(Ordering::Acquire).max(self.leader_since.load(Ordering::Acquire));
        let age = Duration::from_nanos(self.offset(now).saturating_sub(since));
        if age >= self.staleness {
            let what = if self.last_loop.load(Ordering::Acquire) == 0 {
                "no loop has completed"
            } else {
                "the last loop completed"
            };
            Err(format!(
                "leader, and {what} {:.1}s ago (staleness window {:.1}s)",
                age.as_secs_f64(),
                self.staleness.as_secs_f64()
            ))
        } else {
            Ok(())
        }
    }

    /// Records a status write's outcome; returns the failures in a row, counting this one.
    pub fn status_written(&self, result: Result<(), &str>) -> u32 {
        match result {
            Ok(()) => {
                self.status_failures.store(0, Ordering::Release);
                0
            }
            Err(why) => {
                *self.status_error.lock().unwrap_or_else(|p| p.into_inner()) = why.to_string();
                self.status_failures.fetch_add(1, Ordering::AcqRel).saturating_add(1)
            }
        }
    }

    /// Readiness: `Err` while the caches have not synced, or while status writes keep failing.
    pub fn ready(&self) -> Result<(), String> {
        if !self.is_synced() {
            return Err("reflector caches not synced yet".into());
        }
        let failures = self.status_failures.load(Ordering::Acquire);
        if failures >= STATUS_FAILURES_UNREADY {
            let why = self.status_error.lock().unwrap_or_else(|p| p.into_inner()).clone();
            return Err(format!("status ConfigMaps not written ({failures} failures in a row): {why}"));
        }
        Ok(())
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

fn probe(result: Result<(), String>) -> Response {
    match result {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

async fn metrics(State(s): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], s.metrics.encode()).into_response()
}

async fn healthz(State(s): State<AppState>) -> Response {
    probe(s.health.live(Instant::now()))
}

async fn readyz(State(s): State<AppState>) -> Response {
    probe(s.health.ready())
}

/// The endpoints as an axum router (for embedding in another server).
pub fn router(metrics: Arc<Metrics>, health: Arc<Health>) -> Router {
    Router::new()
        .route("/metrics", get(self::metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, health })
}

/// Serves the endpoints on `listener` until `shutdown` completes, then finishes the requests in
/// flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(metrics, health)).with_graceful_shutdown(shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_follows_leadership_and_the_staleness_window() {
        let h = Health::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert!(h.live(t0 + Duration::from_secs(3600)).is_ok(), "a standby replica is alive");
        h.set_leader(true, t0);
        assert!(h.live(t0 + Duration::from_secs(59)).is_ok(), "a new leader gets a full window");
        let err = h.live(t0 + Duration::from_secs(61)).unwrap_err();
        assert!(err.contains("no loop has completed"), "{err}");
        h.loop_completed(t0 + Duration::from_secs(100));
        assert!(h.live(t0 + Duration::from_secs(150)).is_ok());
        let err = h.live(t0 + Duration::from_secs(170)).unwrap_err();
        assert!(err.contains("last loop completed 70.0s ago"), "{err}");
        h.set_leader(false, t0 + Duration::from_secs(170));
        assert!(h.live(t0 + Duration::from_secs(1000)).is_ok());
        assert!(h.ready().is_err());
        h.set_synced(true);
        assert!(h.ready().is_ok());
    }

    /// One HTTP/1.1 request over a fresh connection: (status, content type, body).
    async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connecting to the health server");
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        conn.write_all(req.as_bytes()).await.expect("sending the request");
        let mut raw = String::new();
        conn.read_to_string(&mut raw).await.expect("reading the response");
        let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
        let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status code");
        let ctype = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type:").map(|v| v.trim().to_string()))
            .unwrap_or_default();
        (status, ctype, body.to_string())
    }

    #[tokio::test]
    async fn endpoints_answer_over_http() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let metrics = Arc::new(Metrics::new());
        // A zero window: a leader is stale at once, so the probe fails without waiting.
        let health = Arc::new(Health::new(Duration::ZERO));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, metrics.clone(), health.clone(), async {
            let _ = stopped.await;
        }));

        metrics.scaled_up("aws/prod/h100", 2);
        let (status, ctype, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert_eq!(ctype, OPENMETRICS_CONTENT_TYPE);
        assert!(body.contains("gpuscale_scale_ups_total{group=\"aws/prod/h100\"} 1"), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");

        assert_eq!(get(addr, "/healthz").await.0, 200, "a standby replica is alive");
        let (status, _, body) = get(addr, "/readyz").await;
        assert_eq!((status, body.as_str()), (503, "reflector caches not synced yet\n"));
        health.set_synced(true);
        assert_eq!(get(addr, "/readyz").await.0, 200);

        health.set_leader(true, Instant::now());
        let (status, _, body) = get(addr, "/healthz").await;
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("no loop has completed"), "{body}");
        assert_eq!(get(addr, "/nope").await.0, 404);

        stop.send(()).expect("server still running");
        server.await.expect("server task").expect("server ends cleanly on shutdown");
    }
}
