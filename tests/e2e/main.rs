//! The tests that run the controller, the agent or `plan` against an API server: the real control
//! plane (`k8s_*`, `plan_live`: etcd, kube-apiserver, kube-scheduler and kube-controller-manager
//! built by `scripts/k8s-controlplane.sh`) or the in-process stand-in (`controller_*`,
//! `fake_apiserver`, `agent_annotate`).
//!
//! They are one test binary because each links kube-rs, tokio and the controller: as fifteen
//! binaries (the gpuscale crate is built at opt-level 3, and the test crates with it) they took
//! about 40 CPU-minutes of CI's build, mostly compiling the same generic code again. Each former
//! file is a module, so one of them runs with a filter, e.g.
//! `cargo test --all-features --test e2e k8s_safety::`.

// The shared harnesses, each once for all modules.
#[path = "../support/apiserver/mod.rs"]
mod apiserver;
#[path = "../support/controlplane.rs"]
mod controlplane;
#[path = "../support/dra.rs"]
mod dra;
#[path = "../support/controller_fixtures.rs"]
mod fixtures;
#[path = "../support/cluster_harness.rs"]
mod harness;
#[path = "../support/kube_cluster.rs"]
mod kube_cluster;
#[path = "../support/kueue.rs"]
mod kueue;
#[cfg(feature = "aws")]
#[path = "../support/moto.rs"]
mod moto_server;
#[path = "../support/peers.rs"]
mod peers;
#[path = "../support/peers_plot.rs"]
mod peers_plot;
#[path = "../support/provisioning_crd.rs"]
mod provisioning_crd;
#[path = "../support/telemetry.rs"]
mod telemetry;

mod agent_annotate;
mod controller_loop;
mod controller_preemption;
mod controller_status;
mod fake_apiserver;
mod k8s_controller;
mod k8s_dra_e2e;
mod k8s_fixtures_valid;
mod k8s_kueue;
mod k8s_peers;
mod k8s_provisioning;
mod k8s_safety;
mod k8s_scheduler_diff;
mod k8s_tenancy;
mod plan_live;
