//! gpuscale side by side with the real Cluster Autoscaler and the real Karpenter (issue #46), on
//! the real control plane (`tests/support/peers.rs` says how they are run and measured).
//!
//! The smoke tests run one small burst per autoscaler. gpuscale's always runs; a peer's runs when
//! its binary is given (`GPUSCALE_KARPENTER_BIN`, `GPUSCALE_CLUSTER_AUTOSCALER_BIN`, from
//! `scripts/peers.sh`) and is skipped, saying so, when it is not: building both peers takes longer
//! than CI's budget (docs/peers.md). A peer that is given but does not work fails the test.
//!
//! The full table is `scripts/peers.sh table` (the ignored `peer_table` test).

use crate::peers;
use crate::peers_plot;

use peers::{
    burst, capacity_error, dra_claims, gang, gang_kueue, load_drop, mig, openb_day, record, run, time_sliced,
    Autoscaler, Figures,
};
use std::time::Duration;

const KARPENTER: &str = "GPUSCALE_KARPENTER_BIN";
const CLUSTER_AUTOSCALER: &str = "GPUSCALE_CLUSTER_AUTOSCALER_BIN";

/// Four one-GPU pods: every one bound, on nodes the autoscaler launched with enough GPUs. The run
/// lasts 60 s: Cluster Autoscaler waits until the oldest pending GPU pod is 30 s old before it
/// scales up (`unschedulablePodWithGpuTimeBuffer` in core/static_autoscaler.go).
async fn smoke(a: Autoscaler) {
    let f = run(&a, &burst(4, Duration::from_secs(60))).await;
    eprintln!("{}\n{}", Figures::header(), f.row());
    assert_eq!(f.never_bound, 0, "{} left pods unbound: {}", a.name(), f.row());
    assert!(f.launched >= 1, "{} launched no node: {}", a.name(), f.row());
    assert!(f.gpus_end.1 >= 4 && f.gpus_end.2 == 4, "{}: GPUs at the end {:?}", a.name(), f.gpus_end);
    assert!(f.p95_bind_s >= peers::BOOT.as_secs_f64() - 1.0, "bound before any node could boot: {}", f.row());
    assert!(f.cost_usd > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_gpuscale() {
    smoke(Autoscaler::Gpuscale).await;
}

/// Eight pods of one `nvidia.com/gpu` on GPUs time-sliced four ways: gpuscale buys two physical
/// GPUs (the two cheapest nodes that hold them), not eight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_gpuscale_time_sliced() {
    let f = run(&Autoscaler::Gpuscale, &time_sliced(8, 4, Duration::from_secs(30))).await;
    eprintln!("{}\n{}", Figures::header(), f.row());
    assert_eq!(f.never_bound, 0, "{}", f.row());
    assert_eq!(f.gpus_end, (2, 8, 8), "physical / advertised / used GPUs: {}", f.row());
    assert_eq!(f.types.get("g6.xlarge"), Some(&2), "{}", f.row());
}

/// Four pods claiming one GPU each through DRA: gpuscale buys the four one-GPU nodes (cheaper
/// than one four-GPU node), their DRA driver publishes the devices, and kube-scheduler allocates
/// every claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_gpuscale_dra() {
    let f = run(&Autoscaler::Gpuscale, &dra_claims(4, Duration::from_secs(30))).await;
    eprintln!("{}\n{}", Figures::header(), f.row());
    assert_eq!(f.never_bound, 0, "{}", f.row());
    assert_eq!(f.gpus_end, (4, 4, 4), "physical / published / allocated GPUs: {}", f.row());
    assert_eq!(f.types.get("g6.xlarge"), Some(&4), "{}", f.row());
}

/// With the cheapest type out of capacity, every pod is still bound, on the next type, and no
/// node of the refused type ever appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_gpuscale_capacity_error() {
    let f = run(&Autoscaler::Gpuscale, &capacity_error(4, Duration::from_secs(30))).await;
    eprintln!("{}\n{}", Figures::header(), f.row());
    assert_eq!(f.never_bound, 0, "{}", f.row());
    assert!(!f.types.contains_key("g6.xlarge") && f.launched >= 1, "{}", f.row());
    assert_eq!(f.gpus_end.2, 4, "{}", f.row());
}

/// A gang of two 8-GPU pods queued by Kueue: Kueue asks gpuscale for the capacity with a
/// ProvisioningRequest, gpuscale buys the two 8-GPU nodes, Kueue admits the group and both pods
/// are bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_gpuscale_gang_kueue() {
    let f = run(&Autoscaler::Gpuscale, &gang_kueue(2, 8, Duration::from_secs(30))).await;
    eprintln!("{}\n{}", Figures::header(), f.row());
    assert_eq!(f.never_bound, 0, "{}", f.row());
    assert_eq!(f.gpus_end, (16, 16, 16), "{}", f.row());
    assert_eq!(f.types.get("g6.48xlarge"), Some(&2), "{}", f.row());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_karpenter() {
    match Autoscaler::from_env(KARPENTER, Autoscaler::Karpenter) {
        Some(a) => smoke(a).await,
        None => {
            eprintln!("SKIPPED: {KARPENTER} is unset (export {KARPENTER}=\"$(scripts/peers.sh karpenter)\")")
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_cluster_autoscaler() {
    match Autoscaler::from_env(CLUSTER_AUTOSCALER, Autoscaler::ClusterAutoscaler) {
        Some(a) => smoke(a).await,
        None => eprintln!(
            "SKIPPED: {CLUSTER_AUTOSCALER} is unset (export {CLUSTER_AUTOSCALER}=\"$(scripts/peers.sh cluster-autoscaler)\")"
        ),
    }
}

/// The plot draws two lines per run, scaled to the largest fleet, and escapes names.
#[test]
fn the_plot_draws_each_run_in_both_panels() {
    let run = |autoscaler: &'static str, held: u64| Figures {
        autoscaler,
        scenario: "a -> b".into(),
        cost_usd: 0.0,
        fleet_usd_per_hour: 0.0,
        p50_bind_s: 0.0,
        p95_bind_s: 0.0,
        never_bound: 0,
        launched: 0,
        removed: 0,
        evicted: 0,
        types: Default::default(),
        gpus_end: (held, held, held),
        series: (0..=40)
            .map(|i| {
                let s = peers::Sample {
                    physical: held.min(i),
                    advertised: 4 * held.min(i),
                    used: i.min(4 * held),
                };
                (f64::from(i as u32), s)
            })
            .collect(),
    };
    let runs = [run("gpuscale", 12), run("Karpenter", 32)];
    let svg = peers_plot::svg("a -> b", &runs);
    assert_eq!(svg.matches("<polyline").count(), 4, "{svg}");
    assert!(svg.contains("a -&gt; b") && !svg.contains("a -> b"), "{svg}");
    // The larger fleet sets the axis: 32 GPUs round up to 50, so 32 is at 64% of the panel.
    assert!(svg.contains(">50</text>"), "{svg}");
    assert_eq!(peers_plot::slug("MIG: 4 x 3g.20gb (all-balanced)"), "mig-4-x-3g-20gb-all-balanced");
    let csv = peers_plot::csv(&runs);
    assert_eq!(csv.lines().count(), 1 + 2 * 41);
    assert!(csv.contains("\nKarpenter,40.00,32,128,40\n"), "{csv}");
}

/// The openb day replays every pod of the window once, in time order, each deleted after it was
/// created, whole GPUs only, within the run.
#[test]
fn the_openb_day_creates_each_pod_once_and_deletes_it_later() {
    use peers::Step;
    let s = openb_day(180.0);
    let mut created = std::collections::BTreeMap::new();
    let mut last = Duration::ZERO;
    for step in &s.steps {
        let at = match step {
            Step::CreateAt(at, job) => {
                let name = job["metadata"]["name"].as_str().unwrap().to_string();
                let gpus = &job["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
                    ["nvidia.com/gpu"];
                assert!(gpus.is_null() || gpus.as_str().unwrap().parse::<u32>().unwrap() >= 1, "{job}");
                assert!(created.insert(name, *at).is_none(), "{job} created twice");
                *at
            }
            Step::DeleteAt(at, path) => {
                let name = path.rsplit('/').next().unwrap();
                assert!(created.get(name).is_some_and(|c| c <= at), "{path} deleted before it was created");
                *at
            }
            other => panic!("{other:?}"),
        };
        assert!(at >= last && at <= s.duration, "out of order at {at:?}");
        last = at;
    }
    // The busiest day of openb's default list: a few hundred pods, 24 h / 180 = 8 min.
    assert!((200..1000).contains(&created.len()), "{} pods", created.len());
    assert_eq!(s.duration, Duration::from_secs(480 + 20));
}

/// The table of docs/peers.md: every scenario with every autoscaler (both peers required).
/// `GPUSCALE_PEERS_SCENARIOS` (comma-separated words, e.g. `mig,time-sliced`) keeps the scenarios
/// whose name holds one of them, and `GPUSCALE_PEERS_AUTOSCALERS` (`gpuscale,karpenter,cluster-autoscaler`)
/// the autoscalers named; only the peers kept are required. With `GPUSCALE_PEERS_PLOTS` (a folder),
/// each scenario's GPUs over time go there as `<scenario>.svg` and `.csv`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes per run; `scripts/peers.sh table`"]
async fn peer_table() {
    let wanted = |var: &str, name: &str| {
        std::env::var(var).map_or(true, |v| {
            v.split(',')
                .any(|w| !w.trim().is_empty() && name.to_lowercase().contains(&w.trim().to_lowercase()))
        })
    };
    let need = |var, make| {
        Autoscaler::from_env(var, make)
            .unwrap_or_else(|| panic!("{var} is unset: run `scripts/peers.sh table`"))
    };
    let mut all = Vec::new();
    if wanted("GPUSCALE_PEERS_AUTOSCALERS", "gpuscale") {
        all.push(Autoscaler::Gpuscale);
    }
    if wanted("GPUSCALE_PEERS_AUTOSCALERS", "karpenter") {
        all.push(need(KARPENTER, Autoscaler::Karpenter));
    }
    if wanted("GPUSCALE_PEERS_AUTOSCALERS", "cluster-autoscaler") {
        all.push(need(CLUSTER_AUTOSCALER, Autoscaler::ClusterAutoscaler));
    }
    let n = std::env::var("GPUSCALE_PEERS_BURST").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let speedup =
        std::env::var("GPUSCALE_PEERS_OPENB_SPEEDUP").ok().and_then(|v| v.parse().ok()).unwrap_or(180.0);
    let scenarios = [
        burst(n, Duration::from_secs(90)),
        time_sliced(48, 4, Duration::from_secs(90)),
        mig(4, 16, Duration::from_secs(90)),
        gang(4, 8, Duration::from_secs(60)),
        gang_kueue(4, 8, Duration::from_secs(60)),
        load_drop(8, 2, Duration::from_secs(100)),
        dra_claims(16, Duration::from_secs(90)),
        capacity_error(24, Duration::from_secs(90)),
        openb_day(speedup),
    ];
    let scenarios: Vec<_> =
        scenarios.into_iter().filter(|s| wanted("GPUSCALE_PEERS_SCENARIOS", &s.name)).collect();
    assert!(!scenarios.is_empty() && !all.is_empty(), "GPUSCALE_PEERS_SCENARIOS / _AUTOSCALERS keep nothing");
    let plots = std::env::var_os("GPUSCALE_PEERS_PLOTS").map(std::path::PathBuf::from);
    record(&Figures::header());
    for s in &scenarios {
        let mut runs = Vec::new();
        for a in &all {
            if s.refused.is_some() && !a.can_be_refused() {
                record(&format!(
                    "| {} | {} | not run: its kwok provider cannot fail a launch |",
                    s.name,
                    a.name()
                ));
                continue;
            }
            let f = run(a, s).await;
            record(&f.row());
            runs.push(f);
        }
        if let Some(dir) = &plots {
            std::fs::create_dir_all(dir).unwrap();
            let stem = dir.join(peers_plot::slug(&s.name));
            std::fs::write(stem.with_extension("svg"), peers_plot::svg(&s.name, &runs)).unwrap();
            std::fs::write(stem.with_extension("csv"), peers_plot::csv(&runs)).unwrap();
        }
    }
}
