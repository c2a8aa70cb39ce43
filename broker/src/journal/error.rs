//! The journal's error type.
//!
//! Every variant is `Clone` (I/O errors are behind an `Arc`) so that one failed `fdatasync`
//! can complete every waiter of its batch with the same error.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// What went wrong in the journal, and what to do about it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum JournalError {
    /// An I/O call failed. If it happened while writing or syncing, the journal is now poisoned.
    #[error(
        "journal I/O failed while {action} {path}: {source}; check the disk (dmesg, free space, \
         permissions) and restart the broker, which recovers everything that was acknowledged"
    )]
    Io {
        /// What the journal was doing ("fdatasync", "write", "open", ...).
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: Arc<io::Error>,
    },

    /// The disk is full: a new segment could not be preallocated, a write hit ENOSPC, or
    /// the journal is in disk-full mode and refuses records that store data. Not poison: the
    /// journal keeps writing removals and stores data again once space is back.
    #[error(
        "journal disk is full: could not {action} {path} ({bytes} bytes): {source}; records \
         that store data are refused until disk space is freed (receiving messages frees it; \
         no restart needed); everything acknowledged is kept"
    )]
    NoSpace {
        /// "preallocate", "write", "store a record in" (refused in disk-full mode), ...
        action: &'static str,
        /// The segment file.
        path: PathBuf,
        /// How many bytes were asked for.
        bytes: u64,
        /// The operating system's error.
        #[source]
        source: Arc<io::Error>,
    },

    /// An earlier write or `fdatasync` failed, so the journal refuses all further writes.
    /// Retrying a failed fsync can report success for data the kernel already dropped
    /// ("Can applications survive fsync failures?", USENIX ATC '20), so we never do.
    #[error(
        "journal is poisoned by an earlier failure ({cause}) and accepts no more writes; \
         restart the broker: reopening the journal recovers every acknowledged record"
    )]
    Poisoned {
        /// The failure that poisoned the journal.
        cause: Arc<str>,
    },

    /// A record or segment header that should be intact is not (it is not in the last
    /// segment, so it cannot be a torn write from a crash).
    #[error(
        "journal file {path} is corrupt at offset {offset}: {reason}; this is not a torn tail \
         from a crash (the file is not the last segment), so the journal refuses to open: \
         restore the data directory from a backup, or move this file aside to accept the loss"
    )]
    Corrupt {
        /// The segment file.
        path: PathBuf,
        /// Byte offset of the bad header or record.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },

    /// The last segment is damaged and a record written later follows the damage, so the
    /// damage is not a torn write from a crash: the damaged bytes were synced (acknowledged).
    /// Opening with `truncate_damaged` (`mqd --truncate-damaged-journal`) drops them.
    #[error(
        "journal file {path} is damaged at offset {offset} ({reason}) and a valid record written \
         later follows at offset {next_record}, so this is not a torn write from a crash and \
         cutting here would drop acknowledged records; restore the data directory from a \
         backup, or start mqd with --truncate-damaged-journal to drop everything from offset \
         {offset} of this file to its end (what is dropped is logged)"
    )]
    Damaged {
        /// The segment file (the last one).
        path: PathBuf,
        /// Byte offset of the first bad record (0: the segment header).
        offset: u64,
        /// What is wrong with it.
        reason: String,
        /// Offset of the first valid record found after the damage.
        next_record: u64,
    },

    /// One submission encodes to a record larger than the journal accepts.
    #[error(
        "journal record of {size} bytes exceeds the limit of {max} bytes; send smaller \
         messages or split the transaction"
    )]
    TooLarge {
        /// Encoded size of the record.
        size: u64,
        /// The limit.
        max: u64,
    },

    /// The message is not live in the journal (never put, removed, purged, or its queue deleted).
    #[error("queue {queue_id} has no live message with seq {seq} in the journal")]
    NotFound {
        /// Queue id asked for.
        queue_id: u64,
        /// Sequence number asked for.
        seq: u64,
    },

    /// The options given to `open` cannot work.
    #[error("invalid journal options: {0}")]
    InvalidOptions(String),

    /// The journal was shut down; reopen it to write again.
    #[error("journal is shut down; reopen it to write again")]
    Closed,

    /// A record of a [`super::Chain`] was not written because an earlier record of the same
    /// chain failed: nothing of it is on disk.
    #[error(
        "journal record not written: an earlier record it depends on was not stored ({cause}); \
         nothing of this one was stored either"
    )]
    EarlierFailed {
        /// Why the earlier record failed.
        cause: Arc<str>,
    },
}

impl JournalError {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        JournalError::Io {
            action,
            path: path.into(),
            source: Arc::new(source),
        }
    }

    /// An I/O error from a write path: ENOSPC becomes [`JournalError::NoSpace`].
    pub(crate) fn write(
        action: &'static str,
        path: impl Into<PathBuf>,
        bytes: u64,
        source: io::Error,
    ) -> Self {
        if source.raw_os_error() == Some(libc::ENOSPC)
            || source.kind() == io::ErrorKind::StorageFull
        {
            JournalError::NoSpace {
                action,
                path: path.into(),
                bytes,
                source: Arc::new(source),
            }
        } else {
            JournalError::io(action, path, source)
        }
    }

    /// Whether the record of a submission that failed with this error may still be on disk
    /// (and found by recovery after a restart): true when its write or `fdatasync` was issued
    /// and failed (an I/O error; the journal is then poisoned). False for refusals before
    /// anything was written (poisoned, closed, too large, disk full, an earlier record of its
    /// chain failed) and for a write that hit ENOSPC, whose bytes the writer zeroed and synced
    /// before answering.
    pub fn may_be_stored(&self) -> bool {
        matches!(self, JournalError::Io { .. })
    }

    /// True for [`JournalError::Poisoned`].
    pub fn is_poisoned(&self) -> bool {
        matches!(self, JournalError::Poisoned { .. })
    }
}
