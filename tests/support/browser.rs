//! The dashboard browser checks: whether Debian's Chromium and playwright-core are there
//! (`scripts/setup-browser.sh` installs both), and one bounded run of a `tests/browser/*.mjs`
//! script whose last stdout line is a JSON report `{"ok": true, ...}`.

use super::process::Launch;
use serde_json::Value;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where a screenshot named `name` goes: `docs/` unless `KVPLANE_DASHBOARD_SCREENSHOT_DIR` says.
pub fn screenshot(name: &str) -> PathBuf {
    let dir = std::env::var_os("KVPLANE_DASHBOARD_SCREENSHOT_DIR")
        .map_or_else(|| repo().join("docs"), PathBuf::from);
    std::fs::create_dir_all(&dir).expect("screenshot folder");
    dir.join(name)
}

/// Whether the browser prerequisites are there; panics with instructions unless
/// `KVPLANE_SKIP_BROWSER=1` asks to skip.
pub fn ready() -> bool {
    let chromium = Path::new("/usr/bin/chromium").exists();
    let modules = repo()
        .join("tests/browser/node_modules/playwright-core")
        .exists();
    if chromium && modules {
        return true;
    }
    if std::env::var_os("KVPLANE_SKIP_BROWSER").is_some_and(|v| v == "1") {
        eprintln!("dashboard browser test skipped (KVPLANE_SKIP_BROWSER=1)");
        return false;
    }
    panic!(
        "the dashboard browser tests need /usr/bin/chromium (present: {chromium}) and \
         tests/browser/node_modules (present: {modules}): run `bash scripts/setup-browser.sh`, \
         or set KVPLANE_SKIP_BROWSER=1 to skip them"
    );
}

/// Runs `tests/browser/<script>` with `args` under node, killed after `deadline`; panics with
/// its output unless it exits 0 and its last JSON line says `"ok": true`. Returns that report.
pub async fn run(script: &str, args: &[OsString], deadline: Duration) -> Value {
    let out = Launch::new(&format!("node {script} (Node 20 needed)"), "node")
        .arg(repo().join("tests/browser").join(script))
        .args(args)
        .current_dir(repo().join("tests/browser"))
        .run(deadline)
        .await;
    println!("{}", out.stdout);
    eprintln!("{}", out.stderr);
    out.assert_success(script);
    let report: Value = out
        .stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .expect("the script prints a JSON report last");
    assert_eq!(report["ok"], true, "{report}");
    report
}
