//! The protocol crate's boundary, held by a test (issue 38): the decisions depend on the vocabulary
//! only, so the model check (tidal-model) can drive them without any of the runtime, and nothing in
//! them can do I/O, read the environment or the clock. A dependency added to either crate, or a
//! call into the environment, fails here with what to do instead.

use std::path::{Path, PathBuf};

/// The repository's root (this crate is `crates/tidal-protocol`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The names in the `[dependencies]` table of a crate's manifest (not dev or build dependencies).
fn dependencies(krate: &str) -> Vec<String> {
    let manifest = root().join("crates").join(krate).join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .unwrap_or_else(|error| panic!("read {}: {error}", manifest.display()));
    let mut inside = false;
    let mut names = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
            continue;
        }
        if inside && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['=', '.', ' ']).next().unwrap_or_default();
            names.push(name.to_string());
        }
    }
    names
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries =
            std::fs::read_dir(&dir).unwrap_or_else(|error| panic!("list {}: {error}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files
}

#[test]
fn the_protocol_depends_on_the_vocabulary_only() {
    assert_eq!(
        dependencies("tidal-protocol"),
        ["tidal-types"],
        "tidal-protocol holds pure decisions: their inputs come from tidal-types; I/O belongs in tidal-cluster"
    );
}

#[test]
fn the_model_drives_the_protocol_and_nothing_of_the_runtime() {
    let ours: Vec<String> =
        dependencies("tidal-model").into_iter().filter(|name| name.starts_with("tidal-")).collect();
    assert_eq!(
        ours,
        ["tidal-types", "tidal-protocol"],
        "the model check explores tidal-protocol's decisions; a rule it needs from the runtime moves into tidal-protocol"
    );
}

#[test]
fn the_protocol_reads_no_environment_clock_or_files() {
    let forbidden = ["std::env", "std::fs", "std::net", "Instant::now", "SystemTime", "std::thread"];
    for file in sources(&root().join("crates/tidal-protocol/src")) {
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|error| panic!("read {}: {error}", file.display()));
        for (number, line) in text.lines().enumerate() {
            for word in forbidden {
                assert!(
                    !line.contains(word),
                    "{}:{}: `{word}` in a decision; pass what it needs as an argument",
                    file.display(),
                    number + 1
                );
            }
        }
    }
}
