//! The integration tests of mq: real brokers (in-process on port 0, or `mqd` processes), real
//! clients, the real `mq` command line. One binary, one module per behaviour (one link instead
//! of nine; see ripgrep's `tests/`).
//!
//! Index:
//! - `mqd_process`: the daemon's start-up line, SIGTERM with open streams, the data-dir lock.
//! - `queue_admin`: create, delete, list, info, purge; path and format names; name case;
//!   deleting a queue under waiting receivers and under a consumer's unacknowledged messages.
//! - `message_properties`: send, receive, peek, timeouts, priority, label, correlation id,
//!   app-specific, body limits, ids, times.
//! - `competing_receivers`: many receivers, each message once; a dropped consumer gives back.
//! - `express_quota`: the broker-wide express memory quota refuses, then recovers.
//! - `multiple_element_names`: `FORMATNAME:a,b` fans out one message; not receivable.
//! - `send_pipelining`: a pipelined sender, in order; a refusal fails only its message.
//! - `cli`: the `mq` command line against an `mqd` process: commands, JSON, exit codes.
//! - `bad_input`: every kind of bad input (CLI and raw gRPC) is refused clearly and hurts
//!   nothing.
//! - `recoverable`: recoverable messages across `kill -9` and SIGTERM of `mqd`: acknowledged
//!   means kept, in order, no duplicates; express gone, queues kept; removals; priorities;
//!   journal segments stay few.

mod bad_input;
mod cli;
mod competing_receivers;
mod express_quota;
mod message_properties;
mod mqd_process;
mod multiple_element_names;
mod queue_admin;
mod recoverable;
mod send_pipelining;
