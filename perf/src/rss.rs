//! [`rss_bytes`]: a process's resident memory, for the report's `rss` line: the embedded
//! broker's (this process) or `--broker-pid`'s. The broker's memory trim reads it the same way.

/// VmRSS of `pid` (`None`: this process) in bytes; `None` where `/proc` cannot tell (not
/// Linux, no such process).
pub use mq_broker::rss_bytes_of as rss_bytes;
