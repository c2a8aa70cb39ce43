//! Behaviour tests of the journal, one module per behaviour.
//!
//! Index:
//! - `reopen`: clean shutdown and reopen recovers defs, messages in order, bodies; removes,
//!   purges, queue deletes and redefinitions are respected; `Commit` works as a future.
//! - `torn_tail`: a cut or garbage tail of the last segment is truncated and zeroed, later
//!   appends survive another reopen; a bad record in an earlier segment refuses to open.
//! - `crash`: crash at the Nth sync for many N and seeds: acknowledged == recovered prefix,
//!   multi-op submits all or nothing, bodies intact, journal writable again.
//! - `poison`: a failed fdatasync fails the batch and poisons the journal.
//! - `disk_full`: ENOSPC refuses data without poisoning, removals use the reserve, space
//!   coming back is noticed by itself.
//! - `damage`: damage in the last segment followed by later writes refuses to open, unless
//!   `truncate_damaged`; a torn group commit is still cut.
//! - `backpressure`: the submission queue is bounded; submitters wait; a removal rides the next
//!   group commit ahead of the queue.
//! - `body_cache`: recently written bodies are read from memory within a byte budget, go with
//!   their message, move with a Rekey; older ones are read back intact, adjacent ones with one
//!   read; a reopened journal keeps none.
//! - `compaction`: disk use stays bounded under put/remove churn, live messages stay
//!   readable while compaction moves them, watermarks survive dropped segments.
//! - `concurrency`: many threads submitting share syncs (group commit).
//! - `format_fixture`: a journal written by format version 1 still reads.
//! - `large_bodies`: bodies written from where they are (vectored writes) read back byte for
//!   byte through group commits, rolls, compaction and a reopen.
//! - `rekey`: a Rekey moves a message without writing it again, through reopen, compaction and
//!   a crash between copy and unlink; an older journal takes Rekeys from its next segment.
//! - `idle_spin`: the writer's spin before it sleeps takes a submission made meanwhile without
//!   sleeping, never loses one made as it gives up, keeps every acknowledged transaction across
//!   crashes; off by default, not after a large record, at most 1 ms.
//! - `zero_ahead`: zeros laid ahead of the records while idle: crashes at any sync (theirs
//!   included) keep every acknowledged transaction; on real files commits over them read back;
//!   none when off or on in-memory storage.

mod common;

mod backpressure;
mod body_cache;
mod compaction;
mod concurrency;
mod crash;
mod damage;
mod disk_full;
mod format_fixture;
mod idle_spin;
mod inline;
mod large_bodies;
mod poison;
mod rekey;
mod reopen;
mod torn_tail;
mod writeback;
mod zero_ahead;
