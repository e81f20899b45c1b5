//! Any bytes as `trajectory_groups` (of a log or a training job), validated with the server's
//! limits. Must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tandem_core::trajectory::{validate_groups, TrajectoryLimits};
use tandem_core::validate::Validator;

fuzz_target!(|data: &[u8]| {
    if let Ok(groups) = serde_json::from_slice::<serde_json::Value>(data) {
        let mut v = Validator::new("body");
        let _ = validate_groups(&mut v, &groups, &TrajectoryLimits::default());
    }
});
