//! The regressions file (`chaos/regressions.txt`): every `(scenario, seed)` that ever broke an
//! invariant. Each line is `scenario seed [open]  # what it found`; `open` marks a finding not
//! fixed yet (replayed by `tidal-sim --regressions --open`, kept out of `make test` until fixed).
//! The file is compiled in, so every test binary replays the version it was built with.

/// The file's text.
pub const TEXT: &str = include_str!("../../regressions.txt");

/// One line of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Scenario name.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// Not fixed yet.
    pub open: bool,
    /// What it found (the comment).
    pub note: String,
}

/// Every entry of [`TEXT`].
pub fn entries() -> anyhow::Result<Vec<Entry>> {
    parse(TEXT)
}

/// Parses a regressions file.
pub fn parse(text: &str) -> anyhow::Result<Vec<Entry>> {
    let mut entries = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let (fields, note) = line.split_once('#').unwrap_or((line, ""));
        let fields: Vec<&str> = fields.split_whitespace().collect();
        let (scenario, seed, open) = match fields.as_slice() {
            [] => continue,
            [scenario, seed] => (scenario, seed, false),
            [scenario, seed, "open"] => (scenario, seed, true),
            _ => {
                anyhow::bail!("regressions.txt line {}: expected `scenario seed [open]`: {line}", number + 1)
            }
        };
        let seed = seed
            .parse()
            .map_err(|error| anyhow::anyhow!("regressions.txt line {}: seed {seed}: {error}", number + 1))?;
        entries.push(Entry { scenario: scenario.to_string(), seed, open, note: note.trim().to_string() });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines_comments_and_open_marks() {
        let entries = parse("# header\n\nchaos 3  # fixed\nchaos 59 open # liveness\n").unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(
            entries[0],
            Entry { scenario: "chaos".into(), seed: 3, open: false, note: "fixed".into() }
        );
        assert!(entries[1].open);
        assert!(parse("chaos x\n").is_err());
        assert!(parse("chaos 3 closed\n").is_err());
    }

    #[test]
    fn the_file_parses_and_names_known_scenarios() {
        for entry in entries().unwrap() {
            assert!(crate::Scenario::named(&entry.scenario).is_some(), "unknown scenario in {entry:?}");
        }
    }
}
