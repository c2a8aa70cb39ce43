//! `mqd`'s configuration layers: the TOML file of `--config` and `MQD_*` variables beneath the
//! command line, derived from the clap command itself, so every flag is a file key and a variable.
//!
//! One source of truth: the flags of `mqd` (its clap `Command`). Each option `--some-flag` is
//! also the file key `some-flag` and the environment variable `MQD_SOME_FLAG` (unless the flag
//! names another variable itself). A flag added later needs nothing here. Precedence, highest
//! first: command line, environment, file, built-in default. The file is checked whole before
//! mqd starts: an unknown key or a value its flag would refuse is one line naming the file and
//! the key (exit status 2, like every usage error).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command};

/// The id of the option that names the file (`--config`).
pub const CONFIG_ARG: &str = "config";
/// The id of the option that prints the effective configuration (`--print-config`).
pub const PRINT_CONFIG_ARG: &str = "print_config";

/// Why the configuration layers could not be put together.
#[derive(Debug)]
pub enum LayerError {
    /// A command-line or environment problem (or `--help`, `--version`): clap prints and exits.
    Clap(clap::Error),
    /// A config file problem: one line that names the file and, where it is about one, the key.
    File(String),
}

impl std::fmt::Display for LayerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayerError::Clap(e) => write!(f, "{e}"),
            LayerError::File(m) => f.write_str(m),
        }
    }
}

impl From<clap::Error> for LayerError {
    fn from(e: clap::Error) -> Self {
        LayerError::Clap(e)
    }
}

/// Gives every option of `cmd` without an environment variable the variable
/// `<prefix><FLAG_NAME>` (`--max-body-bytes` → `MQD_MAX_BODY_BYTES`). `--config` gets one too
/// (`MQD_CONFIG`); `--print-config`, `--help` and `--version` do not.
pub fn with_env(cmd: Command, prefix: &str) -> Command {
    cmd.mut_args(|a| {
        if a.get_env().is_some() || !(is_layered(&a) || a.get_id() == CONFIG_ARG) {
            return a;
        }
        let name = format!(
            "{prefix}{}",
            a.get_long()
                .unwrap_or_default()
                .to_uppercase()
                .replace('-', "_")
        );
        let a = a.env(name);
        // A switch's variable takes what people write in unit files: 1/0, yes/no, on/off.
        if matches!(a.get_action(), ArgAction::SetTrue) {
            a.value_parser(clap::builder::BoolishValueParser::new())
        } else {
            a
        }
    })
}

/// Whether an option is part of the configuration (a file key, a line of `--print-config`).
fn is_layered(a: &Arg) -> bool {
    a.get_long().is_some()
        && !a.is_positional()
        && a.get_id() != CONFIG_ARG
        && a.get_id() != PRINT_CONFIG_ARG
        && matches!(
            a.get_action(),
            ArgAction::Set | ArgAction::Append | ArgAction::SetTrue
        )
}

/// Parses `args` with `cmd` (give it [`with_env`] first) and, when `--config FILE` (or its
/// variable) is given, fills every option the command line and the environment left unset from
/// FILE. A subcommand's matches are returned as parsed (the file is for the daemon).
pub fn parse(
    cmd: &Command,
    args: impl IntoIterator<Item = impl Into<OsString>>,
) -> Result<ArgMatches, LayerError> {
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let first = cmd.clone().try_get_matches_from(&args)?;
    if first.subcommand().is_some() {
        return Ok(first);
    }
    let Some(path) = first.get_one::<PathBuf>(CONFIG_ARG).cloned() else {
        return Ok(first);
    };
    let from_file = file_args(cmd, &first, &path)?;
    if from_file.is_empty() {
        return Ok(first);
    }
    // The file's values go in as options of their own, only for options neither the command
    // line nor the environment set, so the second parse cannot disagree with the first.
    let mut again = Vec::with_capacity(args.len() + from_file.len());
    again.extend(args.first().cloned());
    again.extend(from_file);
    again.extend(args.iter().skip(1).cloned());
    Ok(cmd.clone().try_get_matches_from(again)?)
}

/// The command-line options that stand for `path`'s keys the command line and environment did
/// not set, each value checked by its flag's own parser.
fn file_args(cmd: &Command, first: &ArgMatches, path: &Path) -> Result<Vec<OsString>, LayerError> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| LayerError::File(format!("cannot read the config file {shown}: {e}")))?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        let at = e
            .span()
            .map(|s| {
                let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
                format!(" line {line}:")
            })
            .unwrap_or_default();
        LayerError::File(format!(
            "{shown}:{at} not valid TOML: {}",
            e.message().trim()
        ))
    })?;
    let mut out = Vec::new();
    for (key, value) in &table {
        let key_err = |what: String| LayerError::File(format!("{shown}: key `{key}`: {what}"));
        let Some(arg) = cmd.get_arguments().find(|a| {
            is_layered(a)
                && (a.get_long() == Some(key.as_str())
                        // A flag's visible alias is a key too (`http-listen`).
                        || a.get_visible_aliases()
                            .is_some_and(|v| v.contains(&key.as_str())))
        }) else {
            return Err(key_err(format!(
                "unknown key (the keys are the long flags of {} --help without the dashes)",
                cmd.get_name()
            )));
        };
        // Checked even where the command line or the environment overrides it: the file is
        // checked whole.
        let overridden = matches!(
            first.value_source(arg.get_id().as_str()),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        if matches!(arg.get_action(), ArgAction::SetTrue) {
            match value {
                toml::Value::Boolean(true) if !overridden => out.push(format!("--{key}").into()),
                toml::Value::Boolean(_) => {}
                _ => return Err(key_err("must be true or false".into())),
            }
            continue;
        }
        let values = match value {
            toml::Value::Array(items) if matches!(arg.get_action(), ArgAction::Append) => items
                .iter()
                .map(scalar)
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| key_err("must be a list of strings or numbers".into()))?,
            v => vec![scalar(v).ok_or_else(|| {
                key_err(if matches!(arg.get_action(), ArgAction::Append) {
                    "must be a string, a number or a list of them".into()
                } else {
                    "must be a string or a number".into()
                })
            })?],
        };
        for v in values {
            let opt = format!("--{key}={v}");
            // The flag's own parser, alone, so its error is about this value only.
            let alone = Command::new(cmd.get_name().to_string())
                .no_binary_name(true)
                .arg(arg.clone());
            if let Err(e) = alone.try_get_matches_from([&opt]) {
                return Err(key_err(one_line(&e)));
            }
            if !overridden {
                out.push(opt.into());
            }
        }
    }
    Ok(out)
}

fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        // An option that takes true or false (not a switch: those are handled above).
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A clap error's first line without its `error: ` prefix.
fn one_line(e: &clap::Error) -> String {
    let s = e.to_string();
    let first = s.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

/// The effective configuration as a TOML document: every option of `cmd`, in `--help` order,
/// each after its help text; options without a value are shown commented out. Feeding it
/// back with `--config` gives the same configuration.
pub fn print(cmd: &Command, matches: &ArgMatches) -> String {
    let mut out = format!(
        "# The effective configuration of {} (command line > MQD_* environment > config file > defaults).\n",
        cmd.get_name()
    );
    for arg in cmd.get_arguments().filter(|a| is_layered(a)) {
        let key = arg.get_long().unwrap_or_default();
        let id = arg.get_id().as_str();
        out.push('\n');
        if let Some(help) = arg.get_help() {
            for line in wrapped(&help.to_string()) {
                out.push_str("# ");
                out.push_str(&line);
                out.push('\n');
            }
        }
        if matches!(arg.get_action(), ArgAction::SetTrue) {
            out.push_str(&format!("{key} = {}\n", matches.get_flag(id)));
            continue;
        }
        let raw: Vec<String> = matches
            .get_raw(id)
            .map(|vs| vs.map(|v| v.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let integer = is_integer(arg);
        let boolean = arg.get_value_parser().type_id() == std::any::TypeId::of::<bool>();
        let render = |v: &str| match (v.parse::<i64>(), v.parse::<bool>()) {
            (Ok(i), _) if integer => i.to_string(),
            (_, Ok(b)) if boolean => b.to_string(),
            _ => toml::Value::String(v.to_string()).to_string(),
        };
        if matches!(arg.get_action(), ArgAction::Append) {
            let items: Vec<String> = raw.iter().map(|v| render(v)).collect();
            out.push_str(&format!("{key} = [{}]\n", items.join(", ")));
        } else if let Some(v) = raw.first() {
            out.push_str(&format!("{key} = {}\n", render(v)));
        } else {
            out.push_str(&format!("# {key} = (not set)\n"));
        }
    }
    out
}

fn is_integer(arg: &Arg) -> bool {
    use std::any::TypeId;
    let t = arg.get_value_parser().type_id();
    [
        TypeId::of::<u64>(),
        TypeId::of::<u32>(),
        TypeId::of::<u16>(),
        TypeId::of::<usize>(),
        TypeId::of::<i64>(),
        TypeId::of::<i32>(),
    ]
    .into_iter()
    .any(|id| t == id)
}

/// A help text wrapped at about 96 columns.
fn wrapped(help: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for w in help.split_whitespace() {
        if !line.is_empty() && line.len() + w.len() > 96 {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(w);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// Every file key of `cmd` (its layered options' long names), in `--help` order.
pub fn keys(cmd: &Command) -> Vec<String> {
    cmd.get_arguments()
        .filter(|a| is_layered(a))
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect()
}
