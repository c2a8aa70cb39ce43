//! Limits on client-supplied strings, shared by broker, client and CLI, and [`quote`]: the one
//! way an error message or a log line shows a client-supplied value (truncated, escaped).

use std::fmt::Write;

/// The longest single path or format name (one element), in bytes: a 253-character host, a
/// port, `DIRECT=TCP:`, `private$` and a 124-character queue name fit.
pub const MAX_FORMAT_NAME_ELEMENT_BYTES: usize = 1024;
/// Default most elements in a multiple-element format name (`mqd --max-format-name-elements`).
pub const DEFAULT_MAX_FORMAT_NAME_ELEMENTS: usize = 100;
/// The longest response queue of a message, in bytes (it is a format name).
pub const MAX_RESPONSE_QUEUE_BYTES: usize = MAX_FORMAT_NAME_ELEMENT_BYTES;
/// The longest `source` (sending broker name) of a forwarding stream, in bytes.
pub const MAX_SOURCE_BYTES: usize = 255;
/// The longest `sender` of a forwarded message, in bytes: an identity name (a user of at most
/// 128 characters is at most 512 bytes).
pub const MAX_SENDER_BYTES: usize = 512;
/// The longest reason kept with a refusal or a dead letter, in bytes (longer ones are cut).
pub const MAX_REASON_BYTES: usize = 512;
/// The longest outgoing-queue destination (`host:port` or a format name), in bytes.
pub const MAX_DESTINATION_BYTES: usize = MAX_FORMAT_NAME_ELEMENT_BYTES;
/// How much of a client-supplied value [`quote`] shows, in characters: enough for any valid
/// single queue name (`DIRECT=TCP:` + 253-character host + port + `\private$\` + 124).
pub const QUOTE_CHARS: usize = 420;

/// `s` as error messages and log lines show it: control characters escaped, and cut after
/// [`QUOTE_CHARS`] characters with a note of how long it really is. Never longer than about
/// `QUOTE_CHARS * 10 + 40` bytes (every character escaped), whatever `s` is.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(QUOTE_CHARS * 2));
    for (n, c) in s.chars().enumerate() {
        if n == QUOTE_CHARS {
            let _ = write!(out, "…[{} bytes in all]", s.len());
            return out;
        }
        if c.is_control() {
            let _ = write!(out, "{}", c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// `s` cut to at most `max` bytes on a character boundary, with `…` marking a cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_cuts_long_values_and_escapes_controls() {
        assert_eq!(quote("a\nb"), "a\\nb");
        let long = "x".repeat(1 << 20);
        let q = quote(&long);
        assert!(q.len() < QUOTE_CHARS + 40, "{}", q.len());
        assert!(q.ends_with(&format!("[{} bytes in all]", 1 << 20)));
        let wide = "é".repeat(QUOTE_CHARS + 10);
        assert!(quote(&wide).starts_with(&"é".repeat(QUOTE_CHARS)));
    }

    #[test]
    fn truncate_keeps_char_boundaries_and_the_limit() {
        assert_eq!(truncate("short", 10), "short");
        let t = truncate(&"é".repeat(100), 11);
        assert!(t.len() <= 11, "{t}");
        assert!(t.ends_with('…'));
    }
}
