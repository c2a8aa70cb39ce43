//! The storage the journal runs on: a directory of segment files.
//!
//! [`Io`] is small on purpose so that a fault-injecting implementation
//! ([`FaultyIo`](super::FaultyIo)) can stand in for the real one ([`FileIo`]) in tests.
//! Contracts are written on each method; the journal relies on nothing else.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use super::segment::{parse_segment_file_name, segment_path};

/// A directory of segment files, identified by segment number.
pub trait Io: Send + Sync + 'static {
    /// Creates `dir` if it is missing.
    fn init(&self, dir: &Path) -> io::Result<()>;
    /// Segment numbers present in `dir`, in ascending order. Other files are ignored.
    fn list(&self, dir: &Path) -> io::Result<Vec<u64>>;
    /// Opens an existing segment for reading and writing.
    fn open(&self, dir: &Path, segment: u64) -> io::Result<Arc<dyn SegmentFile>>;
    /// Creates a new, empty segment; fails if it exists. The file's existence is not durable
    /// until [`Io::sync_dir`] returns.
    fn create(&self, dir: &Path, segment: u64) -> io::Result<Arc<dyn SegmentFile>>;
    /// Makes creations and removals in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Unlinks a segment. Handles already open stay readable. Not durable until `sync_dir`.
    fn remove(&self, dir: &Path, segment: u64) -> io::Result<()>;
    /// Creates (or grows) the reserve file [`RESERVE_FILE`] in `dir` with `len` bytes of
    /// allocated space (ENOSPC here when the disk is full; nothing is left allocated then).
    /// The default keeps no reserve.
    fn create_reserve(&self, dir: &Path, len: u64) -> io::Result<()> {
        let _ = (dir, len);
        Ok(())
    }
    /// Deletes the reserve file, freeing its space for a segment. Not durable until
    /// `sync_dir`.
    fn remove_reserve(&self, dir: &Path) -> io::Result<()> {
        let _ = dir;
        Ok(())
    }
}

/// Name of the file that holds the disk-full reserve (see the journal module docs).
pub const RESERVE_FILE: &str = "reserve.bin";

/// One open segment file. Shared by the writer and readers (`read_body`), hence `&self`.
pub trait SegmentFile: Send + Sync {
    /// Current length in bytes (including preallocated space).
    fn len(&self) -> io::Result<u64>;
    /// True if the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Fills `buf` from `offset`; reading past the end is an error (`UnexpectedEof`).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`. NOT durable until [`SegmentFile::sync`] returns Ok;
    /// after a crash any suffix of unsynced writes may be missing or torn.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// `fdatasync`: every write that returned before this call is durable once it returns Ok.
    /// After an Err nothing is known about unsynced data, and a retry proves nothing.
    fn sync(&self) -> io::Result<()>;
    /// Grows the file to at least `len` bytes of zeros, reserving the disk space
    /// (ENOSPC here, not later). Never shrinks.
    fn preallocate(&self, len: u64) -> io::Result<()>;
    /// Sets the length to `len` (used only to drop a damaged tail that holds no records).
    fn truncate(&self, len: u64) -> io::Result<()>;
}

/// The real thing: `pread`/`pwrite`, `fallocate`, `fdatasync`, and a directory fsync.
#[derive(Debug, Default, Clone, Copy)]
pub struct FileIo;

impl Io for FileIo {
    fn init(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<u64>> {
        let mut v = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if let Some(n) = entry.file_name().to_str().and_then(parse_segment_file_name) {
                v.push(n);
            }
        }
        v.sort_unstable();
        Ok(v)
    }

    fn open(&self, dir: &Path, segment: u64) -> io::Result<Arc<dyn SegmentFile>> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(segment_path(dir, segment))?;
        Ok(Arc::new(RealFile(f)))
    }

    fn create(&self, dir: &Path, segment: u64) -> io::Result<Arc<dyn SegmentFile>> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(segment_path(dir, segment))?;
        Ok(Arc::new(RealFile(f)))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn remove(&self, dir: &Path, segment: u64) -> io::Result<()> {
        fs::remove_file(segment_path(dir, segment))
    }

    fn create_reserve(&self, dir: &Path, len: u64) -> io::Result<()> {
        let path = dir.join(RESERVE_FILE);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let f = RealFile(f);
        let r = f.preallocate(len).and_then(|()| f.sync());
        if r.is_err() {
            // Give back whatever part was allocated.
            drop(f);
            let _ = fs::remove_file(&path);
        }
        r
    }

    fn remove_reserve(&self, dir: &Path) -> io::Result<()> {
        match fs::remove_file(dir.join(RESERVE_FILE)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }
}

struct RealFile(File);

impl SegmentFile for RealFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn preallocate(&self, len: u64) -> io::Result<()> {
        if self.len()? >= len {
            return Ok(());
        }
        #[allow(unsafe_code)]
        // SAFETY: plain syscall on a file descriptor we own; no pointers involved.
        let r = unsafe { libc::fallocate(self.0.as_raw_fd(), 0, 0, len as libc::off_t) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            // Filesystems without fallocate (tmpfs on old kernels, some FUSE): a sparse file
            // still reads as zeros; ENOSPC then shows up at write time instead.
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => self.0.set_len(len),
            _ => Err(e),
        }
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}
