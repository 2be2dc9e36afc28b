//! The simulated cloud: boot delays, capacity errors, spot interruptions, deletions, idempotence.

use gpuscale::model::{ErrorClass, InstanceState, NodeGroup};
use gpuscale::providers::config::{load_strs, ProviderConfig};
use gpuscale::providers::simulated::{Operation, SimulatedCloud, SimulationSettings};
use gpuscale::providers::{CloudProvider, ProviderError};
use std::time::Duration;

const SECS: fn(u64) -> Duration = Duration::from_secs;

fn config(simulation: &str) -> ProviderConfig {
    let text = format!(
        "accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    simulation: {simulation}
    nodeGroups:
      - name: h100
        instanceType: p5.48xlarge
        zones: [us-east-1a, us-east-1b]
        maxSize: 10
      - name: l4-spot
        instanceType: g6.12xlarge
        zones: [us-east-1a]
        capacityType: spot
        maxSize: 50
        targetSize: 20
        price: {{spot: 2.0}}
      - name: custom
        instanceType: z1.big
        instanceSpec: {{vcpu: 8, memoryGiB: 32, price: {{onDemand: 0.5}}}}
        zones: [us-east-1b]
        minSize: 1
        maxSize: 3
        targetSize: 1
"
    );
    load_strs(&[("sim.yaml", text)]).unwrap()
}

fn cloud(simulation: &str) -> SimulatedCloud {
    SimulatedCloud::from_config(&config(simulation)).into_iter().next().unwrap()
}

fn group<'a>(groups: &'a [NodeGroup], id: &str) -> &'a NodeGroup {
    groups.iter().find(|g| g.id == id).unwrap()
}

fn count(g: &NodeGroup, pred: impl Fn(&InstanceState) -> bool) -> usize {
    g.instances.iter().filter(|i| pred(&i.state)).count()
}

#[tokio::test]
async fn scale_up_boots_after_the_boot_delay() {
    let c = cloud("{bootSeconds: 120, seed: 1}");
    assert_eq!(c.account(), "sim");
    let groups = c.refresh().await.unwrap();
    // Initial target sizes exist as running instances.
    let spot = group(&groups, "sim/l4-spot");
    assert_eq!(count(spot, |s| *s == InstanceState::Running), 20);
    let custom = group(&groups, "sim/custom");
    assert!(custom.instances[0].id.starts_with("sim:///us-east-1b/custom-"));

    c.set_target_size("sim/h100", 4).await.unwrap();
    let g = c.snapshot();
    let h100 = group(&g, "sim/h100");
    assert_eq!(h100.target_size, 4);
    assert_eq!(count(h100, |s| *s == InstanceState::Pending), 4);
    // Balanced over both zones, AWS-shaped ids.
    for zone in ["us-east-1a", "us-east-1b"] {
        let prefix = format!("aws:///{zone}/i-");
        assert_eq!(h100.instances.iter().filter(|i| i.id.starts_with(&prefix)).count(), 2);
    }
    for i in &h100.instances {
        let hex = i.id.rsplit("/i-").next().unwrap();
        assert_eq!(hex.len(), 17, "{}", i.id);
        assert!(hex.chars().all(|c| c.is_ascii_hexdigit()));
    }

    c.advance(SECS(119));
    assert_eq!(count(group(&c.snapshot(), "sim/h100"), |s| *s == InstanceState::Pending), 4);
    c.advance(SECS(1));
    let g = c.snapshot();
    assert_eq!(count(group(&g, "sim/h100"), |s| *s == InstanceState::Running), 4);
    assert_eq!(c.now(), SECS(120));

    let ops = c.operations();
    assert_eq!(ops[0].op, Operation::Refresh);
    assert!(matches!(
        &ops[1].op,
        Operation::SetTargetSize { group, from: 0, to: 4, error: None } if group == "sim/h100"
    ));
    assert_eq!(ops.iter().filter(|o| matches!(o.op, Operation::Launched { .. })).count(), 4);
    let running: Vec<_> = ops.iter().filter(|o| matches!(o.op, Operation::Running { .. })).collect();
    assert_eq!(running.len(), 4);
    assert!(running.iter().all(|o| o.at == SECS(120)));
}

#[tokio::test]
async fn setting_the_same_target_twice_creates_nothing_more() {
    let c = cloud("{seed: 2}");
    c.set_target_size("sim/h100", 3).await.unwrap();
    let first: Vec<String> =
        group(&c.snapshot(), "sim/h100").instances.iter().map(|i| i.id.clone()).collect();
    c.set_target_size("sim/h100", 3).await.unwrap();
    c.advance(SECS(1));
    c.set_target_size("sim/h100", 3).await.unwrap();
    let after: Vec<String> =
        group(&c.snapshot(), "sim/h100").instances.iter().map(|i| i.id.clone()).collect();
    assert_eq!(first, after);
    // Scale in: the pending instances go first, newest first.
    c.set_target_size("sim/h100", 1).await.unwrap();
    let g = c.snapshot();
    let h = group(&g, "sim/h100");
    assert_eq!(count(h, |s| *s == InstanceState::Terminating), 2);
    c.advance(SECS(1));
    assert_eq!(group(&c.snapshot(), "sim/h100").instances.len(), 1);
}

#[tokio::test]
async fn capacity_errors_are_seeded_and_reproducible() {
    async fn failures(seed: u64) -> Vec<(String, bool)> {
        let c = cloud(&format!("{{capacityErrorRate: 0.3, seed: {seed}}}"));
        c.set_target_size("sim/h100", 10).await.unwrap();
        group(&c.snapshot(), "sim/h100")
            .instances
            .iter()
            .map(|i| (i.id.clone(), matches!(i.state, InstanceState::Failed { .. })))
            .collect()
    }
    let a = failures(11).await;
    assert_eq!(a, failures(11).await, "same seed, same run");
    assert_ne!(a, failures(12).await, "another seed, another run");
    let failed = a.iter().filter(|(_, f)| *f).count();
    assert!(failed > 0 && failed < 10, "{failed} of 10 failed at rate 0.3");

    let c = cloud("{capacityErrorRate: 1.0}");
    c.set_target_size("sim/h100", 2).await.unwrap();
    let g = c.snapshot();
    for i in &group(&g, "sim/h100").instances {
        let InstanceState::Failed { class, message } = &i.state else { panic!("{:?}", i.state) };
        assert_eq!(*class, ErrorClass::OutOfCapacity);
        assert!(message.contains("InsufficientInstanceCapacity"), "{message}");
        assert!(message.contains("p5.48xlarge"), "{message}");
    }
    // Failed launches hold their slot (no relaunch on a repeated target) until retried.
    c.set_target_size("sim/h100", 2).await.unwrap();
    assert_eq!(group(&c.snapshot(), "sim/h100").instances.len(), 2);
    c.set_capacity_error_rate(0.0);
    c.advance(SECS(60));
    let g = c.snapshot();
    let h = group(&g, "sim/h100");
    assert_eq!(h.instances.len(), 2);
    assert_eq!(count(h, |s| *s == InstanceState::Pending), 2);
}

#[tokio::test]
async fn zone_capacity_caps_launches() {
    let c = cloud("{zoneCapacity: {us-east-1b: 2}}");
    // custom already has 1 live instance in us-east-1b.
    c.set_target_size("sim/h100", 6).await.unwrap();
    let g = c.snapshot();
    let h = group(&g, "sim/h100");
    let in_b = h.instances.iter().filter(|i| i.id.starts_with("aws:///us-east-1b/")).count();
    assert_eq!(in_b, 1, "{:?}", h.instances);
    // Balancing prefers 1b, it is full, so the rest go to 1a.
    assert_eq!(count(h, |s| matches!(s, InstanceState::Failed { .. })), 0);
    c.set_zone_capacity("us-east-1a", Some(5));
    c.set_target_size("sim/h100", 7).await.unwrap();
    let g = c.snapshot();
    let h = group(&g, "sim/h100");
    assert_eq!(count(h, |s| matches!(s, InstanceState::Failed { .. })), 1);
}

#[tokio::test]
async fn delete_specific_instances_decrements_the_target() {
    let c = cloud("{seed: 5}");
    c.set_target_size("sim/h100", 3).await.unwrap();
    c.advance(SECS(200));
    let g = c.snapshot();
    let victim = group(&g, "sim/h100").instances[1].id.clone();
    let keep: Vec<String> =
        group(&g, "sim/h100").instances.iter().map(|i| i.id.clone()).filter(|id| *id != victim).collect();
    c.delete_instances("sim/h100", std::slice::from_ref(&victim)).await.unwrap();
    let g = c.snapshot();
    let h = group(&g, "sim/h100");
    assert_eq!(h.target_size, 2);
    let state = |id: &str| &h.instances.iter().find(|i| i.id == id).unwrap().state;
    assert_eq!(*state(&victim), InstanceState::Terminating);
    for id in &keep {
        assert_eq!(*state(id), InstanceState::Running);
    }
    // A retried delete of the same instance is a no-op, not a second decrement.
    c.delete_instances("sim/h100", std::slice::from_ref(&victim)).await.unwrap();
    assert_eq!(group(&c.snapshot(), "sim/h100").target_size, 2);
    c.advance(SECS(1));
    let g = c.snapshot();
    let h = group(&g, "sim/h100");
    let ids: Vec<String> = h.instances.iter().map(|i| i.id.clone()).collect();
    assert_eq!(ids, keep, "no replacement launched");

    // Unknown instance: nothing changes.
    let err = c
        .delete_instances("sim/h100", &[keep[0].clone(), "aws:///us-east-1a/i-nope".into()])
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::InstanceNotFound { .. }), "{err}");
    assert_eq!(group(&c.snapshot(), "sim/h100").target_size, 2);
    // Below minSize is refused.
    let custom = group(&c.snapshot(), "sim/custom").instances[0].id.clone();
    assert!(matches!(
        c.delete_instances("sim/custom", &[custom]).await,
        Err(ProviderError::SizeOutOfRange { min: 1, .. })
    ));
    let ops = c.operations();
    assert!(ops.iter().any(|o| matches!(
        &o.op,
        Operation::DeleteInstances { error: Some(e), .. } if e.contains("i-nope")
    )));
}

#[tokio::test]
async fn bounds_and_unknown_groups() {
    let c = cloud("{}");
    assert!(matches!(
        c.set_target_size("sim/h100", 11).await,
        Err(ProviderError::SizeOutOfRange { target: 11, max: 10, .. })
    ));
    assert!(matches!(c.set_target_size("sim/nope", 1).await, Err(ProviderError::GroupNotFound(_))));
    assert!(group(&c.snapshot(), "sim/h100").instances.is_empty());
    assert!(matches!(c.operations().last().unwrap().op, Operation::SetTargetSize { error: Some(_), .. }));
}

#[tokio::test]
async fn spot_instances_are_interrupted_and_replaced() {
    let run = |seed: u64| async move {
        let c = cloud(&format!("{{spotInterruptionsPerHour: 0.5, seed: {seed}, bootSeconds: 60}}"));
        for _ in 0..12 {
            c.advance(SECS(300));
        }
        let interrupted =
            c.operations().iter().filter(|o| matches!(o.op, Operation::SpotInterrupted { .. })).count();
        let g = c.snapshot();
        // On-demand groups are never interrupted.
        assert!(!c.operations().iter().any(|o| matches!(
            &o.op,
            Operation::SpotInterrupted { group, .. } if group != "sim/l4-spot"
        )));
        let live = group(&g, "sim/l4-spot")
            .instances
            .iter()
            .filter(|i| matches!(i.state, InstanceState::Pending | InstanceState::Running))
            .count();
        (interrupted, live)
    };
    let (n, live) = run(3).await;
    // 20 instances for an hour at 0.5/h: about 10 expected.
    assert!((3..=20).contains(&n), "{n} interruptions");
    assert_eq!(live, 20, "the group replaces interrupted instances");
    assert_eq!(run(3).await, (n, live));
}

#[tokio::test]
async fn built_directly_and_shared_between_tasks() {
    let cfg = config("{}");
    let groups = cfg.node_groups_of("sim");
    let c = std::sync::Arc::new(SimulatedCloud::new(
        "direct",
        groups,
        SimulationSettings { boot: SECS(10), ..SimulationSettings::default() },
    ));
    let mut tasks = Vec::new();
    for t in 1..=4u32 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            c.set_target_size("sim/h100", t).await.unwrap();
            c.refresh().await.unwrap().len()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 3);
    }
    c.advance(SECS(10));
    let h = c.snapshot();
    let h = group(&h, "sim/h100");
    assert!((1..=4).contains(&h.target_size));
    assert_eq!(
        h.instances.iter().filter(|i| i.state == InstanceState::Running).count() as u32,
        h.target_size
    );
}

#[cfg(feature = "cloud")]
#[tokio::test(start_paused = true)]
async fn polite_wrapper_learns_from_simulated_stockouts() {
    use gpuscale::model::CapacityType;
    use gpuscale::providers::politeness::{Polite, PolitenessConfig};
    let c = cloud("{capacityErrorRate: 1.0}");
    let p = Polite::new(c, PolitenessConfig::default());
    p.refresh().await.unwrap();
    p.set_target_size("sim/h100", 2).await.unwrap();
    p.refresh().await.unwrap();
    assert!(!p.is_offering_available("p5.48xlarge", "us-east-1a", CapacityType::OnDemand));
    assert!(!p.is_offering_available("p5.48xlarge", "us-east-1b", CapacityType::OnDemand));
    assert!(p.group_backoff("sim/h100").is_some());
    assert!(p.set_target_size("sim/h100", 3).await.is_err());
    assert_eq!(
        p.inner().operations().iter().filter(|o| matches!(o.op, Operation::SetTargetSize { .. })).count(),
        1,
        "the refused scale-up never reached the cloud"
    );
}

#[tokio::test]
async fn simulated_gcp_types_get_gke_templates_and_sim_ids() {
    let text = "accounts:
  - name: gsim
    provider: simulated
    region: us-central1
    nodeGroups:
      - {name: l4, instanceType: g2-standard-24, zones: [us-central1-a], maxSize: 3, targetSize: 1}
";
    let cfg = load_strs(&[("gsim.yaml", text)]).unwrap();
    let g = &cfg.node_groups()[0];
    assert_eq!(g.template.labels["cloud.google.com/gke-nodepool"], "l4");
    assert_eq!(g.template.labels["topology.kubernetes.io/region"], "us-central1");
    assert_eq!(g.template.gpus.len(), 2);
    let c = SimulatedCloud::from_config(&cfg).remove(0);
    let groups = c.refresh().await.unwrap();
    assert_eq!(groups[0].instances[0].id, "sim:///us-central1-a/l4-0001");
}
