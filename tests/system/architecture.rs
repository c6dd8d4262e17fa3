//! The dependency direction of docs/ARCHITECTURE.md, checked on the source: every
//! `crate::<module>` path in `src/<module>/` must be an edge the table below allows. Shared
//! plumbing never reaches up into a service, and no service reaches into another; a new edge
//! is a design decision, made here and in docs/ARCHITECTURE.md together. The crates that
//! must stay behind one module (the ZMQ library behind `transport`, the NATS client behind
//! `cluster`) are checked the same way over every Rust file of `src/`, the binary's and the
//! load generators' included, and over `benches/`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module → the crate modules it may use. `lib.rs` (the root) and `bin/` are not checked.
const ALLOWED: &[(&str, &[&str])] = &[
    // Shared, below every service.
    ("protocol", &[]),
    ("transport", &[]),
    ("net", &[]),
    ("memory", &[]),
    ("config", &["protocol"]),
    ("web", &["config"]),
    // The cluster's metrics are written with the one `/metrics` writer (web::exposition); the
    // one leader loop serves the service it elected as a `service::Running`.
    ("cluster", &["config", "service", "web"]),
    // The service skeleton (handle, start error, runner, configuration layers); its binds
    // write `host:port` as `net` does (IPv6 literals in brackets).
    ("service", &["net"]),
    // Clients of the services (linked by workers and load generators).
    ("worker", &["net", "protocol", "transport"]),
    // `bench route` scores its client-side policies with the router's own formula and runs
    // the router's core in process for `--overhead` (the router is what it measures).
    ("bench", &["protocol", "router", "transport"]),
    // The services: each may use the shared modules, never another service.
    (
        "controller",
        &[
            "cluster",
            "config",
            "net",
            "protocol",
            "service",
            "transport",
            "web",
        ],
    ),
    (
        "indexer",
        &[
            "cluster",
            "config",
            "memory",
            "net",
            "service",
            "transport",
            "web",
        ],
    ),
    (
        "coordinator",
        &["cluster", "config", "net", "service", "web"],
    ),
    // The router runs the indexer's index in process (the one service-to-service edge: a
    // router is the indexer's client, embedded); with `--cluster` its replicas share their
    // reservations through the cluster's compare-and-set bucket.
    (
        "router",
        &["cluster", "config", "indexer", "service", "web"],
    ),
    // The node reports what it holds as a worker does, through the worker library.
    (
        "node",
        &[
            "config",
            "net",
            "protocol",
            "service",
            "transport",
            "web",
            "worker",
        ],
    ),
];

/// External crate → the only `src/` module whose code may name it.
const CONFINED: &[(&str, &str)] = &[("zeromq", "transport"), ("async_nats", "cluster")];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether code (comments excluded) names the crate `name` as a path (`name::…`) or in a
/// `use name` / `extern crate name`.
fn names_crate(text: &str, name: &str) -> bool {
    text.lines().any(|line| {
        let code = line.split("//").next().unwrap_or("");
        code.match_indices(name).any(|(at, _)| {
            let before = code[..at].chars().next_back();
            let after = &code[at + name.len()..];
            let starts_word = !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            starts_word
                && (after.starts_with("::")
                    || (code[..at].trim_end().ends_with("use")
                        || code[..at].trim_end().ends_with("crate"))
                        && after.starts_with([';', ' ']))
        })
    })
}

/// The `crate::<name>` modules a source text uses, comments excluded.
fn crate_uses(text: &str) -> BTreeSet<String> {
    let mut uses = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let name: String = rest[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `crate::Server`-style items of the root are not modules.
            if name.starts_with(|c: char| c.is_ascii_lowercase()) {
                uses.insert(name);
            }
            rest = &rest[at + "crate::".len()..];
        }
    }
    uses
}

#[test]
fn modules_depend_only_in_the_documented_direction() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut checked = BTreeSet::new();
    let mut violations = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let first = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .expect("utf-8 path");
        let module = first.strip_suffix(".rs").unwrap_or(first);
        if module == "lib" || module == "bin" {
            continue;
        }
        let Some(ok) = allowed.get(module) else {
            violations.push(format!(
                "{}: module `{module}` is not in the table",
                rel.display()
            ));
            continue;
        };
        checked.insert(module);
        let text = std::fs::read_to_string(file).expect("read source");
        for used in crate_uses(&text) {
            if used != module && !ok.contains(&used.as_str()) {
                violations.push(format!("{}: uses crate::{used}", rel.display()));
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    // The check saw every module of the table, so a rename cannot make it vacuous.
    let expected: BTreeSet<&str> = allowed.keys().copied().collect();
    assert_eq!(checked, expected);
}

#[test]
fn confined_crates_are_named_only_by_their_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    rust_files(&root.join("benches"), &mut files);
    let mut violations = Vec::new();
    let mut seen = BTreeSet::new();
    for file in &files {
        let module = file
            .strip_prefix(&src)
            .ok()
            .and_then(|rel| rel.components().next())
            .and_then(|c| c.as_os_str().to_str())
            .map(|m| m.strip_suffix(".rs").unwrap_or(m));
        let text = std::fs::read_to_string(file).expect("read source");
        for &(krate, owner) in CONFINED {
            if names_crate(&text, krate) {
                if module == Some(owner) {
                    seen.insert(krate);
                } else {
                    violations.push(format!("{}: names `{krate}`", file.display()));
                }
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    // Each owner really uses its crate, so the scan cannot pass by seeing nothing.
    assert_eq!(seen.len(), CONFINED.len(), "{seen:?}");
}

#[test]
fn the_crate_scanner_sees_paths_and_uses_and_skips_comments_and_words() {
    assert!(names_crate("use zeromq::prelude::*;", "zeromq"));
    assert!(names_crate("let s = zeromq::PubSocket::new();", "zeromq"));
    assert!(names_crate("use async_nats;", "async_nats"));
    assert!(!names_crate("// zeromq::PubSocket", "zeromq"));
    assert!(!names_crate("let my_zeromq::x = 1;", "zeromq"));
    assert!(!names_crate("/// the `zeromq` crate", "zeromq"));
    assert!(!names_crate("let zeromq_like = 1;", "zeromq"));
}

#[test]
fn the_scanner_sees_uses_and_skips_comments() {
    let text = "use crate::web::serve;\n// crate::controller in a comment\nlet x = crate::net::host_port(a, b); // crate::node\nlet s = crate::Server::x;";
    let uses: Vec<String> = crate_uses(text).into_iter().collect();
    assert_eq!(uses, ["net", "web"]);
}

/// The five services, each laid out by docs/ARCHITECTURE.md's "One service anatomy".
const SERVICES: &[&str] = &["controller", "coordinator", "indexer", "node", "router"];

/// The route-declaring calls of `web::route` whose first argument is a path.
const ROUTE_CALLS: &[&str] = &["get(\"/", "post(\"/", "put(\"/", "delete(\"/"];

#[test]
fn every_service_has_the_one_anatomy() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut missing = Vec::new();
    for service in SERVICES {
        let dir = src.join(service);
        let has = |alternatives: &[&str]| alternatives.iter().any(|p| dir.join(p).exists());
        for (part, alternatives) in [
            ("mod.rs", &["mod.rs"][..]),
            ("config", &["config.rs", "config/mod.rs"][..]),
            ("model/", &["model/mod.rs"][..]),
            ("routes/", &["routes/mod.rs"][..]),
            ("metrics.rs", &["metrics.rs"][..]),
        ] {
            if !has(alternatives) {
                missing.push(format!("src/{service}/: no {part}"));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn path_attributes_are_for_test_files_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read source");
        for line in text.lines() {
            let line = line.trim();
            if let Some(rest) = line.strip_prefix("#[path = \"") {
                let target = rest.split('"').next().unwrap_or("");
                if !target.ends_with("_tests.rs") {
                    found.push(format!("{}: {line}", file.display()));
                }
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Every (method, path) a service declares, with the files that spell it in a route declaration.
fn declared_paths(dir: &Path) -> BTreeMap<String, Vec<String>> {
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    let mut paths: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in &files {
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with("_tests.rs") || name == "tests.rs" {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("read source");
        // Test modules at the end of a file declare their own little tables.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for call in ROUTE_CALLS.iter().chain(&[".route(\"/", "undocumented("]) {
            let method = call.split('(').next().unwrap_or("");
            for (at, _) in code.match_indices(call) {
                let open = at + call.find('(').unwrap_or(0);
                let rest = code[open..]
                    .trim_start_matches(|c: char| c != '"')
                    .trim_start_matches('"');
                let Some(path) = rest.split('"').next() else {
                    continue;
                };
                paths
                    .entry(format!("{method} {path}"))
                    .or_default()
                    .push(file.display().to_string());
            }
        }
    }
    paths
}

#[test]
fn each_route_path_is_written_once_per_service() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut repeated = Vec::new();
    let mut seen = 0;
    for service in SERVICES {
        for (path, places) in declared_paths(&src.join(service)) {
            seen += 1;
            if places.len() > 1 {
                repeated.push(format!(
                    "src/{service}: {path} declared {} times: {places:?}",
                    places.len()
                ));
            }
        }
    }
    assert!(repeated.is_empty(), "{}", repeated.join("\n"));
    // Each service declares routes, so a change of the declaration form cannot pass unseen.
    assert!(
        seen >= 30,
        "only {seen} route paths found: has the table's form changed?"
    );
}
