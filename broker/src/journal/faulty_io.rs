//! [`FaultyIo`]: an in-memory [`Io`] that fails on request and simulates crashes.
//!
//! Each file keeps two images: what a reader sees now, and what is durable. A write lands in
//! the first and is queued as pending; a successful `sync` of that file applies its pending
//! writes to the durable image. A *crash* (at the Nth sync, or [`FaultyIo::restart`] at any
//! moment) keeps, per file, the durable image plus a random prefix of the pending writes,
//! the last one possibly cut mid-way: a torn write.
//!
//! A disk capacity can be set ([`FaultyIo::set_capacity`]): growing a file (preallocating or
//! writing past its end) or the reserve file beyond it fails with ENOSPC, like a small
//! filesystem.
//!
//! Simplifications, on purpose: directory operations (create, remove) and length changes
//! (preallocate, truncate) are durable at once; the directory path is ignored (one directory).

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::io::{Io, SegmentFile};

/// Fault-injecting, crash-simulating in-memory storage for tests. Clones share the same disk.
#[derive(Clone)]
pub struct FaultyIo {
    fs: Arc<Fs>,
}

impl std::fmt::Debug for FaultyIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FaultyIo")
    }
}

struct Fs {
    ctl: Mutex<Ctl>,
    resumed: std::sync::Condvar,
}

#[derive(Default)]
struct Ctl {
    files: BTreeMap<u64, Arc<MemFile>>,
    syncs: u64,
    fail_sync_at: Option<u64>,
    crash_at_sync: Option<u64>,
    panic_at_sync: Option<u64>,
    enospc_writes: bool,
    /// The next write stores only this many of its bytes, then fails with ENOSPC (once).
    enospc_write_after: Option<usize>,
    enospc_preallocate: bool,
    /// Total bytes the files (and the reserve) may take; `None`: unlimited.
    capacity: Option<u64>,
    /// Size of the reserve file, if it exists.
    reserve: Option<u64>,
    /// Syncs block while set (to hold the writer inside a group commit).
    syncs_paused: bool,
    /// Syncs blocked by `syncs_paused` right now.
    syncs_waiting: u64,
    /// [`Io::retire`] waits while set, unless hurried (a slow unlink thread).
    retires_held: bool,
    /// Retires that were held and then hurried by the journal.
    retires_hurried: u64,
    /// Set once crashed: the disk as it will be found after the reboot.
    crashed: Option<BTreeMap<u64, Vec<u8>>>,
    /// What [`Io::zero_ahead`] answers (off unless a test asks: it adds syncs).
    zero_ahead: bool,
    /// Every [`SegmentFile::start_writeback`] call: offset, length, and whether those bytes
    /// had all been written (and not yet synced) when it was made.
    writebacks: Vec<(u64, u64, bool)>,
    rng: u64,
}

impl Ctl {
    /// Bytes in use: every file's length plus the reserve.
    fn used(&self) -> u64 {
        let files: u64 = self
            .files
            .values()
            .map(|f| f.data.lock().unwrap().current.len() as u64)
            .sum();
        files + self.reserve.unwrap_or(0)
    }

    /// ENOSPC if growing something from `old` to `new` bytes does not fit the capacity.
    fn check_growth(&self, old: u64, new: u64) -> io::Result<()> {
        match self.capacity {
            Some(cap) if new > old && self.used() + (new - old) > cap => {
                Err(io::Error::from_raw_os_error(libc::ENOSPC))
            }
            _ => Ok(()),
        }
    }
}

struct MemFile {
    fs: Weak<Fs>,
    data: Mutex<FileData>,
}

#[derive(Default, Clone)]
struct FileData {
    current: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<(u64, Vec<u8>)>,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn crashed_err() -> io::Error {
    io::Error::other("simulated crash: this process is dead")
}

fn write_into(buf: &mut Vec<u8>, off: u64, data: &[u8]) {
    let end = off as usize + data.len();
    if buf.len() < end {
        buf.resize(end, 0);
    }
    buf[off as usize..end].copy_from_slice(data);
}

impl Ctl {
    /// The disk after a power loss now: durable images plus a random prefix of pending writes.
    fn surviving_state(&mut self) -> BTreeMap<u64, Vec<u8>> {
        let mut out = BTreeMap::new();
        let files: Vec<(u64, Arc<MemFile>)> =
            self.files.iter().map(|(k, v)| (*k, v.clone())).collect();
        for (n, f) in files {
            let d = f.data.lock().unwrap();
            let mut img = d.durable.clone();
            let keep = (splitmix(&mut self.rng) % (d.pending.len() as u64 + 1)) as usize;
            for (i, (off, bytes)) in d.pending.iter().enumerate().take(keep) {
                if i + 1 == keep && splitmix(&mut self.rng).is_multiple_of(2) {
                    // Torn: only a prefix of the last surviving write reached the disk.
                    let cut = (splitmix(&mut self.rng) % (bytes.len() as u64 + 1)) as usize;
                    write_into(&mut img, *off, &bytes[..cut]);
                } else {
                    write_into(&mut img, *off, bytes);
                }
            }
            out.insert(n, img);
        }
        out
    }
}

impl FaultyIo {
    /// An empty disk; `seed` drives every random choice (which writes survive a crash).
    pub fn new(seed: u64) -> Self {
        FaultyIo {
            fs: Arc::new(Fs {
                ctl: Mutex::new(Ctl {
                    rng: seed,
                    ..Ctl::default()
                }),
                resumed: std::sync::Condvar::new(),
            }),
        }
    }

    fn from_image(image: BTreeMap<u64, Vec<u8>>, seed: u64) -> Self {
        let io = FaultyIo::new(seed);
        {
            let mut ctl = io.fs.ctl.lock().unwrap();
            for (n, bytes) in image {
                let f = Arc::new(MemFile {
                    fs: Arc::downgrade(&io.fs),
                    data: Mutex::new(FileData {
                        current: bytes.clone(),
                        durable: bytes,
                        pending: Vec::new(),
                    }),
                });
                ctl.files.insert(n, f);
            }
        }
        io
    }

    /// Makes the journal write zeros ahead of its records while idle, as on real files
    /// ([`Io::zero_ahead`]); off by default, as it adds syncs. Kept by restarts.
    pub fn set_zero_ahead(&self, on: bool) {
        self.fs.ctl.lock().unwrap().zero_ahead = on;
    }

    /// The `n`th file sync from now (1 = the next one) fails with EIO; data stays pending.
    pub fn fail_sync_at(&self, n: u64) {
        let mut c = self.fs.ctl.lock().unwrap();
        c.fail_sync_at = Some(c.syncs + n);
    }

    /// The `n`th file sync from now (1 = the next one) panics, in whichever thread syncs: a bug
    /// in the journal's own code, for tests of what a panicking writer leaves behind.
    pub fn panic_at_sync(&self, n: u64) {
        let mut c = self.fs.ctl.lock().unwrap();
        c.panic_at_sync = Some(c.syncs + n);
    }

    /// The `n`th file sync from now (1 = the next one) crashes the machine: it fails, every
    /// later call fails, and [`FaultyIo::restart`] returns the disk as found after reboot.
    pub fn crash_at_sync(&self, n: u64) {
        let mut c = self.fs.ctl.lock().unwrap();
        c.crash_at_sync = Some(c.syncs + n);
    }

    /// While on, every write fails with ENOSPC.
    pub fn fail_writes_with_enospc(&self, on: bool) {
        self.fs.ctl.lock().unwrap().enospc_writes = on;
    }

    /// The next write stores only its first `n` bytes (in the page cache, not synced) and then
    /// fails with ENOSPC, as a write that ran out of space part way does.
    pub fn fail_next_write_with_enospc_after(&self, n: usize) {
        self.fs.ctl.lock().unwrap().enospc_write_after = Some(n);
    }

    /// A new disk holding what a killed process leaves: every write made so far, synced or
    /// not (the page cache survives a `kill -9`; only a power loss drops unsynced writes).
    pub fn restart_after_kill(&self) -> FaultyIo {
        let mut c = self.fs.ctl.lock().unwrap();
        let image = c
            .files
            .iter()
            .map(|(n, f)| (*n, f.data.lock().unwrap().current.clone()))
            .collect();
        let seed = splitmix(&mut c.rng);
        let zero_ahead = c.zero_ahead;
        drop(c);
        let io = FaultyIo::from_image(image, seed);
        io.set_zero_ahead(zero_ahead);
        io
    }

    /// While on, every preallocation fails with ENOSPC.
    pub fn fail_preallocate_with_enospc(&self, on: bool) {
        self.fs.ctl.lock().unwrap().enospc_preallocate = on;
    }

    /// Limits the disk to `bytes` in total (`None`: unlimited). Lowering it below what is in
    /// use frees nothing; it makes every growth fail until enough is deleted.
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.fs.ctl.lock().unwrap().capacity = bytes;
    }

    /// Bytes in use by the files and the reserve.
    pub fn used(&self) -> u64 {
        self.fs.ctl.lock().unwrap().used()
    }

    /// Size of the reserve file, if there is one.
    pub fn reserve(&self) -> Option<u64> {
        self.fs.ctl.lock().unwrap().reserve
    }

    /// While on, every file sync waits (holding the journal's writer in its group commit).
    pub fn pause_syncs(&self, on: bool) {
        self.fs.ctl.lock().unwrap().syncs_paused = on;
        self.fs.resumed.notify_all();
    }

    /// While on, segments handed to the journal's unlink thread stay on the disk (their space
    /// taken) until the journal hurries it ([`Io::retire`]'s `hurry`) or this is turned off.
    pub fn hold_retires(&self, on: bool) {
        self.fs.ctl.lock().unwrap().retires_held = on;
        self.fs.resumed.notify_all();
    }

    /// Retires held by [`FaultyIo::hold_retires`] that the journal hurried.
    pub fn retires_hurried(&self) -> u64 {
        self.fs.ctl.lock().unwrap().retires_hurried
    }

    /// Whether a sync is held by [`FaultyIo::pause_syncs`] right now (its write was made).
    pub fn sync_held(&self) -> bool {
        self.fs.ctl.lock().unwrap().syncs_waiting > 0
    }

    /// Every `start_writeback` hint so far: offset, length, and whether the range was
    /// written and pending (not yet synced) at the time.
    pub fn writebacks(&self) -> Vec<(u64, u64, bool)> {
        self.fs.ctl.lock().unwrap().writebacks.clone()
    }

    /// File syncs attempted so far.
    pub fn syncs(&self) -> u64 {
        self.fs.ctl.lock().unwrap().syncs
    }

    /// True once a simulated crash happened.
    pub fn crashed(&self) -> bool {
        self.fs.ctl.lock().unwrap().crashed.is_some()
    }

    /// A new disk holding what survives a power loss: the state at the crash if one happened,
    /// otherwise a power loss right now. Faults are not carried over.
    pub fn restart(&self) -> FaultyIo {
        let mut c = self.fs.ctl.lock().unwrap();
        let image = match &c.crashed {
            Some(img) => img.clone(),
            None => c.surviving_state(),
        };
        let seed = splitmix(&mut c.rng);
        let zero_ahead = c.zero_ahead;
        drop(c);
        let io = FaultyIo::from_image(image, seed);
        io.set_zero_ahead(zero_ahead);
        io
    }

    /// Segment numbers and their current lengths.
    pub fn segments(&self) -> Vec<(u64, u64)> {
        let c = self.fs.ctl.lock().unwrap();
        c.files
            .iter()
            .map(|(n, f)| (*n, f.data.lock().unwrap().current.len() as u64))
            .collect()
    }

    /// Overwrites bytes of a segment, durably (for corruption tests).
    pub fn corrupt(&self, segment: u64, offset: u64, bytes: &[u8]) {
        let c = self.fs.ctl.lock().unwrap();
        let f = c.files.get(&segment).expect("no such segment");
        let mut d = f.data.lock().unwrap();
        write_into(&mut d.current, offset, bytes);
        write_into(&mut d.durable, offset, bytes);
    }

    fn check_alive(&self) -> io::Result<()> {
        if self.fs.ctl.lock().unwrap().crashed.is_some() {
            return Err(crashed_err());
        }
        Ok(())
    }
}

impl Io for FaultyIo {
    fn init(&self, _dir: &Path) -> io::Result<()> {
        self.check_alive()
    }

    fn zero_ahead(&self) -> bool {
        self.fs.ctl.lock().unwrap().zero_ahead
    }

    fn list(&self, _dir: &Path) -> io::Result<Vec<u64>> {
        self.check_alive()?;
        Ok(self.fs.ctl.lock().unwrap().files.keys().copied().collect())
    }

    fn open(&self, _dir: &Path, segment: u64) -> io::Result<Arc<dyn SegmentFile>> {
        self.check_alive()?;
        let c = self.fs.ctl.lock().unwrap();
        match c.files.get(&segment) {
            Some(f) => Ok(f.clone()),
            None => Err(io::Error::from(io::ErrorKind::NotFound)),
        }
    }

    fn create(&self, _dir: &Path, segment: u64) -> io::Result<Arc<dyn SegmentFile>> {
        self.check_alive()?;
        let mut c = self.fs.ctl.lock().unwrap();
        if c.files.contains_key(&segment) {
            return Err(io::Error::from(io::ErrorKind::AlreadyExists));
        }
        let f = Arc::new(MemFile {
            fs: Arc::downgrade(&self.fs),
            data: Mutex::new(FileData::default()),
        });
        c.files.insert(segment, f.clone());
        Ok(f)
    }

    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        self.check_alive()
    }

    fn remove(&self, _dir: &Path, segment: u64) -> io::Result<()> {
        self.check_alive()?;
        let mut c = self.fs.ctl.lock().unwrap();
        c.files
            .remove(&segment)
            .map(|_| ())
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn retire(&self, dir: &Path, segment: u64, hurry: &AtomicBool) -> io::Result<()> {
        {
            let mut c = self.fs.ctl.lock().unwrap();
            let mut held = false;
            while c.retires_held && c.crashed.is_none() && !hurry.load(Ordering::Acquire) {
                held = true;
                c = self
                    .fs
                    .resumed
                    .wait_timeout(c, std::time::Duration::from_millis(1))
                    .unwrap()
                    .0;
            }
            if held && hurry.load(Ordering::Acquire) {
                c.retires_hurried += 1;
            }
        }
        self.remove(dir, segment)?;
        self.sync_dir(dir)
    }

    fn create_reserve(&self, _dir: &Path, len: u64) -> io::Result<()> {
        self.check_alive()?;
        let mut c = self.fs.ctl.lock().unwrap();
        let old = c.reserve.unwrap_or(0);
        if c.enospc_preallocate && len > old {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        c.check_growth(old, len)?;
        c.reserve = Some(old.max(len));
        Ok(())
    }

    fn remove_reserve(&self, _dir: &Path) -> io::Result<()> {
        self.check_alive()?;
        self.fs.ctl.lock().unwrap().reserve = None;
        Ok(())
    }
}

impl MemFile {
    fn fs(&self) -> io::Result<Arc<Fs>> {
        self.fs.upgrade().ok_or_else(crashed_err)
    }
}

impl SegmentFile for MemFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.data.lock().unwrap().current.len() as u64)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let d = self.data.lock().unwrap();
        let end = offset as usize + buf.len();
        if end > d.current.len() {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        buf.copy_from_slice(&d.current[offset as usize..end]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        {
            let fs = self.fs()?;
            let c = fs.ctl.lock().unwrap();
            if c.crashed.is_some() {
                return Err(crashed_err());
            }
            if c.enospc_writes {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            let old = self.data.lock().unwrap().current.len() as u64;
            c.check_growth(old, offset + buf.len() as u64)?;
        }
        let partial = self
            .fs()?
            .ctl
            .lock()
            .unwrap()
            .enospc_write_after
            .take()
            .map(|n| n.min(buf.len()));
        if let Some(n) = partial {
            let mut d = self.data.lock().unwrap();
            write_into(&mut d.current, offset, &buf[..n]);
            d.pending.push((offset, buf[..n].to_vec()));
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let mut d = self.data.lock().unwrap();
        write_into(&mut d.current, offset, buf);
        d.pending.push((offset, buf.to_vec()));
        Ok(())
    }

    fn start_writeback(&self, offset: u64, len: u64) {
        let Ok(fs) = self.fs() else { return };
        let pending = {
            let d = self.data.lock().unwrap();
            let end = offset + len;
            // Every byte of the range is covered by a pending write.
            let mut at = offset;
            let mut ws: Vec<(u64, u64)> = d
                .pending
                .iter()
                .map(|(o, b)| (*o, *o + b.len() as u64))
                .collect();
            ws.sort_unstable();
            for (s, e) in ws {
                if s <= at && e > at {
                    at = e;
                }
            }
            at >= end
        };
        fs.ctl
            .lock()
            .unwrap()
            .writebacks
            .push((offset, len, pending));
    }

    fn sync(&self) -> io::Result<()> {
        let fs = self.fs()?;
        let mut c = fs.ctl.lock().unwrap();
        while c.syncs_paused {
            c.syncs_waiting += 1;
            c = fs.resumed.wait(c).unwrap();
            c.syncs_waiting -= 1;
        }
        if c.crashed.is_some() {
            return Err(crashed_err());
        }
        c.syncs += 1;
        if c.crash_at_sync == Some(c.syncs) {
            let img = c.surviving_state();
            c.crashed = Some(img);
            return Err(io::Error::other("simulated crash during fdatasync"));
        }
        if c.fail_sync_at == Some(c.syncs) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        if c.panic_at_sync == Some(c.syncs) {
            drop(c);
            panic!("FaultyIo::panic_at_sync: a simulated bug during fdatasync");
        }
        let mut d = self.data.lock().unwrap();
        let pending = std::mem::take(&mut d.pending);
        for (off, bytes) in pending {
            write_into(&mut d.durable, off, &bytes);
        }
        Ok(())
    }

    fn preallocate(&self, len: u64) -> io::Result<()> {
        {
            let fs = self.fs()?;
            let c = fs.ctl.lock().unwrap();
            if c.crashed.is_some() {
                return Err(crashed_err());
            }
            if c.enospc_preallocate {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            let old = self.data.lock().unwrap().current.len() as u64;
            c.check_growth(old, len)?;
        }
        let mut d = self.data.lock().unwrap();
        if (d.current.len() as u64) < len {
            d.current.resize(len as usize, 0);
        }
        if (d.durable.len() as u64) < len {
            d.durable.resize(len as usize, 0);
        }
        Ok(())
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        self.fs()?;
        let mut d = self.data.lock().unwrap();
        d.current.resize(len as usize, 0);
        d.durable.resize(len as usize, 0);
        Ok(())
    }
}
