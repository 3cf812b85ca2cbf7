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

/// The tokens a node accepts.
pub struct Tokens {
    tokens: Vec<Token>,
}

/// Why a request was not let in.
#[derive(Debug, PartialEq, Eq)]
pub enum AuthError {
    /// No or unknown token.
    Unauthorized,
    /// Known token without the scope.
    Forbidden,
}

impl Tokens {
    /// Reads a token file: `[[token]]` tables with `name`, `token` (at least 16 bytes), `scopes`
    /// and optionally `inbox_owners` (glob patterns).
    pub fn load(path: &Path) -> anyhow::Result<Tokens> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read token file {}", path.display()))?;
        Tokens::parse(&text).with_context(|| format!("parse token file {}", path.display()))
    }

    /// Parses token file text.
    pub fn parse(text: &str) -> anyhow::Result<Tokens> {
        let file: TokenFile = toml::from_str(text)?;
        anyhow::ensure!(!file.token.is_empty(), "no tokens");
        let mut tokens = Vec::new();
        for entry in file.token {
            anyhow::ensure!(entry.token.len() >= 16, "token {:?} is shorter than 16 bytes", entry.name);
            anyhow::ensure!(!entry.name.is_empty(), "a token has an empty name");
            let scopes = entry
                .scopes
                .iter()
                .map(|scope| match scope.as_str() {
                    "read" => Ok(Scope::Read),
                    "write" => Ok(Scope::Write),
                    "admin" => Ok(Scope::Admin),
                    "receive" => Ok(Scope::Receive),
                    "inbox_admin" => Ok(Scope::InboxAdmin),
                    other => Err(anyhow::anyhow!("token {:?} has unknown scope {other:?}", entry.name)),
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let inbox_owners = entry.inbox_owners.unwrap_or_else(|| vec!["*".into()]);
            tokens.push(Token {
                digest: *blake3::hash(entry.token.as_bytes()).as_bytes(),
                principal: Principal { name: entry.name, scopes, inbox_owners },
            });
        }
        Ok(Tokens { tokens })
    }

    /// Checks an `Authorization` header value against `scope`.
    pub fn check(&self, authorization: Option<&str>, scope: Scope) -> Result<Principal, AuthError> {
        let presented =
            authorization.and_then(|value| value.strip_prefix("Bearer ")).ok_or(AuthError::Unauthorized)?;
        let digest = blake3::hash(presented.trim().as_bytes());
        // blake3::Hash's equality is constant time; scan every token so the position of a match
        // does not show either.
        let mut found: Option<&Principal> = None;
        for token in &self.tokens {
            if blake3::Hash::from(token.digest) == digest {
                found = Some(&token.principal);
            }
        }
        let principal = found.ok_or(AuthError::Unauthorized)?;
        if principal.allows(scope) {
            Ok(principal.clone())
        } else {
            Err(AuthError::Forbidden)
        }
    }
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
            Err(AuthError::Forbidden)
        );
        assert!(tokens.check(Some("Bearer ops-token-0123456789abc"), Scope::Write).is_ok());
        assert_eq!(
            tokens.check(Some("Bearer nope-nope-nope-nope"), Scope::Read),
            Err(AuthError::Unauthorized)
        );
        assert_eq!(tokens.check(None, Scope::Read), Err(AuthError::Unauthorized));
        assert_eq!(tokens.check(Some("ingest-token-0123456789"), Scope::Read), Err(AuthError::Unauthorized));
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
}
