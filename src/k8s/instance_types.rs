//! GPUs that well-known cloud instance types carry, for nodes whose device plugin has not
//! advertised them yet (the node is then in-flight GPU capacity, not an empty node).

/// GPU model (a [`crate::model::GpuCatalog`] name) and count of a cloud instance type, for the
/// AWS, GCP and Azure GPU families; `None` for other types.
pub fn instance_gpus(instance_type: &str) -> Option<(&'static str, u32)> {
    let t = instance_type.trim();
    if let Some((family, size)) = t.split_once('.') {
        // AWS: family.size
        let fixed = match (family, size) {
            ("p4d", "24xlarge") => Some(("A100-40GB", 8)),
            ("p4de", "24xlarge") => Some(("A100-80GB", 8)),
            ("p5", "48xlarge") => Some(("H100-80GB", 8)),
            ("p5", "4xlarge") => Some(("H100-80GB", 1)),
            ("p5e" | "p5en", "48xlarge") => Some(("H200-141GB", 8)),
            ("p3", "2xlarge") => Some(("V100-16GB", 1)),
            ("p3", "8xlarge") => Some(("V100-16GB", 4)),
            ("p3", "16xlarge") => Some(("V100-16GB", 8)),
            ("p3dn", "24xlarge") => Some(("V100-32GB", 8)),
            _ => None,
        };
        if fixed.is_some() {
            return fixed;
        }
        let model = match family {
            "g4dn" => "T4",
            "g5" => "A10G",
            "g6" => "L4",
            "g6e" => "L40S",
            _ => return None,
        };
        let count = match size {
            "xlarge" | "2xlarge" | "4xlarge" | "8xlarge" | "16xlarge" => 1,
            "12xlarge" | "24xlarge" => 4,
            "48xlarge" | "metal" => 8,
            _ => return None,
        };
        return Some((model, count));
    }
    // GCP: a2-highgpu-8g, a3-megagpu-8g, g2-standard-48.
    let parts: Vec<&str> = t.split('-').collect();
    if let [family, kind, size] = parts.as_slice() {
        let gpus_suffix = size.strip_suffix('g').and_then(|n| n.parse::<u32>().ok());
        match (*family, *kind, gpus_suffix) {
            ("a2", "highgpu" | "megagpu", Some(n)) => return Some(("A100-40GB", n)),
            ("a2", "ultragpu", Some(n)) => return Some(("A100-80GB", n)),
            ("a3", "highgpu" | "megagpu" | "edgegpu", Some(n)) => return Some(("H100-80GB", n)),
            ("a3", "ultragpu", Some(n)) => return Some(("H200-141GB", n)),
            _ => {}
        }
        if *family == "g2" && *kind == "standard" {
            let n = match *size {
                "4" | "8" | "12" | "16" | "32" => 1,
                "24" => 2,
                "48" => 4,
                "96" => 8,
                _ => return None,
            };
            return Some(("L4", n));
        }
    }
    // Azure.
    match t {
        "Standard_ND96asr_v4" => Some(("A100-40GB", 8)),
        "Standard_ND96amsr_A100_v4" => Some(("A100-80GB", 8)),
        "Standard_ND96isr_H100_v5" => Some(("H100-80GB", 8)),
        "Standard_NC4as_T4_v3" | "Standard_NC8as_T4_v3" | "Standard_NC16as_T4_v3" => Some(("T4", 1)),
        "Standard_NC64as_T4_v3" => Some(("T4", 4)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_gpu_instance_types() {
        assert_eq!(instance_gpus("p4d.24xlarge"), Some(("A100-40GB", 8)));
        assert_eq!(instance_gpus("p5.48xlarge"), Some(("H100-80GB", 8)));
        assert_eq!(instance_gpus("g6.12xlarge"), Some(("L4", 4)));
        assert_eq!(instance_gpus("g6.xlarge"), Some(("L4", 1)));
        assert_eq!(instance_gpus("g4dn.metal"), Some(("T4", 8)));
        assert_eq!(instance_gpus("a2-highgpu-4g"), Some(("A100-40GB", 4)));
        assert_eq!(instance_gpus("a3-megagpu-8g"), Some(("H100-80GB", 8)));
        assert_eq!(instance_gpus("g2-standard-48"), Some(("L4", 4)));
        assert_eq!(instance_gpus("Standard_ND96asr_v4"), Some(("A100-40GB", 8)));
        assert_eq!(instance_gpus("m6i.4xlarge"), None);
        assert_eq!(instance_gpus("n2-standard-8"), None);
        assert_eq!(instance_gpus("g5.huge"), None);
    }
}
