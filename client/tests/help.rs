//! The `mq` binary's help, as a new user meets it: every command listed by `mq --help` has a
//! `--help` of its own that exits 0 and names the command's usage.
//!
//! Being an integration test of `mq-client` also makes `cargo test --workspace` build the `mq`
//! binary itself (Cargo builds a package's binaries for its integration tests), in the same
//! pass and with the same features as everything else, so the integration tests' harness
//! (`mq_tests::BUILD_ARGS`) finds it built.

use std::process::Command;

fn mq(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mq"))
        .args(args)
        .output()
        .expect("run mq");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The command names of the `Commands:` section of a clap help text.
fn commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn every_command_has_a_help_that_names_its_usage() {
    let (ok, top, err) = mq(&["--help"]);
    assert!(ok, "mq --help failed: {err}");
    let cmds = commands(&top);
    for expected in [
        "queue", "send", "receive", "peek", "browse", "outgoing", "tx", "info",
    ] {
        assert!(
            cmds.iter().any(|c| c == expected),
            "`mq --help` does not list `{expected}`: {cmds:?}"
        );
    }
    for c in &cmds {
        let (ok, help, err) = mq(&[c, "--help"]);
        assert!(ok, "mq {c} --help failed: {err}");
        assert!(
            help.contains(&format!("Usage: mq {c}")),
            "mq {c} --help has no usage line:\n{help}"
        );
        // A subcommand with subcommands of its own: each of those too.
        for sub in commands(&help) {
            let (ok, h, err) = mq(&[c, &sub, "--help"]);
            assert!(ok, "mq {c} {sub} --help failed: {err}");
            assert!(
                h.contains(&format!("Usage: mq {c} {sub}")),
                "mq {c} {sub} --help has no usage line:\n{h}"
            );
        }
    }
}

#[test]
fn a_mistyped_command_is_a_usage_error_naming_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_mq"))
        .arg("sned")
        .output()
        .expect("run mq");
    assert_eq!(out.status.code(), Some(2), "a usage error exits 2");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sned"), "{err}");
}
