//! The storage the journal runs on: a directory of segment files.
//!
//! [`Io`] is small on purpose so that a fault-injecting implementation
//! ([`FaultyIo`](super::FaultyIo)) can stand in for the real one ([`FileIo`]) in tests.
//! Contracts are written on each method; the journal relies on nothing else.

use std::fs::{self, File, OpenOptions};
use std::io::{self, IoSlice};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Removes a dead segment durably, like [`Io::remove`] then [`Io::sync_dir`], for a
    /// caller that is not in a hurry for the space (the unlink thread, `unlink.rs`). Once it
    /// returns Ok the segment is gone from [`Io::list`] for good; a crash in between leaves
    /// either the segment as it was or nothing. The default is exactly `remove` + `sync_dir`;
    /// [`FileIo`] frees the space a step at a time (see [`RETIRE_STEP`]) until `hurry` is set
    /// (the writer wants the space now), then the rest at once.
    fn retire(&self, dir: &Path, segment: u64, hurry: &AtomicBool) -> io::Result<()> {
        let _ = hurry;
        self.remove(dir, segment)?;
        self.sync_dir(dir)
    }
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
    /// Whether a preallocated segment's space is allocated but not yet written on disk (a real
    /// file after `fallocate`: unwritten extents). The first write into such space makes the
    /// next `fdatasync` also commit the filesystem's metadata (the extents become written), so
    /// the journal then writes zeros ahead of its records while idle
    /// ([`super::JournalOptions::zero_ahead_bytes`]). Default false.
    fn zero_ahead(&self) -> bool {
        false
    }
}

/// Name of the file that holds the disk-full reserve (see the journal module docs).
pub const RESERVE_FILE: &str = "reserve.bin";

/// [`FileIo::retire`] renames a dead segment to its name with this suffix (which
/// [`Io::list`] does not see), then frees its space; [`Io::init`] removes leftovers.
pub const RETIRED_SUFFIX: &str = ".retired";

/// [`FileIo::retire`] shortens a dead segment by this many bytes at a time, pausing
/// [`RETIRE_PAUSE`] after each step, before it unlinks what is left.
///
/// Why: unlinking a preallocated 64 MiB segment frees all its extents in one go, and on ext4
/// the journal writer's next `fdatasync`s (which commit the file system's journal, since
/// writes into preallocated space convert extents) wait behind that. Although the unlink runs
/// on its own thread, it was most of the recoverable e2e p99 at half the maximum rate:
/// 16-23 ms with whole-file unlinks, 3.6-4.8 ms with unlinks made no-ops by an `LD_PRELOAD`
/// shim, 3.9-5.8 ms with 1 MiB steps and 1 ms pauses (docs/benchmarks.md, "What made the
/// recoverable tail").
pub const RETIRE_STEP: u64 = 1 << 20;
/// See [`RETIRE_STEP`].
pub const RETIRE_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

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
    /// `len` bytes from `offset`, in a new buffer: [`SegmentFile::read_at`] into a zeroed
    /// one by default; [`FileIo`]'s files read into fresh memory without zeroing it first (a
    /// `memset` of every body a recoverable receive reads, ~2% of CPU at 1 MB).
    fn read_vec_at(&self, len: usize, offset: u64) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.read_at(&mut buf, offset)?;
        Ok(buf)
    }
    /// Writes all of `buf` at `offset`. NOT durable until [`SegmentFile::sync`] returns Ok;
    /// after a crash any suffix of unsynced writes may be missing or torn.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Writes all of `bufs`, one after another, at `offset`: the same contract as
    /// [`SegmentFile::write_at`] of their concatenation. The default concatenates them and
    /// calls `write_at` (what a fault-injecting file sees); [`FileIo`]'s files use `pwritev`,
    /// so large bodies go to the kernel from where they are, without a copy.
    fn write_vectored_at(&self, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<()> {
        match bufs {
            [one] => self.write_at(one, offset),
            _ => {
                let mut all = Vec::with_capacity(bufs.iter().map(|b| b.len()).sum());
                for b in bufs {
                    all.extend_from_slice(b);
                }
                self.write_at(&all, offset)
            }
        }
    }
    /// `fdatasync`: every write that returned before this call is durable once it returns Ok.
    /// After an Err nothing is known about unsynced data, and a retry proves nothing.
    fn sync(&self) -> io::Result<()>;
    /// A hint, not a durability step: start writing `[offset, offset + len)`, written just
    /// before, to the disk now, without waiting (`sync_file_range(SYNC_FILE_RANGE_WRITE)`), so
    /// that the device works on it while the writer copies the next bytes of the same group
    /// commit. Only [`SegmentFile::sync`] makes anything durable. The default does nothing.
    fn start_writeback(&self, offset: u64, len: u64) {
        let _ = (offset, len);
    }
    /// Grows the file to at least `len` bytes of zeros, reserving the disk space
    /// (ENOSPC here, not later). Never shrinks.
    fn preallocate(&self, len: u64) -> io::Result<()>;
    /// Sets the length to `len` (used only to drop a damaged tail that holds no records).
    fn truncate(&self, len: u64) -> io::Result<()>;
}

/// The real thing: `pread`/`pwrite`, `fallocate`, `fdatasync`, and a directory fsync.
#[derive(Debug, Default, Clone, Copy)]
pub struct FileIo;

/// Shortens `f` by [`RETIRE_STEP`] at a time, pausing `pause` after each step, until at most
/// one step is left or `hurry` is set (the rest then goes with the unlink, at once). Returns
/// the steps taken.
fn shrink_in_steps(f: &File, hurry: &AtomicBool, pause: std::time::Duration) -> io::Result<u64> {
    let mut len = f.metadata()?.len();
    let mut steps = 0;
    while len > RETIRE_STEP && !hurry.load(Ordering::Acquire) {
        len -= RETIRE_STEP;
        f.set_len(len)?;
        steps += 1;
        std::thread::sleep(pause);
    }
    Ok(steps)
}

impl Io for FileIo {
    /// `fallocate` leaves unwritten extents (ext4, XFS): an `fdatasync` after the first write
    /// into them commits the filesystem journal too (measured on ext4: 5.2-6.0k syncs/s of
    /// 1,137 B, p90 ~230 us, against 8.3-8.9k/s, p90 ~130 us, into written blocks).
    fn zero_ahead(&self) -> bool {
        true
    }

    /// Also removes what a crash left of segments being retired ([`RETIRED_SUFFIX`]).
    fn init(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)?;
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.ends_with(RETIRED_SUFFIX))
            {
                fs::remove_file(entry.path())?;
            }
        }
        Ok(())
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

    /// Renames the segment out of the journal's sight and makes that durable (from then on
    /// it is removed as far as recovery is concerned: `init` deletes the leftover), then
    /// shortens it [`RETIRE_STEP`] at a time and unlinks the rest (at once when `hurry` is
    /// set). Truncating the renamed file cannot damage the journal: a crash mid-way leaves a
    /// file no one reads.
    fn retire(&self, dir: &Path, segment: u64, hurry: &AtomicBool) -> io::Result<()> {
        let path = segment_path(dir, segment);
        let mut retired = path.clone().into_os_string();
        retired.push(RETIRED_SUFFIX);
        fs::rename(&path, &retired)?;
        self.sync_dir(dir)?;
        let shrink = || -> io::Result<u64> {
            let f = OpenOptions::new().write(true).open(&retired)?;
            shrink_in_steps(&f, hurry, RETIRE_PAUSE)
        };
        // A failed step only means the rest is freed in one go.
        let _ = shrink();
        fs::remove_file(&retired)
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

/// What a `pread`/`pwritev` return value means: `Ok(Some(n))` bytes moved, `Ok(None)`
/// interrupted (call again), an error, or `zero` when nothing moved (end of file, or a write
/// that made no progress).
fn transferred(r: isize, zero: io::ErrorKind, what: &str) -> io::Result<Option<usize>> {
    match r {
        r if r < 0 => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(None)
            } else {
                Err(e)
            }
        }
        0 => Err(io::Error::new(zero, what.to_string())),
        r => Ok(Some(r as usize)),
    }
}

impl SegmentFile for RealFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }

    fn read_vec_at(&self, len: usize, offset: u64) -> io::Result<Vec<u8>> {
        let mut buf: Vec<u8> = Vec::with_capacity(len);
        let mut done = 0usize;
        while done < len {
            #[allow(unsafe_code)]
            // SAFETY: pread writes at most `len - done` bytes into the spare capacity starting
            // at `done`, which lies inside the allocation of `len` bytes.
            let r = unsafe {
                libc::pread(
                    self.0.as_raw_fd(),
                    buf.as_mut_ptr().add(done) as *mut libc::c_void,
                    len - done,
                    (offset + done as u64) as libc::off_t,
                )
            };
            match transferred(
                r,
                io::ErrorKind::UnexpectedEof,
                "failed to fill whole buffer",
            )? {
                Some(n) => done += n,
                None => continue,
            }
        }
        #[allow(unsafe_code)]
        // SAFETY: the loop above initialised all `len` bytes.
        unsafe {
            buf.set_len(len)
        };
        Ok(buf)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }

    fn write_vectored_at(&self, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<()> {
        // At most IOV_MAX (1024 on Linux) slices per call; a short write resumes where it
        // stopped, like `write_all_at`.
        const MAX_IOV: usize = 1024;
        let mut bufs = bufs;
        let mut skip = 0usize; // bytes of bufs[0] already written
        let mut offset = offset;
        while !bufs.is_empty() {
            if bufs[0].len() == skip {
                bufs = &bufs[1..];
                skip = 0;
                continue;
            }
            let n = bufs.len().min(MAX_IOV);
            let mut iov: Vec<libc::iovec> = Vec::with_capacity(n);
            for (i, b) in bufs[..n].iter().enumerate() {
                let from = if i == 0 { skip } else { 0 };
                iov.push(libc::iovec {
                    iov_base: b[from..].as_ptr() as *mut libc::c_void,
                    iov_len: b.len() - from,
                });
            }
            #[allow(unsafe_code)]
            // SAFETY: every iovec points into a slice borrowed for the duration of the call,
            // with its exact length; pwritev only reads them.
            let r = unsafe {
                libc::pwritev(
                    self.0.as_raw_fd(),
                    iov.as_ptr(),
                    iov.len() as libc::c_int,
                    offset as libc::off_t,
                )
            };
            let Some(mut written) =
                transferred(r, io::ErrorKind::WriteZero, "pwritev wrote nothing")?
            else {
                continue;
            };
            offset += written as u64;
            while written > 0 {
                let left = bufs[0].len() - skip;
                if written < left {
                    skip += written;
                    written = 0;
                } else {
                    written -= left;
                    bufs = &bufs[1..];
                    skip = 0;
                }
            }
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    /// `sync_file_range(SYNC_FILE_RANGE_WRITE)`. Its outcome is ignored: it only starts
    /// writeback early, and a failure to write shows in the `fdatasync` that follows.
    fn start_writeback(&self, offset: u64, len: u64) {
        #[allow(unsafe_code)]
        // SAFETY: plain syscall on a file descriptor we own; no pointers involved.
        let _ = unsafe {
            libc::sync_file_range(
                self.0.as_raw_fd(),
                offset as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// More slices than one pwritev takes (IOV_MAX), of many lengths (empty ones too), at an
    /// offset: the file holds their concatenation.
    #[test]
    fn vectored_write_writes_every_slice_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let f = FileIo.create(dir.path(), 1).unwrap();
        let parts: Vec<Vec<u8>> = (0..2500u32)
            .map(|i| (0..(i * 7) % 300).map(|k| (i + k) as u8).collect())
            .collect();
        let slices: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
        let want: Vec<u8> = parts.concat();
        f.write_vectored_at(&slices, 4096).unwrap();
        let mut got = vec![0u8; want.len()];
        f.read_at(&mut got, 4096).unwrap();
        assert!(got == want, "the file holds the slices in order");
        assert_eq!(f.len().unwrap(), 4096 + want.len() as u64);
        // read_vec_at reads the same bytes, and not past the end.
        assert!(f.read_vec_at(want.len(), 4096).unwrap() == want);
        assert_eq!(f.read_vec_at(0, 4096).unwrap(), Vec::<u8>::new());
        let e = f.read_vec_at(want.len() + 1, 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    /// A hurried retire takes no step: the rest goes with the unlink, at once.
    #[test]
    fn a_hurried_retire_frees_the_rest_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::create(dir.path().join("x")).unwrap();
        f.set_len(3 * RETIRE_STEP + 5).unwrap();
        let pause = std::time::Duration::ZERO;
        assert_eq!(
            shrink_in_steps(&f, &AtomicBool::new(true), pause).unwrap(),
            0
        );
        assert_eq!(f.metadata().unwrap().len(), 3 * RETIRE_STEP + 5);
        assert_eq!(
            shrink_in_steps(&f, &AtomicBool::new(false), pause).unwrap(),
            3
        );
        assert_eq!(f.metadata().unwrap().len(), 5);
    }

    /// Retiring takes a segment out of the listing for good and leaves no file; a retired file
    /// left by a crash (renamed, not yet unlinked) is not listed and goes at the next `init`.
    #[test]
    fn a_retired_segment_is_gone_and_leftovers_go_at_init() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        FileIo.init(d).unwrap();
        for seg in [1, 2, 3] {
            let f = FileIo.create(d, seg).unwrap();
            f.preallocate(3 * RETIRE_STEP + 12345).unwrap();
            f.write_at(b"records", 100).unwrap();
        }
        FileIo.retire(d, 1, &AtomicBool::new(false)).unwrap();
        assert_eq!(FileIo.list(d).unwrap(), vec![2, 3]);
        let names = |d: &Path| -> Vec<String> {
            let mut v: Vec<String> = fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            names(d).len(),
            2,
            "no file of segment 1 is left: {:?}",
            names(d)
        );

        // A crash after the rename: the leftover is not a segment, and init removes it.
        let mut leftover = segment_path(d, 2).into_os_string();
        leftover.push(RETIRED_SUFFIX);
        fs::rename(segment_path(d, 2), &leftover).unwrap();
        assert_eq!(FileIo.list(d).unwrap(), vec![3]);
        FileIo.init(d).unwrap();
        assert_eq!(
            names(d),
            vec![segment_path(d, 3)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()]
        );
    }
}
