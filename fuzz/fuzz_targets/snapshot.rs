//! The snapshot reader: text limits, JSON (List fast path and general path) and YAML, the
//! bounds, decoding and conversion.
#![no_main]
use gpuscale::k8s::load_text;
use gpuscale::textfile::{read_text, InputLimits};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = read_text(data, InputLimits::default()) else { return };
    for name in ["snapshot.json", "snapshot.yaml"] {
        let _ = load_text(Path::new(name), &text);
    }
});
