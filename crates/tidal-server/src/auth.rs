//! Bearer tokens with scopes, from a token file.
//!
//! Tokens are compared in constant time (by BLAKE3 digest, then a length-independent compare), so
//! response timing says nothing about how much of a guess was right. Without a token file every route
//! is open; `serve` allows that only on loopback unless told `--insecure`.

use anyhow::Context;
use serde::Deserialize;
use std::path::Path;

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Read routes.
    Read,
    /// Write routes.
    Write,
    /// Operator routes.
    Admin,
    /// Inbox receive and ack.
    Receive,
    /// Inbox discard and close.
    InboxAdmin,
}

/// Who made a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// Token name (logged in every batch envelope); `anonymous` without a token file.
    pub name: String,
    scopes: Vec<Scope>,
    /// Owners whose inboxes the inbox routes may touch: glob patterns (`*` matches any run of
    /// characters); every owner when the token file says nothing.
    inbox_owners: Vec<String>,
}

impl Principal {
    /// The principal of an open node.
    pub fn anonymous() -> Principal {
        Principal {
            name: "anonymous".into(),
            scopes: vec![Scope::Read, Scope::Write, Scope::Admin],
            inbox_owners: vec!["*".into()],
        }
    }

    /// The node itself, for the writes it makes on its own (retention trims): `name` is logged in
    /// the batch envelope. Names under the reserved prefix cannot be token names.
    pub fn system(name: &str) -> Principal {
        Principal {
            name: name.into(),
            scopes: vec![Scope::Write, Scope::InboxAdmin],
            inbox_owners: vec!["*".into()],
        }
    }

    /// Whether this principal holds `scope` (admin implies every scope).
    pub fn allows(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope) || self.scopes.contains(&Scope::Admin)
    }

    /// Whether the inbox routes may touch `owner`'s inbox for this principal.
    pub fn may_use_inbox(&self, owner: &str) -> bool {
        self.inbox_owners.iter().any(|pattern| glob_matches(pattern, owner))
    }
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters (none included) and
/// every other character itself.
pub fn glob_matches(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else { return rest.is_empty() };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    token: Vec<TokenEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    token: String,
    scopes: Vec<String>,
    #[serde(default)]
    inbox_owners: Option<Vec<String>>,
}

struct Token {
    digest: [u8; 32],
    principal: Principal,
}

/// The tokens a node accepts, and the rate limit on logging the requests they refuse.
pub struct Tokens {
    tokens: Vec<Token>,
    /// Refusals happen only where tokens are checked, so the limit lives with them.
    pub refusals: RefusalLimit,
}

/// Why a request was not let in.
#[derive(Debug, PartialEq, Eq)]
pub enum AuthError {
    /// No bearer token (401).
    Missing,
    /// A token no entry of the file holds (401).
    Unknown,
    /// The token `name` lacks `scope` (403).
    Forbidden {
        /// The token's name (never its value).
        name: String,
        /// The scope the route needs.
        scope: Scope,
    },
}

impl AuthError {
    /// Whether the answer is 401 (else 403).
    pub fn unauthorized(&self) -> bool {
        matches!(self, AuthError::Missing | AuthError::Unknown)
    }

    /// The reason, for the refusal log: no token value in it.
    pub fn reason(&self) -> String {
        match self {
            AuthError::Missing => "no bearer token".into(),
            AuthError::Unknown => "unknown token".into(),
            AuthError::Forbidden { scope, .. } => format!("token lacks the {scope:?} scope"),
        }
    }

    /// The token's name, when it was a known token.
    pub fn token_name(&self) -> Option<&str> {
        match self {
            AuthError::Forbidden { name, .. } => Some(name),
            AuthError::Missing | AuthError::Unknown => None,
        }
    }
}

impl Tokens {
    /// Reads a token file: `[[token]]` tables with `name`, `token` (at least 16 bytes), `scopes`
    /// and optionally `inbox_owners` (glob patterns). The file must not be readable by group or
    /// others ([`read_private_file`]).
    pub fn load(path: &Path) -> anyhow::Result<Tokens> {
        let text = read_private_file(path, "token file")?;
        Tokens::parse(&text).with_context(|| format!("parse token file {}", path.display()))
    }

    /// Parses token file text. No error quotes a token: a TOML error is reduced to its line and
    /// column ([`toml_error_without_values`]), and every other names the token by its `name`.
    pub fn parse(text: &str) -> anyhow::Result<Tokens> {
        let file: TokenFile =
            toml::from_str(text).map_err(|error| toml_error_without_values(text, &error))?;
        anyhow::ensure!(!file.token.is_empty(), "no tokens");
        let mut tokens: Vec<Token> = Vec::new();
        for entry in file.token {
            anyhow::ensure!(!entry.name.is_empty(), "a token has an empty name");
            anyhow::ensure!(entry.token.len() >= 16, "token {:?} is shorter than 16 bytes", entry.name);
            // A presented token is trimmed before it is compared, so this one could never match.
            anyhow::ensure!(
                entry.token.trim() == entry.token,
                "token {:?} has leading or trailing whitespace (it could never match)",
                entry.name
            );
            let digest = *blake3::hash(entry.token.as_bytes()).as_bytes();
            for other in &tokens {
                anyhow::ensure!(other.principal.name != entry.name, "two tokens are named {:?}", entry.name);
                // Only one principal may own a value: with two, which one a request got would
                // depend on the file's order (a read token could be an admin one).
                anyhow::ensure!(
                    other.digest != digest,
                    "tokens {:?} and {:?} have the same value",
                    other.principal.name,
                    entry.name
                );
            }
            let scopes = parse_scopes(&entry.name, &entry.scopes)?;
            let inbox_owners = entry.inbox_owners.unwrap_or_else(|| vec!["*".into()]);
            tokens.push(Token { digest, principal: Principal { name: entry.name, scopes, inbox_owners } });
        }
        Ok(Tokens {
            tokens,
            refusals: RefusalLimit::new(REFUSAL_LINES_PER_SECOND, std::time::Duration::from_secs(1)),
        })
    }

    /// Checks an `Authorization` header value against `scope`.
    pub fn check(&self, authorization: Option<&str>, scope: Scope) -> Result<Principal, AuthError> {
        let presented =
            authorization.and_then(|value| value.strip_prefix("Bearer ")).ok_or(AuthError::Missing)?;
        let digest = blake3::hash(presented.trim().as_bytes());
        // blake3::Hash's equality is constant time; scan every token so the position of a match
        // does not show either.
        let mut found: Option<&Principal> = None;
        for token in &self.tokens {
            if blake3::Hash::from(token.digest) == digest {
                found = Some(&token.principal);
            }
        }
        let principal = found.ok_or(AuthError::Unknown)?;
        if principal.allows(scope) {
            Ok(principal.clone())
        } else {
            Err(AuthError::Forbidden { name: principal.name.clone(), scope })
        }
    }
}

/// How many refusal lines a node logs per [`RefusalLimit`] window (one second).
pub const REFUSAL_LINES_PER_SECOND: u32 = 10;

/// The rate limit on the refusal log (401 and 403 answers are logged at WARN): a client trying
/// tokens, or one misconfigured, must not flood the log.
pub type RefusalLimit = tidal_types::LogLimit;

fn parse_scopes(name: &str, scopes: &[String]) -> anyhow::Result<Vec<Scope>> {
    scopes
        .iter()
        .map(|scope| match scope.as_str() {
            "read" => Ok(Scope::Read),
            "write" => Ok(Scope::Write),
            "admin" => Ok(Scope::Admin),
            "receive" => Ok(Scope::Receive),
            "inbox_admin" => Ok(Scope::InboxAdmin),
            other => Err(anyhow::anyhow!("token {name:?} has unknown scope {other:?}")),
        })
        .collect()
}

/// A TOML error as its line and column and the parser's words with every quoted string left out:
/// the toml crate's own rendering shows the offending line, and a message may quote a value; in a
/// token file either can be a token, which must never reach a log.
fn toml_error_without_values(text: &str, error: &toml::de::Error) -> anyhow::Error {
    let message = without_quoted(error.message());
    match error.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |tail| tail.chars().count()) + 1;
            anyhow::anyhow!("invalid TOML at line {line}, column {column}: {message}")
        }
        None => anyhow::anyhow!("invalid TOML: {message}"),
    }
}

/// `text` with the contents of each double- or single-quoted run replaced by `…`.
fn without_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut open: Option<char> = None;
    for c in text.chars() {
        match open {
            Some(quote) if c == quote => {
                out.push(c);
                open = None;
            }
            Some(_) => {}
            None if c == '"' || c == '\'' => {
                out.push(c);
                out.push('…');
                open = Some(c);
            }
            None => out.push(c),
        }
    }
    out
}

/// Reads a file that holds credentials (a token file, the cluster secret): one that group or
/// others may read is refused, naming the file, its mode and the fix. The mode is taken from the
/// opened file, so it is the mode of what is read. `what` names the file in errors.
pub fn read_private_file(path: &Path, what: &str) -> anyhow::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).with_context(|| format!("read {what} {}", path.display()))?;
    check_private(&file, path, what)?;
    let mut text = String::new();
    file.read_to_string(&mut text).with_context(|| format!("read {what} {}", path.display()))?;
    Ok(text)
}

#[cfg(unix)]
fn check_private(file: &std::fs::File, path: &Path, what: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode =
        file.metadata().with_context(|| format!("stat {what} {}", path.display()))?.permissions().mode();
    anyhow::ensure!(
        mode & 0o077 == 0,
        "{what} {} has mode {:04o}: group or others may read it. Run `chmod 600 {}` (only its owner \
         may read it)",
        path.display(),
        mode & 0o7777,
        path.display()
    );
    Ok(())
}

#[cfg(not(unix))]
fn check_private(_file: &std::fs::File, _path: &Path, _what: &str) -> anyhow::Result<()> {
    Ok(())
}

/// Writes a file that holds credentials readable and writable by its owner only (mode 0600, set
/// when the file is created, so it is never readable by others for a moment). An existing file is
/// truncated and keeps its mode; [`read_private_file`] refuses it if that lets others read it.
pub fn write_private_file(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(contents)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
[[token]]
name = "ingest"
token = "ingest-token-0123456789"
scopes = ["read", "write"]

[[token]]
name = "ops"
token = "ops-token-0123456789abc"
scopes = ["admin"]
"#;

    #[test]
    fn scopes_are_enforced_and_admin_implies_all() {
        let tokens = Tokens::parse(FILE).unwrap();
        let ingest = tokens.check(Some("Bearer ingest-token-0123456789"), Scope::Write).unwrap();
        assert_eq!(ingest.name, "ingest");
        assert_eq!(
            tokens.check(Some("Bearer ingest-token-0123456789"), Scope::Admin),
            Err(AuthError::Forbidden { name: "ingest".into(), scope: Scope::Admin })
        );
        assert!(tokens.check(Some("Bearer ops-token-0123456789abc"), Scope::Write).is_ok());
        assert_eq!(tokens.check(Some("Bearer nope-nope-nope-nope"), Scope::Read), Err(AuthError::Unknown));
        assert_eq!(tokens.check(None, Scope::Read), Err(AuthError::Missing));
        assert_eq!(tokens.check(Some("ingest-token-0123456789"), Scope::Read), Err(AuthError::Missing));
    }

    #[test]
    fn bad_files_are_refused() {
        assert!(Tokens::parse("").is_err());
        assert!(Tokens::parse("[[token]]\nname = \"a\"\ntoken = \"short\"\nscopes = [\"read\"]\n").is_err());
        assert!(Tokens::parse(
            "[[token]]\nname = \"a\"\ntoken = \"long-enough-token-x\"\nscopes = [\"root\"]\n"
        )
        .is_err());
    }

    /// Owner patterns: `*` matches any run, everything else itself; a token without patterns
    /// reaches every inbox, one with patterns only the owners they match.
    #[test]
    fn inbox_owner_patterns() {
        for (pattern, text, expected) in [
            ("*", "anything", true),
            ("agent-*", "agent-7", true),
            ("agent-*", "user-7", false),
            ("*-eu", "shop-eu", true),
            ("a*b*c", "a-x-b-y-c", true),
            ("a*b*c", "a-x-c-y-b", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("ab*ba", "aba", false),
        ] {
            assert_eq!(glob_matches(pattern, text), expected, "{pattern} on {text}");
        }
        let file = "[[token]]\nname = \"a\"\ntoken = \"long-enough-token-x\"\nscopes = [\"write\", \"receive\"]\ninbox_owners = [\"agent-*\"]\n";
        let tokens = Tokens::parse(file).unwrap();
        let principal = tokens.check(Some("Bearer long-enough-token-x"), Scope::Receive).unwrap();
        assert!(principal.may_use_inbox("agent-1") && !principal.may_use_inbox("user-1"));
        assert!(Principal::anonymous().may_use_inbox("anyone"));
    }

    /// A token file's errors name tokens by their names and places by line and column: the values
    /// never appear, not even where the TOML itself is broken on the token's line.
    #[test]
    fn errors_never_quote_a_token() {
        const VALUE: &str = "leaky-value-7f3a9c2e51";
        let entry = |name: &str, value: &str| {
            format!("[[token]]\nname = \"{name}\"\ntoken = \"{value}\"\nscopes = [\"read\"]\n")
        };
        let cases = [
            (format!("{}{}", entry("a", VALUE), entry("b", VALUE)), "same value"),
            (format!("{}{}", entry("a", VALUE), entry("a", "another-value-0123456")), "named"),
            (entry("a", &format!(" {VALUE}")), "whitespace"),
            (entry("a", &format!("{VALUE}\t")), "whitespace"),
            (format!("[[token]]\nname = \"a\"\ntoken = \"{VALUE}\" scopes\n"), "line 3"),
            (format!("[[token]]\nname = \"a\"\ntoken = \"{VALUE}\nscopes = []\n"), "line 3"),
            (format!("[[token]]\nname = \"a\"\ntoken = [\"{VALUE}\"]\nscopes = []\n"), "line 3"),
            (format!("[[token]]\nname = \"a\"\ntoken = \"x\"\nscopes = \"{VALUE}\"\n"), "line 4"),
        ];
        for (text, expected) in cases {
            let error = format!("{:#}", Tokens::parse(&text).err().expect("refused"));
            assert!(error.contains(expected), "{error}");
            assert!(!error.contains(VALUE) && !error.contains("7f3a9c"), "the token leaked: {error}");
        }
    }

    /// Only the owner may read a token file; the refusal names the file, its mode and the fix.
    #[cfg(unix)]
    #[test]
    fn a_token_file_others_may_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        write_private_file(&path, FILE.as_bytes()).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(Tokens::load(&path).is_ok());
        for mode in [0o640, 0o604, 0o644] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let error = format!("{:#}", Tokens::load(&path).err().expect("refused"));
            assert!(error.contains(&path.display().to_string()), "{error}");
            assert!(error.contains(&format!("{mode:04o}")), "{error}");
            assert!(error.contains(&format!("chmod 600 {}", path.display())), "{error}");
        }
    }

    /// At most `lines` lines per window; the suppressed ones are counted and reported with the
    /// next line written, in a later window.
    #[test]
    fn refusal_lines_are_rate_limited_and_suppressions_counted() {
        let limit = RefusalLimit::new(3, std::time::Duration::from_secs(1));
        let start = std::time::Instant::now();
        let at = |ms: u64| start + std::time::Duration::from_millis(ms);
        let first: Vec<_> = (0..10).map(|i| limit.admit(at(i * 10))).collect();
        assert_eq!(&first[..3], &[Some(0), Some(0), Some(0)]);
        assert!(first[3..].iter().all(Option::is_none), "{first:?}");
        assert_eq!(limit.admit(at(999)), None);
        assert_eq!(limit.admit(at(1000)), Some(8), "the next window reports the 8 suppressed");
        assert_eq!(limit.admit(at(1001)), Some(0));
        assert_eq!(limit.admit(at(1002)), Some(0));
        assert_eq!(limit.admit(at(1003)), None);
        assert_eq!(limit.admit(at(5000)), Some(1));
    }
}
