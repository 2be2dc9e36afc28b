//! The ProvisioningRequest CRD as Cluster Autoscaler publishes it: the YAML in the Go module
//! `k8s.io/autoscaler/cluster-autoscaler/apis` (`config/crd`, versions `v1` and `v1beta1`),
//! fetched through the Go module proxy like the control plane's own modules.
#![allow(dead_code)]

use crate::controlplane::ControlPlane;
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

/// The autoscaler's API module: its `config/crd` holds the CRD YAML (`v1` and `v1beta1`).
const CRD_MODULE: &str = "k8s.io/autoscaler/cluster-autoscaler/apis@v0.0.0-20240830133931-adfbe7e45277";

/// The ProvisioningRequest CRD from the Go module proxy (`go mod download`); fails loudly when Go
/// or the proxy cannot give it.
pub fn crd() -> Value {
    let out = Command::new("go")
        .args(["mod", "download", "-json", CRD_MODULE])
        .env("GOFLAGS", "-mod=mod")
        .output()
        .unwrap_or_else(|e| panic!("cannot run go (needed for the ProvisioningRequest CRD): {e}"));
    let info: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("go mod download {CRD_MODULE}: {e}: {}", String::from_utf8_lossy(&out.stderr))
    });
    let dir = info["Dir"].as_str().unwrap_or_else(|| panic!("go mod download {CRD_MODULE}: {info}"));
    let path = std::path::Path::new(dir).join("config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Installs the CRD on `cp` and waits until it is established (served).
pub async fn install(cp: &ControlPlane) {
    install_crd(cp, crd()).await;
}

/// Applies `crd` on `cp` and waits until it is established (served).
pub async fn install_crd(cp: &ControlPlane, crd: Value) {
    let name = crd["metadata"]["name"].as_str().expect("a CRD name").to_string();
    cp.apply(crd).await;
    let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}");
    let began = Instant::now();
    loop {
        let crd = cp.raw("GET", &path, None).await.unwrap_or_default();
        let established = crd["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Established" && c["status"] == "True"));
        if established {
            return;
        }
        assert!(began.elapsed() < Duration::from_secs(60), "CRD {name} was not established: {crd}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
