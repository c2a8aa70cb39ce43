//! The integration tests of mq: real brokers (in-process on port 0, or `mqd` processes), real
//! clients, the real `mq` command line. One binary, one module per behaviour (one link instead
//! of nine; see ripgrep's `tests/`).
//!
//! Index:
//! - `acks`: acknowledgements to an admin queue: positive and negative, reach-queue and
//!   receive, a NACK class per reason, across two brokers, after `kill -9`, through `mq`.
//! - `mqd_process`: the daemon's start-up line, SIGTERM with open streams, the data-dir lock.
//! - `queue_admin`: create, delete, list, info, purge; path and format names; name case;
//!   deleting a queue under waiting receivers and under a consumer's unacknowledged messages.
//! - `message_properties`: send, receive, peek, timeouts, priority, label, correlation id,
//!   app-specific, body limits, ids, times.
//! - `competing_receivers`: many receivers, each message once; a dropped consumer gives back.
//! - `batched_acks`: a consumer's held-back acknowledgements remove their messages within the
//!   delay and when `next` times out, a dropped consumer gives everything unacknowledged back;
//!   a big delivery arrives in items of about 64 KiB, in order.
//! - `memory_returns`: after an express burst is drained, mqd's RSS falls (bounded wait).
//! - `express_quota`: the broker-wide express memory quota refuses, then recovers.
//! - `multiple_element_names`: `FORMATNAME:a,b` fans out one message; not receivable.
//! - `send_pipelining`: a pipelined sender, in order; a refusal fails only its message.
//! - `config_file`: `mqd --config`, `MQD_*` variables, `--print-config`: the example covers
//!   every flag and round-trips, precedence, a bad file names the file and the key (exit 2).
//! - `observability`: `/metrics` after a known workload, `/readyz`, gRPC health and reflection
//!   without credentials, `mq info`.
//! - `persistent_counters`: queue, outgoing and broker-wide totals and per-message abort counts
//!   are the same in `mq queue info --json`, `mq outgoing list --json` and `/metrics` after
//!   `kill -9` and a restart.
//! - `http_api`: the HTTP admin API under `/api/v1/`: every endpoint and refusal, rights over
//!   HTTPS with a users file.
//! - `cli`: the `mq` command line against an `mqd` process: commands, JSON, exit codes.
//! - `bad_input`: every kind of bad input (CLI and raw gRPC) is refused clearly and hurts
//!   nothing.
//! - `recoverable`: recoverable messages across `kill -9` and SIGTERM of `mqd`: acknowledged
//!   means kept, in order, no duplicates; express gone, queues kept; removals; priorities;
//!   journal segments stay few.
//! - `recoverable_faults`: the journal's disk fails (in-process brokers on `FaultyIo`): a failed
//!   fdatasync poisons until restart, ENOSPC on a new segment, a crash at the Nth sync; every
//!   acknowledged send survives, in order, once.
//! - `journal_disk`: `mqd` on a damaged journal refuses to start (and
//!   `--truncate-damaged-journal`), and on a full disk (a small tmpfs mounted as root) refuses
//!   sends, keeps receiving, and recovers by itself.
//! - `recoverable_reads`: recoverable bodies delivered soon after their send come from memory
//!   (no journal read, `/metrics`); beyond `--journal-body-cache-bytes` they are read back
//!   intact, adjacent ones with one read; after `kill -9` from the journal.
//! - `recoverable_quota`: the per-queue and broker-wide storage quotas with recoverable
//!   messages: refused, nothing stored touched, free again after receiving, right after a
//!   restart; `mq send --recoverable` over quota.
//! - `transactions`: transactional queues in-process: staged sends invisible until commit,
//!   receives hidden until commit or abort (back at the head, in order, abort count), the
//!   transactional/non-transactional rules (client and CLI), priority ignored, a bad send fails
//!   the commit, the transaction timeout, a vanished client; exactly once under concurrent,
//!   randomly aborting transactions.
//! - `transactions_crash`: transactions against `mqd` processes killed with SIGKILL: a killed
//!   `mq send --tx` or mqd before commit leaves nothing, after commit everything, in order;
//!   receives and sends of one transaction together; exactly once across restarts.
//! - `store_and_forward`: two or three `mqd` processes on loopback: sends to a remote queue wait
//!   in the outgoing queue while it is down; exactly once and in order with concurrent senders
//!   and across `kill -9` of the destination or of the sender; express best effort; remote
//!   transactions (abort, commit); a multiple-element name across three brokers; pause and
//!   resume (API and `mq outgoing`).
//! - `hardening`: bounded strings charged to the quotas (also after recovery), forward streams
//!   bounded per peer and pruned when idle, multiple-element name limits, outgoing queues
//!   created only when used and deleted (`mq outgoing delete`) or expired when empty, refusals
//!   logged rate-limited, client values quoted cut short.
//! - `dead_letter`: `SYSTEM$;DEADLETTER` and `SYSTEM$;DEADXACT`: one test per reason (bad
//!   destination queue, transactional mismatch both ways, quota, time-to-reach-queue and
//!   time-to-be-received in an outgoing queue, time-to-be-received in the destination queue);
//!   read-only; `mq peek` and `mq receive --json` show why.
//! - `flow_limits`: what a client, connection or stream can hold is bounded: connections,
//!   streams per connection, gRPC message size, transactions (bytes, messages, per connection,
//!   the queue quota when staging, the broker's memory), peek pages (`mq peek --count
//!   1000000`), receivers that never read, the ack timeout, an unconfirmed `Consumer::close`.
//! - `service`: `deploy/mqd.service` verifies; READY=1 after recovery and STOPPING=1 on SIGTERM
//!   to `$NOTIFY_SOCKET`; `--log-format json` lines with identity, peer and queue fields.
//! - `stats`: `mq stats` (table, `--watch --json`): per-interval counts add up to what was done.
//! - `subqueues`: subqueues and `mq move` (to a subqueue and back, recoverable, express and
//!   transactional, across kill -9, shared quota), poison messages after `--max-aborts`, and
//!   dead-letter replay (`mq requeue`).
//! - `security`: identities (password, token, certificate, anonymous), every right allowed
//!   and denied (client and `mq`), rights after a restart, protected mode, TLS and mTLS,
//!   authenticated forwarding between two TLS brokers (stream hijack refused, `sender`).
//! - `message_lookup`: receive and peek by id and by correlation id (waiting, not found, in
//!   transactions, after `kill -9`, `mq receive --id / --correlation-id`).
//! - `cursors`: cursors walking a queue while others receive, receive-current, limits, and
//!   `mq browse`.
//! - `queue_properties`: `mq queue set` (label, quota), kept across `kill -9`.
//! - `wire_contract`: every error carries a google.rpc.ErrorInfo reason (calls, streams,
//!   transport-level refusals, per-message send failures); the client maps reasons; the
//!   protocol revision check.
//! - `journals`: queue journals (`Q;JOURNAL`: copies of received messages, express,
//!   recoverable and transactional, across `kill -9`, the journal quota and its counter, sends
//!   refused) and source journaling into `SYSTEM$;JOURNAL` (local, and across two brokers).
//! - `in_doubt_pipelined`: a pipelined transactional sender cut by `kill -9`: in-doubt receipts
//!   carry transaction ids that `TransactionOutcome` resolves truthfully; retries commit once.
//! - `paged_headers`: `mqd --queue-header-window 4`: order, lookups by id and correlation id,
//!   expiry of paged messages, and a paged backlog across `kill -9`.

mod acks;
mod bad_input;
mod batched_acks;
mod cli;
mod competing_receivers;
mod config_file;
mod cursors;
mod dead_letter;
mod durable_admin;
mod express_quota;
mod flow_limits;
mod hardening;
mod http_api;
mod in_doubt;
mod in_doubt_pipelined;
mod journal_disk;
mod journals;
mod kept_senders;
mod large_deliveries;
mod memory_returns;
mod message_lookup;
mod message_properties;
mod mqd_process;
mod multiple_element_names;
mod observability;
mod paged_headers;
mod persistent_counters;
mod poisoned_journal;
mod queue_admin;
mod queue_properties;
mod recoverable;
mod recoverable_faults;
mod recoverable_quota;
mod recoverable_reads;
mod redelivery_window;
mod security;
mod send_pipelining;
mod service;
mod shutdown_acks;
mod silent_broker;
mod stats;
mod store_and_forward;
mod subqueues;
mod transactions;
mod transactions_crash;
mod tx_one_round_trip;
mod tx_stream_reuse;
mod unix_socket;
mod wire_contract;
