//! Repository tidiness that a reviewer would otherwise have to remember (issue 38). The repository
//! must stand on its own: a clone has only what is committed, so no file may lean on the
//! developers' reference folder beside the checkout, every `decisions/NNN` and `experiments/NNN` a
//! file cites must exist, and every repository path the docs link or name must exist. Heavy
//! dependencies stay in the crates that own them (`HEAVY_DEPENDENCIES`).

use std::path::{Path, PathBuf};

/// The repository's root (this crate is `chaos/process`).
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

/// The folders of numbered records (`docs/decisions/NNN-name.md`, `docs/experiments/NNN-name.md`):
/// decisions fix rules, formats, boundaries and contracts; experiments are measurement notes. A
/// note that moves from one to the other keeps its number, so each number names one file.
const RECORD_FOLDERS: &[&str] = &["decisions", "experiments"];

/// The file names in `docs/<folder>`.
fn records(folder: &str) -> Vec<String> {
    std::fs::read_dir(root().join("docs").join(folder))
        .map(|entries| {
            entries.flatten().map(|entry| entry.file_name().to_string_lossy().into_owned()).collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_cited_record_exists() {
    let mut missing = Vec::new();
    for folder in RECORD_FOLDERS {
        let records = records(folder);
        assert!(!records.is_empty(), "docs/{folder} is missing");
        let cited = format!("{folder}/");
        for file in text_files() {
            let Ok(text) = std::fs::read_to_string(&file) else { continue };
            for (number, line) in text.lines().enumerate() {
                for (at, _) in line.match_indices(&cited) {
                    let digits: String =
                        line[at + cited.len()..].chars().take_while(char::is_ascii_digit).collect();
                    if digits.len() == 3
                        && !records.iter().any(|record| record.starts_with(&format!("{digits}-")))
                    {
                        missing.push(format!("{}:{}: {folder}/{digits}", file.display(), number + 1));
                    }
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "cited records that do not exist (a record that moved keeps its number: cite its new folder):\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_record_number_names_one_file() {
    let mut numbers: Vec<(String, String)> = Vec::new();
    for folder in RECORD_FOLDERS {
        for record in records(folder) {
            let digits: String = record.chars().take_while(char::is_ascii_digit).collect();
            if digits.len() == 3 {
                numbers.push((digits, format!("docs/{folder}/{record}")));
            }
        }
    }
    numbers.sort();
    let twice: Vec<String> = numbers
        .windows(2)
        .filter(|pair| pair[0].0 == pair[1].0)
        .map(|pair| format!("{} and {}", pair[0].1, pair[1].1))
        .collect();
    assert!(twice.is_empty(), "record numbers used twice:\n{}", twice.join("\n"));
}

/// The folders at the repository's root that a path in the docs may start with.
const REPOSITORY_FOLDERS: &[&str] = &["docs/", "crates/", "chaos/", "bench/", "fuzz/", "proto/"];

/// The targets of the markdown links `[text](target)` in `line` that point into the repository:
/// no URLs, no mail, no anchor-only links; an anchor after a path is cut off.
fn markdown_links(line: &str) -> Vec<&str> {
    let mut links = Vec::new();
    for (at, _) in line.match_indices("](") {
        let rest = &line[at + 2..];
        let Some(end) = rest.find(')') else { continue };
        let target = rest[..end].split('#').next().unwrap_or_default().trim();
        if target.is_empty()
            || target.contains("://")
            || target.starts_with("mailto:")
            || target.contains(' ')
        {
            continue;
        }
        links.push(target);
    }
    links
}

/// The `docs/...` paths named in `line` (backticked or not), without a sentence's last dot. A
/// record citation (`docs/decisions/NNN`) is left to `every_cited_record_exists`.
fn docs_paths(line: &str) -> Vec<&str> {
    let path_char = |c: char| c.is_ascii_alphanumeric() || "_./-".contains(c);
    let mut paths = Vec::new();
    for (at, _) in line.match_indices("docs/") {
        if line[..at].chars().next_back().is_some_and(path_char) {
            continue; // part of a longer path or word: `../docs/`, `target/doc/`, `rustdocs/`
        }
        let length = line[at..].find(|c: char| !path_char(c)).unwrap_or(line.len() - at);
        let path = line[at..at + length].trim_end_matches(['.', '-']);
        let citation = RECORD_FOLDERS.iter().any(|folder| {
            path.strip_prefix(&format!("docs/{folder}/"))
                .is_some_and(|rest| rest.len() == 3 && rest.chars().all(|c| c.is_ascii_digit()))
        });
        if !citation && !is_pattern(&line[at..at + length]) {
            paths.push(path);
        }
    }
    paths
}

/// Whether a path-like word stands for many paths (`*`, `<name>`, `{a,b}`, `...`, `…`, `NNN`).
fn is_pattern(word: &str) -> bool {
    ["*", "<", "{", "...", "…", "$", "NNN"].iter().any(|pattern| word.contains(pattern))
}

/// The backticked words of `line` that are repository paths: they start with a root folder and
/// are not patterns ([`is_pattern`]). A `:line` suffix is cut off.
fn backticked_paths(line: &str) -> Vec<&str> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .filter(|word| REPOSITORY_FOLDERS.iter().any(|folder| word.starts_with(folder)))
        .filter(|word| !word.contains(char::is_whitespace))
        .filter(|word| !is_pattern(word))
        .map(|word| word.split(':').next().unwrap_or_default())
        .collect()
}

/// Paths the docs already name for a move under way (issue 38), each with the move: a named path
/// under one of them may be missing while the folder does not exist. Once it exists, its entry
/// must go, and every path under it is checked.
const PLANNED_PATHS: &[(&str, &str)] = &[];

/// Whether `path` (relative to the root) exists, or lies under a planned folder not there yet.
fn resolves(path: &str) -> bool {
    root().join(path).exists()
        || PLANNED_PATHS.iter().any(|(planned, _)| {
            (path == *planned || path.starts_with(&format!("{planned}/"))) && !root().join(planned).exists()
        })
}

#[test]
fn every_linked_or_named_repository_path_exists() {
    let mut missing: Vec<String> = PLANNED_PATHS
        .iter()
        .filter(|(planned, _)| root().join(planned).exists())
        .map(|(planned, why)| format!("{planned} exists now ({why}): take it off PLANNED_PATHS"))
        .collect();
    for file in text_files() {
        let relative = file.strip_prefix(root()).unwrap_or(&file).to_string_lossy().replace('\\', "/");
        let markdown = relative.ends_with(".md");
        if !markdown && !relative.ends_with(".rs") {
            continue;
        }
        // Records describe the code of their day: the files they name may have moved since. Their
        // links and the docs they name must still resolve.
        let record = RECORD_FOLDERS.iter().any(|folder| relative.starts_with(&format!("docs/{folder}/")));
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        let here = file.parent().map(Path::to_path_buf).unwrap_or_else(root);
        for (number, line) in text.lines().enumerate() {
            let mut unresolved = Vec::new();
            if markdown {
                unresolved
                    .extend(markdown_links(line).into_iter().filter(|target| !here.join(target).exists()));
            }
            unresolved.extend(docs_paths(line).into_iter().filter(|path| !resolves(path)));
            if !record {
                unresolved.extend(backticked_paths(line).into_iter().filter(|path| !resolves(path)));
            }
            for path in unresolved {
                missing.push(format!("{relative}:{}: {path}", number + 1));
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(missing.is_empty(), "links and repository paths that lead nowhere:\n{}", missing.join("\n"));
}

/// A heavy dependency and the crates that own it. `exceptions` are the crates that depend on it
/// today against the rule, each with the reason: they may only go. An exception that no longer
/// depends on it fails the test too, so that the list shrinks with the code.
struct Owned {
    dependency: &'static str,
    owners: &'static [&'static str],
    exceptions: &'static [(&'static str, &'static str)],
}

/// Which crates (package names, so that a crate may move folders) may depend on which heavy
/// dependency, in any dependency section: normal, dev or build.
const HEAVY_DEPENDENCIES: &[Owned] = &[
    // Terms, votes and membership: the control plane.
    Owned { dependency: "openraft", owners: &["tidal-cluster"], exceptions: &[] },
    // The inter-node transport and its generated code.
    Owned { dependency: "tonic", owners: &["tidal-net"], exceptions: &[] },
    Owned { dependency: "tonic-prost", owners: &["tidal-net"], exceptions: &[] },
    Owned { dependency: "tonic-prost-build", owners: &["tidal-net"], exceptions: &[] },
    Owned { dependency: "protox", owners: &["tidal-net"], exceptions: &[] },
    Owned {
        dependency: "prost",
        owners: &["tidal-net"],
        exceptions: &[("tidal-fuzz", "the rpc target decodes raw fuzz input as protobuf messages")],
    },
    // The engine's store: fjall is a materialization of the log, known only to the engine.
    Owned {
        dependency: "fjall",
        owners: &["tidal-core"],
        exceptions: &[(
            "tidal-cli",
            "dev-dependency: t40_process_crash opens a stopped node's engine to see its tables",
        )],
    },
    Owned { dependency: "rayon-core", owners: &["tidal-core"], exceptions: &[] },
    // Test tooling: the simulation and the model check.
    Owned { dependency: "turmoil", owners: &["tidal-sim"], exceptions: &[] },
    Owned { dependency: "stateright", owners: &["tidal-model", "tidal-sim"], exceptions: &[] },
    // The HTTP API.
    Owned { dependency: "axum", owners: &["tidal-server"], exceptions: &[] },
    // The command line: the binaries' crates only (the server and the network chaos harness).
    Owned {
        dependency: "clap",
        owners: &["tidal-cli", "tidal-netchaos"],
        exceptions: &[(
            "tidal-server",
            "config.rs derives the `serve` flags (ServeArgs) beside the ServeConfig they fill",
        )],
    },
];

/// The package name of a `Cargo.toml` and its dependencies as `(name, section)`: every table whose
/// name ends in `dependencies` (but not the workspace's list of versions), in either form,
/// `name = ...` lines or `[dependencies.name]` tables.
fn manifest(text: &str) -> (Option<String>, Vec<(String, String)>) {
    let mut package = None;
    let mut dependencies = Vec::new();
    let mut section = String::new();
    for line in text.lines().map(|line| line.split('#').next().unwrap_or_default().trim()) {
        if let Some(header) = line.strip_prefix('[') {
            section = header.trim_end_matches(']').trim().to_string();
            let last = section.rsplit('.').next().unwrap_or_default();
            if section.contains("dependencies.") && !section.starts_with("workspace.") {
                let table = section.rsplit_once('.').map(|(table, _)| table).unwrap_or_default();
                dependencies.push((last.trim_matches('"').to_string(), table.to_string()));
            }
            continue;
        }
        let Some((key, value)) = line.split_once('=') else { continue };
        let key = key.trim();
        if section == "package" && key == "name" {
            package = Some(value.trim().trim_matches('"').to_string());
        } else if section.ends_with("dependencies") && !section.starts_with("workspace.") {
            let name = key.split('.').next().unwrap_or_default().trim_matches('"');
            dependencies.push((name.to_string(), section.clone()));
        }
    }
    (package, dependencies)
}

#[test]
fn heavy_dependencies_stay_in_their_crates() {
    let mut wrong = Vec::new();
    let mut used_exceptions: Vec<(&str, &str)> = Vec::new();
    let mut manifests = 0;
    for file in text_files().into_iter().filter(|path| path.ends_with("Cargo.toml")) {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        let (Some(package), dependencies) = manifest(&text) else { continue };
        manifests += 1;
        let relative = file.strip_prefix(root()).unwrap_or(&file).to_string_lossy().into_owned();
        for (dependency, section) in dependencies {
            let Some(rule) = HEAVY_DEPENDENCIES.iter().find(|rule| rule.dependency == dependency) else {
                continue;
            };
            if rule.owners.contains(&package.as_str()) {
                continue;
            }
            match rule.exceptions.iter().find(|(name, _)| *name == package) {
                Some((name, _)) => used_exceptions.push((rule.dependency, *name)),
                None => wrong.push(format!(
                    "{relative}: {package} depends on {dependency} ([{section}]); only {} may",
                    rule.owners.join(", ")
                )),
            }
        }
    }
    assert!(manifests >= 10, "found only {manifests} crate manifests: is the walk broken?");
    for rule in HEAVY_DEPENDENCIES {
        for (name, _) in rule.exceptions {
            if !used_exceptions
                .iter()
                .any(|(dependency, crate_name)| *dependency == rule.dependency && crate_name == name)
            {
                wrong.push(format!(
                    "{name} no longer depends on {}: take it off its exceptions in HEAVY_DEPENDENCIES",
                    rule.dependency
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "heavy dependencies outside the crates that own them (move the code, or list an exception with its reason):\n{}",
        wrong.join("\n")
    );
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
const LONG_FUNCTIONS: &[(&str, &str, usize)] = &[];

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

/// Library code that still returns its errors as text, by file and count: each may only shrink
/// (issue 38: one error enum per crate, with values). Everything else says what went wrong in a type.
const STRING_ERRORS: &[(&str, usize)] = &[
    // Reasons of a damaged hard-negatives state, wrapped by the caller.
    ("crates/tidal-core/src/negatives.rs", 2),
    // A snapshot stream's entry checks, turned into the install's error by their one caller.
    ("crates/tidal-core/src/snapshot.rs", 3),
    ("crates/tidal-core/src/flusher.rs", 1),
    // A ship's shape check: its text is the refusal's reason, which travels in the answer.
    ("crates/tidal-protocol/src/follower.rs", 1),
    ("crates/tidal-wal/src/wal.rs", 1),
    ("crates/tidal-wal/src/wal_meta.rs", 1),
    ("crates/tidal-wal/src/quarantine.rs", 1),
];

#[test]
fn library_errors_are_types_not_strings() {
    let mut found = Vec::new();
    for file in production_sources() {
        let relative = file.strip_prefix(root()).unwrap_or(&file).to_string_lossy().into_owned();
        if !relative.contains("crates/") || relative.contains("/src/bin/") || relative.ends_with("main.rs") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        // `, String>` closing the Result (not `Map<K, String>>` inside its Ok type).
        let closes =
            |line: &str| [", String> ", ", String>,", ", String>)"].iter().any(|end| line.contains(end));
        let count = code.lines().filter(|line| line.contains("Result<") && closes(line)).count();
        let allowed = STRING_ERRORS.iter().find(|(path, _)| relative.ends_with(path)).map_or(0, |(_, n)| *n);
        if count > allowed {
            found.push(format!("{relative}: {count} Result<_, String> (allowed {allowed})"));
        } else if count < allowed {
            found.push(format!(
                "{relative}: {count} Result<_, String> now: lower its entry in STRING_ERRORS to {count}"
            ));
        }
    }
    assert!(
        found.is_empty(),
        "errors as text in library code (return the crate's error enum):\n{}",
        found.join("\n")
    );
}
