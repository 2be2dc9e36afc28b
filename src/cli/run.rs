//! `gpuscale run`: the in-cluster controller.

use anyhow::Context;
use clap::Args;
use gpuscale::config::GpuscaleConfig;
use gpuscale::controller::providers::ProviderSet;
use gpuscale::controller::reconcile::{Controller, ControllerOptions};
use gpuscale::controller::LogObserver;
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
    let identity = match args.identity {
        Some(i) => i,
        None => std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).context(
            "no leader-election identity: pass --identity or set POD_NAME (the pod name) or HOSTNAME",
        )?,
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting tokio")?;
    runtime.block_on(async move {
        let mut kube_config = kube::Config::infer()
            .await
            .context("finding the Kubernetes API server (in-cluster or kubeconfig)")?;
        // The loop retries on its own schedule; kube's built-in retry would sit out an eviction's
        // 429 Retry-After inside one pass and stall every other node.
        kube_config.default_retry = false;
        let client = kube::Client::try_from(kube_config).context("building the Kubernetes client")?;
        let set = ProviderSet::connect(&providers).await?;
        let options = ControllerOptions {
            config: file.controller,
            planner: file.planner,
            identity,
            namespace,
            dry_run: args.dry_run,
            drive_simulated_clock: true,
        };
        let controller = Controller::new(client, Arc::new(set), options, Arc::new(LogObserver));
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!("shutting down");
            stop_tx.send_replace(true);
        });
        controller.run(stop_rx).await?;
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
