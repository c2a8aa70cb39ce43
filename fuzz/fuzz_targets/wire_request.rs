#![no_main]
//! `cargo +nightly fuzz run wire_request`: see `mq_broker::fuzzing::wire_requests`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = mq_broker::fuzzing::wire_requests(data);
});
