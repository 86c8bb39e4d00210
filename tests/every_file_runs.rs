//! Every test and bench file runs: the integration tests and benches live at the top of the
//! repository and belong to `app/`, whose manifest lists them one by one (`autotests` cannot
//! reach outside the package). A file that is not listed would never build or run, so a new
//! `tests/x.rs` or `benches/x.rs` that is not declared fails this test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::Path;

/// The `.rs` files directly inside `dir` (helpers live in subfolders such as `tests/common`).
fn files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

/// The files of `folder` that `app/Cargo.toml` declares as `path = "../<folder>/x.rs"`.
fn declared(manifest: &str, folder: &str) -> BTreeSet<String> {
    let prefix = format!("path = \"../{folder}/");
    manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix(prefix.as_str()))
        .filter_map(|rest| rest.strip_suffix('"'))
        .filter(|name| !name.contains('/'))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_test_and_bench_file_is_declared_in_the_app_manifest() {
    let app = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(app.join("Cargo.toml")).unwrap();
    for folder in ["tests", "benches"] {
        let on_disk = files(&app.join("..").join(folder));
        let listed = declared(&manifest, folder);
        let missing: Vec<_> = on_disk.difference(&listed).collect();
        let stale: Vec<_> = listed.difference(&on_disk).collect();
        assert!(
            missing.is_empty() && stale.is_empty(),
            "{folder}/: not declared in app/Cargo.toml (so never run): {missing:?}; declared but absent: {stale:?}"
        );
        assert!(on_disk.len() > 5, "{folder}/ looks empty: {on_disk:?}");
    }
}
