//! `mqd --config FILE`, `MQD_*` variables and `--print-config`: every flag is a file key, the
//! example file covers them all, the printed configuration reads back the same, command line >
//! environment > file > defaults, and a bad file is one line naming the file and the key (exit 2).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use mq_tests::{mq, mqd_path, run_with_timeout, temp_data_dir, MqdProcess};

const Q: &str = r".\private$\q";

fn example_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/mqd.toml")
}

/// `mqd ARGS` to completion, without any MQD_* variable of the test's own environment.
fn mqd_run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(mqd_path());
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("MQD_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    run_with_timeout(cmd, None, Duration::from_secs(60)).expect("mqd runs")
}

fn print_config(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut all = args.to_vec();
    all.push("--print-config");
    let out = mqd_run(&all, env);
    assert!(
        out.status.success(),
        "mqd {all:?}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The value line of `key` in a `--print-config` output.
fn value_of(config: &str, key: &str) -> String {
    let prefix = format!("{key} = ");
    config
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no `{key}` in\n{config}"))
        .to_string()
}

/// The keys a TOML text sets or shows commented out (`key = ...` or `# key = ...`).
fn keys_in(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| {
            let l = l.strip_prefix("# ").unwrap_or(l);
            let (k, _) = l.split_once(" = ")?;
            (!k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
            .then(|| k.to_string())
        })
        .collect()
}

/// The long flags `mqd --help` lists, but for --help, --version and the two about the file.
fn flags_in_help() -> BTreeSet<String> {
    let out = mqd_run(&["--help"], &[]);
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).expect("utf-8");
    help.lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .filter_map(|l| l.split([' ', '=', ',']).next())
        .filter(|f| !["help", "version", "config", "print-config"].contains(f))
        .map(str::to_string)
        .collect()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write config");
    p
}

#[test]
fn example_config_covers_every_flag_and_round_trips_through_print_config() {
    let example = std::fs::read_to_string(example_path()).expect("docs/examples/mqd.toml");
    let flags = flags_in_help();
    assert!(
        flags.len() > 30,
        "too few flags found in mqd --help: {flags:?}"
    );
    assert_eq!(
        keys_in(&example),
        flags,
        "docs/examples/mqd.toml must show every flag of mqd --help as a key, and nothing else"
    );
    let dir = temp_data_dir("config-example");
    // As shipped: parses, and its two set keys are in force.
    let shipped = print_config(&["--config", example_path().to_str().unwrap()], &[]);
    assert_eq!(value_of(&shipped, "data-dir"), "\"/var/lib/mqd\"");
    // Every key set: uncomment every `# key = value` line.
    let all: String = example
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(rest) if keys_in(rest).len() == 1 => format!("{rest}\n"),
            _ => format!("{l}\n"),
        })
        .collect();
    let all_path = write(dir.path(), "all.toml", &all);
    let first = print_config(&["--config", all_path.to_str().unwrap()], &[]);
    assert!(
        !first.contains("(not set)"),
        "a key of the example is not in force:\n{first}"
    );
    assert_eq!(keys_in(&first), flags);
    assert_eq!(value_of(&first, "name"), "\"broker-a\"");
    assert_eq!(
        value_of(&first, "alias"),
        "[\"mq.example.com\", \"192.0.2.10\"]"
    );
    // What --print-config prints reads back as the same configuration.
    let printed = write(dir.path(), "printed.toml", &first);
    let second = print_config(&["--config", printed.to_str().unwrap()], &[]);
    assert_eq!(first, second);
}

#[test]
fn command_line_beats_environment_beats_file_beats_default() {
    let dir = temp_data_dir("config-precedence");
    let file = write(
        dir.path(),
        "mqd.toml",
        "name = \"from-file\"\nmax-body-bytes = 1000\ntx-outcome-max = 7\nack-timeout = \"90s\"\n\
         insecure = true\nalias = [\"x.example\", \"y.example\"]\njournal-inline-commits = false\n",
    );
    let f = file.to_str().unwrap();
    let env = [("MQD_NAME", "from-env"), ("MQD_MAX_BODY_BYTES", "2000")];
    let c = print_config(&["--config", f, "--name", "from-flag"], &env);
    assert_eq!(value_of(&c, "name"), "\"from-flag\"", "flag > env > file");
    assert_eq!(value_of(&c, "max-body-bytes"), "2000", "env > file");
    assert_eq!(value_of(&c, "tx-outcome-max"), "7", "file > default");
    assert_eq!(value_of(&c, "ack-timeout"), "\"90s\"");
    assert_eq!(value_of(&c, "insecure"), "true");
    assert_eq!(
        value_of(&c, "journal-inline-commits"),
        "false",
        "a true-or-false option"
    );
    assert_eq!(value_of(&c, "alias"), "[\"x.example\", \"y.example\"]");
    assert_eq!(value_of(&c, "max-connections"), "1024", "default");
    let c = print_config(&["--config", f], &env);
    assert_eq!(value_of(&c, "name"), "\"from-env\"", "env > file");
    let c = print_config(&["--config", f], &[]);
    assert_eq!(value_of(&c, "name"), "\"from-file\"");
    assert_eq!(value_of(&c, "max-body-bytes"), "1000");
    // The file through MQD_CONFIG, a switch through its variable, a list through a flag.
    let c = print_config(
        &["--alias", "z.example"],
        &[("MQD_CONFIG", f), ("MQD_TRUNCATE_DAMAGED_JOURNAL", "1")],
    );
    assert_eq!(value_of(&c, "name"), "\"from-file\"");
    assert_eq!(value_of(&c, "truncate-damaged-journal"), "true");
    assert_eq!(value_of(&c, "alias"), "[\"z.example\"]");

    // The file reaches the running broker, not only --print-config: its body limit refuses.
    let data = temp_data_dir("config-precedence-run");
    let mut mqd = MqdProcess::start_with_args(data.path(), &["--config", f]).expect("mqd starts");
    let url = mqd.url().to_string();
    assert!(mq(&url, &["queue", "create", Q], None).status.success());
    assert!(mq(&url, &["send", Q, &"a".repeat(900)], None)
        .status
        .success());
    let big = mq(&url, &["send", Q, &"b".repeat(1500)], None);
    assert!(
        !big.status.success(),
        "a 1500-byte body passed a 1000-byte limit"
    );
    let err = String::from_utf8_lossy(&big.stderr);
    assert!(err.contains("1000"), "{err}");
    mqd.terminate(Duration::from_secs(30)).expect("mqd stops");
}

/// Runs `mqd --config FILE` on a file holding `text` and returns its stderr; it must exit 2
/// with one line that names the file and `names`.
fn refused(text: &str, names: &str) -> String {
    let dir = temp_data_dir("config-bad");
    let file = write(dir.path(), "bad.toml", text);
    let f = file.to_str().unwrap();
    let data = dir.path().to_str().unwrap();
    let out = mqd_run(
        &["--config", f, "--data-dir", data, "--listen", "127.0.0.1:0"],
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{text:?}: {err}");
    assert!(out.stdout.is_empty(), "mqd started on {text:?}");
    assert_eq!(err.lines().count(), 1, "one line for {text:?}: {err}");
    assert!(err.contains(f), "{err} does not name the file");
    assert!(err.contains(names), "{err} does not name {names}");
    err
}

#[test]
fn a_bad_config_file_is_one_line_naming_the_file_and_the_key() {
    let e = refused(
        "listen = \"127.0.0.1:0\"\nmax-bodybytes = 5\n",
        "`max-bodybytes`",
    );
    assert!(e.contains("unknown key"), "{e}");
    let e = refused("max-body-bytes = \"lots\"\n", "`max-body-bytes`");
    assert!(e.contains("lots"), "{e}");
    refused("max-connections = 0\n", "`max-connections`");
    refused("ack-timeout = \"soon\"\n", "`ack-timeout`");
    refused("insecure = \"yes\"\n", "`insecure`");
    refused("journal-inline-commits = 1\n", "`journal-inline-commits`");
    refused("listen = [\"127.0.0.1:0\"]\n", "`listen`");
    refused("log-format = \"xml\"\n", "`log-format`");
    // Keys that are not options of the daemon.
    refused("config = \"other.toml\"\n", "`config`");
    refused("print-config = true\n", "`print-config`");
    // Not TOML at all: the file and the line.
    refused("listen = \"127.0.0.1:0\"\nmax-body-bytes = \n", "line 2");
    // A missing file.
    let dir = temp_data_dir("config-missing");
    let missing = dir.path().join("nope.toml");
    let out = mqd_run(&["--config", missing.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope.toml"));
}

/// A flag's visible alias is a file key too: `http-listen` (README's name for `--metrics-listen`)
/// was refused as an unknown key (helper-73), while `--http-listen` worked on the command line.
/// Its variable is `MQD_HTTP_LISTEN`, as the flag names it.
#[test]
fn an_alias_of_a_flag_is_a_key() {
    let dir = temp_data_dir("config-alias");
    let file = dir.path().join("mqd.toml");
    std::fs::write(&file, "http-listen = \"127.0.0.1:9\"\n").unwrap();
    let shown = print_config(&["--config", file.to_str().unwrap()], &[]);
    assert_eq!(value_of(&shown, "metrics-listen"), "\"127.0.0.1:9\"");
    let shown = print_config(&[], &[("MQD_HTTP_LISTEN", "127.0.0.1:8")]);
    assert_eq!(value_of(&shown, "metrics-listen"), "\"127.0.0.1:8\"");
}
