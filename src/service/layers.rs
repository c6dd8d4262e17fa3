//! The one configuration convention, for every service: a value comes from, first to last,
//! the flag on the command line, its `KVPLANE_<SERVICE>_<FLAG>` twin, the replaced
//! system's own variables (and deprecated old names), the `--config` file (YAML; JSON is
//! YAML), the default.
//!
//! clap does the first two and the default: [`with_env_twins`] gives every flag of a
//! service its twin. [`layer`] does the rest once clap has parsed: for each flag whose value
//! is still the default, it takes the first alias variable that is set, else the file's key,
//! and returns them as extra command-line words to parse again ([`reparse_args`]). A value
//! that clap or the service then refuses names the flag and, through [`Provenance`], the
//! variable or file it came from. An unknown file key is an error naming the file and key.
//!
//! Knows no service: the names (service prefix, aliases, file keys) come from each service's
//! `config.rs` as a [`Layout`].

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// How an alias variable's text becomes the flag's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Convert {
    /// Taken as it is.
    Text,
    /// Surrounding quotes dropped (`"8000"` → `8000`), as LMCache's `_parse_quoted_string`.
    Unquoted,
    /// An integer, as Python's `int()` reads it (surrounding space and quotes dropped).
    Int,
}

/// Another variable a flag is read from (after its twin, before the file).
#[derive(Debug, Clone)]
pub struct Alias {
    /// The variable.
    pub var: String,
    /// The flag's long name (`health-check-interval`).
    pub flag: String,
    /// How its text is read.
    pub convert: Convert,
    /// Whether using it logs a deprecation warning.
    pub deprecated: bool,
}

/// One service's names for the layers.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// The service's word in `KVPLANE_<SERVICE>_<FLAG>` (`SERVE`, `NODE`, …).
    pub service: &'static str,
    /// Variables that name the config file when `--config` is not given, first wins
    /// (e.g. LMCache's `LMCACHE_CONTROLLER_CONFIG_FILE`).
    pub file_vars: Vec<String>,
    /// Alias variables, first wins.
    pub aliases: Vec<Alias>,
    /// File keys that are another system's names for a flag (`controller_port` → `port`);
    /// every flag's own name (`max-workers` or `max_workers`) is a key too.
    pub file_keys: Vec<(&'static str, &'static str)>,
    /// File keys (and alias variables holding a JSON object) whose mapping holds more
    /// settings by flag name (LMCache's `extra_config`).
    pub nested: Vec<&'static str>,
    /// A variable whose JSON object holds more settings by flag name (`*_EXTRA_CONFIG`).
    pub nested_vars: Vec<String>,
    /// File keys that hold another service's settings (`kvplane serve`'s `coordinator:`,
    /// `indexer:`): skipped here, read by [`parse_embedded`] with [`Settings::section`].
    pub sections: Vec<&'static str>,
}

/// A settings file's mapping (YAML; JSON is YAML), or one section of it.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How errors name it: `config file PATH`.
    shown: String,
    /// Prefix of its keys in errors (`coordinator.` for a section).
    prefix: String,
    map: serde_json::Map<String, serde_json::Value>,
}

impl Settings {
    /// Reads the file at `path` (empty: no settings).
    ///
    /// # Errors
    /// It cannot be read, is not YAML, or is not a mapping; the error names the file.
    pub fn read(path: &std::path::Path) -> Result<Self, LayerError> {
        let shown = format!("config file {}", path.display());
        let text =
            std::fs::read_to_string(path).map_err(|e| LayerError(format!("{shown}: {e}")))?;
        let value: serde_json::Value = if text.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_norway::from_str(&text).map_err(|e| LayerError(format!("{shown}: {e}")))?
        };
        let map = match value {
            serde_json::Value::Null => serde_json::Map::new(),
            serde_json::Value::Object(m) => m,
            _ => {
                return Err(LayerError(format!(
                    "{shown}: expected a mapping of settings"
                )))
            }
        };
        Ok(Self {
            shown,
            prefix: String::new(),
            map,
        })
    }

    /// The mapping under `key` (another service's settings), `None` if the key is absent.
    ///
    /// # Errors
    /// The key holds something other than a mapping.
    pub fn section(&self, key: &str) -> Result<Option<Self>, LayerError> {
        let map = match self.map.get(key) {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::Object(m)) => m.clone(),
            Some(other) => {
                return Err(LayerError(format!(
                    "{} (key {}{key}): expected a mapping of settings, got {other}",
                    self.shown, self.prefix
                )))
            }
        };
        Ok(Some(Self {
            shown: self.shown.clone(),
            prefix: format!("{}{key}.", self.prefix),
            map,
        }))
    }
}

/// Why the layers could not be applied.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LayerError(pub String);

/// Where each value the layers supplied came from, to name it in errors.
#[derive(Debug, Clone, Default)]
pub struct Provenance {
    by_flag: BTreeMap<String, String>,
    /// Deprecation warnings to log.
    pub warnings: Vec<String>,
    /// The config file read, if any.
    pub file: Option<PathBuf>,
}

impl Provenance {
    /// Where the value of `--flag` came from, if the layers supplied it.
    #[must_use]
    pub fn source_of(&self, flag: &str) -> Option<&str> {
        self.by_flag.get(flag).map(String::as_str)
    }

    /// `message` (an error naming `--flag` somewhere) with the source of the first layered
    /// flag it names appended.
    #[must_use]
    pub fn explain(&self, message: &str) -> String {
        for (flag, source) in &self.by_flag {
            let named = format!("--{flag}");
            let hit = message.match_indices(&named).any(|(i, _)| {
                let next = message[i + named.len()..].chars().next();
                !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
            });
            if hit {
                return format!(
                    "{} (the value of --{flag} came from {source})",
                    message.trim_end()
                );
            }
        }
        message.to_string()
    }
}

/// The twin of `--flag` for `service`: `KVPLANE_<SERVICE>_<FLAG>`.
#[must_use]
pub fn twin(service: &str, flag: &str) -> String {
    format!(
        "KVPLANE_{service}_{}",
        flag.replace('-', "_").to_ascii_uppercase()
    )
}

/// Gives every flag of `cmd` its `KVPLANE_<SERVICE>_<FLAG>` twin (replacing any variable the
/// derive named) and adds `--config FILE` if `cmd` lacks it. A bool flag's twin reads
/// 1/0, true/false, yes/no, on/off.
#[must_use]
pub fn with_env_twins(cmd: Command, service: &'static str) -> Command {
    let cmd = if cmd.get_arguments().any(|a| a.get_id() == "config") {
        cmd
    } else {
        cmd.arg(
            clap::Arg::new("config")
                .long("config")
                .value_name("FILE")
                .help("YAML (or JSON) file of settings by flag name; flags and variables win"),
        )
    };
    cmd.mut_args(|arg| {
        let Some(long) = arg.get_long().map(str::to_string) else {
            return arg;
        };
        // clap keeps `&'static str` names: the twins live as long as the process.
        let var: &'static str = Box::leak(twin(service, &long).into_boxed_str());
        let arg = arg.env(var);
        if matches!(arg.get_action(), ArgAction::SetTrue) {
            arg.value_parser(clap::builder::BoolishValueParser::new())
        } else {
            arg
        }
    })
}

/// The flags of `cmd` by long name, with whether each takes several values and whether it
/// is a switch.
fn flags(cmd: &Command) -> BTreeMap<String, (String, bool, bool)> {
    cmd.get_arguments()
        .filter_map(|a| {
            let long = a.get_long()?;
            let many = matches!(a.get_action(), ArgAction::Append);
            let switch = matches!(a.get_action(), ArgAction::SetTrue);
            Some((long.to_string(), (a.get_id().to_string(), many, switch)))
        })
        .collect()
}

/// A value the layers supply for a flag.
#[derive(Debug, Clone)]
struct Supplied {
    values: Vec<String>,
    source: String,
}

/// The YAML value as flag text: scalars as written, lists one value each, mappings as JSON.
fn as_values(v: &serde_json::Value) -> Vec<String> {
    match v {
        serde_json::Value::Null => Vec::new(),
        serde_json::Value::String(s) => vec![s.clone()],
        serde_json::Value::Array(items) => items.iter().flat_map(as_values).collect(),
        other => vec![other.to_string()],
    }
}

fn unquote(s: &str) -> &str {
    let t = s.trim();
    for q in ['"', '\''] {
        if t.len() >= 2 && t.starts_with(q) && t.ends_with(q) {
            return &t[1..t.len() - 1];
        }
    }
    s
}

fn convert(c: Convert, text: &str) -> Result<String, String> {
    match c {
        Convert::Text => Ok(text.to_string()),
        Convert::Unquoted => Ok(unquote(text).to_string()),
        Convert::Int => {
            let t = unquote(text).trim().replace('_', "");
            t.parse::<i64>()
                .map(|n| n.to_string())
                .map_err(|_| format!("{text:?} is not an integer"))
        }
    }
}

/// Which flags of `matches` still hold their default (or nothing).
fn open(matches: &ArgMatches, id: &str) -> bool {
    matches!(
        matches
            .try_contains_id(id)
            .ok()
            .and_then(|_| matches.value_source(id)),
        None | Some(ValueSource::DefaultValue)
    )
}

/// Applies the alias and file layers to a parsed subcommand: the extra command-line words
/// (`--flag=value`) for every flag still at its default that an alias variable or the file
/// sets, and where each came from.
///
/// # Errors
/// The file cannot be read or parsed, holds an unknown key or a value of the wrong shape,
/// or an alias variable's value cannot be converted: each names the file or variable and
/// the flag.
pub fn layer(
    cmd: &Command,
    matches: &ArgMatches,
    layout: &Layout,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Vec<String>, Provenance), LayerError> {
    let path = match matches.get_one::<String>("config") {
        Some(path) if !path.is_empty() => Some(PathBuf::from(path)),
        _ => layout
            .file_vars
            .iter()
            .find_map(|v| env(v).filter(|p| !p.is_empty()))
            .map(PathBuf::from),
    };
    let settings = path.as_deref().map(Settings::read).transpose()?;
    let (words, mut prov) = layer_with(cmd, matches, layout, env, settings.as_ref())?;
    prov.file = path;
    Ok((words, prov))
}

/// [`layer`] with the file's settings given (`None`: no file), not named by `--config`.
///
/// # Errors
/// As [`layer`].
pub fn layer_with(
    cmd: &Command,
    matches: &ArgMatches,
    layout: &Layout,
    env: &dyn Fn(&str) -> Option<String>,
    file: Option<&Settings>,
) -> Result<(Vec<String>, Provenance), LayerError> {
    let flags = flags(cmd);
    let mut supplied: BTreeMap<String, Supplied> = BTreeMap::new();
    let mut prov = Provenance::default();
    let is_open = |flag: &str, supplied: &BTreeMap<String, Supplied>| {
        flags
            .get(flag)
            .is_some_and(|(id, _, _)| open(matches, id) && !supplied.contains_key(flag))
    };

    // The replaced system's variables and deprecated names.
    for a in &layout.aliases {
        let Some(text) = env(&a.var) else { continue };
        if !is_open(&a.flag, &supplied) {
            continue;
        }
        let value = convert(a.convert, &text)
            .map_err(|e| LayerError(format!("{} (for --{}): {e}", a.var, a.flag)))?;
        if a.deprecated {
            prov.warnings.push(format!(
                "{} is deprecated: use {} (or --{})",
                a.var,
                twin(layout.service, &a.flag),
                a.flag
            ));
        }
        supplied.insert(
            a.flag.clone(),
            Supplied {
                values: vec![value],
                source: a.var.clone(),
            },
        );
    }
    for var in &layout.nested_vars {
        let Some(text) = env(var) else { continue };
        let value: serde_json::Value = serde_json::from_str(unquote(&text))
            .map_err(|e| LayerError(format!("{var}: not a JSON object: {e}")))?;
        nested(&value, var, &flags, &mut supplied, &is_open)?;
    }

    // The config file.
    if let Some(settings) = file {
        from_file(settings, layout, &flags, &mut supplied, &is_open)?;
    }
    words_of(&flags, supplied, prov)
}

/// The file's settings, for flags still open.
fn from_file(
    settings: &Settings,
    layout: &Layout,
    flags: &BTreeMap<String, (String, bool, bool)>,
    supplied: &mut BTreeMap<String, Supplied>,
    is_open: &dyn Fn(&str, &BTreeMap<String, Supplied>) -> bool,
) -> Result<(), LayerError> {
    let shown = &settings.shown;
    for (key, v) in &settings.map {
        let source = format!("{shown} (key {}{key})", settings.prefix);
        if layout.sections.contains(&key.as_str()) {
            continue;
        }
        if layout.nested.contains(&key.as_str()) {
            nested(v, &source, flags, supplied, is_open)?;
            continue;
        }
        let flag = flag_of(key, layout, flags).ok_or_else(|| {
            LayerError(format!(
                "{shown}: unknown key \"{}{key}\" (keys are the flags' names: {})",
                settings.prefix,
                known_keys(layout, flags)
            ))
        })?;
        if is_open(&flag, supplied) {
            supplied.insert(
                flag,
                Supplied {
                    values: as_values(v),
                    source,
                },
            );
        }
    }
    Ok(())
}

/// The command-line words of the values supplied, and where each came from.
fn words_of(
    flags: &BTreeMap<String, (String, bool, bool)>,
    supplied: BTreeMap<String, Supplied>,
    mut prov: Provenance,
) -> Result<(Vec<String>, Provenance), LayerError> {
    let mut words = Vec::new();
    for (flag, s) in supplied {
        let (_, many, switch) = &flags[&flag];
        if s.values.len() > 1 && !many {
            return Err(LayerError(format!(
                "{} (for --{flag}): one value expected, got a list",
                s.source
            )));
        }
        for v in &s.values {
            if *switch {
                match v.to_ascii_lowercase().as_str() {
                    "true" | "1" | "yes" | "on" => words.push(format!("--{flag}")),
                    "false" | "0" | "no" | "off" => {}
                    _ => {
                        return Err(LayerError(format!(
                            "{} (for --{flag}): {v:?} is not true or false",
                            s.source
                        )))
                    }
                }
            } else {
                words.push(format!("--{flag}={v}"));
            }
        }
        prov.by_flag.insert(flag, s.source);
    }
    Ok((words, prov))
}

/// Settings nested in a mapping (LMCache's `extra_config`), by flag name.
fn nested(
    value: &serde_json::Value,
    source: &str,
    flags: &BTreeMap<String, (String, bool, bool)>,
    supplied: &mut BTreeMap<String, Supplied>,
    is_open: &dyn Fn(&str, &BTreeMap<String, Supplied>) -> bool,
) -> Result<(), LayerError> {
    let map = match value {
        serde_json::Value::Null => return Ok(()),
        serde_json::Value::Object(m) => m,
        _ => return Err(LayerError(format!("{source}: expected a mapping"))),
    };
    for (key, v) in map {
        let flag = key.replace('_', "-");
        if !flags.contains_key(&flag) || flag == "config" {
            return Err(LayerError(format!("{source}: unknown setting {key:?}")));
        }
        if is_open(&flag, supplied) {
            supplied.insert(
                flag,
                Supplied {
                    values: as_values(v),
                    source: format!("{source}, {key}"),
                },
            );
        }
    }
    Ok(())
}

fn flag_of(
    key: &str,
    layout: &Layout,
    flags: &BTreeMap<String, (String, bool, bool)>,
) -> Option<String> {
    if let Some((_, flag)) = layout.file_keys.iter().find(|(k, _)| *k == key) {
        return Some((*flag).to_string());
    }
    let flag = key.replace('_', "-");
    (flag != "config" && flags.contains_key(&flag)).then_some(flag)
}

fn known_keys(layout: &Layout, flags: &BTreeMap<String, (String, bool, bool)>) -> String {
    let mut keys: Vec<String> = flags
        .keys()
        .filter(|f| *f != "config" && *f != "help" && *f != "version")
        .map(|f| f.replace('-', "_"))
        .collect();
    keys.extend(layout.file_keys.iter().map(|(k, _)| (*k).to_string()));
    keys.extend(layout.nested.iter().map(|k| (*k).to_string()));
    keys.extend(layout.sections.iter().map(|k| format!("{k} (a section)")));
    keys.join(", ")
}

/// `args` (the process's, subcommand included) with `words` appended: parse them again to
/// get every layer's values. The subcommands layered take flags only, so appended flags
/// cannot be mistaken for positional arguments.
#[must_use]
pub fn reparse_args(args: &[std::ffi::OsString], words: Vec<String>) -> Vec<std::ffi::OsString> {
    let mut all = args.to_vec();
    all.extend(words.into_iter().map(Into::into));
    all
}

/// A service another runs in its process (`kvplane serve --coordinator-port PORT`): on the
/// host process's `host` and the `port` it gives, its variables read through `env`, and
/// `file`, its section of the host's `--config` file.
#[derive(Clone, Copy)]
pub struct Embedded<'a> {
    /// The address the host process serves on.
    pub host: &'a str,
    /// The port the host process gives the service.
    pub port: u16,
    /// The variables (the process's, or a test's).
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// The service's section of the host's settings file.
    pub file: Option<&'a Settings>,
}

impl<'a> Embedded<'a> {
    /// The service on `host:port`, read from `env` and `file`.
    #[must_use]
    pub fn new(
        host: &'a str,
        port: u16,
        env: &'a dyn Fn(&str) -> Option<String>,
        file: Option<&'a Settings>,
    ) -> Self {
        Self {
            host,
            port,
            env,
            file,
        }
    }

    /// Service `A`'s flags through [`parse_embedded`], with `--host` and `--port` the host's.
    ///
    /// # Errors
    /// A value is refused (by clap or a layer), naming the flag and where it came from.
    pub fn parse<A: clap::Args + clap::FromArgMatches>(
        &self,
        layout: &Layout,
    ) -> Result<(A, Provenance), LayerError> {
        let fixed = [
            format!("--host={}", self.host),
            format!("--port={}", self.port),
        ];
        parse_embedded(layout, &fixed, self.env, self.file)
    }
}

/// The first of `flags` (whether it was given, why it is refused) that was given, refused
/// naming where its value came from: a flag a service run by another process does not take.
///
/// # Errors
/// That flag's refusal.
pub fn refuse_given(
    prov: &Provenance,
    flags: impl IntoIterator<Item = (bool, String)>,
) -> Result<(), LayerError> {
    match flags.into_iter().find(|(given, _)| *given) {
        Some((_, why)) => Err(LayerError(prov.explain(&why))),
        None => Ok(()),
    }
}

/// Service `A`'s flags read without a command line of its own: a service that another
/// runs in its process (`kvplane serve --coordinator-port`). From first to last: `fixed`
/// (command-line words, `--host=…`, that the host process decides), `A`'s
/// `KVPLANE_<SERVICE>_<FLAG>` twins and `layout`'s aliases, read through `env`, then `file`
/// (a section of the host's `--config` file, by flag name), then the defaults. A flag of
/// `fixed` is refused in `file`: the host decides it.
///
/// # Errors
/// A value is refused (by clap or a layer), naming the flag and where it came from.
pub fn parse_embedded<A: clap::Args + clap::FromArgMatches>(
    layout: &Layout,
    fixed: &[String],
    env: &dyn Fn(&str) -> Option<String>,
    file: Option<&Settings>,
) -> Result<(A, Provenance), LayerError> {
    let cmd = A::augment_args(Command::new(layout.service).no_binary_name(true));
    // The twins are read through `env` (as aliases that come first), not by clap.
    let cmd = with_env_twins(cmd, layout.service).mut_args(|a| a.env(None));
    let mut layout = layout.clone();
    let twins: Vec<Alias> = flags(&cmd)
        .into_keys()
        .filter(|f| f != "config" && f != "help")
        .map(|flag| Alias {
            var: twin(layout.service, &flag),
            flag,
            convert: Convert::Text,
            deprecated: false,
        })
        .collect();
    layout.aliases.splice(0..0, twins);
    if let Some(settings) = file {
        for word in fixed {
            let flag = word.trim_start_matches("--");
            let flag = flag.split_once('=').map_or(flag, |(f, _)| f);
            for key in [flag.to_string(), flag.replace('-', "_")] {
                if settings.map.contains_key(&key) {
                    return Err(LayerError(format!(
                        "{} (key {}{key}): --{flag} is not read from here: the process \
                         running this service sets it",
                        settings.shown, settings.prefix
                    )));
                }
            }
        }
    }
    let words = fixed.to_vec();
    let loose = cmd.clone().mut_args(|a| a.required(false));
    let first = loose
        .try_get_matches_from(&words)
        .map_err(|e| LayerError(first_line(&e)))?;
    let (more, prov) = layer_with(&cmd, &first, &layout, env, file)?;
    let all: Vec<String> = words.into_iter().chain(more).collect();
    let matches = cmd
        .try_get_matches_from(all)
        .map_err(|e| LayerError(prov.explain(&first_line(&e))))?;
    let args = A::from_arg_matches(&matches).map_err(|e| LayerError(first_line(&e)))?;
    Ok((args, prov))
}

/// The first line of clap's error, without its `error: `.
fn first_line(e: &clap::Error) -> String {
    let text = e.to_string();
    text.lines()
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .to_string()
}

#[cfg(test)]
#[path = "layers_tests.rs"]
mod tests;
