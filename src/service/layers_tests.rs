use super::*;
use clap::{Arg, ArgAction, Command};
use std::collections::HashMap;
use std::ffi::OsString;

fn cmd() -> Command {
    with_env_twins(
        Command::new("demo")
            .arg(Arg::new("port").long("port").default_value("9000"))
            .arg(Arg::new("host").long("host").default_value("0.0.0.0"))
            .arg(Arg::new("engine").long("engine").action(ArgAction::Append))
            .arg(Arg::new("quiet").long("quiet").action(ArgAction::SetTrue)),
        "DEMO",
    )
}

fn layout() -> Layout {
    Layout {
        service: "DEMO",
        file_vars: vec!["OLD_CONFIG_FILE".into()],
        aliases: vec![
            Alias {
                var: "OLD_PORT".into(),
                flag: "port".into(),
                convert: Convert::Int,
                deprecated: false,
            },
            Alias {
                var: "KVPLANE_HOST".into(),
                flag: "host".into(),
                convert: Convert::Text,
                deprecated: true,
            },
        ],
        file_keys: vec![("old_port", "port")],
        nested: vec!["extra"],
        nested_vars: vec![],
        sections: vec!["other"],
    }
}

/// Parses `args` with `env` (clap reads the process's variables for the twins: the tests
/// use names no one sets, and pass the others through `env`) and a file holding `yaml`.
fn parse(
    args: &[&str],
    env: &[(&str, &str)],
    yaml: Option<&str>,
) -> Result<(ArgMatches, Provenance), String> {
    let dir = std::env::temp_dir().join(format!("kvplane-layers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{}.yaml", args.len() + env.len() * 7));
    let mut argv: Vec<OsString> = vec!["demo".into()];
    argv.extend(args.iter().map(Into::into));
    if let Some(y) = yaml {
        std::fs::write(&file, y).unwrap();
        argv.push(format!("--config={}", file.display()).into());
    }
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    let lookup = |k: &str| env.get(k).cloned();
    let first = cmd()
        .try_get_matches_from(&argv)
        .map_err(|e| e.to_string())?;
    let (words, prov) = layer(&cmd(), &first, &layout(), &lookup).map_err(|e| e.0)?;
    let m = cmd()
        .try_get_matches_from(reparse_args(&argv, words))
        .map_err(|e| prov.explain(&e.to_string()))?;
    Ok((m, prov))
}

fn port(m: &ArgMatches) -> &str {
    m.get_one::<String>("port").unwrap()
}

#[test]
fn precedence_is_flag_then_alias_then_file_then_default() {
    let (m, _) = parse(&[], &[], None).unwrap();
    assert_eq!(port(&m), "9000");
    let (m, p) = parse(&[], &[], Some("port: 9100\n")).unwrap();
    assert_eq!(port(&m), "9100");
    assert!(p.source_of("port").unwrap().contains("key port"));
    let (m, p) = parse(&[], &[("OLD_PORT", "'9200'")], Some("port: 9100\n")).unwrap();
    assert_eq!(port(&m), "9200");
    assert_eq!(p.source_of("port"), Some("OLD_PORT"));
    let (m, p) = parse(
        &["--port", "9300"],
        &[("OLD_PORT", "9200")],
        Some("port: 9100"),
    )
    .unwrap();
    assert_eq!(port(&m), "9300");
    assert_eq!(p.source_of("port"), None, "the flag's own value");
}

#[test]
fn file_keys_lists_switches_and_nested_settings() {
    let yaml = "old_port: 9400\nengine: [a, b]\nquiet: true\nextra:\n  host: h\n";
    let (m, _) = parse(&[], &[], Some(yaml)).unwrap();
    assert_eq!(port(&m), "9400");
    let engines: Vec<&String> = m.get_many::<String>("engine").unwrap().collect();
    assert_eq!(engines, ["a", "b"]);
    assert!(m.get_flag("quiet"));
    assert_eq!(m.get_one::<String>("host").unwrap(), "h");
    // JSON is YAML.
    let (m, _) = parse(
        &[],
        &[],
        Some(r#"{"port": 1, "quiet": false, "host": null}"#),
    )
    .unwrap();
    assert_eq!((port(&m), m.get_flag("quiet")), ("1", false));
    assert_eq!(
        m.get_one::<String>("host").unwrap(),
        "0.0.0.0",
        "null: the default"
    );
}

#[test]
fn unknown_keys_and_bad_values_name_the_file_and_the_flag() {
    let e = parse(&[], &[], Some("prot: 1\n")).unwrap_err();
    assert!(
        e.contains("unknown key \"prot\"") && e.contains("config file"),
        "{e}"
    );
    assert!(e.contains("port"), "the known keys are listed: {e}");
    let e = parse(&[], &[], Some("port: [1, 2]\n")).unwrap_err();
    assert!(e.contains("--port") && e.contains("key port"), "{e}");
    let e = parse(&[], &[], Some("quiet: maybe\n")).unwrap_err();
    assert!(e.contains("--quiet"), "{e}");
    let e = parse(&[], &[("OLD_PORT", "90x")], None).unwrap_err();
    assert!(e.contains("OLD_PORT") && e.contains("--port"), "{e}");
    let e = parse(&[], &[], Some("- a\n- b\n")).unwrap_err();
    assert!(e.contains("expected a mapping"), "{e}");
    let e = parse(&[], &[], Some("port: [\n")).unwrap_err();
    assert!(e.contains("config file"), "{e}");
}

#[test]
fn deprecated_aliases_warn_and_the_file_can_come_from_a_variable() {
    let dir = std::env::temp_dir().join(format!("kvplane-layers-var-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("c.yaml");
    std::fs::write(&file, "port: 9500\n").unwrap();
    let (m, p) = parse(
        &[],
        &[
            ("KVPLANE_HOST", "h2"),
            ("OLD_CONFIG_FILE", file.to_str().unwrap()),
        ],
        None,
    )
    .unwrap();
    assert_eq!(port(&m), "9500");
    assert_eq!(m.get_one::<String>("host").unwrap(), "h2");
    assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
    assert!(
        p.warnings[0].contains("KVPLANE_DEMO_HOST"),
        "{:?}",
        p.warnings
    );
}

#[test]
fn every_flag_gets_its_twin() {
    let c = cmd();
    for a in c.get_arguments().filter(|a| a.get_long().is_some()) {
        let long = a.get_long().unwrap();
        assert_eq!(
            a.get_env().and_then(|e| e.to_str()),
            Some(twin("DEMO", long).as_str()),
            "--{long}"
        );
    }
    assert_eq!(twin("SERVE", "max-workers"), "KVPLANE_SERVE_MAX_WORKERS");
}

#[test]
fn explain_names_only_whole_flags() {
    let mut p = Provenance::default();
    p.by_flag.insert("port".into(), "FILE".into());
    assert!(p.explain("bad --port value").contains("came from FILE"));
    assert!(!p.explain("bad --port-range").contains("came from"));
}
