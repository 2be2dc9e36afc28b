//! The EventBridge events of the interruption queue, read as Karpenter's interruption controller
//! reads them (`pkg/controllers/interruption/messages`): four event shapes become notices, the
//! rest are known to be nothing to act on.
//!
//! | `detail-type` (`source`) | notice |
//! |---|---|
//! | EC2 Spot Instance Interruption Warning (`aws.ec2`) | spot interruption, deadline `time` + 2 min |
//! | EC2 Instance Rebalance Recommendation (`aws.ec2`) | rebalance, no deadline |
//! | EC2 Instance State-change Notification (`aws.ec2`) | terminating now, for `stopping`, `stopped`, `shutting-down`, `terminated`; other states: nothing |
//! | AWS Health Event (`aws.health`), service EC2, category `scheduledChange` | scheduled maintenance of each affected instance, deadline `startTime` |
//!
//! Pure: the body of one SQS message in, notices out.

use crate::model::{Notice, NoticeKind};
use aws_smithy_types::date_time::{DateTime, Format};
use serde::Deserialize;
use thiserror::Error;

/// How long after its warning AWS reclaims a spot instance.
pub const SPOT_WARNING_SECONDS: i64 = 120;

/// A message body that is not an event of the interruption queue.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("interruption queue message {message_id}: {reason}")]
pub struct EventError {
    /// The SQS message id.
    pub message_id: String,
    /// What is wrong with it.
    pub reason: String,
}

#[derive(Deserialize)]
struct Event {
    source: String,
    #[serde(rename = "detail-type")]
    detail_type: String,
    time: String,
    #[serde(default)]
    detail: serde_json::Value,
}

#[derive(Deserialize)]
struct Ec2Detail {
    #[serde(rename = "instance-id")]
    instance_id: String,
    #[serde(default)]
    state: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HealthDetail {
    service: String,
    event_type_category: String,
    #[serde(default)]
    start_time: Option<String>,
    #[serde(default)]
    affected_entities: Vec<AffectedEntity>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AffectedEntity {
    entity_value: String,
}

/// The notices in one message's `body` (an EventBridge event); none for events that call for no
/// action (an instance starting, a Health event about another service). `message_id` names the
/// message in errors.
pub fn notices_of(message_id: &str, body: &str) -> Result<Vec<Notice>, EventError> {
    let bad = |reason: String| EventError { message_id: message_id.to_string(), reason };
    let event: Event =
        serde_json::from_str(body).map_err(|e| bad(format!("not an EventBridge event: {e}")))?;
    let time = parse_time(&event.time, Format::DateTime)
        .ok_or_else(|| bad(format!("time {:?} is not an RFC 3339 time", event.time)))?;
    let ec2 = || {
        serde_json::from_value::<Ec2Detail>(event.detail.clone())
            .map_err(|e| bad(format!("{} without a valid detail: {e}", event.detail_type)))
    };
    let notice = |kind, instance: String, deadline| Notice { kind, instance, issued_at: time, deadline };
    match (event.source.as_str(), event.detail_type.as_str()) {
        ("aws.ec2", "EC2 Spot Instance Interruption Warning") => {
            let d = ec2()?;
            Ok(vec![notice(NoticeKind::SpotInterruption, d.instance_id, Some(time + SPOT_WARNING_SECONDS))])
        }
        ("aws.ec2", "EC2 Instance Rebalance Recommendation") => {
            Ok(vec![notice(NoticeKind::Rebalance, ec2()?.instance_id, None)])
        }
        ("aws.ec2", "EC2 Instance State-change Notification") => {
            let d = ec2()?;
            let going =
                matches!(d.state.as_deref(), Some("stopping" | "stopped" | "shutting-down" | "terminated"));
            Ok(if going { vec![notice(NoticeKind::Terminating, d.instance_id, Some(time))] } else { vec![] })
        }
        ("aws.health", "AWS Health Event") => {
            let d: HealthDetail = serde_json::from_value(event.detail)
                .map_err(|e| bad(format!("AWS Health Event without a valid detail: {e}")))?;
            if d.service != "EC2" || d.event_type_category != "scheduledChange" {
                return Ok(vec![]);
            }
            // Health reports its times as HTTP dates ("Sat, 05 Jun 2021 07:00:00 GMT").
            let start = d
                .start_time
                .as_deref()
                .and_then(|s| parse_time(s, Format::HttpDate).or_else(|| parse_time(s, Format::DateTime)));
            Ok(d.affected_entities
                .into_iter()
                .filter(|e| e.entity_value.starts_with("i-"))
                .map(|e| {
                    notice(NoticeKind::ScheduledMaintenance, e.entity_value, Some(start.unwrap_or(time)))
                })
                .collect())
        }
        (source, detail_type) => Err(bad(format!("unexpected event {detail_type:?} from {source:?}"))),
    }
}

fn parse_time(s: &str, format: Format) -> Option<i64> {
    DateTime::from_str(s, format).ok().map(|t| t.secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    // The shapes of AWS's documentation and of Karpenter's test fixtures.
    const SPOT: &str = r#"{"version":"0","id":"1e5527d7-bb36-4607-3370-4164db56a40e","detail-type":"EC2 Spot Instance Interruption Warning","source":"aws.ec2","account":"123456789012","time":"2026-12-07T10:00:00Z","region":"us-east-1","resources":["arn:aws:ec2:us-east-1a:instance/i-1234567890abcdef0"],"detail":{"instance-id":"i-1234567890abcdef0","instance-action":"terminate"}}"#;
    const REBALANCE: &str = r#"{"version":"0","id":"26112ba2-a1b7-4aa6-b9bd-8e3b0fa9c3c5","detail-type":"EC2 Instance Rebalance Recommendation","source":"aws.ec2","account":"123456789012","time":"2026-12-07T10:00:00Z","region":"us-east-1","resources":["arn:aws:ec2:us-east-1a:instance/i-1234567890abcdef0"],"detail":{"instance-id":"i-1234567890abcdef0"}}"#;
    const HEALTH: &str = r#"{"version":"0","id":"7bf73129-1428-4cd3-a780-95db273d1602","detail-type":"AWS Health Event","source":"aws.health","account":"123456789012","time":"2026-12-07T10:00:00Z","region":"us-east-1","resources":["i-0a1","i-0b2"],"detail":{"eventArn":"arn:aws:health:us-east-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/x","service":"EC2","eventTypeCode":"AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED","eventTypeCategory":"scheduledChange","startTime":"Tue, 08 Dec 2026 07:00:00 GMT","eventDescription":[{"language":"en_US","latestDescription":"retirement"}],"affectedEntities":[{"entityValue":"i-0a1"},{"entityValue":"i-0b2"}]}}"#;

    fn state_change(state: &str) -> String {
        format!(
            r#"{{"version":"0","id":"7bf73129-1428-4cd3-a780-95db273d1602","detail-type":"EC2 Instance State-change Notification","source":"aws.ec2","account":"123456789012","time":"2026-12-07T10:00:00Z","region":"us-east-1","resources":["arn:aws:ec2:us-east-1:123456789012:instance/i-0abc"],"detail":{{"instance-id":"i-0abc","state":"{state}"}}}}"#
        )
    }

    const T: i64 = 1_796_637_600; // 2026-12-07T10:00:00Z

    #[test]
    fn the_four_event_shapes_become_notices() {
        let spot = notices_of("m1", SPOT).unwrap();
        assert_eq!(
            spot,
            vec![Notice {
                kind: NoticeKind::SpotInterruption,
                instance: "i-1234567890abcdef0".into(),
                issued_at: T,
                deadline: Some(T + 120)
            }]
        );
        assert!(spot[0].is_for("aws:///us-east-1a/i-1234567890abcdef0"));
        let rebalance = notices_of("m2", REBALANCE).unwrap();
        assert_eq!(rebalance[0].kind, NoticeKind::Rebalance);
        assert_eq!(rebalance[0].deadline, None);
        let going = notices_of("m3", &state_change("shutting-down")).unwrap();
        assert_eq!(going[0].kind, NoticeKind::Terminating);
        assert_eq!(going[0].deadline, Some(T));
        let health = notices_of("m4", HEALTH).unwrap();
        let start = T + 21 * 3600; // the next day, 07:00
        assert_eq!(
            health.iter().map(|n| (n.kind, n.instance.as_str(), n.deadline)).collect::<Vec<_>>(),
            vec![
                (NoticeKind::ScheduledMaintenance, "i-0a1", Some(start)),
                (NoticeKind::ScheduledMaintenance, "i-0b2", Some(start))
            ]
        );
    }

    #[test]
    fn events_that_call_for_nothing_are_empty_and_garbage_is_named() {
        assert!(notices_of("m", &state_change("running")).unwrap().is_empty());
        assert!(notices_of("m", &state_change("pending")).unwrap().is_empty());
        let other_service = HEALTH.replace(r#""service":"EC2""#, r#""service":"RDS""#);
        assert!(notices_of("m", &other_service).unwrap().is_empty());
        let err = notices_of("m9", "hello").unwrap_err();
        assert!(
            err.to_string().starts_with("interruption queue message m9: not an EventBridge event"),
            "{err}"
        );
        let err = notices_of("m9", &SPOT.replace("2026-12-07T10:00:00Z", "yesterday")).unwrap_err();
        assert!(err.reason.contains(r#"time "yesterday""#), "{err}");
        let err = notices_of("m9", &SPOT.replace(r#""instance-id""#, r#""instance""#)).unwrap_err();
        assert!(
            err.reason.contains("EC2 Spot Instance Interruption Warning without a valid detail"),
            "{err}"
        );
        let err = notices_of("m9", &SPOT.replace("aws.ec2", "aws.s3")).unwrap_err();
        assert!(err.reason.contains("unexpected event"), "{err}");
    }
}
