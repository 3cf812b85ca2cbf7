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
}

/// Who made a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// Token name (logged in every batch envelope); `anonymous` without a token file.
    pub name: String,
    scopes: Vec<Scope>,
}

impl Principal {
    /// The principal of an open node.
    pub fn anonymous() -> Principal {
        Principal { name: "anonymous".into(), scopes: vec![Scope::Read, Scope::Write, Scope::Admin] }
    }

    /// The node itself, for the writes it makes on its own (retention trims): `name` is logged in
    /// the batch envelope. Names under the reserved prefix cannot be token names.
    pub fn system(name: &str) -> Principal {
        Principal { name: name.into(), scopes: vec![Scope::Write] }
    }

    /// Whether this principal holds `scope` (admin implies every scope).
    pub fn allows(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope) || self.scopes.contains(&Scope::Admin)
    }
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
    /// Reads a token file: `[[token]]` tables with `name`, `token` (at least 16 bytes) and `scopes`.
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
                    other => Err(anyhow::anyhow!("token {:?} has unknown scope {other:?}", entry.name)),
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            tokens.push(Token {
                digest: *blake3::hash(entry.token.as_bytes()).as_bytes(),
                principal: Principal { name: entry.name, scopes },
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
}
