//! Classification of AWS SDK errors into [`ProviderError`].
//!
//! [`classify`] is pure (error code, HTTP status, transport kind in; class out); [`from_sdk`]
//! only extracts those facts from an SDK error.

use crate::providers::{BoxError, ProviderError};
use aws_sdk_autoscaling::config::http::HttpResponse;
use aws_sdk_autoscaling::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use std::time::Duration;
use thiserror::Error;

/// An AWS API failure with the facts that classified it; the `source` of
/// [`ProviderError::Api`] and the message of the other variants.
#[derive(Debug, Error)]
#[error("{op}: {}{}{}", code.as_deref().map(|c| format!("{c}: ")).unwrap_or_default(), message, status.map(|s| format!(" (HTTP {s})")).unwrap_or_default())]
pub struct AwsApiError {
    /// Operation, e.g. `SetDesiredCapacity`.
    pub op: &'static str,
    /// AWS error code (`Throttling`, `ValidationError`), when the service answered with one.
    pub code: Option<String>,
    /// Service message, or the SDK's description of a transport failure.
    pub message: String,
    /// HTTP status, when a response arrived.
    pub status: Option<u16>,
    /// The SDK error.
    #[source]
    pub source: Option<BoxError>,
}

/// How far a failed call got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The service answered (possibly with an unparseable body).
    Response,
    /// The call timed out.
    Timeout,
    /// The request could not be sent (connection refused, DNS, I/O).
    Dispatch,
    /// Credentials could not be resolved.
    Credentials,
    /// The request could not be built.
    Construction,
}

const THROTTLING: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "RequestThrottled",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "EC2ThrottledException",
    "SlowDown",
    "PriorRequestNotComplete",
    "BandwidthLimitExceeded",
];
const CAPACITY: &[&str] = &[
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity",
    "InsufficientCapacityOnOutpost",
];
const QUOTA: &[&str] = &[
    "LimitExceeded",
    "LimitExceededException",
    "VcpuLimitExceeded",
    "InstanceLimitExceeded",
    "MaxSpotInstanceCountExceeded",
    "ServiceQuotaExceededException",
];
const AUTH: &[&str] = &[
    "AuthFailure",
    "UnauthorizedOperation",
    "AccessDenied",
    "AccessDeniedException",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "MissingAuthenticationToken",
    "InvalidAccessKeyId",
    "ExpiredToken",
    "ExpiredTokenException",
    "UnrecognizedClientException",
    "OptInRequired",
];
const RETRYABLE: &[&str] = &[
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "Unavailable",
    "RequestTimeout",
    "RequestTimeoutException",
    "ServiceLinkedRoleFailure",
    "ResourceContention",
];

/// Classifies a failed call: throttling codes and HTTP 429 → [`ProviderError::Throttled`],
/// capacity codes → [`ProviderError::InsufficientCapacity`], limit codes →
/// [`ProviderError::QuotaExceeded`], credential/signature codes, HTTP 401/403 and unresolvable
/// credentials → [`ProviderError::Auth`], 5xx, timeouts and dispatch failures → retryable
/// [`ProviderError::Api`], everything else → non-retryable [`ProviderError::Api`].
pub fn classify(
    account: &str,
    group: &str,
    retry_after: Option<Duration>,
    transport: Transport,
    error: AwsApiError,
) -> ProviderError {
    let code = error.code.as_deref().unwrap_or("");
    let status = error.status.unwrap_or(0);
    let is = |list: &[&str]| list.contains(&code);
    if is(THROTTLING) || status == 429 {
        ProviderError::Throttled { retry_after }
    } else if is(CAPACITY) {
        ProviderError::InsufficientCapacity { group: group.to_owned(), message: error.to_string() }
    } else if is(QUOTA) {
        ProviderError::QuotaExceeded(error.to_string())
    } else if is(AUTH) || status == 401 || status == 403 || transport == Transport::Credentials {
        ProviderError::Auth { account: account.to_owned(), message: error.to_string() }
    } else {
        let retryable = is(RETRYABLE)
            || (500..600).contains(&status)
            || matches!(transport, Transport::Timeout | Transport::Dispatch);
        ProviderError::Api { op: error.op, cause: Box::new(error), retryable }
    }
}

/// Classifies an SDK error of operation `op` on `group` (empty for account-wide reads).
pub fn from_sdk<E>(
    op: &'static str,
    account: &str,
    group: &str,
    err: SdkError<E, HttpResponse>,
) -> ProviderError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let raw = err.raw_response();
    let status = raw.map(|r| r.status().as_u16());
    let retry_after = raw
        .and_then(|r| r.headers().get("retry-after"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let transport = match &err {
        SdkError::ServiceError(_) | SdkError::ResponseError(_) => Transport::Response,
        SdkError::TimeoutError(_) => Transport::Timeout,
        _ if caused_by_credentials(&err) => Transport::Credentials,
        SdkError::DispatchFailure(d) if d.is_timeout() => Transport::Timeout,
        SdkError::DispatchFailure(_) => Transport::Dispatch,
        _ => Transport::Construction,
    };
    let code = err.code().map(str::to_owned);
    let message = err.message().map(str::to_owned).unwrap_or_else(|| DisplayErrorContext(&err).to_string());
    let error = AwsApiError { op, code, message, status, source: Some(Box::new(err)) };
    classify(account, group, retry_after, transport, error)
}

/// Whether the error chain holds a credentials-provider failure (no credentials, assume-role
/// refused), which the SDK reports as a construction or dispatch failure.
fn caused_by_credentials(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if e.is::<aws_credential_types::provider::error::CredentialsError>() {
            return true;
        }
        cur = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_autoscaling::error::ErrorMetadata;
    use aws_sdk_autoscaling::operation::set_desired_capacity::SetDesiredCapacityError;
    use aws_sdk_ec2::operation::run_instances::RunInstancesError;
    use aws_smithy_runtime_api::client::result::ConnectorError;
    use aws_smithy_runtime_api::http::StatusCode;
    use aws_smithy_types::body::SdkBody;

    fn response(status: u16) -> HttpResponse {
        HttpResponse::new(StatusCode::try_from(status).unwrap(), SdkBody::empty())
    }

    fn asg_err(code: &str, status: u16) -> ProviderError {
        let e = SetDesiredCapacityError::generic(
            ErrorMetadata::builder().code(code).message(format!("{code} happened")).build(),
        );
        from_sdk("SetDesiredCapacity", "prod", "gpu", SdkError::service_error(e, response(status)))
    }

    fn ec2_err(code: &str, status: u16) -> ProviderError {
        let e = RunInstancesError::generic(ErrorMetadata::builder().code(code).build());
        from_sdk("RunInstances", "prod", "gpu", SdkError::service_error(e, response(status)))
    }

    #[test]
    fn throttling_codes_and_429_are_throttled() {
        assert!(matches!(asg_err("Throttling", 400), ProviderError::Throttled { retry_after: None }));
        assert!(matches!(ec2_err("RequestLimitExceeded", 503), ProviderError::Throttled { .. }));
        assert!(matches!(asg_err("SomethingElse", 429), ProviderError::Throttled { .. }));
        let mut raw = response(400);
        raw.headers_mut().insert("retry-after", "7");
        let e = SetDesiredCapacityError::generic(ErrorMetadata::builder().code("Throttling").build());
        let p = from_sdk("SetDesiredCapacity", "prod", "gpu", SdkError::service_error(e, raw));
        assert!(matches!(
            p,
            ProviderError::Throttled { retry_after: Some(d) } if d == Duration::from_secs(7)
        ));
        assert!(p.is_retryable());
    }

    #[test]
    fn capacity_quota_and_auth_codes_are_classified() {
        match ec2_err("InsufficientInstanceCapacity", 500) {
            ProviderError::InsufficientCapacity { group, message } => {
                assert_eq!(group, "gpu");
                assert!(message.contains("InsufficientInstanceCapacity"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        for code in ["LimitExceeded", "VcpuLimitExceeded", "InstanceLimitExceeded"] {
            assert!(matches!(ec2_err(code, 400), ProviderError::QuotaExceeded(_)), "{code}");
        }
        for code in ["AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId"] {
            assert!(
                matches!(ec2_err(code, 400), ProviderError::Auth { ref account, .. } if account == "prod"),
                "{code}"
            );
        }
        assert!(matches!(asg_err("Whatever", 403), ProviderError::Auth { .. }));
    }

    #[test]
    fn server_errors_and_timeouts_are_retryable_others_not() {
        let e = asg_err("InternalFailure", 500);
        assert!(matches!(e, ProviderError::Api { retryable: true, op: "SetDesiredCapacity", .. }));
        assert!(e.is_retryable());
        let e = asg_err("ValidationError", 400);
        assert!(matches!(e, ProviderError::Api { retryable: false, .. }));
        assert!(e.to_string().contains("ValidationError"), "{e}");
        let timeout: SdkError<SetDesiredCapacityError, HttpResponse> =
            SdkError::timeout_error("operation timed out");
        assert!(from_sdk("SetDesiredCapacity", "prod", "gpu", timeout).is_retryable());
        let io: SdkError<SetDesiredCapacityError, HttpResponse> = SdkError::dispatch_failure(
            ConnectorError::io(Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))),
        );
        assert!(from_sdk("SetDesiredCapacity", "prod", "gpu", io).is_retryable());
    }
}
