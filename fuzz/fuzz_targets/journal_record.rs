#![no_main]
//! `cargo +nightly fuzz run journal_record`: see `mq_broker::fuzzing::record_decoder`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = mq_broker::fuzzing::record_decoder(data);
});
