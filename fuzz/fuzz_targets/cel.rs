//! CEL device selectors: compiled, then evaluated on a GPU.
#![no_main]
use gpuscale::model::cel::{AttrValue, DeviceView, Program, Semver};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else { return };
    let Ok(program) = Program::compile(source) else { return };
    let d = "gpu.nvidia.com";
    let attributes = BTreeMap::from([
        (format!("{d}/type"), AttrValue::Str("gpu".into())),
        (format!("{d}/productName"), AttrValue::Str("NVIDIA H100 80GB HBM3".into())),
        (format!("{d}/index"), AttrValue::Int(3)),
        (format!("{d}/mig"), AttrValue::Bool(false)),
        (format!("{d}/driverVersion"), AttrValue::Version(Semver::parse("550.90.7").unwrap())),
    ]);
    let capacity = BTreeMap::from([(format!("{d}/memory"), 81_559i128 << 20)]);
    let _ = program.matches(&DeviceView { driver: d, attributes: &attributes, capacity: &capacity });
});
