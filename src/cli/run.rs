//! `gpuscale run`: the in-cluster controller.

use anyhow::Context;
use clap::Args;
use gpuscale::config::GpuscaleConfig;
use gpuscale::controller::health::{self, Health};
use gpuscale::controller::metrics::Metrics;
use gpuscale::controller::observers::{HealthObserver, MetricsObserver, StatusObserver};
use gpuscale::controller::providers::ProviderSet;
use gpuscale::controller::reconcile::{Controller, ControllerOptions};
use gpuscale::controller::status::StatusPublisher;
use gpuscale::controller::{LogObserver, Observer, Observers};
use gpuscale::providers::config;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// Arguments of `gpuscale run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Provider config file(s) with the cloud accounts and node groups (repeatable).
    #[arg(long, required = true)]
    providers: Vec<PathBuf>,
    /// gpuscale config file (`planner:` and `controller:` sections).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Plan and publish the plan, never change the cluster or the clouds.
    #[arg(long)]
    dry_run: bool,
    /// Holder identity in the leader-election Lease (the pod name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Namespace of the Lease (default: the config's `controller.namespace`, else
    /// `$POD_NAMESPACE`, else `gpuscale-system`).
    #[arg(long)]
    namespace: Option<String>,
    /// Address of the `/metrics`, `/healthz` and `/readyz` endpoints.
    #[arg(long, default_value = "0.0.0.0:8080")]
    listen: std::net::SocketAddr,
    /// `/healthz` fails when the leader has not completed a loop for this many seconds.
    #[arg(long, default_value_t = 300)]
    health_staleness_seconds: u64,
}

/// Runs the controller until SIGINT or SIGTERM.
pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let file = match &args.config {
        Some(path) => GpuscaleConfig::load(path)?,
        None => GpuscaleConfig::default(),
    };
    let providers = config::load_files(&args.providers)?;
    let namespace = args
        .namespace
        .or(file.controller.namespace.clone())
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .unwrap_or_else(|| "gpuscale-system".into());
    let hostname = std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty());
    let identity = match (args.identity, hostname) {
        (Some(i), _) | (None, Some(i)) => i,
        // A dry run takes no part in the election: the name only labels its Events.
        (None, None) if args.dry_run => "gpuscale-dry-run".to_string(),
        (None, None) => anyhow::bail!(
            "no leader-election identity: pass --identity or set POD_NAME (the pod name) or HOSTNAME"
        ),
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting tokio")?;
    runtime.block_on(async move {
        // kube's message already holds its causes, which its `source()` chain would repeat.
        let kube_config = kube::Config::infer().await.map_err(|e| {
            anyhow::anyhow!(
                "finding the Kubernetes API server (in-cluster or kubeconfig): {}",
                super::kube_config_message(&e)
            )
        })?;
        let client = gpuscale::controller::client(kube_config).context("building the Kubernetes client")?;
        let set = ProviderSet::connect(&providers).await?;
        let options = ControllerOptions {
            config: file.controller,
            planner: gpuscale::planner::PlannerSettings {
                telemetry: file.telemetry,
                tenancy: file.tenancy,
                ..file.planner
            },
            identity,
            namespace,
            dry_run: args.dry_run,
            drive_simulated_clock: true,
            mutant: Default::default(),
        };
        let metrics = Arc::new(Metrics::new());
        let health = Arc::new(Health::new(std::time::Duration::from_secs(args.health_staleness_seconds)));
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("--listen {}: cannot bind", args.listen))?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut server_stop = stop_rx.clone();
        let server = tokio::spawn(health::serve(listener, metrics.clone(), health.clone(), async move {
            let _ = server_stop.wait_for(|s| *s).await;
        }));
        let (status, status_task) =
            StatusPublisher::new(client.clone(), options.namespace.clone(), options.identity.clone())
                .with_metrics(metrics.clone())
                .with_health(health.clone())
                .spawn();
        let observers: Vec<Arc<dyn Observer>> = vec![
            Arc::new(LogObserver),
            Arc::new(MetricsObserver(metrics)),
            Arc::new(HealthObserver(health)),
            Arc::new(StatusObserver::new(status.clone())),
        ];
        let controller = Controller::new(client, Arc::new(set), options, Arc::new(Observers(observers)));
        status.set_fence(controller.fence());
        tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!("shutting down");
            stop_tx.send_replace(true);
        });
        let result = controller.run(stop_rx).await;
        status.flush().await;
        status_task.abort();
        if let Err(e) = server.await.context("metrics server task")? {
            tracing::warn!(error = %e, "metrics server stopped with an error");
        }
        result?;
        Ok(ExitCode::SUCCESS)
    })
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
