#![no_main]
//! `cargo +nightly fuzz run segment_recovery`: see `mq_broker::fuzzing::segment_recovery`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = mq_broker::fuzzing::segment_recovery(data);
});
