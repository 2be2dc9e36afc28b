//! The agent's main loop: sample, track idleness, update metrics, publish; serve HTTP meanwhile.

use super::gce_metadata::GceMetadata;
use super::imds::{self, Imds};
use super::metrics::AgentMetrics;
use super::publish::{NodeAnnotator, PublishPolicy, PublishState};
use super::source::{SourceError, TelemetrySource};
use crate::model::{IdleTracker, NoticeKind};
use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use axum::Router;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use thiserror::Error;

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Address of the `/metrics` and `/healthz` server.
    pub listen: SocketAddr,
    /// Time between samples.
    pub interval: Duration,
    /// Node to annotate; `None` serves metrics only.
    pub node_name: Option<String>,
    /// Utilisation (percent) below which a GPU counts as idle.
    pub idle_threshold_pct: u8,
    /// When to write the node annotation.
    pub publish: PublishPolicy,
    /// Where to read interruption notices (the EC2 metadata service); `None`: not watched.
    pub interruptions: Option<InterruptionWatch>,
}

/// The agent's watch of the instance metadata service for interruption notices.
#[derive(Debug, Clone)]
pub struct InterruptionWatch {
    /// Whose metadata server it is.
    pub cloud: MetadataCloud,
    /// host:port of the metadata server (169.254.169.254:80 on EC2 and GCE).
    pub imds_endpoint: String,
    /// Time between reads of IMDS (AWS Node Termination Handler reads every 2 s); on GCE, the
    /// time before a read again after a failed one (reads there wait for a change).
    pub interval: Duration,
}

/// Which cloud's metadata server the agent reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataCloud {
    /// EC2's IMDSv2, read every interval.
    Aws,
    /// GCE's metadata server, waited on for changes.
    Gcp,
}

/// A metadata server, read for notices.
enum NoticeSource {
    Aws(Imds),
    Gcp(GceMetadata),
}

impl NoticeSource {
    fn new(w: &InterruptionWatch) -> Self {
        match w.cloud {
            MetadataCloud::Aws => Self::Aws(Imds::new(w.imds_endpoint.clone())),
            MetadataCloud::Gcp => Self::Gcp(GceMetadata::new(w.imds_endpoint.clone())),
        }
    }

    /// Whether a read returns at once (so reads are paced by the interval).
    fn polled(&self) -> bool {
        matches!(self, Self::Aws(_))
    }

    async fn notices(&mut self) -> Result<Vec<crate::model::Notice>, imds::ImdsError> {
        match self {
            Self::Aws(i) => i.notices(unix_now() as i64).await,
            Self::Gcp(g) => g.notices(|| unix_now() as i64).await,
        }
    }
}

/// Why the agent stopped with an error.
#[derive(Debug, Error)]
pub enum AgentError {
    /// The metrics address cannot be bound.
    #[error("cannot listen on {addr}: {cause}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error (in the message, so not also a `source()`).
        cause: std::io::Error,
    },
    /// The HTTP server failed.
    #[error("metrics server on {addr}: {cause}")]
    Serve {
        /// The address.
        addr: SocketAddr,
        /// The error (in the message, so not also a `source()`).
        cause: std::io::Error,
    },
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Runs the agent until `shutdown` completes: binds the HTTP server, then samples every
/// `interval`. Annotations go through `client`, or a client from the in-cluster/kubeconfig
/// environment made on first use. Returns the bound address through `bound` (useful with port 0).
pub async fn run(
    options: AgentOptions,
    mut source: Box<dyn TelemetrySource>,
    client: Option<kube::Client>,
    shutdown: impl Future<Output = ()> + Send,
    bound: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) -> Result<(), AgentError> {
    let metrics = Arc::new(AgentMetrics::new());
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|cause| AgentError::Bind { addr: options.listen, cause })?;
    let addr = listener.local_addr().map_err(|cause| AgentError::Bind { addr: options.listen, cause })?;
    tracing::info!(%addr, interval = ?options.interval, node = ?options.node_name, "gpuscale agent serving /metrics and /healthz");
    if let Some(tx) = bound {
        let _ = tx.send(addr);
    }
    let served = metrics.clone();
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = served.clone();
                async move {
                    (
                        [(CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
                        m.encode(),
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut server_stop = stop_rx.clone();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = server_stop.wait_for(|s| *s).await;
            })
            .await
    });

    let watcher = options.interruptions.clone().zip(options.node_name.clone()).map(|(w, node)| {
        tracing::info!(cloud = ?w.cloud, endpoint = %w.imds_endpoint, every = ?w.interval, %node, "watching the instance metadata service for interruption notices");
        tokio::spawn(watch_interruptions(w, client.clone(), node, stop_rx.clone()))
    });
    let mut tracker = IdleTracker::new(options.idle_threshold_pct);
    let mut publish = PublishState::default();
    let mut annotator: Option<NodeAnnotator> =
        client.zip(options.node_name.clone()).map(|(c, node)| NodeAnnotator::new(c, node));
    let mut client_error_logged = false;
    let mut unavailable_logged = false;
    let mut ticker = tokio::time::interval(options.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = ticker.tick() => {}
        }
        let now = unix_now();
        let mut sample = match source.sample(now) {
            Ok(s) => s,
            Err(SourceError::Unavailable { reason }) => {
                if !unavailable_logged {
                    tracing::warn!(%reason, "no NVIDIA driver (NVML unavailable): serving empty GPU metrics; will retry");
                    unavailable_logged = true;
                }
                metrics.record_unavailable();
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "GPU sample failed");
                metrics.record_error();
                continue;
            }
        };
        if unavailable_logged {
            tracing::info!(gpus = sample.gpus.len(), "NVML available");
            unavailable_logged = false;
        }
        tracker.observe(&mut sample);
        metrics.record(&sample);
        let Some(node) = &options.node_name else { continue };
        if !publish.due(&options.publish, &sample, now) {
            continue;
        }
        if annotator.is_none() {
            crate::tls::install_crypto_provider();
            match kube::Client::try_default().await {
                Ok(client) => annotator = Some(NodeAnnotator::new(client, node.clone())),
                Err(e) => {
                    if !client_error_logged {
                        tracing::warn!(error = %e, "no Kubernetes client; the node annotation is not written (metrics still served)");
                        client_error_logged = true;
                    }
                    publish.attempted(&sample, now, false);
                    continue;
                }
            }
        }
        if let Some(a) = &annotator {
            let result = a.publish(&sample).await;
            if let Err(e) = &result {
                tracing::warn!(node = %node, error = %e, "writing the telemetry annotation failed");
            }
            metrics.record_annotation(result.is_ok());
            publish.attempted(&sample, now, result.is_ok());
        }
    }
    tracing::info!("gpuscale agent shutting down");
    let _ = stop_tx.send(true);
    if let Some(w) = watcher {
        let _ = w.await;
    }
    match server.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(cause)) => Err(AgentError::Serve { addr, cause }),
        Err(join) => Err(AgentError::Serve { addr, cause: std::io::Error::other(join.to_string()) }),
    }
}

/// Reads the metadata service (every `interval` on EC2, on each change on GCE) and marks the node
/// with the most urgent notice (the taint the controller reacts to), once per kind; until
/// `stop`. Failures are logged once per run of failures and retried after `interval`.
async fn watch_interruptions(
    w: InterruptionWatch,
    client: Option<kube::Client>,
    node: String,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut source = NoticeSource::new(&w);
    let mut marker = client.map(|c| NodeAnnotator::new(c, node.clone()));
    let mut marked: Option<NoticeKind> = None;
    let mut failing = false;
    let mut ticker = tokio::time::interval(w.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if source.polled() || failing {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = ticker.tick() => {}
            }
        }
        let read = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            read = source.notices() => read,
        };
        let notices = match read {
            Ok(n) => n,
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "reading interruption notices failed; retrying");
                }
                failing = true;
                continue;
            }
        };
        let Some(kind) = imds::most_urgent(&notices).map(|n| n.kind).filter(|k| marked != Some(*k)) else {
            failing = false;
            continue;
        };
        if marker.is_none() {
            crate::tls::install_crypto_provider();
            marker = kube::Client::try_default().await.ok().map(|c| NodeAnnotator::new(c, node.clone()));
        }
        let Some(m) = &marker else {
            if !failing {
                tracing::warn!(notice = kind.name(), "no Kubernetes client; the node cannot be marked");
            }
            failing = true;
            continue;
        };
        match m.mark_interruption(kind).await {
            Ok(_) => {
                tracing::warn!(%node, notice = kind.name(), "interruption notice: node marked");
                marked = Some(kind);
                failing = false;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(%node, error = %e, "marking the node failed; retrying");
                }
                failing = true;
            }
        }
    }
}
