//! The controller loop against the in-process stand-in API server, kept only for what a real
//! server cannot be made to do on demand: a chosen request failing with 500 (a flaky server in the
//! middle of a drain) and a PodGroup CRD without installing one. Everything else runs on the real
//! control plane in `tests/e2e/k8s_controller.rs`.

use crate::apiserver;
use crate::fixtures;
use crate::harness;
#[cfg(feature = "aws")]
use crate::moto_server;

use apiserver::{Fault, Settings};
use gpuscale::controller::drain::DRAIN_EVICTED;
use gpuscale::model::InstanceState;
use gpuscale::planner::PlannerSettings;
use gpuscale::providers::simulated::Operation;
use harness::{fast_config, l4_providers, pod_json, Cluster};
use serde_json::json;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

fn live_instances(c: &Cluster) -> Vec<String> {
    c.group("gpu-l4")
        .instances
        .iter()
        .filter(|i| matches!(i.state, InstanceState::Pending | InstanceState::Running))
        .map(|i| i.id.clone())
        .collect()
}

fn set_target_calls(c: &Cluster) -> Vec<(u32, u32)> {
    c.cloud
        .operations()
        .into_iter()
        .filter_map(|r| match r.op {
            Operation::SetTargetSize { from, to, error: None, .. } => Some((from, to)),
            _ => None,
        })
        .collect()
}

fn eviction_log(c: &Cluster) -> Vec<String> {
    c.server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/eviction"))
        .map(|r| format!("{:?} {} {}", r.replica, r.path, r.status))
        .collect()
}

fn no_scale_down() -> PlannerSettings {
    PlannerSettings { scale_down: false, ..Default::default() }
}

fn evictions(c: &Cluster, pod: &str, status: u16) -> usize {
    c.server
        .requests()
        .iter()
        .filter(|r| {
            r.method == "POST" && r.path.ends_with(&format!("/pods/{pod}/eviction")) && r.status == status
        })
        .count()
}

/// Two nodes: one runs a 3-GPU pod, the other a 1-GPU pod that fits beside it.
async fn two_node_cluster(settings: Settings) -> (std::sync::Arc<Cluster>, String, String) {
    let c = Cluster::start(&l4_providers(2, 4), settings).await;
    let mut nodes = c.register_all_ready();
    nodes.sort();
    let (busy, idle) = (nodes[0].clone(), nodes[1].clone());
    c.server.create(pod_json("ml", "big", 3, Some("ReplicaSet"), Some(&busy)));
    c.server.create(pod_json("ml", "web", 1, Some("ReplicaSet"), Some(&idle)));
    (c, busy, idle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_drain_resumes_without_losing_pods() {
    // Pods take their (capped) grace period to go, so the drain is caught in the middle.
    let settings = Settings {
        graceful_pod_deletion: true,
        max_grace_period: Duration::from_millis(1500),
        ..Default::default()
    };
    let (c, busy, idle) = two_node_cluster(settings).await;
    c.schedule.store(false, std::sync::atomic::Ordering::Relaxed);
    for i in 0..3 {
        c.server.create(pod_json("ml", &format!("side-{i}"), 0, Some("ReplicaSet"), Some(&idle)));
    }
    let on_idle = ["web", "side-0", "side-1", "side-2"];
    // The first replica's evictions of the side pods fail (a flaky API server), so it crashes
    // with work left: web evicted, the side pods still running.
    c.server.inject_fault(Fault::new("POST", "/api/v1/namespaces/ml/pods/side-", 500, 3));
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    // The first replica passes every 2 s while busy, so the test stops it between passes.
    let slow = harness::ControllerConfig { resync_seconds: 30.0, ..fast_config() };
    let first = c.controller("a", slow, PlannerSettings::default());
    c.server
        .wait_until(WAIT, "the first eviction", |s| {
            s.requests().iter().any(|r| r.path.ends_with("/eviction") && r.status == 201)
        })
        .await;
    first.task.abort(); // a crash: no lease release, no cleanup
    let _ = first.task.await;
    let node = c.server.get("nodes", "", &idle).expect("node still there after the crash");
    assert_eq!(node["metadata"]["annotations"][DRAIN_EVICTED], "true", "drain state is on the node");
    let second = c.controller("b", fast_config(), PlannerSettings::default());
    c.server
        .wait_until(WAIT, "the drain finished by the new leader", |s| s.get("nodes", "", &idle).is_none())
        .await;
    // Every pod of the node left through the Eviction API; one may still be terminating
    // within its grace period (the kubelet's business), none vanished otherwise.
    for pod in on_idle {
        let evicted = evictions(&c, pod, 201) == 1;
        let left = c.server.get("pods", "ml", pod);
        let terminating = left.as_ref().is_none_or(|p| p["metadata"]["deletionTimestamp"].is_string());
        assert!(
            evicted && terminating,
            "pod {pod}: evicted once through the API = {evicted}, object now: {left:?}\n{:#?}",
            eviction_log(&c)
        );
    }
    assert!(c.server.get("pods", "ml", "big").is_some());
    assert!(c.server.get("nodes", "", &busy).is_some());
    let writers: std::collections::BTreeSet<_> = c
        .server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/eviction"))
        .filter_map(|r| r.replica.clone())
        .collect();
    let log: Vec<String> = c
        .server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/eviction"))
        .map(|r| format!("{:?} {} {}", r.replica, r.path, r.status))
        .collect();
    assert!(writers.contains("b"), "the new leader evicted the rest: {log:#?}");
    c.server
        .wait_until(WAIT, "node_deleted reported", |_| {
            second.recorder.with_prefix("node_deleted").iter().any(|l| l.contains(&idle))
        })
        .await;
    second.stop.send_replace(true);
    second.task.await.unwrap().unwrap();
    driver.abort();
}

fn gang_pod(i: usize) -> serde_json::Value {
    let mut p = pod_json("ml", &format!("worker-{i}"), 1, Some("Job"), None);
    p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = json!("llm");
    p
}

fn pod_group(min: u32) -> serde_json::Value {
    json!({
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "llm", "namespace": "ml"},
        "spec": {"minMember": min}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_scales_up_all_or_nothing() {
    let c = Cluster::start(&l4_providers(0, 4), Settings::default()).await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    c.server.create(pod_group(6));
    let replica = c.controller("a", fast_config(), no_scale_down());
    for i in 0..6 {
        c.server.create(gang_pod(i));
    }
    c.server
        .wait_until(WAIT, "the whole gang running", |s| {
            (0..6).all(|i| {
                s.get("pods", "ml", &format!("worker-{i}")).is_some_and(|p| p["status"]["phase"] == "Running")
            })
        })
        .await;
    assert_eq!(set_target_calls(&c), vec![(0, 2)]);
    assert_eq!(live_instances(&c).len(), 2);
    replica.stop.send_replace(true);
    replica.task.await.unwrap().unwrap();
    driver.abort();
}

/// The capacity fallback within a pass: the cheaper group's raise fails for capacity in the API
/// call itself, and the same pass (no refresh in between) raises the next cheapest group that
/// fits, whose node then runs the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insufficient_capacity_error_moves_the_scale_up_to_the_next_group_in_the_same_pass() {
    let providers = r#"
accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    simulation: {bootSeconds: 10, capacityErrorRate: 0, spotInterruptionsPerHour: 0, seed: 3}
    nodeGroups:
      - {name: gpu-l4, instanceType: g6.12xlarge, zones: [us-east-1a], maxSize: 4, price: {onDemand: 4.0}}
      - {name: gpu-l4-b, instanceType: g6.12xlarge, zones: [us-east-1b], maxSize: 4, price: {onDemand: 5.0}}
"#;
    let c = Cluster::start(providers, Settings::default()).await;
    c.cloud
        .set_refuse_raises("sim/gpu-l4", Some("ZONE_RESOURCE_POOL_EXHAUSTED: no g6.12xlarge in us-east-1a"));
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.controller("a", fast_config(), no_scale_down());
    c.server.create(pod_json("ml", "train", 1, Some("Job"), None));
    c.server
        .wait_until(WAIT, "the pod running", |s| {
            s.get("pods", "ml", "train").is_some_and(|p| p["status"]["phase"] == "Running")
        })
        .await;
    let ops: Vec<Operation> = c.cloud.operations().into_iter().map(|r| r.op).collect();
    let failed = ops
        .iter()
        .position(
            |o| matches!(o, Operation::SetTargetSize { group, error: Some(_), .. } if group == "sim/gpu-l4"),
        )
        .expect("the cheaper group was tried first");
    let fallback = ops
        .iter()
        .position(|o| matches!(o, Operation::SetTargetSize { group, from: 0, to: 1, error: None } if group == "sim/gpu-l4-b"))
        .expect("the next group was raised");
    assert!(failed < fallback, "{ops:#?}");
    assert!(
        !ops[failed..fallback].iter().any(|o| matches!(o, Operation::Refresh)),
        "the fallback waited for another pass: {ops:#?}"
    );
    let pod = c.server.get("pods", "ml", "train").unwrap();
    let node = pod["spec"]["nodeName"].as_str().unwrap().to_string();
    assert_eq!(
        c.server.get("nodes", "", &node).unwrap()["metadata"]["labels"]["gpuscale.io/node-group"],
        "gpu-l4-b"
    );
    assert_eq!(c.group("gpu-l4").target_size, 0);
    replica.stop.send_replace(true);
    replica.task.await.unwrap().unwrap();
    driver.abort();
}

/// A spot interruption notice (the taint gpuscale's agent or AWS Node Termination Handler puts on
/// the Node) leads to one replacement in the next cheapest pool (not the reclaimed one), the node
/// cordoned and its pod evicted through the Eviction API, exactly once: a controller restarted in
/// the middle does not launch a second replacement nor evict again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_interruption_notice_replaces_and_drains_the_node_exactly_once_across_a_restart() {
    spot_interruption_across_a_restart(0).await;
}

/// The same at the reclaimed group's minimum size: the cloud takes the node whatever the minimum,
/// so its pods are still moved (a voluntary drain would be refused there), and the drained node
/// is left to the cloud, cordoned, rather than terminated below the minimum or given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_interruption_at_the_group_minimum_still_moves_the_pods_and_leaves_the_node_to_the_cloud() {
    let c = spot_interruption_across_a_restart(1).await;
    let deletes: Vec<_> = c
        .cloud
        .operations()
        .into_iter()
        .filter(|r| matches!(&r.op, Operation::DeleteInstances { group, .. } if group == "sim/spot-a"))
        .collect();
    assert!(deletes.is_empty(), "terminated below the minimum: {deletes:?}");
}

async fn spot_interruption_across_a_restart(spot_min: u32) -> std::sync::Arc<Cluster> {
    let providers = format!(
        r#"
accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    simulation: {{bootSeconds: 10, capacityErrorRate: 0, spotInterruptionsPerHour: 0, seed: 3}}
    nodeGroups:
      - {{name: spot-a, instanceType: g6.12xlarge, zones: [us-east-1a], capacityType: spot, minSize: {spot_min}, maxSize: 4, targetSize: 1, price: {{onDemand: 4.6, spot: 1.5}}}}
      - {{name: spot-b, instanceType: g6.12xlarge, zones: [us-east-1b], capacityType: spot, maxSize: 4, price: {{onDemand: 4.6, spot: 1.7}}}}
      - {{name: od-a, instanceType: g6.12xlarge, zones: [us-east-1a], maxSize: 4, price: {{onDemand: 4.6}}}}
"#
    );
    let c = Cluster::start(&providers, Settings::default()).await;
    let node = c.register_all_ready().pop().expect("the spot node");
    c.server.create(pod_json("ml", "train", 1, Some("ReplicaSet"), Some(&node)));
    let first = c.controller("a", fast_config(), no_scale_down());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(set_target_calls(&c).is_empty(), "nothing to do before the notice");
    c.server.update("nodes", "", &node, |n| {
        n["spec"]["taints"] = json!([{"key": "gpuscale.io/interruption", "value": "spot-interruption", "effect": "NoSchedule"}]);
    });
    c.server
        .wait_until(WAIT, "the pod evicted", |s| {
            s.requests().iter().any(|r| r.path.ends_with("/pods/train/eviction") && r.status == 201)
        })
        .await;
    first.task.abort(); // a crash in the middle
    let _ = first.task.await;
    let second = c.controller("b", fast_config(), no_scale_down());
    tokio::time::sleep(Duration::from_secs(4)).await;
    let raises: Vec<(String, u32, u32)> = c
        .cloud
        .operations()
        .into_iter()
        .filter_map(|r| match r.op {
            Operation::SetTargetSize { group, from, to, error: None } if to > from => Some((group, from, to)),
            _ => None,
        })
        .collect();
    assert_eq!(raises, vec![("sim/spot-b".to_string(), 0, 1)], "one replacement, outside the reclaimed pool");
    assert_eq!(evictions(&c, "train", 201), 1, "{:#?}", eviction_log(&c));
    // The node was cordoned through the drain path (or is gone once drained), never deleted
    // first, and never given back to the scheduler.
    if let Some(n) = c.server.get("nodes", "", &node) {
        assert_eq!(n["spec"]["unschedulable"], true, "{n:#}");
    }
    second.stop.send_replace(true);
    second.task.await.unwrap().unwrap();
    c
}

/// The same through the AWS interruption queue, end to end: an EC2 Spot Instance Interruption
/// Warning in SQS (moto), real-shaped as EventBridge delivers it, for an instance of an Auto
/// Scaling group (moto) leads to one replacement in the other spot pool at once, the node cordoned
/// at once and its pod evicted through the Eviction API just in time, at the time the drain wrote
/// on the Node (the pod runs on while the replacement boots), exactly once across a controller
/// crash in between; the message is deleted once handled.
#[cfg(feature = "aws")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_warning_from_the_sqs_interruption_queue_replaces_and_drains_exactly_once_across_a_restart() {
    use aws_sdk_autoscaling::types::{LaunchTemplateSpecification, Tag};
    use aws_sdk_ec2::types::{
        InstanceType, LaunchTemplateInstanceMarketOptionsRequest, MarketType, RequestLaunchTemplateData,
    };
    use gpuscale::providers::aws::AwsProvider;
    use gpuscale::providers::CloudProvider;

    let endpoint = moto_server::moto();
    let sdk = moto_server::sdk_config(&endpoint, "us-east-1").await;
    let (asg, ec2, sqs) = (
        aws_sdk_autoscaling::Client::new(&sdk),
        aws_sdk_ec2::Client::new(&sdk),
        aws_sdk_sqs::Client::new(&sdk),
    );
    let run = format!("itn-{}-{}", std::process::id(), k8s_openapi::jiff::Timestamp::now().as_millisecond());
    let template = format!("{run}-lt");
    let spot = LaunchTemplateInstanceMarketOptionsRequest::builder().market_type(MarketType::Spot).build();
    let data = RequestLaunchTemplateData::builder()
        .image_id("ami-12c6146b")
        .instance_type(InstanceType::from("g6.xlarge"))
        .instance_market_options(spot)
        .build();
    ec2.create_launch_template()
        .launch_template_name(&template)
        .launch_template_data(data)
        .send()
        .await
        .unwrap();
    // Two spot pools of one type in two zones; the first runs the noticed instance.
    for (pool, zone, desired) in [("a", "us-east-1a", 1), ("b", "us-east-1b", 0)] {
        let name = format!("{run}-{pool}");
        let tag = |k: &str, v: &str| {
            Tag::builder().resource_id(&name).resource_type("auto-scaling-group").key(k).value(v).build()
        };
        asg.create_auto_scaling_group()
            .auto_scaling_group_name(&name)
            .launch_template(LaunchTemplateSpecification::builder().launch_template_name(&template).build())
            .availability_zones(zone)
            .min_size(0)
            .max_size(4)
            .desired_capacity(desired)
            .tags(tag("k8s.io/cluster-autoscaler/enabled", "true"))
            .tags(tag(&format!("k8s.io/cluster-autoscaler/{run}"), "owned"))
            .send()
            .await
            .unwrap();
    }
    let queue = format!("{run}-interruptions");
    let queue_url = sqs.create_queue().queue_name(&queue).send().await.unwrap().queue_url.unwrap();
    let desired = |pool: &'static str| {
        let (asg, name) = (asg.clone(), format!("{run}-{pool}"));
        async move {
            let out =
                asg.describe_auto_scaling_groups().auto_scaling_group_names(&name).send().await.unwrap();
            out.auto_scaling_groups()[0].desired_capacity().unwrap_or_default()
        }
    };

    // The cluster: the pool-a instance's Node, Ready, running a pod.
    let groups =
        AwsProvider::connect(queue_settings(&endpoint, &run, &queue)).await.unwrap().refresh().await.unwrap();
    let pool_a = groups.iter().find(|g| g.id.ends_with("-a")).expect("pool a");
    let instance = pool_a.instances[0].id.clone();
    let server = apiserver::FakeApiServer::start_with(Settings::default()).await;
    server.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}));
    let node = fixtures::node_name(&instance);
    server.create(fixtures::node_json(pool_a, &instance));
    server.set_node_ready(&node, true);
    server.create(pod_json("ml", "train", 1, Some("ReplicaSet"), Some(&node)));
    // The pod's grace (1 s), the margin (5 s), a pass (1 s) and a lead of 100 s: its eviction
    // comes 13 s after the two-minute warning (EventBridge's `time` is in whole seconds).
    let mut config = fast_config();
    config.interruptions.eviction_lead_seconds = 100;
    let start = |replica: &str, providers| {
        fixtures::spawn_on(
            server.replica_client(replica),
            providers,
            replica,
            config.clone(),
            no_scale_down(),
            false,
            Default::default(),
        )
    };
    let first = start("a", queue_providers(&endpoint, &run, &queue).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!((desired("a").await, desired("b").await), (1, 0), "nothing to do before the warning");

    // EventBridge's delivery of the warning, issued now: the instance goes in two minutes.
    let bare = instance.rsplit('/').next().unwrap();
    let warning = json!({
        "version": "0", "id": "1e5527d7-bb36-4607-3370-4164db56a40e",
        "detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2",
        "account": "123456789012", "time": whole_seconds_now(),
        "region": "us-east-1", "resources": [format!("arn:aws:ec2:us-east-1a:instance/{bare}")],
        "detail": {"instance-id": bare, "instance-action": "terminate"}
    });
    sqs.send_message().queue_url(&queue_url).message_body(warning.to_string()).send().await.unwrap();
    let evict_at_of = |s: &apiserver::FakeApiServer| {
        let n = s.get("nodes", "", &node)?;
        n["metadata"]["annotations"][gpuscale::controller::drain::DRAIN_EVICT_AT]
            .as_str()?
            .parse::<k8s_openapi::jiff::Timestamp>()
            .ok()
    };
    server.wait_until(WAIT, "the drain's eviction time on the Node", |s| evict_at_of(s).is_some()).await;
    let evict_at = evict_at_of(&server).unwrap();
    let left = evict_at.duration_since(k8s_openapi::jiff::Timestamp::now()).as_secs_f64();
    assert!((5.0..=14.0).contains(&left), "the pod runs until 13 s after the warning, {left} s from now");
    // The replacement is raised right after the drain's marks (they come first, so that a crash
    // in between never raises two), in the other pool.
    let raised = std::time::Instant::now();
    while desired("b").await == 0 && raised.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(desired("b").await, 1, "the replacement raised at once, in the other pool");
    let evicted_train = |s: &apiserver::FakeApiServer| {
        s.requests().iter().filter(|r| r.path.ends_with("/pods/train/eviction") && r.status == 201).count()
    };
    assert_eq!(evicted_train(&server), 0, "no eviction before its time");
    first.task.abort(); // a crash in the middle
    let _ = first.task.await;
    let second = start("b", queue_providers(&endpoint, &run, &queue).await);
    // The new leader keeps the time written on the Node: nothing evicted until just before it.
    let before = evict_at - k8s_openapi::jiff::SignedDuration::from_millis(1500);
    let wait = before.duration_since(k8s_openapi::jiff::Timestamp::now());
    if wait.is_positive() {
        tokio::time::sleep(wait.unsigned_abs()).await;
    }
    assert_eq!(evicted_train(&server), 0, "no eviction before its time, by the new leader either");
    server.wait_until(WAIT, "the pod evicted", |s| evicted_train(s) > 0).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(desired("b").await, 1, "one replacement, in the other pool");
    let evicted = server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/pods/train/eviction") && r.status == 201)
        .count();
    assert_eq!(evicted, 1);
    if let Some(n) = server.get("nodes", "", &node) {
        assert_eq!(n["spec"]["unschedulable"], true, "{n:#}");
    }
    // The message was deleted once handled: none left, none in flight.
    assert_eq!(moto_server::queue_depth(&sqs, &queue_url).await, ("0".into(), "0".into()));
    second.stop.send_replace(true);
    second.task.await.unwrap().unwrap();
}

/// The account of the queue test: its Auto Scaling groups by the run's tag, its queue.
#[cfg(feature = "aws")]
fn queue_settings(endpoint: &str, run: &str, queue: &str) -> gpuscale::providers::aws::AwsSettings {
    let mut s = gpuscale::providers::aws::AwsSettings::new("test", "us-east-1");
    s.endpoint_url = Some(endpoint.to_string());
    s.discovery_tags =
        std::collections::BTreeMap::from([(format!("k8s.io/cluster-autoscaler/{run}"), String::new())]);
    s.interruption_queue = Some(queue.to_string());
    s.static_credentials_for_tests = Some(gpuscale::providers::aws::StaticCredentials {
        access_key_id: "testing".into(),
        secret_access_key: "testing".into(),
        session_token: None,
    });
    s
}

/// The controller's accounts for the queue test, connected afresh (as a restarted process).
#[cfg(feature = "aws")]
async fn queue_providers(
    endpoint: &str,
    run: &str,
    queue: &str,
) -> std::sync::Arc<gpuscale::controller::providers::ProviderSet> {
    use gpuscale::controller::providers::{AnyProvider, ProviderSet};
    use gpuscale::providers::politeness::{Polite, PolitenessConfig};
    let aws =
        gpuscale::providers::aws::AwsProvider::connect(queue_settings(endpoint, run, queue)).await.unwrap();
    std::sync::Arc::new(ProviderSet::from_providers(vec![AnyProvider::Aws(Polite::new(
        aws,
        PolitenessConfig::default(),
    ))]))
}

/// Now as EventBridge writes times: RFC 3339 in whole seconds.
#[cfg(feature = "aws")]
fn whole_seconds_now() -> String {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    k8s_openapi::jiff::Timestamp::from_second(now).expect("a valid time").to_string()
}
