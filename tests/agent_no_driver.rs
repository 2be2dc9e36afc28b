//! The real `gpuscale agent` binary on this driver-less machine: it must start, say NVML is
//! unavailable through its metrics, keep serving, and stop cleanly on SIGTERM.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills the agent if the test fails half-way.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("binding a loopback port").local_addr().unwrap().port()
}

/// One HTTP/1.1 GET over a plain socket; returns (status line, body).
fn get(addr: SocketAddr, path: &str) -> std::io::Result<(String, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    s.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    Ok((head.lines().next().unwrap_or_default().to_string(), body.to_string()))
}

#[test]
fn agent_without_a_driver_serves_metrics_and_stops_on_sigterm() {
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_gpuscale"))
        .args(["agent", "--listen", &addr.to_string(), "--interval", "1s", "--no-annotate"])
        // Also on a machine that has a driver, this library path does not exist.
        .args(["--nvml-library", "/nonexistent/gpuscale-test/libnvidia-ml.so.1"])
        .env("NODE_NAME", "test-node")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the gpuscale binary");
    let mut agent = Agent(child);

    // Poll until the first sample has been recorded.
    let deadline = Instant::now() + Duration::from_secs(60);
    let body = loop {
        if let Some(status) = agent.0.try_wait().unwrap() {
            let mut err = String::new();
            let _ = agent.0.stderr.take().unwrap().read_to_string(&mut err);
            panic!("the agent exited early with {status}: {err}");
        }
        match get(addr, "/metrics") {
            // Wait for a sample, not just the gauge's initial value.
            Ok((status, body))
                if body.contains("\ngpuscale_agent_nvml_available 0\n")
                    && !body.contains("gpuscale_agent_samples_unavailable_total 0\n") =>
            {
                assert!(status.contains("200"), "{status}");
                break body;
            }
            _ if Instant::now() > deadline => {
                panic!("no gpuscale_agent_nvml_available 0 on {addr}/metrics in 60s")
            }
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    assert!(
        !body.contains("gpuscale_agent_gpu_utilization_ratio{"),
        "no GPU series without a driver:\n{body}"
    );
    assert!(body.contains("gpuscale_agent_samples_total 0"), "no successful sample:\n{body}");
    assert!(body.trim_end().ends_with("# EOF"), "{body}");
    let (status, health) = get(addr, "/healthz").expect("GET /healthz");
    assert!(status.contains("200") && health.trim() == "ok", "{status} {health}");
    // Still serving after more samples.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(get(addr, "/metrics").unwrap().1.contains("\ngpuscale_agent_nvml_available 0\n"));

    let pid = agent.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().expect("running kill");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = agent.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the agent did not stop within 30s of SIGTERM");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    agent.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "exit {status}: {err}");
    assert_eq!(err.lines().filter(|l| l.contains("NVML unavailable")).count(), 1, "warned once:\n{err}");
    assert!(err.contains("shutting down"), "{err}");
}
