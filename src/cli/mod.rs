//! Command-line parsing and the subcommands' edges: files in, reports out.

#[cfg(feature = "agent")]
mod agent;
mod autoscale;
mod generate;
mod plan;
mod plot;
#[cfg(feature = "controller")]
mod run;
mod simulate;

use clap::{Parser, Subcommand, ValueEnum};
use std::process::ExitCode;

/// Kubernetes GPU cluster autoscaler and placement scheduler.
#[derive(Debug, Parser)]
#[command(name = "gpuscale", version, about)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "GPUSCALE_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the scaling plan for a cluster snapshot (dry run: nothing is changed). With no
    /// arguments, plans an embedded example cluster against a simulated cloud.
    Plan(plan::PlanArgs),
    /// Replay a GPU trace through the placement scheduler (the FGD paper's workload-inflation
    /// experiment) and report how much of the cluster each policy allocates.
    Simulate(simulate::SimulateArgs),
    /// Write a real-shaped `kubectl get nodes,pods -A -o json` snapshot of any size (5,000 GPU
    /// nodes and 60,000 pods by default) and its provider config, to try `plan` at scale.
    Generate(generate::GenerateArgs),
    /// Node GPU telemetry agent (a DaemonSet): NVML readings as Prometheus metrics and as the
    /// `gpuscale.io/gpu-telemetry` node annotation the controller reads.
    #[cfg(feature = "agent")]
    Agent(agent::AgentArgs),
    /// Run the in-cluster controller: watch pending pods and nodes, scale node groups, drain
    /// and remove unneeded nodes (leader-elected; `--dry-run` only reports the plan).
    #[cfg(feature = "controller")]
    Run(run::RunArgs),
}

/// Sets up `tracing` output on stderr; `RUST_LOG` filters (default `info`); colour only on a
/// terminal without `NO_COLOR`.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal, and never when NO_COLOR is set (no-color.org).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour);
    match format {
        LogFormat::Text => builder.fmt_fields(ShownFields).init(),
        // JSON's own string escaping keeps every value exact and on its line.
        LogFormat::Json => builder.json().init(),
    }
}

/// Text log fields with every value through [`gpuscale::shown::shown`] (names, reasons and error
/// messages from the cluster and the clouds): a newline in a pod name cannot forge a log or plan
/// line on stderr, and ESC reads as it does in the plan table (`\u{1b}`).
struct ShownFields;

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for ShownFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut visitor = ShownVisitor { writer, result: Ok(()), first: true };
        fields.record(&mut visitor);
        visitor.result
    }
}

/// Writes `message` as it is and other fields as `name=value`, every value escaped.
struct ShownVisitor<'w> {
    writer: tracing_subscriber::fmt::format::Writer<'w>,
    result: std::fmt::Result,
    first: bool,
}

impl ShownVisitor<'_> {
    fn field(&mut self, field: &tracing::field::Field, value: std::fmt::Arguments<'_>) {
        if self.result.is_err() {
            return;
        }
        let sep = if std::mem::take(&mut self.first) { "" } else { " " };
        let value = gpuscale::shown::Shown(value);
        self.result = match field.name() {
            "message" => write!(self.writer, "{sep}{value}"),
            name => write!(self.writer, "{sep}{}={value}", name.trim_start_matches("r#")),
        };
    }
}

impl tracing::field::Visit for ShownVisitor<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.field(field, format_args!("{value}"));
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.field(field, format_args!("{value:?}"));
    }
}

/// A kube-rs config error as one message: kube quotes an unreadable kubeconfig's path twice
/// (`'"/path"'`), which this writes once (`/path`).
#[cfg(feature = "controller")]
pub fn kube_config_message(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cause {
        if let Some(kube::config::KubeconfigError::ReadConfig(_, path)) = e.downcast_ref() {
            text = text.replace(&format!("'{path:?}'"), &path.display().to_string());
        }
        cause = e.source();
    }
    text
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Plan(args) => plan::run(args),
        Command::Simulate(args) => simulate::run(args),
        Command::Generate(args) => generate::run(args),
        #[cfg(feature = "agent")]
        Command::Agent(args) => agent::run(args),
        #[cfg(feature = "controller")]
        Command::Run(args) => run::run(args),
    }
}
