//! The moto server (the AWS API emulator) shared by the tests of one binary: `MOTO_ENDPOINT` when
//! set (scripts/test.sh starts one), otherwise one started with `scripts/moto.sh` (installing moto
//! with pip on first use), stopped by the script's watchdog when this process exits. A test that
//! needs it fails loudly when it cannot start.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

static MOTO: OnceLock<Result<String, String>> = OnceLock::new();

/// The moto endpoint shared by all tests of this binary.
pub fn moto() -> String {
    MOTO.get_or_init(|| {
        if let Ok(ep) = std::env::var("MOTO_ENDPOINT") {
            return Ok(ep);
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/moto.sh");
        let state = std::env::temp_dir().join(format!("gpuscale-moto-{}", std::process::id()));
        let out = Command::new("bash")
            .arg(&script)
            .arg("start")
            .env("MOTO_STATE_DIR", &state)
            .env("MOTO_OWNER_PID", std::process::id().to_string())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let endpoint = stdout.lines().last().unwrap_or("").trim().to_owned();
        if !out.status.success() || !endpoint.starts_with("http://") {
            return Err(format!(
                "{} start failed ({}): stdout {stdout:?}, stderr {:?}",
                script.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(endpoint)
    })
    .clone()
    .unwrap_or_else(|e| panic!("moto is needed for the AWS provider tests and could not start: {e}"))
}

/// SDK settings for setting up fixtures in moto (any credentials sign for it).
pub async fn sdk_config(endpoint: &str, region: &str) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(region.to_string()))
        .endpoint_url(endpoint)
        .credentials_provider(aws_credential_types::Credentials::new(
            "testing", "testing", None, None, "test",
        ))
        .load()
        .await
}

/// The messages of an SQS queue: `(visible, in flight)` (moto's approximate counts are exact).
pub async fn queue_depth(sqs: &aws_sdk_sqs::Client, url: &str) -> (String, String) {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(A::ApproximateNumberOfMessages)
        .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .expect("GetQueueAttributes");
    let count = |a| out.attributes().and_then(|m| m.get(&a)).cloned().unwrap_or_default();
    (count(A::ApproximateNumberOfMessages), count(A::ApproximateNumberOfMessagesNotVisible))
}
