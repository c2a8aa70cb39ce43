//! What SERVER and CLIENT agree on.
//!
//! Both walk the same (payload, formatter) plan and run numbers, so both must be given the same
//! `--payload`, `--formatter`, `--count` and `--runs`. Per run the client sends N messages to
//! QUEUE, each labelled [`message_label`]; the server receives exactly N, checks every label
//! (so a mismatched pair fails with a clear message instead of hanging), decodes and compares
//! every body, then sends one reply to RESPONSE-QUEUE: labelled [`reply_label`], the number of
//! messages it verified in `app_specific`, and its send-to-decode latency histogram
//! (HdrHistogram V2 encoding) as the raw body. The client's run ends when the reply arrives.

use super::Combo;

/// The label of every message of a run.
pub(crate) fn message_label(combo: &Combo, run: u32) -> String {
    format!("mqperf {} run {run}", combo.name())
}

/// The label of the server's reply after a run.
pub(crate) fn reply_label(combo: &Combo, run: u32) -> String {
    format!("mqperf reply {} run {run}", combo.name())
}
