//! The gpuscale config file (`--config gpuscale.yaml`): how the planner and the controller behave.
//!
//! Cloud accounts and node groups live in the provider config files
//! ([`crate::providers::config`]); this file holds the policy knobs, one section per concern, so a
//! team can keep one file per cluster while provider files stay per cloud account.

use crate::planner::PlannerSettings;
use crate::providers::config::ConfigError;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The whole config file. Every section is optional; absent sections take their defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GpuscaleConfig {
    /// Planner knobs: placement policy, scale-down threshold, consolidation, disruption budget.
    pub planner: PlannerSettings,
    /// How agent telemetry is used: idle window, maximum age.
    pub telemetry: crate::model::TelemetrySettings,
    /// Tenants, cohorts, GPU quotas, fair sharing and preemption (absent: no multi-tenancy).
    pub tenancy: Option<crate::tenancy::TenancyConfig>,
    /// In-cluster controller knobs (`gpuscale run`): batching, drain, readiness, leader election.
    pub controller: crate::controller::config::ControllerConfig,
}

impl GpuscaleConfig {
    /// Reads and parses a config file (within [`crate::limits::MAX_CONFIG_BYTES`], text only,
    /// nesting bounded); errors name the file, line and field.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file =
            std::fs::File::open(path).map_err(|cause| ConfigError::Io { file: path.to_path_buf(), cause })?;
        let limits =
            crate::textfile::InputLimits { max_bytes: crate::limits::MAX_CONFIG_BYTES, ..Default::default() };
        let text = crate::textfile::read_text(file, limits)
            .map_err(|reason| ConfigError::Text { file: path.to_path_buf(), reason })?;
        Self::parse(path, &text)
    }

    /// Parses config text; `path` only names the source in errors. An empty file (nothing but
    /// white space: a failed redirect, a wrong path in a ConfigMap) is an error; a file of only
    /// comments, or `{}`, is the default, with a warning for the comments.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        if text.trim().is_empty() {
            return Err(ConfigError::Invalid {
                file: path.to_path_buf(),
                field: "(file)".into(),
                value: format!("{} bytes", text.len()),
                reason: "the config file is empty; write `{}` for every default, or leave out --config"
                    .into(),
            });
        }
        let yaml_err = |e: serde_yaml::Error| ConfigError::yaml(path, &e);
        let value: serde_yaml::Value = serde_yaml::from_str(text).map_err(yaml_err)?;
        if value.is_null() {
            tracing::warn!(
                target: "gpuscale::config",
                "{}: the config file holds no settings (only comments or null); every default applies",
                path.display()
            );
            return Ok(Self::default());
        }
        // From the text, not the value: errors then carry their line and column.
        let config: Self = serde_yaml::from_str(text).map_err(yaml_err)?;
        if let Some(tenancy) = &config.tenancy {
            tenancy.validate(path)?;
        }
        let problems = config.planner.problems().into_iter().chain(config.controller.problems());
        if let Some((field, value, reason)) = problems.into_iter().next() {
            return Err(ConfigError::Invalid { file: path.to_path_buf(), field, value, reason });
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_the_default_and_sections_override_it() {
        let p = Path::new("gpuscale.yaml");
        assert_eq!(GpuscaleConfig::parse(p, "# nothing\n").unwrap(), GpuscaleConfig::default());
        assert_eq!(GpuscaleConfig::parse(p, "{}\n").unwrap(), GpuscaleConfig::default());
        for empty in ["", "\n", "  \n\t\n"] {
            let e = GpuscaleConfig::parse(p, empty).unwrap_err().to_string();
            assert!(e.starts_with("gpuscale.yaml: ") && e.contains("the config file is empty"), "{e}");
        }
        let c =
            GpuscaleConfig::parse(p, "planner:\n  scaleDownUtilization: 0.3\n  maxDisruptions: 5\n").unwrap();
        assert_eq!(c.planner.scale_down_utilization, 0.3);
        assert_eq!(c.planner.max_disruptions, 5);
        assert_eq!(c.planner.seed, PlannerSettings::default().seed);
    }

    #[test]
    fn errors_name_file_field_and_value() {
        let p = Path::new("/etc/gpuscale/gpuscale.yaml");
        let e = GpuscaleConfig::parse(p, "planner:\n  scaleDownUtilisation: 0.3\n").unwrap_err().to_string();
        assert!(
            e.starts_with("/etc/gpuscale/gpuscale.yaml:2:3: ") && e.contains("scaleDownUtilisation"),
            "{e}"
        );
        assert!(!e.contains(" at line "), "the position once: {e}");
        let e = GpuscaleConfig::parse(p, "planner:\n  scaleDownUtilization: 1.5\n").unwrap_err().to_string();
        assert!(e.contains("planner.scaleDownUtilization = 1.5"), "{e}");
        let e = GpuscaleConfig::parse(p, "planner: [1, 2\n").unwrap_err().to_string();
        assert!(e.starts_with("/etc/gpuscale/gpuscale.yaml:"), "{e}");
    }
}
