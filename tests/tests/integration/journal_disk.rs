//! The journal's disk against real `mqd` processes:
//! - damage in the middle of the journal's last segment, with records written after it: mqd
//!   refuses to start (non-zero exit, one line naming the file and offset); with
//!   `--truncate-damaged-journal` it starts, drops the damaged part and logs what it dropped;
//! - a full disk (a small tmpfs mounted by the test as root; skipped with a printed reason
//!   where mounting is not permitted): sends are refused with RESOURCE_EXHAUSTED, receives keep
//!   working, and sends work again by themselves once receiving has freed space; everything
//!   acknowledged survives `kill -9`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mq_client::{Error, Message};
use mq_tests::{drain_queue, mqd_command, run_with_timeout, MqdProcess};

const Q: &str = r".\private$\disk";
const WAIT: Duration = Duration::from_secs(20);

fn body(n: u64, len: usize) -> Vec<u8> {
    let mut b = format!("msg-{n:04}-").into_bytes();
    b.resize(len.max(b.len()), b'x');
    b
}

fn number(b: &[u8]) -> u64 {
    let s = String::from_utf8_lossy(b);
    s.split('-').nth(1).and_then(|n| n.parse().ok()).unwrap()
}

fn last_segment(data: &Path) -> PathBuf {
    let dir = data.join("journal");
    let mut segs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    segs.pop().expect("a segment")
}

#[test]
fn damaged_journal_refuses_to_start_until_told_to_truncate() {
    let dir = mq_tests::temp_data_dir("mq-damage-");
    let rt = tokio::runtime::Runtime::new().unwrap();
    {
        let (mut mqd, client) = rt.block_on(MqdProcess::launch_with_queue(dir.path(), &[], Q));
        rt.block_on(async {
            let q = client.queue(Q).unwrap();
            for n in 1..=20 {
                q.send(Message::new(body(n, 300)).recoverable(true))
                    .await
                    .unwrap();
            }
        });
        mqd.kill9_checked();
    }
    // Flip a byte in the body of message 5 (acknowledged, with 15 acknowledged after it).
    let seg = last_segment(dir.path());
    let mut bytes = std::fs::read(&seg).unwrap();
    let marker = b"msg-0005-";
    let at = bytes
        .windows(marker.len())
        .position(|w| w == marker)
        .expect("message 5 in the last segment")
        + 50;
    bytes[at] ^= 0x20;
    std::fs::write(&seg, &bytes).unwrap();

    let out = run_with_timeout(mqd_command(dir.path(), &[]), None, WAIT).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mqd started on a damaged journal");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("listening on"),
        "it must not serve"
    );
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("damaged at offset"))
        .collect();
    assert_eq!(lines.len(), 1, "one clear line: {stderr}");
    let seg_name = seg.file_name().unwrap().to_str().unwrap();
    assert!(
        lines[0].contains(seg_name) && lines[0].contains("--truncate-damaged-journal"),
        "names the segment, the offset and the way out: {}",
        lines[0]
    );
    // Nothing was changed by refusing.
    assert_eq!(std::fs::read(&seg).unwrap(), bytes);

    let mut mqd = MqdProcess::launch(dir.path(), &["--truncate-damaged-journal"]);
    rt.block_on(async {
        let client = mqd.connect().await;
        let got: Vec<u64> = drain_queue(&client, Q, WAIT)
            .await
            .iter()
            .map(|b| number(b))
            .collect();
        assert_eq!(
            got,
            vec![1, 2, 3, 4],
            "the damage and everything after it dropped"
        );
    });
    mqd.terminate(WAIT).unwrap();
    let log = mqd.stderr();
    // The 15 sends after the damage, and the snapshots of the counters written between them
    // (every 100 ms while sends are written, every second while idle: more on a slow machine).
    let dropped = log
        .split("records=")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse::<u32>().ok());
    assert!(
        log.contains("--truncate-damaged-journal")
            && dropped.is_some_and(|n| (15..=60).contains(&n))
            && log.contains("put "),
        "logs what it dropped: {log}"
    );
}

/// A size-limited tmpfs mounted for the test; unmounted (lazily, after its users) on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = tempfile::Builder::new()
            .prefix("mq-tmpfs-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn full_disk_refuses_sends_keeps_receives_and_recovers_by_itself() {
    let fs = match Tmpfs::mount("8m") {
        Ok(fs) => fs,
        Err(why) => {
            println!(
                "SKIPPED full_disk_refuses_sends_keeps_receives_and_recovers_by_itself: {why}"
            );
            return;
        }
    };
    let data = fs.path().join("data");
    let args = ["--journal-segment-bytes", "1048576"];
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mut mqd, client) = rt.block_on(MqdProcess::launch_with_queue(&data, &args, Q));
    let (acked, more) = rt.block_on(async {
        let q = client.queue(Q).unwrap();
        // Fill the disk.
        let mut acked = 0u64;
        let err = loop {
            assert!(acked < 10_000, "8 MiB never filled up");
            match q
                .send(Message::new(body(acked + 1, 4000)).recoverable(true))
                .await
            {
                Ok(_) => acked += 1,
                Err(e) => break e,
            }
        };
        let Error::QuotaExceeded(msg) = &err else {
            panic!("expected RESOURCE_EXHAUSTED, got {err:?}");
        };
        assert!(msg.contains("disk is full"), "{msg}");
        assert!(acked > 500, "only {acked} messages of 4 KB fitted in 8 MiB");
        // Refused again, not poisoned; other clients' requests are answered.
        let e = q
            .send(Message::new(body(99_999, 10)).recoverable(true))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::QuotaExceeded(_)), "{e:?}");
        assert_eq!(q.info().await.unwrap().messages, acked);
        // Receives keep working on the full disk: take everything.
        let got: Vec<u64> = drain_queue(&client, Q, WAIT)
            .await
            .iter()
            .map(|b| number(b))
            .collect();
        assert_eq!(got, (1..=acked).collect::<Vec<_>>());
        // Receiving freed the space: sends work again, by themselves.
        let deadline = Instant::now() + WAIT;
        let mut n = acked + 1;
        loop {
            match q.send(Message::new(body(n, 4000)).recoverable(true)).await {
                Ok(_) => break,
                Err(Error::QuotaExceeded(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("sends did not come back after the queue was drained: {e:?}"),
            }
        }
        for _ in 0..99 {
            n += 1;
            q.send(Message::new(body(n, 4000)).recoverable(true))
                .await
                .unwrap();
        }
        (acked, n)
    });
    drop(client);
    mqd.kill9_checked();
    let mut mqd = MqdProcess::launch(&data, &args);
    rt.block_on(async {
        let client = mqd.connect().await;
        let got: Vec<u64> = drain_queue(&client, Q, WAIT)
            .await
            .iter()
            .map(|b| number(b))
            .collect();
        assert_eq!(got, (acked + 1..=more).collect::<Vec<_>>());
    });
    mqd.terminate(WAIT).unwrap();
    drop(mqd);
    drop(fs);
}
