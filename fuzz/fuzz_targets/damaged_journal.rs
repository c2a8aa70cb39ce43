#![no_main]
//! `cargo +nightly fuzz run damaged_journal`: see `mq_broker::fuzzing::damaged_journal`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = mq_broker::fuzzing::damaged_journal(data);
});
