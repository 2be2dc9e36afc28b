//! The gpuscale config (`--config`).
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = gpuscale::config::GpuscaleConfig::parse(Path::new("gpuscale.yaml"), text);
});
