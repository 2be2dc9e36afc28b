//! The AWS provider against moto (the AWS API emulator in server mode, `support/moto.rs`) and
//! against a loopback server that throttles in AWS's wire format.
#![cfg(feature = "aws")]

#[path = "support/moto.rs"]
mod moto_server;

use aws_sdk_autoscaling::types::{
    InstancesDistribution, LaunchTemplate, LaunchTemplateOverrides, LaunchTemplateSpecification,
    MixedInstancesPolicy, Tag,
};
use aws_sdk_ec2::types::{
    InstanceType, LaunchTemplateInstanceMarketOptionsRequest, MarketType, RequestLaunchTemplateData,
};
use gpuscale::model::{dollars, CapacityType, InstanceState, NodeGroup, NoticeKind, TaintEffect};
use gpuscale::providers::aws::{AwsProvider, AwsSettings, PriceSource, StaticCredentials};
use gpuscale::providers::{CloudProvider, ProviderError};
use moto_server::moto;
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const REGION: &str = "us-east-1";
const ZONE: &str = "us-east-1a";
/// An AMI moto ships in its default image list.
const AMI: &str = "ami-12c6146b";
const ENABLED: &str = "k8s.io/cluster-autoscaler/enabled";

/// A name no other test (or earlier run against the same server) uses.
fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{prefix}-{}-{}-{nanos}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

fn settings(endpoint: &str, cluster: &str) -> AwsSettings {
    let mut s = AwsSettings::new("test", REGION);
    s.endpoint_url = Some(endpoint.to_owned());
    s.discovery_tags = BTreeMap::from([
        (ENABLED.to_owned(), "true".to_owned()),
        (format!("k8s.io/cluster-autoscaler/{cluster}"), String::new()),
    ]);
    s.static_credentials_for_tests = Some(StaticCredentials {
        access_key_id: "testing".into(),
        secret_access_key: "testing".into(),
        session_token: None,
    });
    s
}

/// Raw SDK clients for setting up fixtures in moto.
async fn clients(endpoint: &str) -> (aws_sdk_autoscaling::Client, aws_sdk_ec2::Client) {
    let config = moto_server::sdk_config(endpoint, REGION).await;
    (aws_sdk_autoscaling::Client::new(&config), aws_sdk_ec2::Client::new(&config))
}

async fn launch_template(ec2: &aws_sdk_ec2::Client, name: &str, instance_type: &str, spot: bool) {
    let mut data =
        RequestLaunchTemplateData::builder().image_id(AMI).instance_type(InstanceType::from(instance_type));
    if spot {
        data = data.instance_market_options(
            LaunchTemplateInstanceMarketOptionsRequest::builder().market_type(MarketType::Spot).build(),
        );
    }
    ec2.create_launch_template()
        .launch_template_name(name)
        .launch_template_data(data.build())
        .send()
        .await
        .expect("CreateLaunchTemplate");
}

fn tag(group: &str, key: &str, value: &str) -> Tag {
    Tag::builder()
        .resource_id(group)
        .resource_type("auto-scaling-group")
        .key(key)
        .value(value)
        .propagate_at_launch(false)
        .build()
}

fn cluster_tags(group: &str, cluster: &str) -> Vec<Tag> {
    vec![tag(group, ENABLED, "true"), tag(group, &format!("k8s.io/cluster-autoscaler/{cluster}"), "owned")]
}

/// An ASG on a launch template.
async fn asg(
    asg: &aws_sdk_autoscaling::Client,
    name: &str,
    template: &str,
    version: Option<&str>,
    (min, max, desired): (i32, i32, i32),
    tags: Vec<Tag>,
) {
    asg.create_auto_scaling_group()
        .auto_scaling_group_name(name)
        .launch_template(
            LaunchTemplateSpecification::builder()
                .launch_template_name(template)
                .set_version(version.map(str::to_owned))
                .build(),
        )
        .min_size(min)
        .max_size(max)
        .desired_capacity(desired)
        .availability_zones(ZONE)
        .set_tags(Some(tags))
        .send()
        .await
        .expect("CreateAutoScalingGroup");
}

async fn desired_of(client: &aws_sdk_autoscaling::Client, name: &str) -> (i32, Vec<String>) {
    let out = client
        .describe_auto_scaling_groups()
        .auto_scaling_group_names(name)
        .send()
        .await
        .expect("DescribeAutoScalingGroups");
    let g = &out.auto_scaling_groups()[0];
    let mut ids: Vec<String> =
        g.instances().iter().filter_map(|i| i.instance_id().map(str::to_owned)).collect();
    ids.sort();
    (g.desired_capacity().unwrap(), ids)
}

fn by_id<'a>(groups: &'a [NodeGroup], id: &str) -> &'a NodeGroup {
    groups.iter().find(|g| g.id == id).unwrap_or_else(|| {
        panic!("group {id} not discovered; got {:?}", groups.iter().map(|g| &g.id).collect::<Vec<_>>())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovers_groups_by_tag_and_prefix_with_gpu_facts_and_prices() {
    let endpoint = moto();
    let (asg_client, ec2) = clients(&endpoint).await;
    let cluster = unique("disc");
    let prefix = format!("{cluster}-gpu-");

    let lt_g5 = unique("lt-g5");
    launch_template(&ec2, &lt_g5, "g5.xlarge", false).await;
    // Version 2 of this template switches to g6.xlarge; version 1 stays the default.
    let lt_multi = unique("lt-multi");
    launch_template(&ec2, &lt_multi, "g5.12xlarge", false).await;
    ec2.create_launch_template_version()
        .launch_template_name(&lt_multi)
        .launch_template_data(
            RequestLaunchTemplateData::builder()
                .image_id(AMI)
                .instance_type(InstanceType::from("g6.xlarge"))
                .build(),
        )
        .send()
        .await
        .expect("CreateLaunchTemplateVersion");
    let lt_spot = unique("lt-spot");
    launch_template(&ec2, &lt_spot, "g5.xlarge", true).await;

    // A10G on-demand with labels, taints and a price tag.
    let a10g = format!("{prefix}a10g");
    let mut tags = cluster_tags(&a10g, &cluster);
    tags.push(tag(&a10g, "k8s.io/cluster-autoscaler/node-template/label/team", "ml"));
    tags.push(tag(
        &a10g,
        "k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu",
        "present:NoSchedule",
    ));
    tags.push(tag(&a10g, "gpuscale.io/price-on-demand", "1.006"));
    asg(&asg_client, &a10g, &lt_g5, None, (0, 4, 0), tags).await;

    // Explicit $Latest reads version 2 (L4); $Default reads version 1 (4x A10G).
    let l4 = format!("{prefix}l4");
    asg(&asg_client, &l4, &lt_multi, Some("$Latest"), (0, 2, 0), cluster_tags(&l4, &cluster)).await;
    let a10g4 = format!("{prefix}a10g4");
    asg(&asg_client, &a10g4, &lt_multi, Some("$Default"), (0, 2, 0), cluster_tags(&a10g4, &cluster)).await;

    // Spot through the launch template's market options.
    let spot_lt = format!("{prefix}spot-lt");
    asg(&asg_client, &spot_lt, &lt_spot, None, (0, 2, 0), cluster_tags(&spot_lt, &cluster)).await;

    // p4d through a mixed instances policy: first override, all-spot distribution.
    let p4d = format!("{prefix}p4d");
    asg_client
        .create_auto_scaling_group()
        .auto_scaling_group_name(&p4d)
        .mixed_instances_policy(
            MixedInstancesPolicy::builder()
                .launch_template(
                    LaunchTemplate::builder()
                        .launch_template_specification(
                            LaunchTemplateSpecification::builder()
                                .launch_template_name(&lt_g5)
                                .version("$Latest")
                                .build(),
                        )
                        .overrides(LaunchTemplateOverrides::builder().instance_type("p4d.24xlarge").build())
                        .overrides(LaunchTemplateOverrides::builder().instance_type("p5.48xlarge").build())
                        .build(),
                )
                .instances_distribution(
                    InstancesDistribution::builder()
                        .on_demand_base_capacity(0)
                        .on_demand_percentage_above_base_capacity(0)
                        .spot_allocation_strategy("capacity-optimized")
                        .build(),
                )
                .build(),
        )
        .min_size(0)
        .max_size(8)
        .desired_capacity(0)
        .availability_zones(ZONE)
        .availability_zones("us-east-1b")
        .set_tags(Some(cluster_tags(&p4d, &cluster)))
        .send()
        .await
        .expect("CreateAutoScalingGroup p4d");

    // Not managed: another cluster's tag, and this cluster's tag without the name prefix.
    let other = format!("{prefix}other");
    asg(&asg_client, &other, &lt_g5, None, (0, 2, 0), cluster_tags(&other, &unique("other-cluster"))).await;
    let unprefixed = format!("{cluster}-cpu-x");
    asg(&asg_client, &unprefixed, &lt_g5, None, (0, 2, 0), cluster_tags(&unprefixed, &cluster)).await;

    let mut s = settings(&endpoint, &cluster);
    s.name_prefix = Some(prefix.clone());
    let provider = AwsProvider::connect(s).await.expect("connect");
    let discovered = provider.discover().await.expect("discover");
    let groups: Vec<NodeGroup> = discovered.iter().map(|d| d.group.clone()).collect();
    let mut ids: Vec<&str> = groups.iter().map(|g| g.id.as_str()).collect();
    ids.sort();
    let mut want: Vec<String> =
        [&a10g, &a10g4, &l4, &p4d, &spot_lt].iter().map(|n| format!("aws/test/{n}")).collect();
    want.sort();
    assert_eq!(ids, want);

    // A10G: moto's (and EC2's) g5.xlarge: 4 vCPU, 16 GiB, one A10G with 22888 MiB.
    let g = by_id(&groups, &format!("aws/test/{a10g}"));
    assert_eq!(g.account, "test");
    assert_eq!(g.instance_type, "g5.xlarge");
    assert_eq!(g.capacity_type, CapacityType::OnDemand);
    assert_eq!(g.price, 1_006_000);
    assert_eq!((g.min_size, g.max_size, g.target_size), (0, 4, 0));
    assert_eq!(g.zones, vec![ZONE.to_owned()]);
    let t = &g.template;
    assert_eq!(t.gpu_model.as_deref(), Some("A10G"));
    assert_eq!(t.gpus.len(), 1);
    assert_eq!(t.gpus[0].memory_mib, 22888);
    assert_eq!(t.allocatable.cpu_milli, 4000);
    assert_eq!(t.allocatable.memory_mib(), 16384);
    assert_eq!(t.zone.as_deref(), Some(ZONE));
    assert_eq!(t.labels["team"], "ml");
    assert_eq!(t.labels["node.kubernetes.io/instance-type"], "g5.xlarge");
    assert_eq!(t.labels["kubernetes.io/arch"], "amd64");
    assert_eq!(t.taints.len(), 1);
    assert_eq!(t.taints[0].key, "nvidia.com/gpu");
    assert_eq!(t.taints[0].value, "present");
    assert_eq!(t.taints[0].effect, TaintEffect::NoSchedule);
    let d = discovered.iter().find(|d| d.group.id == g.id).unwrap();
    assert_eq!(d.price_source, PriceSource::Tag);

    // Launch template versions.
    let g = by_id(&groups, &format!("aws/test/{l4}"));
    assert_eq!(g.instance_type, "g6.xlarge");
    assert_eq!(g.template.gpu_model.as_deref(), Some("L4"));
    assert_eq!(g.template.gpus.len(), 1);
    assert_eq!(g.price, 0, "no price tag, on-demand: price left for the catalog");
    let d = discovered.iter().find(|d| d.group.id == g.id).unwrap();
    assert_eq!(d.price_source, PriceSource::Unknown);
    let g = by_id(&groups, &format!("aws/test/{a10g4}"));
    assert_eq!(g.instance_type, "g5.12xlarge");
    assert_eq!(g.template.gpus.len(), 4);
    assert_eq!(g.template.allocatable.cpu_milli, 48_000);

    // Spot from launch template market options, priced from spot history.
    let g = by_id(&groups, &format!("aws/test/{spot_lt}"));
    assert_eq!(g.capacity_type, CapacityType::Spot);
    let d = discovered.iter().find(|d| d.group.id == g.id).unwrap();
    assert_eq!(d.price_source, PriceSource::SpotHistory);
    let zone_price = d.spot_prices[ZONE];
    assert!(zone_price > 0.0);
    assert_eq!(g.price, dollars(zone_price));

    // p4d: 8x A100 40 GB, 96 vCPU, 1152 GiB; spot via the mixed policy, priced from history.
    let g = by_id(&groups, &format!("aws/test/{p4d}"));
    assert_eq!(g.instance_type, "p4d.24xlarge");
    assert_eq!(g.capacity_type, CapacityType::Spot);
    assert_eq!(g.zones, vec![ZONE.to_owned(), "us-east-1b".to_owned()]);
    let t = &g.template;
    assert_eq!(t.gpu_model.as_deref(), Some("A100-40GB"));
    assert_eq!(t.gpus.len(), 8);
    assert!(t.gpus.iter().all(|d| d.memory_mib == 40960));
    assert_eq!(t.allocatable.cpu_milli, 96_000);
    assert_eq!(t.allocatable.memory_mib(), 1_179_648);
    let model = gpuscale::model::GpuCatalog.resolve(t.gpu_model.as_deref().unwrap()).unwrap();
    assert!(model.mig.is_some(), "A100 is MIG-capable");
    assert!(t.mig_geometry().is_none(), "but the template's GPUs are not in MIG mode");
    assert_eq!(t.labels["eks.amazonaws.com/capacityType"], "SPOT");
    let d = discovered.iter().find(|d| d.group.id == g.id).unwrap();
    assert_eq!(d.price_source, PriceSource::SpotHistory);
    let highest = [ZONE, "us-east-1b"].iter().map(|z| d.spot_prices[*z]).fold(0.0, f64::max);
    assert_eq!(g.price, dollars(highest));
    assert!(d.launch_failure.is_none());

    // refresh() returns the same groups.
    let refreshed = provider.refresh().await.expect("refresh");
    assert_eq!(refreshed.len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scales_up_and_terminates_a_specific_instance() {
    let endpoint = moto();
    let (asg_client, ec2) = clients(&endpoint).await;
    let cluster = unique("scale");
    let lt = unique("lt");
    launch_template(&ec2, &lt, "g6.xlarge", false).await;
    let name = unique("scale-asg");
    asg(&asg_client, &name, &lt, None, (0, 4, 0), cluster_tags(&name, &cluster)).await;
    let id = format!("aws/test/{name}");
    let provider = AwsProvider::connect(settings(&endpoint, &cluster)).await.unwrap();

    provider.set_target_size(&id, 3).await.expect("scale up");
    let groups = provider.refresh().await.unwrap();
    let g = by_id(&groups, &id);
    assert_eq!(g.target_size, 3);
    assert_eq!(g.instances.len(), 3);
    assert!(g.instances.iter().all(|i| i.state == InstanceState::Running));
    assert!(g.instances.iter().all(|i| i.id.starts_with(&format!("aws:///{ZONE}/i-"))), "{:?}", g.instances);
    let before = g.instances.clone();

    // Same target again: no change, same instances.
    provider.set_target_size(&id, 3).await.expect("idempotent");
    // The bare ASG name works too.
    provider.set_target_size(&name, 3).await.expect("idempotent by name");
    let (desired, ids) = desired_of(&asg_client, &name).await;
    assert_eq!(desired, 3);
    assert_eq!(ids.len(), 3);

    // Terminate the second instance by provider id: target and instances shrink by one.
    let victim = before[1].id.clone();
    provider.delete_instances(&id, std::slice::from_ref(&victim)).await.expect("delete");
    let groups = provider.refresh().await.unwrap();
    let g = by_id(&groups, &id);
    assert_eq!(g.target_size, 2);
    let mut left: Vec<&str> = g.instances.iter().map(|i| i.id.as_str()).collect();
    left.sort();
    let mut want: Vec<&str> = before.iter().map(|i| i.id.as_str()).filter(|i| *i != victim).collect();
    want.sort();
    assert_eq!(left, want);

    // A bare instance id works as well.
    let bare = want[0].rsplit('/').next().unwrap().to_owned();
    provider.delete_instances(&id, std::slice::from_ref(&bare)).await.expect("delete bare id");
    let (desired, ids) = desired_of(&asg_client, &name).await;
    assert_eq!(desired, 1);
    assert_eq!(ids.len(), 1);
    assert_ne!(ids[0], bare);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_out_of_range_targets_unknown_groups_and_foreign_instances() {
    let endpoint = moto();
    let (asg_client, ec2) = clients(&endpoint).await;
    let cluster = unique("reject");
    let lt = unique("lt");
    launch_template(&ec2, &lt, "g5.xlarge", false).await;
    let name = unique("reject-asg");
    asg(&asg_client, &name, &lt, None, (1, 3, 1), cluster_tags(&name, &cluster)).await;
    let other = unique("reject-other");
    asg(&asg_client, &other, &lt, None, (0, 3, 1), cluster_tags(&other, &cluster)).await;
    let unmanaged = unique("reject-unmanaged");
    asg(&asg_client, &unmanaged, &lt, None, (0, 3, 0), vec![tag(&unmanaged, ENABLED, "true")]).await;
    let id = format!("aws/test/{name}");
    let provider = AwsProvider::connect(settings(&endpoint, &cluster)).await.unwrap();

    match provider.set_target_size(&id, 4).await {
        Err(ProviderError::SizeOutOfRange { group, target: 4, min: 1, max: 3 }) => assert_eq!(group, id),
        other => panic!("expected SizeOutOfRange, got {other:?}"),
    }
    assert!(matches!(
        provider.set_target_size(&id, 0).await,
        Err(ProviderError::SizeOutOfRange { target: 0, .. })
    ));
    assert_eq!(desired_of(&asg_client, &name).await.0, 1, "desired capacity untouched");

    for group in ["aws/test/no-such-group".to_owned(), format!("aws/test/{unmanaged}")] {
        assert!(
            matches!(provider.set_target_size(&group, 1).await, Err(ProviderError::GroupNotFound(ref g)) if *g == group),
            "{group}"
        );
        assert!(matches!(
            provider.delete_instances(&group, &["i-0123456789abcdef0".to_owned()]).await,
            Err(ProviderError::GroupNotFound(_))
        ));
    }

    // An instance of another group, and a malformed reference.
    let (_, other_ids) = desired_of(&asg_client, &other).await;
    let foreign = other_ids[0].clone();
    match provider.delete_instances(&id, std::slice::from_ref(&foreign)).await {
        Err(ProviderError::InstanceNotFound { group, instance }) => {
            assert_eq!(group, id);
            assert_eq!(instance, foreign);
        }
        other => panic!("expected InstanceNotFound, got {other:?}"),
    }
    assert!(matches!(
        provider.delete_instances(&id, &["node-1".to_owned()]).await,
        Err(ProviderError::InstanceNotFound { .. })
    ));
    assert_eq!(desired_of(&asg_client, &other).await, (1, other_ids));

    // Deleting the only instance would go below min size 1.
    let (_, own) = desired_of(&asg_client, &name).await;
    assert_eq!(own.len(), 1);
    assert!(matches!(
        provider.delete_instances(&id, &own).await,
        Err(ProviderError::SizeOutOfRange { target: 0, min: 1, .. })
    ));
    assert_eq!(desired_of(&asg_client, &name).await, (1, own));
}

/// A loopback server answering every request with a canned status and body; counts requests.
async fn canned_server(
    respond: impl Fn(&str) -> (u16, String) + Send + Sync + 'static,
) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let respond = Arc::new(respond);
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let counter = counter.clone();
            let respond = respond.clone();
            tokio::spawn(async move {
                // Read the head, then Content-Length bytes of body.
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let head_end = loop {
                    let n = match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break p + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while buf.len() < head_end + len {
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                counter.fetch_add(1, Ordering::SeqCst);
                let body = String::from_utf8_lossy(&buf[head_end..head_end + len]).into_owned();
                let (status, reply) = respond(&body);
                let response = format!(
                    "HTTP/1.1 {status} {}\r\nContent-Type: text/xml\r\nContent-Length: {}\r\nx-amzn-requestid: 0f1e2d3c\r\nConnection: close\r\n\r\n{reply}",
                    if status == 200 { "OK" } else { "Error" },
                    reply.len()
                );
                let _ = sock.write_all(response.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    (format!("http://{addr}"), hits)
}

fn throttle_settings(endpoint: &str) -> AwsSettings {
    let mut s = settings(endpoint, "throttled");
    s.operation_timeout_secs = 10;
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autoscaling_throttling_maps_to_throttled() {
    let (endpoint, hits) = canned_server(|_| {
        (
            400,
            r#"<ErrorResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/">
  <Error>
    <Type>Sender</Type>
    <Code>Throttling</Code>
    <Message>Rate exceeded</Message>
  </Error>
  <RequestId>8c2a5a3e-0000-4000-8000-000000000000</RequestId>
</ErrorResponse>"#
                .to_owned(),
        )
    })
    .await;
    let provider = AwsProvider::connect(throttle_settings(&endpoint)).await.unwrap();
    let err = provider.refresh().await.expect_err("throttled");
    assert!(matches!(err, ProviderError::Throttled { .. }), "{err:?}");
    assert!(err.is_retryable());
    let err = provider.set_target_size("aws/test/any", 1).await.expect_err("throttled");
    assert!(matches!(err, ProviderError::Throttled { .. }), "{err:?}");
    assert_eq!(hits.load(Ordering::SeqCst), 2, "one request per call: the SDK does not retry");
}

const THROTTLING_XML: &str = r#"<ErrorResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/">
  <Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error>
  <RequestId>8c2a5a3e-0000-4000-8000-000000000003</RequestId>
</ErrorResponse>"#;

const NO_GROUPS_XML: &str = r#"<DescribeAutoScalingGroupsResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/">
  <DescribeAutoScalingGroupsResult><AutoScalingGroups/></DescribeAutoScalingGroupsResult>
  <ResponseMetadata><RequestId>8c2a5a3e-0000-4000-8000-000000000004</RequestId></ResponseMetadata>
</DescribeAutoScalingGroupsResponse>"#;

/// A server that throttles the first `throttle` requests, then answers with no groups; the
/// arrival time of every request.
async fn throttling_server(throttle: usize) -> (String, Arc<std::sync::Mutex<Vec<std::time::Instant>>>) {
    let arrivals = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = arrivals.clone();
    let (endpoint, _) = canned_server(move |_| {
        let mut a = seen.lock().unwrap();
        a.push(std::time::Instant::now());
        if a.len() <= throttle {
            (400, THROTTLING_XML.to_owned())
        } else {
            (200, NO_GROUPS_XML.to_owned())
        }
    })
    .await;
    (endpoint, arrivals)
}

/// One retry layer: the SDK's retries are off, so `retry.maxAttempts` attempts reach AWS (not
/// maxAttempts squared), each after a token of the account's rate limiter, and throttling is
/// backed off by our layer alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_retried_by_one_layer_and_every_attempt_passes_the_rate_limiter() {
    use gpuscale::providers::config::{BackoffConfig, RateLimitConfig, RetryConfig};
    use gpuscale::providers::politeness::{Polite, PolitenessConfig};
    use std::time::Duration;
    // 5 requests per second, no burst: attempts at least 200 ms apart. The backoff itself is
    // zero, so only the limiter can space them.
    let polite = |attempts| PolitenessConfig {
        rate_limit: Some(RateLimitConfig { requests_per_second: 5.0, burst: 1 }),
        retry: RetryConfig { max_attempts: attempts, base_delay_ms: 0, max_delay_ms: 0, seed: 1 },
        backoff: BackoffConfig::default(),
    };
    let spacing = |arrivals: &[std::time::Instant]| -> Vec<Duration> {
        arrivals.windows(2).map(|w| w[1] - w[0]).collect()
    };

    // Throttled three times, then answered: exactly four requests.
    let (endpoint, arrivals) = throttling_server(3).await;
    let provider = Polite::new(AwsProvider::connect(throttle_settings(&endpoint)).await.unwrap(), polite(5));
    let groups = provider.refresh().await.expect("answered after three throttles");
    assert!(groups.is_empty());
    let a = arrivals.lock().unwrap().clone();
    assert_eq!(a.len(), 4, "three throttled attempts and one answered, nothing more");
    let gaps = spacing(&a);
    assert!(
        gaps.iter().all(|g| *g >= Duration::from_millis(190)),
        "every attempt waited for the limiter: {gaps:?}"
    );

    // Throttled for good: maxAttempts requests in all (the SDK's own retries made it 3 x 3 = 9).
    let (endpoint, arrivals) = throttling_server(usize::MAX).await;
    let provider = Polite::new(AwsProvider::connect(throttle_settings(&endpoint)).await.unwrap(), polite(3));
    let err = provider.refresh().await.expect_err("throttled on every attempt");
    assert!(matches!(err, ProviderError::Throttled { .. }), "{err:?}");
    let a = arrivals.lock().unwrap().clone();
    assert_eq!(a.len(), 3, "maxAttempts = 3 attempts reach AWS");
    let gaps = spacing(&a);
    assert!(
        gaps.iter().all(|g| *g >= Duration::from_millis(190)),
        "every attempt waited for the limiter: {gaps:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_request_limit_exceeded_maps_to_throttled() {
    // Auto Scaling answers with one spot p4d group; EC2 then throttles DescribeInstanceTypes in
    // its own error shape.
    let (endpoint, hits) = canned_server(|body| {
        if body.contains("Action=DescribeAutoScalingGroups") {
            (
                200,
                r#"<DescribeAutoScalingGroupsResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/">
  <DescribeAutoScalingGroupsResult>
    <AutoScalingGroups>
      <member>
        <AutoScalingGroupName>gpu</AutoScalingGroupName>
        <MixedInstancesPolicy>
          <LaunchTemplate>
            <LaunchTemplateSpecification><LaunchTemplateName>lt</LaunchTemplateName><Version>$Latest</Version></LaunchTemplateSpecification>
            <Overrides><member><InstanceType>p4d.24xlarge</InstanceType></member></Overrides>
          </LaunchTemplate>
          <InstancesDistribution><OnDemandBaseCapacity>0</OnDemandBaseCapacity><OnDemandPercentageAboveBaseCapacity>0</OnDemandPercentageAboveBaseCapacity></InstancesDistribution>
        </MixedInstancesPolicy>
        <MinSize>0</MinSize><MaxSize>4</MaxSize><DesiredCapacity>0</DesiredCapacity>
        <AvailabilityZones><member>us-east-1a</member></AvailabilityZones>
        <Instances/>
        <Tags><member><ResourceId>gpu</ResourceId><ResourceType>auto-scaling-group</ResourceType><Key>k8s.io/cluster-autoscaler/enabled</Key><Value>true</Value><PropagateAtLaunch>false</PropagateAtLaunch></member></Tags>
      </member>
    </AutoScalingGroups>
  </DescribeAutoScalingGroupsResult>
  <ResponseMetadata><RequestId>8c2a5a3e-0000-4000-8000-000000000001</RequestId></ResponseMetadata>
</DescribeAutoScalingGroupsResponse>"#
                    .to_owned(),
            )
        } else {
            (
                503,
                r#"<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>8c2a5a3e-0000-4000-8000-000000000002</RequestID></Response>"#
                    .to_owned(),
            )
        }
    })
    .await;
    let provider = AwsProvider::connect(throttle_settings(&endpoint)).await.unwrap();
    let err = provider.refresh().await.expect_err("throttled");
    assert!(matches!(err, ProviderError::Throttled { .. }), "{err:?}");
    assert_eq!(hits.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_legacy_launch_configuration_groups() {
    let endpoint = moto();
    let (asg_client, _) = clients(&endpoint).await;
    let cluster = unique("lc");
    let lc = unique("lc-p5");
    asg_client
        .create_launch_configuration()
        .launch_configuration_name(&lc)
        .image_id(AMI)
        .instance_type("p5.48xlarge")
        .spot_price("98.32")
        .send()
        .await
        .expect("CreateLaunchConfiguration");
    let name = unique("lc-asg");
    asg_client
        .create_auto_scaling_group()
        .auto_scaling_group_name(&name)
        .launch_configuration_name(&lc)
        .min_size(0)
        .max_size(2)
        .desired_capacity(1)
        .availability_zones(ZONE)
        .set_tags(Some(cluster_tags(&name, &cluster)))
        .send()
        .await
        .expect("CreateAutoScalingGroup");
    let provider = AwsProvider::connect(settings(&endpoint, &cluster)).await.unwrap();
    let groups = provider.refresh().await.unwrap();
    assert_eq!(groups.len(), 1);
    let g = &groups[0];
    assert_eq!(g.id, format!("aws/test/{name}"));
    assert_eq!(g.instance_type, "p5.48xlarge");
    // A launch configuration with a spot price asks for spot.
    assert_eq!(g.capacity_type, CapacityType::Spot);
    assert!(g.price > 0);
    assert_eq!(g.template.gpu_model.as_deref(), Some("H100-80GB"));
    assert_eq!(g.template.gpus.len(), 8);
    assert!(g.template.gpus.iter().all(|d| d.memory_mib == 81920));
    assert_eq!(g.template.allocatable.cpu_milli, 192_000);
    assert_eq!(g.target_size, 1);
    assert_eq!(g.instances.len(), 1);
    assert_eq!(g.instances[0].state, InstanceState::Running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assumes_the_configured_role_through_sts() {
    let endpoint = moto();
    let (asg_client, ec2) = clients(&endpoint).await;
    let cluster = unique("role");
    let lt = unique("lt");
    launch_template(&ec2, &lt, "g5.xlarge", false).await;
    let name = unique("role-asg");
    asg(&asg_client, &name, &lt, None, (0, 2, 0), cluster_tags(&name, &cluster)).await;

    // The static credentials sign STS AssumeRole; moto's STS hands out session credentials
    // that then sign the Auto Scaling and EC2 calls.
    let mut s = settings(&endpoint, &cluster);
    s.role_arn = Some("arn:aws:iam::123456789012:role/gpuscale-autoscaler".into());
    s.external_id = Some("gpuscale-test".into());
    let provider = AwsProvider::connect(s).await.expect("connect with role");
    let groups = provider.refresh().await.expect("refresh with assumed role");
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].id, format!("aws/test/{name}"));
    provider.set_target_size(&groups[0].id, 1).await.expect("scale with assumed role");
    assert_eq!(desired_of(&asg_client, &name).await.0, 1);

    // Settings that cannot work are refused before any call.
    let mut bad = settings(&endpoint, &cluster);
    bad.role_arn = Some("gpuscale-autoscaler".into());
    let err = AwsProvider::connect(bad).await.expect_err("bad role arn");
    assert!(err.to_string().contains("role_arn"), "{err}");
}

/// `gpuscale plan --live-groups`: the group sizes come from the cloud, not from counting the
/// snapshot's nodes. An ASG running three instances costs three instances before the plan even
/// though the snapshot shows none of them (their nodes have not registered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_with_live_groups_reads_the_real_sizes() {
    let endpoint = moto();
    let (asg_client, ec2) = clients(&endpoint).await;
    let cluster = unique("live");
    let template = unique("lt-live");
    launch_template(&ec2, &template, "g5.xlarge", false).await;
    let name = format!("{cluster}-gpu-a10g");
    let mut tags = cluster_tags(&name, &cluster);
    tags.push(tag(&name, "gpuscale.io/price-on-demand", "1.006"));
    asg(&asg_client, &name, &template, None, (0, 5, 3), tags).await;

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("aws.yaml");
    std::fs::write(
        &config,
        format!(
            "accounts:\n  - name: live\n    provider: aws\n    region: {REGION}\n    endpointUrl: {endpoint}\n    credentials: {{env: true}}\n    discovery:\n      tags:\n        {ENABLED}: \"true\"\n        k8s.io/cluster-autoscaler/{cluster}: owned\n"
        ),
    )
    .unwrap();
    let snapshot = dir.path().join("empty.json");
    std::fs::write(&snapshot, r#"{"apiVersion":"v1","kind":"List","items":[]}"#).unwrap();
    let plan = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_gpuscale"))
            .args(["plan", "--snapshot", snapshot.to_str().unwrap(), "--providers", config.to_str().unwrap()])
            .args(["-o", "json"])
            .args(extra)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_REGION", REGION)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let live = plan(&["--live-groups"]);
    assert_eq!(live["costBeforePerHourUsd"].as_f64(), Some(3.0 * 1.006), "{live}");
    // Offline, the group holds the snapshot's nodes: none.
    let offline = plan(&[]);
    assert_eq!(offline["costBeforePerHourUsd"].as_f64(), Some(0.0), "{offline}");
}

/// Raw SQS client for putting events in moto's queues, as EventBridge would.
async fn sqs_client(endpoint: &str) -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(&moto_server::sdk_config(endpoint, REGION).await)
}

/// An EventBridge event as the interruption queue receives it (AWS's documented shapes).
fn event(detail_type: &str, source: &str, detail: serde_json::Value) -> String {
    serde_json::json!({
        "version": "0",
        "id": "1e5527d7-bb36-4607-3370-4164db56a40e",
        "detail-type": detail_type,
        "source": source,
        "account": "123456789012",
        "time": "2026-12-07T10:00:00Z",
        "region": REGION,
        "resources": [],
        "detail": detail,
    })
    .to_string()
}

fn kinds(deliveries: &[gpuscale::providers::Delivery]) -> Vec<(NoticeKind, String)> {
    let mut out: Vec<(NoticeKind, String)> =
        deliveries.iter().flat_map(|d| d.notices.iter().map(|n| (n.kind, n.instance.clone()))).collect();
    out.sort();
    out
}

/// The interruption queue read through the provider against moto's SQS: the four event shapes
/// EventBridge delivers become notices, other messages come with none; a message not
/// acknowledged comes back after the queue's visibility timeout (so a controller that crashed
/// before acting sees it again), an acknowledged one never does. The queue is named by name or
/// by URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_interruption_queue_yields_notices_and_deletes_only_what_is_acknowledged() {
    use aws_sdk_sqs::types::QueueAttributeName;
    let endpoint = moto();
    let sqs = sqs_client(&endpoint).await;
    let name = unique("interruptions");
    let url = sqs
        .create_queue()
        .queue_name(&name)
        .attributes(QueueAttributeName::VisibilityTimeout, "1")
        .send()
        .await
        .expect("CreateQueue")
        .queue_url
        .expect("a queue URL");
    let spot = event(
        "EC2 Spot Instance Interruption Warning",
        "aws.ec2",
        serde_json::json!({"instance-id": "i-0spot", "instance-action": "terminate"}),
    );
    let rebalance = event(
        "EC2 Instance Rebalance Recommendation",
        "aws.ec2",
        serde_json::json!({"instance-id": "i-0reb"}),
    );
    let stopping = event(
        "EC2 Instance State-change Notification",
        "aws.ec2",
        serde_json::json!({"instance-id": "i-0stop", "state": "stopping"}),
    );
    let running = event(
        "EC2 Instance State-change Notification",
        "aws.ec2",
        serde_json::json!({"instance-id": "i-0run", "state": "running"}),
    );
    let health = event(
        "AWS Health Event",
        "aws.health",
        serde_json::json!({
            "service": "EC2", "eventTypeCategory": "scheduledChange",
            "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            "startTime": "Tue, 08 Dec 2026 07:00:00 GMT",
            "affectedEntities": [{"entityValue": "i-0ret"}]
        }),
    );
    for body in [&spot, &rebalance, &stopping, &running, &health, &"not an event".to_string()] {
        sqs.send_message().queue_url(&url).message_body(body).send().await.expect("SendMessage");
    }

    let mut s = settings(&endpoint, &unique("queue"));
    s.interruption_queue = Some(name.clone());
    let provider = AwsProvider::connect(s).await.unwrap();
    let mut got = Vec::new();
    // SQS hands out a sample of the queue per call; all six come within a few reads.
    for _ in 0..10 {
        got.extend(provider.receive_notices().await.expect("ReceiveMessage"));
        if got.len() >= 6 {
            break;
        }
    }
    assert_eq!(got.len(), 6, "{got:?}");
    let mut sorted_want = vec![
        (NoticeKind::SpotInterruption, "i-0spot".to_string()),
        (NoticeKind::Rebalance, "i-0reb".to_string()),
        (NoticeKind::ScheduledMaintenance, "i-0ret".to_string()),
        (NoticeKind::Terminating, "i-0stop".to_string()),
    ];
    sorted_want.sort();
    assert_eq!(kinds(&got), sorted_want);
    let spot_notice = got.iter().flat_map(|d| &d.notices).find(|n| n.instance == "i-0spot").unwrap();
    assert_eq!(spot_notice.deadline, Some(spot_notice.issued_at + 120));
    assert_eq!(got.iter().filter(|d| d.notices.is_empty()).count(), 2, "the running state and the garbage");

    // Nothing acknowledged: all six come back once the visibility timeout has passed.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let mut again = Vec::new();
    for _ in 0..10 {
        again.extend(provider.receive_notices().await.expect("ReceiveMessage"));
        if again.len() >= 6 {
            break;
        }
    }
    assert_eq!(kinds(&again), sorted_want);
    // Acknowledge all but the spot warning: only it comes back.
    let keep: Vec<String> = again
        .iter()
        .filter(|d| !d.notices.iter().any(|n| n.instance == "i-0spot"))
        .map(|d| d.receipt.clone())
        .collect();
    assert_eq!(keep.len(), 5);
    provider.acknowledge_notices(&keep).await.expect("DeleteMessageBatch");
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let mut last = Vec::new();
    for _ in 0..3 {
        last.extend(provider.receive_notices().await.expect("ReceiveMessage"));
    }
    assert_eq!(kinds(&last), vec![(NoticeKind::SpotInterruption, "i-0spot".to_string())]);

    // By URL: the same queue, and the last message deleted.
    let mut s = settings(&endpoint, &unique("queue"));
    s.interruption_queue = Some(url.clone());
    let by_url = AwsProvider::connect(s).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let left = by_url.receive_notices().await.expect("ReceiveMessage by URL");
    assert_eq!(kinds(&left), vec![(NoticeKind::SpotInterruption, "i-0spot".to_string())]);
    by_url.acknowledge_notices(&[left[0].receipt.clone()]).await.unwrap();
    assert_eq!(moto_server::queue_depth(&sqs, &url).await, ("0".into(), "0".into()));

    // An account without a queue has no notices and makes no call.
    let plain = AwsProvider::connect(settings(&endpoint, &unique("queue"))).await.unwrap();
    assert!(plain.receive_notices().await.unwrap().is_empty());
}
