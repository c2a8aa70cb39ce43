#![no_main]
//! `cargo +nightly fuzz run format_name`: see `mq_broker::fuzzing::format_name`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = mq_broker::fuzzing::format_name(data);
});
