//! Repository tidiness that a reviewer would otherwise have to remember (issue 38). The repository
//! must stand on its own: a clone has only what is committed, so no file may lean on the
//! developers' reference folder beside the checkout, and every `decisions/NNN` a file cites must
//! exist.

use std::path::{Path, PathBuf};

/// The repository's root (this crate is `harness/process`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every committed-looking text file: sources, docs, scripts, manifests (no build output, no
/// dependencies' folders, no git internals).
fn text_files() -> Vec<PathBuf> {
    let skip = ["target", ".git", "node_modules", ".venv", "results", "__pycache__", "fuzz/artifacts"];
    let kinds = ["rs", "md", "toml", "sh", "py", "txt", "yml", "yaml", "json", "html", "js"];
    let mut files = Vec::new();
    let mut stack = vec![root()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !skip.contains(&name.as_str()) {
                    stack.push(path);
                }
            } else if name == "Makefile"
                || path.extension().is_some_and(|ext| kinds.iter().any(|k| ext == *k))
            {
                files.push(path);
            }
        }
    }
    files
}

#[test]
fn no_file_leans_on_a_folder_outside_the_repository() {
    // Spelled in two halves so that this file does not name it.
    let outside = format!("../{}", "shared");
    let mut found = Vec::new();
    for file in text_files() {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        for (number, line) in text.lines().enumerate() {
            if line.contains(&outside) {
                found.push(format!("{}:{}: {}", file.display(), number + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "a clone has no {outside}: keep what the project needs inside it (docs/PROTOCOL.md, bench/peers/):\n{}",
        found.join("\n")
    );
}

#[test]
fn every_cited_decision_record_exists() {
    let records: Vec<String> = std::fs::read_dir(root().join("docs/decisions"))
        .map(|entries| {
            entries.flatten().map(|entry| entry.file_name().to_string_lossy().into_owned()).collect()
        })
        .unwrap_or_default();
    assert!(!records.is_empty(), "docs/decisions is missing");
    let mut missing = Vec::new();
    for file in text_files() {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        for (number, line) in text.lines().enumerate() {
            for (at, _) in line.match_indices("decisions/") {
                let digits: String =
                    line[at + "decisions/".len()..].chars().take_while(char::is_ascii_digit).collect();
                if digits.len() == 3
                    && !records.iter().any(|record| record.starts_with(&format!("{digits}-")))
                {
                    missing.push(format!("{}:{}: decisions/{digits}", file.display(), number + 1));
                }
            }
        }
    }
    assert!(missing.is_empty(), "cited decision records that do not exist:\n{}", missing.join("\n"));
}

/// Production source files: every crate's `src/` (tests, benches, examples and the harness are
/// tooling and excluded).
fn production_sources() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = text_files()
        .into_iter()
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .filter(|path| {
            let relative = path.strip_prefix(root()).unwrap_or(path).to_string_lossy().replace('\\', "/");
            let relative = relative.trim_start_matches("./");
            relative.starts_with("crates/") && relative.contains("/src/")
        })
        .collect();
    files.sort();
    files
}

/// The functions of a rustfmt-formatted file with their length in lines: a function starts at a
/// line whose code begins with `fn`, `pub fn`, `async fn` and the like, and ends at the first
/// later line that is its indentation followed by `}`. `#[cfg(test)]` modules are skipped.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut index = 0;
    while index < lines.len() {
        let line = lines[index];
        if line.trim_start() == "#[cfg(test)]" {
            break; // test modules come last in this code base's files
        }
        let code = line.trim_start();
        let words: Vec<&str> = code.split_whitespace().collect();
        let fn_at = words.iter().position(|word| *word == "fn");
        let is_fn = fn_at.is_some_and(|at| {
            at + 1 < words.len()
                && words[..at].iter().all(|word| {
                    matches!(
                        *word,
                        "pub" | "pub(crate)" | "pub(super)" | "async" | "const" | "unsafe" | "extern"
                    )
                })
        });
        if let (true, Some(at)) = (is_fn, fn_at) {
            let indent = &line[..line.len() - code.len()];
            let name = words[at + 1].split(['(', '<']).next().unwrap_or_default().to_string();
            let end = (index..lines.len())
                .find(|&i| lines[i] == format!("{indent}}}") || lines[i].ends_with(';') && i == index);
            if let Some(end) = end {
                found.push((name, index + 1, end - index + 1));
                index = end + 1;
                continue;
            }
        }
        index += 1;
    }
    found
}

/// Production functions longer than [`FUNCTION_LINES_MAX`] when the limit came in (issue 38), with
/// their length then: each may only shrink, and leaves this list once it fits.
const LONG_FUNCTIONS: &[(&str, &str, usize)] = &[
    ("crates/tidal-cluster/src/replica/members.rs", "change_members", 141),
    ("crates/tidal-cluster/src/replica/office.rs", "take_office", 156),
    ("crates/tidal-cluster/src/replica/promote.rs", "promote", 132),
    ("crates/tidal-cluster/src/replica.rs", "ship_queue", 122),
    ("crates/tidal-cluster/src/replica.rs", "receive_from", 126),
    ("crates/tidal-model/src/model.rs", "receive", 118),
];

/// The longest a production function may be, in lines (issue 38; the aim is 70).
const FUNCTION_LINES_MAX: usize = 100;

#[test]
fn no_production_function_grows_past_the_limit() {
    let mut over = Vec::new();
    let mut still_long = Vec::new();
    for file in production_sources() {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        let relative = file.strip_prefix(root()).unwrap_or(&file).to_string_lossy().into_owned();
        for (name, line, length) in functions(&text) {
            if length <= FUNCTION_LINES_MAX {
                continue;
            }
            let allowed = LONG_FUNCTIONS
                .iter()
                .find(|(path, function, _)| relative.ends_with(path) && *function == name)
                .map(|(_, _, then)| *then);
            if allowed.is_some() {
                still_long.push(name.clone());
            }
            match allowed {
                Some(then) if length <= then => {}
                _ => {
                    over.push(format!("{relative}:{line}: fn {name} is {length} lines (allowed {allowed:?})"))
                }
            }
        }
    }
    for (path, function, _) in LONG_FUNCTIONS {
        if !still_long.iter().any(|name| name == function) {
            over.push(format!("{path}: fn {function} fits now (or is gone): take it off LONG_FUNCTIONS"));
        }
    }
    assert!(
        over.is_empty(),
        "functions over {FUNCTION_LINES_MAX} lines (split them; a listed one may only shrink):\n{}",
        over.join("\n")
    );
}

/// The crates and files that may read the process environment: the server's configuration, the
/// `tidal` binary and its tooling (tidal-cli), the model's switches, test harnesses. Library code
/// takes what it needs as configuration (decisions/060).
const ENV_READERS: &[&str] =
    &["crates/tidal-server/src/config.rs", "crates/tidal-cli/src/", "crates/tidal-model/src/"];

#[test]
fn library_crates_read_no_environment() {
    let mut found = Vec::new();
    for file in production_sources() {
        let relative = file.strip_prefix(root()).unwrap_or(&file).to_string_lossy().into_owned();
        if ENV_READERS.iter().any(|allowed| relative.contains(allowed)) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if code.contains("env::var") || code.contains("env!(\"TIDAL") {
                found.push(format!("{relative}:{}: {}", number + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "library code reads the environment; make it configuration:\n{}",
        found.join("\n")
    );
}
