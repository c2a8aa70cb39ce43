//! The `mq` command line against an `mqd` process, as a script author uses it: queue commands
//! (human and `--json`), send (argument, `--file`, stdin, properties, `--count` with `{n}`),
//! receive and peek (`--json` fields, base64 for binary bodies), and the documented exit codes:
//! 0 success, 1 error (one line on stderr), 2 usage, 3 timeout before `--count` arrived.

use std::process::Output;

use mq_tests::{mq, MqdProcess};
use serde_json::Value;

fn mqd() -> (tempfile::TempDir, MqdProcess) {
    let dir = tempfile::tempdir().unwrap();
    let mqd = MqdProcess::start(dir.path()).unwrap();
    (dir, mqd)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts success and returns stdout.
#[track_caller]
fn ok(o: Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(0),
        "expected success; stdout: {}; stderr: {}",
        stdout(&o),
        stderr(&o)
    );
    stdout(&o)
}

/// Asserts exit code `code` with exactly one line on stderr, and returns that line.
#[track_caller]
pub(crate) fn fails(o: Output, code: i32) -> String {
    let err = stderr(&o);
    assert_eq!(
        o.status.code(),
        Some(code),
        "expected exit code {code}; stdout: {}; stderr: {err}",
        stdout(&o)
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got: {err:?}");
    lines[0].to_string()
}

fn json_lines(s: &str) -> Vec<Value> {
    s.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn queue_commands_human_and_json() {
    let (_dir, mqd) = mqd();
    let url = mqd.url();
    assert_eq!(ok(mq(url, &["queue", "list"], None)).trim(), "no queues");
    assert_eq!(
        ok(mq(url, &["queue", "create", r".\private$\orders"], None)).trim(),
        r"created .\private$\orders"
    );
    ok(mq(
        url,
        &[
            "queue",
            "create",
            "./private$/audit",
            "--label",
            "audit trail",
            "--quota-bytes",
            "100000",
        ],
        None,
    ));
    ok(mq(url, &["send", r".\private$\orders", "hello"], None));
    ok(mq(url, &["send", r".\private$\orders", "world!"], None));

    let list = ok(mq(url, &["queue", "list"], None));
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 3, "{list}");
    assert!(
        lines[0].contains("NAME") && lines[0].contains("MESSAGES"),
        "{list}"
    );
    assert!(lines[1].starts_with(r".\private$\audit"), "{list}");
    let orders: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(orders, [r".\private$\orders", "2", "11", "no"], "{list}");

    let list: Value =
        serde_json::from_str(&ok(mq(url, &["queue", "list", "--json"], None))).unwrap();
    let arr = list.as_array().expect("an array of queues");
    assert_eq!(arr.len(), 2);
    for q in arr {
        for field in ["name", "messages", "bytes", "transactional"] {
            assert!(q.get(field).is_some(), "missing {field} in {q}");
        }
    }
    assert_eq!(arr[1]["name"], r".\private$\orders");
    assert_eq!(arr[1]["messages"], 2);
    assert_eq!(arr[1]["bytes"], 11);
    assert_eq!(arr[1]["transactional"], false);
    assert_eq!(arr[0]["label"], "audit trail");
    assert_eq!(arr[0]["quota_bytes"], 100000);

    let info = ok(mq(
        url,
        &["queue", "info", r"DIRECT=OS:.\private$\ORDERS"],
        None,
    ));
    assert!(info.contains(r".\private$\orders"), "{info}");
    assert!(
        info.lines()
            .any(|l| l.starts_with("messages:") && l.ends_with(" 2")),
        "{info}"
    );
    let info: Value = serde_json::from_str(&ok(mq(
        url,
        &["queue", "info", r".\private$\orders", "--json"],
        None,
    )))
    .unwrap();
    assert_eq!(info["name"], r".\private$\orders");
    assert_eq!(info["messages"], 2);
    assert_eq!(info["bytes"], 11);
    assert_eq!(info["transactional"], false);
    assert_eq!(info["format_name"], r"DIRECT=OS:.\private$\orders");

    let purged = ok(mq(url, &["queue", "purge", r".\private$\orders"], None));
    assert!(purged.contains("purged 2"), "{purged}");
    let info: Value = serde_json::from_str(&ok(mq(
        url,
        &["queue", "info", r".\private$\orders", "--json"],
        None,
    )))
    .unwrap();
    assert_eq!(
        (info["messages"].as_u64(), info["bytes"].as_u64()),
        (Some(0), Some(0))
    );

    assert!(ok(mq(url, &["queue", "delete", r".\private$\orders"], None)).contains("deleted"));
    let line = fails(mq(url, &["queue", "info", r".\private$\orders"], None), 1);
    assert!(
        line.contains(r".\private$\orders") && line.contains("does not exist"),
        "{line}"
    );
    let list: Value =
        serde_json::from_str(&ok(mq(url, &["queue", "list", "--json"], None))).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1);
}

#[test]
fn send_forms_and_receive_json_fields() {
    let (dir, mqd) = mqd();
    let url = mqd.url();
    let q = r".\private$\cli";
    ok(mq(url, &["queue", "create", q], None));

    // BODY argument with every property; a single send prints the message id.
    let id = ok(mq(
        url,
        &[
            "send",
            q,
            "from-arg",
            "--label",
            "L1",
            "--priority",
            "6",
            "--correlation-id",
            "corr-1",
            "--app-specific",
            "-5",
        ],
        None,
    ));
    let id = id.trim().to_string();
    assert_eq!(id.len(), 36, "a UUID: {id}");
    assert_eq!(&id[14..15], "7", "a UUID v7: {id}");
    // --file, with a binary (non-UTF-8) body.
    let file = dir.path().join("body.bin");
    std::fs::write(&file, [0xff, 0x00, 0xfe, b'\n']).unwrap();
    ok(mq(
        url,
        &[
            "send",
            q,
            "--file",
            file.to_str().unwrap(),
            "--priority",
            "5",
        ],
        None,
    ));
    // stdin.
    ok(mq(
        url,
        &["send", q, "--priority", "4"],
        Some(b"from stdin"),
    ));

    let peeked = ok(mq(url, &["peek", q, "--count", "3", "--json"], None));
    let received = ok(mq(url, &["receive", q, "--count", "3", "--json"], None));
    assert_eq!(peeked, received, "peek shows what receive then removes");
    let ms = json_lines(&received);
    assert_eq!(ms.len(), 3);
    let m = &ms[0];
    assert_eq!(m["id"], id.as_str());
    assert_eq!(m["body"], "from-arg");
    assert_eq!(m["label"], "L1");
    assert_eq!(m["priority"], 6);
    assert_eq!(m["correlation_id"], "corr-1");
    assert_eq!(m["app_specific"], -5);
    for t in ["sent_time", "arrived_time"] {
        let s = m[t]
            .as_str()
            .unwrap_or_else(|| panic!("{t} is a string: {m}"));
        let parsed = humantime_like(s);
        assert!(parsed, "{t} is RFC 3339: {s}");
    }
    assert!(m["sent_time"].as_str() <= m["arrived_time"].as_str(), "{m}");
    assert_eq!(
        ms[1]["body_base64"], "/wD+Cg==",
        "binary bodies are base64: {}",
        ms[1]
    );
    assert!(ms[1].get("body").is_none(), "{}", ms[1]);
    assert_eq!(ms[1]["priority"], 5);
    assert_eq!(ms[2]["body"], "from stdin");
    assert_eq!(ms[2]["label"], "");
    assert_eq!(ms[2]["priority"], 4);

    // Nothing left.
    let info: Value =
        serde_json::from_str(&ok(mq(url, &["queue", "info", q, "--json"], None))).unwrap();
    assert_eq!(info["messages"], 0);

    // Without --json each body is printed on its own line.
    ok(mq(url, &["send", q, "plain"], None));
    assert_eq!(ok(mq(url, &["receive", q], None)), "plain\n");
}

/// `2024-05-01T12:34:56.789Z`-shaped.
fn humantime_like(s: &str) -> bool {
    let b = s.as_bytes();
    s.len() >= 20
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && s.ends_with('Z')
}

#[test]
fn send_count_substitutes_n_and_receive_count_gets_them_in_order() {
    let (_dir, mqd) = mqd();
    let url = mqd.url();
    let q = r".\private$\many";
    ok(mq(url, &["queue", "create", q], None));
    let out = mq(
        url,
        &["send", q, "order {n} of 500", "--count", "500"],
        None,
    );
    let err = stderr(&out);
    ok(out);
    assert!(err.contains("acknowledged 500 of 500"), "{err}");
    let got = ok(mq(url, &["receive", q, "--count", "500"], None));
    let want: String = (1..=500).map(|n| format!("order {n} of 500\n")).collect();
    assert_eq!(got, want);

    // Without {n}, --count repeats the body.
    ok(mq(url, &["send", q, "same", "--count", "3"], None));
    assert_eq!(
        ok(mq(url, &["receive", q, "--count", "3"], None)),
        "same\nsame\nsame\n"
    );
}

/// `--raw` writes a body's bytes with nothing added, so a binary body goes through a file
/// unchanged; it takes one message and refuses `--count` above 1 (and `--json`) as usage.
#[test]
fn raw_receive_and_peek_write_the_body_unchanged() {
    let (dir, mqd) = mqd();
    let url = mqd.url();
    let q = r".\private$\raw";
    ok(mq(url, &["queue", "create", q], None));
    let body: Vec<u8> = (0..=255u8).chain([b'\n', 0, b'\r', b'\n']).collect();
    let file = dir.path().join("body.bin");
    std::fs::write(&file, &body).unwrap();
    ok(mq(
        url,
        &["send", q, "--file", file.to_str().unwrap()],
        None,
    ));
    ok(mq(url, &["send", q, "second"], None));

    let peeked = mq(url, &["peek", q, "--raw"], None);
    assert_eq!(peeked.status.code(), Some(0), "{}", stderr(&peeked));
    assert_eq!(peeked.stdout, body, "peek --raw");
    let received = mq(url, &["receive", q, "--raw"], None);
    assert_eq!(received.status.code(), Some(0), "{}", stderr(&received));
    assert_eq!(
        received.stdout, body,
        "receive --raw: the bytes, no newline"
    );
    assert_eq!(ok(mq(url, &["receive", q, "--raw"], None)), "second");

    ok(mq(url, &["send", q, "left"], None));
    let e = fails(mq(url, &["receive", q, "--raw", "--count", "2"], None), 2);
    assert!(e.contains("--raw") && e.contains("--json"), "{e}");
    let o = mq(url, &["peek", q, "--raw", "--json"], None);
    assert_eq!(
        o.status.code(),
        Some(2),
        "clap's usage error: {}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("'--raw' cannot be used with '--json'"));
    // Nothing was taken by the refused commands.
    assert_eq!(ok(mq(url, &["receive", q], None)), "left\n");
}

#[test]
fn peek_does_not_remove() {
    let (_dir, mqd) = mqd();
    let url = mqd.url();
    let q = r".\private$\peek";
    ok(mq(url, &["queue", "create", q], None));
    ok(mq(url, &["send", q, "m{n}", "--count", "3"], None));
    for _ in 0..2 {
        assert_eq!(ok(mq(url, &["peek", q], None)), "m1\n");
        assert_eq!(
            ok(mq(url, &["peek", q, "--count", "3"], None)),
            "m1\nm2\nm3\n"
        );
    }
    assert_eq!(ok(mq(url, &["receive", q], None)), "m1\n");
    assert_eq!(ok(mq(url, &["peek", q, "--count", "2"], None)), "m2\nm3\n");
}

#[test]
fn exit_codes() {
    let (_dir, mqd) = mqd();
    let url = mqd.url();
    let q = r".\private$\codes";
    ok(mq(url, &["queue", "create", q], None));

    // 2: usage.
    let out = mq(url, &["send", q, "x", "--no-such-flag"], None);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--no-such-flag"), "{}", stderr(&out));
    let out = mq(url, &["frobnicate"], None);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = mq(url, &["receive", q, "--timeout", "soon"], None);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = mq(url, &["send", q, "x", "--count", "0"], None);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // 1: an error, one line on stderr.
    let line = fails(mq(url, &["receive", r".\private$\absent"], None), 1);
    assert!(line.starts_with("mq: error: "), "{line}");
    assert!(line.contains(r".\private$\absent"), "{line}");

    // 3: timeout before --count arrived; what did arrive is printed.
    ok(mq(url, &["send", q, "a{n}", "--count", "2"], None));
    let out = mq(
        url,
        &["receive", q, "--count", "5", "--timeout", "300ms"],
        None,
    );
    assert_eq!(stdout(&out), "a1\na2\n");
    let line = fails(out, 3);
    assert!(
        line.starts_with("mq: timeout: ") && line.contains("2 of 5"),
        "{line}"
    );
    // Nothing arrived at all: still 3, nothing printed.
    let out = mq(url, &["receive", q, "--timeout", "200ms"], None);
    assert_eq!(stdout(&out), "");
    fails(out, 3);
    let out = mq(url, &["peek", q, "--timeout", "200ms", "--json"], None);
    assert_eq!(stdout(&out), "");
    fails(out, 3);
    // The two that arrived were removed for good (acknowledged before the exit).
    let info: Value =
        serde_json::from_str(&ok(mq(url, &["queue", "info", q, "--json"], None))).unwrap();
    assert_eq!(
        (info["messages"].as_u64(), info["in_flight"].as_u64()),
        (Some(0), Some(0))
    );
}

#[test]
fn send_to_a_multiple_element_name() {
    let (_dir, mqd) = mqd();
    let url = mqd.url();
    ok(mq(url, &["queue", "create", r".\private$\q1"], None));
    ok(mq(url, &["queue", "create", r".\private$\q2"], None));
    let id = ok(mq(
        url,
        &[
            "send",
            r"FORMATNAME:DIRECT=OS:.\private$\q1,DIRECT=OS:.\private$\q2",
            "both",
        ],
        None,
    ));
    for q in [r".\private$\q1", r".\private$\q2"] {
        let m = json_lines(&ok(mq(url, &["receive", q, "--json"], None)));
        assert_eq!(m[0]["id"], id.trim());
        assert_eq!(m[0]["body"], "both");
    }
    let line = fails(
        mq(
            url,
            &["receive", r"FORMATNAME:.\private$\q1,.\private$\q2"],
            None,
        ),
        1,
    );
    assert!(line.contains("multiple-element"), "{line}");
}

/// `mqd --alias`: format names with one of the broker's aliases (a name or an IP address) are
/// local: the message lands in the queue here, not in an outgoing queue to itself.
#[test]
fn sends_to_an_alias_of_the_broker_are_local() {
    let dir = tempfile::tempdir().unwrap();
    let mqd = MqdProcess::start_with_args(
        dir.path(),
        &["--alias", "mq-alias.example", "--alias", "192.0.2.44"],
    )
    .unwrap();
    let url = mqd.url();
    let port = mqd.addr().port();
    ok(mq(url, &["queue", "create", r".\private$\aliased"], None));
    for (name, body) in [
        (
            format!(r"DIRECT=OS:MQ-ALIAS.example:{port}\private$\aliased"),
            "by name",
        ),
        (
            format!(r"DIRECT=TCP:192.0.2.44:{port}\private$\aliased"),
            "by address",
        ),
    ] {
        ok(mq(url, &["send", &name, body], None));
    }
    let got = ok(mq(
        url,
        &[
            "receive",
            r".\private$\aliased",
            "--count",
            "2",
            "--timeout",
            "5s",
        ],
        None,
    ));
    assert!(
        got.contains("by name") && got.contains("by address"),
        "{got}"
    );
    let outgoing = ok(mq(url, &["outgoing", "list", "--json"], None));
    assert!(
        !outgoing.contains("192.0.2.44") && !outgoing.contains("alias"),
        "{outgoing}"
    );
}

/// Help that reads right: clap turns a plain `{n}` into a line break, which hid the placeholder
/// `mq send --help` is about; `mq peek` refuses the `--tx` it shares with `mq receive`.
#[test]
fn send_help_shows_the_placeholder_and_peek_refuses_tx() {
    let help = mq("http://127.0.0.1:1", &["send", "--help"], None);
    assert!(help.status.success());
    let text = stdout(&help);
    assert!(
        text.contains("With --count, {n} in it becomes the message's number, 1..N"),
        "{text}"
    );
    assert!(text.contains("Connection (every command):"), "{text}");
    for sub in [
        &["queue", "create", "--help"][..],
        &["receive", "--help"],
        &["outgoing", "list", "--help"],
        &["stats", "--help"],
    ] {
        let o = mq("http://127.0.0.1:1", sub, None);
        assert!(o.status.success(), "{sub:?}");
    }
    let peek = mq(
        "http://127.0.0.1:1",
        &["peek", r".\private$\q", "--tx"],
        None,
    );
    assert_eq!(peek.status.code(), Some(2), "{peek:?}");
    assert!(String::from_utf8_lossy(&peek.stderr).contains("--tx"));
}

/// `mq peek … | head -1` and `mq receive … | head -1`: when the reader closes the pipe, mq
/// stops quietly (no "Broken pipe" error line) with the SIGPIPE-like exit code 141, and a
/// non-transactional receive whose output was never read gives its unacknowledged messages back.
#[test]
fn a_closed_output_pipe_ends_quietly() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let (_dir, mqd) = mqd();
    let url = mqd.url();
    let q = r".\private$\pipe";
    ok(mq(url, &["queue", "create", q], None));
    ok(mq(
        url,
        &[
            "send",
            q,
            "message {n} with some padding to fill the pipe",
            "--count",
            "2000",
        ],
        None,
    ));
    for verb in ["peek", "receive"] {
        let mut child = Command::new(mq_tests::mq_path())
            .args([verb, q, "--count", "2000", "--json"])
            .env("MQ_BROKER", url)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        lines.read_line(&mut first).unwrap();
        assert!(first.contains("message 1 with"), "{verb}: {first}");
        drop(lines); // the reader goes away, as `head -1` does
        let status = mq_tests::wait_timeout(&mut child, std::time::Duration::from_secs(60))
            .unwrap()
            .unwrap_or_else(|| {
                let _ = child.kill();
                panic!("mq {verb} did not end after its output pipe closed")
            });
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(
            status.code(),
            Some(141),
            "mq {verb}: {status:?}, stderr: {err}"
        );
        assert_eq!(err, "", "mq {verb} printed on stderr");
    }
    // Nothing acknowledged was lost: what the receive could not print is back in the queue
    // (some messages may have been written into the pipe before it closed, and are lost to
    // the reader only because a non-transactional receive is at most once — use --tx).
    let info = ok(mq(url, &["queue", "info", q, "--json"], None));
    let v: Value = serde_json::from_str(&info).unwrap();
    assert!(v["messages"].as_u64().unwrap() > 0, "{info}");
}

/// A receive removes a message only once it is written: when the write fails (`> /dev/full`)
/// the message goes back, for `--count 1` (the default) as for more. Exit 1 with one line.
#[test]
fn a_receive_that_cannot_write_keeps_its_message() {
    use std::process::Command;
    let (_dir, mqd) = mqd();
    let url = mqd.url();
    let q = r".\private$\unwritten";
    ok(mq(url, &["queue", "create", q], None));
    ok(mq(url, &["send", q, "keep me"], None));
    let messages = || -> u64 {
        let info = ok(mq(url, &["queue", "info", q, "--json"], None));
        serde_json::from_str::<Value>(&info).unwrap()["messages"]
            .as_u64()
            .unwrap()
    };
    let sh = |redirect: &str, extra: &str| {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            &format!("exec \"$0\" receive '{q}' --timeout 5s {extra} {redirect}"),
            mq_tests::mq_path().to_str().unwrap(),
        ])
        .env("MQ_BROKER", url);
        mq_tests::run_with_timeout(cmd, None, mq_tests::CLI_TIMEOUT).unwrap()
    };
    if std::path::Path::new("/dev/full").exists() {
        for extra in ["", "--count 3", "--json"] {
            let line = fails(sh("> /dev/full", extra), 1);
            assert!(line.contains("No space left"), "{extra}: {line}");
            assert_eq!(messages(), 1, "{extra}: the message went back");
        }
    }
    assert_eq!(ok(mq(url, &["receive", q], None)), "keep me\n");
    assert_eq!(messages(), 0);
}
