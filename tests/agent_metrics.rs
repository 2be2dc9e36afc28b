//! The agent loop with an in-memory GPU source: real metric values over HTTP, and the idle
//! tracker feeding the idle metric.

use gpuscale::agent::{self, AgentOptions, MemorySource, PublishPolicy};
use gpuscale::model::{GpuSample, MigSample, NodeTelemetry};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connecting to the agent");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

fn sample() -> NodeTelemetry {
    let gpu = |i: u8, util: Option<u8>| GpuSample {
        index: i,
        uuid: format!("GPU-{i}"),
        model: "A100-80GB".into(),
        utilization_pct: util,
        memory_used_bytes: 3 << 30,
        memory_total_bytes: 80 << 30,
        ecc_errors: u64::from(i),
        healthy: i == 0,
        mig: vec![],
        idle_since: None,
    };
    let mut mig_gpu = gpu(1, None);
    mig_gpu.mig =
        (0..3).map(|_| MigSample { profile: "2g.20gb".into(), start: None, utilization_pct: None }).collect();
    NodeTelemetry { sampled_at: 0, gpus: vec![gpu(0, Some(37)), mig_gpu] }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_source_metrics_over_http() {
    let options = AgentOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        interval: Duration::from_millis(100),
        node_name: None,
        idle_threshold_pct: 50,
        publish: PublishPolicy::default(),
        interruptions: None,
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(agent::run(
        options,
        Box::new(MemorySource::new([sample()])),
        None,
        async move {
            let _ = stop_rx.await;
        },
        Some(bound_tx),
    ));
    let addr = tokio::time::timeout(Duration::from_secs(30), bound_rx).await.expect("agent bound").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let body = get(addr, "/metrics").await;
        if body.contains("\ngpuscale_agent_nvml_available 1\n") {
            break body;
        }
        assert!(Instant::now() < deadline, "no sample within 30s:\n{body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let labels = |i: u8| format!(r#"{{gpu="{i}",uuid="GPU-{i}",model="A100-80GB"}}"#);
    for line in [
        format!("gpuscale_agent_gpu_utilization_ratio{} 0.37", labels(0)),
        format!("gpuscale_agent_gpu_memory_used_bytes{} 3221225472", labels(0)),
        format!("gpuscale_agent_gpu_memory_total_bytes{} 85899345920", labels(1)),
        format!("gpuscale_agent_gpu_ecc_errors{} 1", labels(1)),
        format!("gpuscale_agent_gpu_healthy{} 1", labels(0)),
        format!("gpuscale_agent_gpu_healthy{} 0", labels(1)),
        r#"gpuscale_agent_gpu_mig_instances{gpu="1",uuid="GPU-1",model="A100-80GB",profile="2g.20gb"} 3"#
            .into(),
    ] {
        assert!(body.lines().any(|l| l == line), "missing {line:?} in\n{body}");
    }
    // GPU 0 is below the 50% threshold, so the tracker marks it idle; GPU 1 reports no
    // utilisation (MIG) and is never called idle.
    assert!(
        body.lines().any(|l| l.starts_with(&format!("gpuscale_agent_gpu_idle_seconds{} ", labels(0)))),
        "{body}"
    );
    assert!(!body.contains(&format!("gpuscale_agent_gpu_idle_seconds{}", labels(1))), "{body}");
    assert!(!body.contains(&format!("gpuscale_agent_gpu_utilization_ratio{}", labels(1))), "{body}");
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), task).await.expect("agent stopped").unwrap().unwrap();
}
