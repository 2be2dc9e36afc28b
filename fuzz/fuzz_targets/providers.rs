//! The provider config: YAML, validation, node groups.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(config) = gpuscale::providers::config::load_strs(&[("providers.yaml", text)]) {
        let _ = config.node_groups();
    }
});
