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
