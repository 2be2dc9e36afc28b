//! The Alibaba `openb` GPU-sharing trace (cluster-trace-gpu-v2023): node and pod lists as CSV.

use crate::model::{GpuCatalog, GpuDemand, GpuDevice, GpuTopology, Node, Resources, Workload, GPU_MILLI};
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// A malformed trace file, with the place of the problem.
#[derive(Debug, Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("{path}: cannot read: {cause}")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause (in the message, so not also a `source()`).
        cause: std::io::Error,
    },
    /// A required column is missing from the header.
    #[error("{path}: line 1: missing column {column:?} (header has: {header})")]
    MissingColumn {
        /// File.
        path: PathBuf,
        /// The column.
        column: &'static str,
        /// The header as read.
        header: String,
    },
    /// A row could not be parsed as CSV.
    #[error("{path}: line {line}: {message}")]
    Csv {
        /// File.
        path: PathBuf,
        /// 1-based line.
        line: u64,
        /// What the CSV reader said.
        message: String,
    },
    /// A field has a bad value.
    #[error("{path}: line {line}: field {field}: {message} (value {value:?})")]
    Field {
        /// File.
        path: PathBuf,
        /// 1-based line.
        line: u64,
        /// Column name.
        field: &'static str,
        /// The value as written.
        value: String,
        /// What is wrong.
        message: String,
    },
    /// The file has a header but no rows.
    #[error("{path}: no rows")]
    Empty {
        /// File.
        path: PathBuf,
    },
}

/// Quality of service class of a trace pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
pub enum Qos {
    /// Latency-sensitive.
    Ls,
    /// Best-effort.
    Be,
    /// Burstable.
    Burstable,
    /// Guaranteed.
    Guaranteed,
    /// Not given.
    Unspecified,
}

impl Qos {
    /// A Kubernetes-style priority for the class (higher runs first).
    pub fn priority(self) -> i32 {
        match self {
            Qos::Guaranteed => 1000,
            Qos::Ls => 800,
            Qos::Burstable => 500,
            Qos::Unspecified => 100,
            Qos::Be => 0,
        }
    }
}

/// One task of a pod list.
#[derive(Debug, Clone, PartialEq)]
pub struct TracePod {
    /// The workload, GPU demand translated (`num_gpu` whole GPUs, or a `gpu_milli` share of one).
    pub workload: Workload,
    /// QoS class.
    pub qos: Qos,
    /// Seconds from trace start, when given.
    pub creation_time: Option<u64>,
    /// Seconds from trace start, when given.
    pub deletion_time: Option<u64>,
}

/// A header-indexed CSV row reader that reports the file and line of every bad field.
struct Rows {
    path: PathBuf,
    columns: HashMap<String, usize>,
    reader: csv::Reader<std::fs::File>,
}

struct Row<'a> {
    path: &'a Path,
    line: u64,
    record: csv::StringRecord,
    columns: &'a HashMap<String, usize>,
}

impl Rows {
    fn open(path: &Path, required: &[&'static str]) -> Result<Self, TraceError> {
        let file = std::fs::File::open(path).map_err(|cause| TraceError::Io { path: path.into(), cause })?;
        let mut reader = csv::ReaderBuilder::new().flexible(false).trim(csv::Trim::All).from_reader(file);
        let header = reader
            .headers()
            .map_err(|e| TraceError::Csv { path: path.into(), line: 1, message: e.to_string() })?
            .clone();
        let columns: HashMap<String, usize> =
            header.iter().enumerate().map(|(i, h)| (h.to_string(), i)).collect();
        for &column in required {
            if !columns.contains_key(column) {
                return Err(TraceError::MissingColumn {
                    path: path.into(),
                    column,
                    header: header.iter().collect::<Vec<_>>().join(","),
                });
            }
        }
        Ok(Self { path: path.into(), columns, reader })
    }

    fn for_each(&mut self, mut f: impl FnMut(Row<'_>) -> Result<(), TraceError>) -> Result<(), TraceError> {
        let mut any = false;
        for result in self.reader.records() {
            let record = result.map_err(|e| TraceError::Csv {
                path: self.path.clone(),
                line: e.position().map_or(0, |p| p.line()),
                message: e.to_string(),
            })?;
            let line = record.position().map_or(0, |p| p.line());
            any = true;
            f(Row { path: &self.path, line, record, columns: &self.columns })?;
        }
        if any {
            Ok(())
        } else {
            Err(TraceError::Empty { path: self.path.clone() })
        }
    }
}

impl Row<'_> {
    fn raw(&self, field: &'static str) -> &str {
        self.columns.get(field).and_then(|&i| self.record.get(i)).unwrap_or("")
    }

    fn error(&self, field: &'static str, message: impl Into<String>) -> TraceError {
        TraceError::Field {
            path: self.path.into(),
            line: self.line,
            field,
            value: self.raw(field).to_string(),
            message: message.into(),
        }
    }

    fn uint(&self, field: &'static str) -> Result<u64, TraceError> {
        let raw = self.raw(field);
        if raw.is_empty() {
            return Err(self.error(field, "missing value"));
        }
        if raw.starts_with('-') {
            return Err(self.error(field, "must not be negative"));
        }
        raw.parse::<u64>().map_err(|_| self.error(field, "not a whole number"))
    }

    fn optional_uint(&self, field: &'static str) -> Result<Option<u64>, TraceError> {
        if self.raw(field).is_empty() {
            Ok(None)
        } else {
            self.uint(field).map(Some)
        }
    }

    fn model(&self, field: &'static str, name: &str) -> Result<String, TraceError> {
        GpuCatalog
            .resolve(name)
            .map(|m| m.name.to_string())
            .ok_or_else(|| self.error(field, format!("unknown GPU model {name:?}")))
    }
}

/// Reads a node list (`sn,cpu_milli,memory_mib,gpu,model`): empty nodes of the trace's shapes.
pub fn read_nodes(path: &Path) -> Result<Vec<Node>, TraceError> {
    let mut rows = Rows::open(path, &["sn", "cpu_milli", "memory_mib", "gpu", "model"])?;
    let mut nodes = Vec::new();
    rows.for_each(|row| {
        let name = row.raw("sn").to_string();
        if name.is_empty() {
            return Err(row.error("sn", "missing node name"));
        }
        let gpus = row.uint("gpu")?;
        if gpus > crate::scheduler::MAX_GPUS_PER_NODE as u64 {
            return Err(
                row.error("gpu", format!("more than {} GPUs per node", crate::scheduler::MAX_GPUS_PER_NODE))
            );
        }
        let model = if gpus > 0 || !row.raw("model").is_empty() {
            Some(row.model("model", row.raw("model"))?)
        } else {
            None
        };
        let spec = model.as_deref().and_then(|m| GpuCatalog.resolve(m));
        let memory = spec.map_or(0, |s| s.memory_mib);
        nodes.push(Node {
            name,
            allocatable: Resources::new(row.uint("cpu_milli")?, row.uint("memory_mib")?),
            gpus: (0..gpus).map(|i| GpuDevice::standard(i as u8, memory)).collect(),
            topology: GpuTopology::default(),
            gpu_model: model,
            ..Default::default()
        });
        Ok(())
    })?;
    Ok(nodes)
}

/// Reads a pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,qos,pod_phase,
/// creation_time,deletion_time,scheduled_time]`).
pub fn read_pods(path: &Path) -> Result<Vec<TracePod>, TraceError> {
    let mut rows = Rows::open(path, &["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"])?;
    let mut pods = Vec::new();
    rows.for_each(|row| {
        let name = row.raw("name").to_string();
        if name.is_empty() {
            return Err(row.error("name", "missing pod name"));
        }
        let num_gpu = row.uint("num_gpu")?;
        let gpu_milli = row.uint("gpu_milli")?;
        if gpu_milli > u64::from(GPU_MILLI) {
            return Err(row.error("gpu_milli", "a share of one GPU must be at most 1000"));
        }
        if num_gpu > crate::scheduler::MAX_GPUS_PER_NODE as u64 {
            return Err(row.error("num_gpu", "more GPUs than any node can have"));
        }
        let gpu = match (num_gpu, gpu_milli) {
            (0, _) => GpuDemand::None,
            (1, 0) => return Err(row.error("gpu_milli", "a 1-GPU task needs gpu_milli between 1 and 1000")),
            (1, m) if m < u64::from(GPU_MILLI) => {
                GpuDemand::Fraction { count: 1, milli: m as u32, memory_mib: 0 }
            }
            (n, _) => GpuDemand::Whole { count: n as u32 },
        };
        let mut gpu_models = Vec::new();
        for spec in row.raw("gpu_spec").split('|').filter(|s| !s.is_empty()) {
            let m = row.model("gpu_spec", spec)?;
            if !gpu_models.contains(&m) {
                gpu_models.push(m);
            }
        }
        let qos = match row.raw("qos") {
            "" => Qos::Unspecified,
            "LS" => Qos::Ls,
            "BE" => Qos::Be,
            "Burstable" => Qos::Burstable,
            "Guaranteed" => Qos::Guaranteed,
            _ => return Err(row.error("qos", "expected LS, BE, Burstable or Guaranteed")),
        };
        pods.push(TracePod {
            workload: Workload {
                id: format!("openb/{name}"),
                requests: Resources::new(row.uint("cpu_milli")?, row.uint("memory_mib")?),
                gpu,
                gpu_models,
                priority: qos.priority(),
                ..Default::default()
            },
            qos,
            creation_time: row.optional_uint("creation_time")?,
            deletion_time: row.optional_uint("deletion_time")?,
        });
        Ok(())
    })?;
    Ok(pods)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(content: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(content.as_bytes()).unwrap();
        f
    }

    #[test]
    fn reads_nodes_and_pods() {
        let nodes = file("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,96000,393216,8,G2\n");
        let nodes = read_nodes(nodes.path()).unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[1].gpus.len(), 8);
        assert_eq!(nodes[0].gpu_model.as_deref(), Some("P100"));
        let pods = file(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
             p0,12000,16384,1,460,,LS,Running,0,12537496,0\n\
             p1,8000,30517,0,0,,BE,Running,5,10,5\n\
             p2,8000,30517,2,1000,V100M16|V100M32,LS,Running,5,,5\n",
        );
        let pods = read_pods(pods.path()).unwrap();
        assert_eq!(pods[0].workload.gpu, GpuDemand::Fraction { count: 1, milli: 460, memory_mib: 0 });
        assert_eq!(pods[1].workload.gpu, GpuDemand::None);
        assert_eq!(pods[2].workload.gpu, GpuDemand::Whole { count: 2 });
        assert_eq!(pods[2].workload.gpu_models, vec!["V100-16GB", "V100-32GB"]);
        assert_eq!(pods[2].deletion_time, None);
        assert_eq!(pods[0].qos, Qos::Ls);
    }

    #[test]
    fn bad_rows_name_file_line_and_field() {
        let f = file("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,10,1,500\np1,-5,10,0,0\n");
        let err = read_pods(f.path()).unwrap_err().to_string();
        assert!(err.contains(&f.path().display().to_string()), "{err}");
        assert!(err.contains("line 3") && err.contains("cpu_milli") && err.contains("\"-5\""), "{err}");

        let f = file("name,cpu_milli,memory_mib,num_gpu\np0,1000,10,1\n");
        let err = read_pods(f.path()).unwrap_err().to_string();
        assert!(err.contains("missing column \"gpu_milli\""), "{err}");

        let f = file("sn,cpu_milli,memory_mib,gpu,model\nn0,1000,10,2,Z9000\n");
        let err = read_nodes(f.path()).unwrap_err().to_string();
        assert!(err.contains("line 2") && err.contains("field model") && err.contains("Z9000"), "{err}");

        let f = file("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,1000,10,1,500,T4|X1\n");
        let err = read_pods(f.path()).unwrap_err().to_string();
        assert!(err.contains("gpu_spec") && err.contains("X1"), "{err}");

        let f = file("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,10,1,1500\n");
        assert!(read_pods(f.path()).unwrap_err().to_string().contains("at most 1000"));

        let f = file("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,10\n");
        assert!(read_pods(f.path()).unwrap_err().to_string().contains("line 2"));
    }
}
