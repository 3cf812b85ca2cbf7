//! Which node of which cluster a data dir belongs to (decisions/063), recorded where its data
//! lives: `wal/identity` (a small TOML file beside the segments, so a WAL copied into another
//! node's data dir carries it along; the segment format is untouched) and the engine's `local`
//! keyspace (so does a copied `state/`). A node whose configuration names another node or
//! another cluster refuses to start, naming both identities and where the recorded one is.
//!
//! A single node (no `--cluster`) is node 0 of no cluster: a cluster member's data dir is
//! refused by a single node and the other way round. A data dir from a build without identities
//! gets its identity at its first start; there is no way to adopt another node's data dir.

use crate::config::ServeConfig;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tidal_core::TidalDb;

/// Name of the identity file in the WAL directory.
pub(super) const IDENTITY_FILE: &str = "identity";

/// A data dir's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Identity {
    /// The cluster file's `cluster_id`; none for a single node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cluster_id: Option<String>,
    /// The node's `--node-id`; 0 for a single node.
    node_id: u64,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.cluster_id {
            Some(cluster_id) => write!(formatter, "cluster id {cluster_id:?}, node id {}", self.node_id),
            None => write!(formatter, "a single node (no cluster id, node id {})", self.node_id),
        }
    }
}

impl Identity {
    /// The identity `config` gives this node.
    pub(super) fn of(config: &ServeConfig) -> Identity {
        match &config.cluster {
            Some(membership) => {
                Identity { cluster_id: Some(membership.spec.cluster_id.clone()), node_id: membership.me.0 }
            }
            None => Identity { cluster_id: None, node_id: 0 },
        }
    }

    fn encode(&self) -> anyhow::Result<String> {
        let body = toml::to_string(self).context("encode the identity")?;
        Ok(format!(
            "# The node this data dir belongs to (decisions/063): written at its first start and \
             checked at every start.\n{body}"
        ))
    }

    fn decode(bytes: &[u8], place: &dyn std::fmt::Display) -> anyhow::Result<Identity> {
        let text = std::str::from_utf8(bytes).with_context(|| format!("{place} is not UTF-8"))?;
        toml::from_str(text).with_context(|| format!("{place} does not hold an identity"))
    }
}

/// The identity files and keys of one data dir, as [`check`] found them.
pub(super) struct Recorded {
    configured: Identity,
    wal_file: PathBuf,
    wal_missing: bool,
}

/// Path of the WAL's identity file in `data_dir`.
pub(super) fn wal_file(data_dir: &Path) -> PathBuf {
    data_dir.join("wal").join(IDENTITY_FILE)
}

/// Checks the WAL's identity file against the configured identity, before the WAL is recovered
/// (recovery may rewrite a foreign WAL's tail). A missing file is recorded later ([`record`]).
pub(super) fn check_wal(config: &ServeConfig) -> anyhow::Result<Recorded> {
    let configured = Identity::of(config);
    let wal_file = wal_file(&config.data_dir);
    let wal_missing = match std::fs::read(&wal_file) {
        Ok(bytes) => {
            let recorded = Identity::decode(&bytes, &wal_file.display())?;
            refuse_mismatch(&recorded, &configured, &config.data_dir, &wal_file.display())?;
            false
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => true,
        Err(error) => return Err(error).with_context(|| format!("read {}", wal_file.display())),
    };
    Ok(Recorded { configured, wal_file, wal_missing })
}

/// Checks the engine's identity, then records the configured identity where it is missing: in
/// the engine (fsynced) and in the WAL's file (write-then-rename, fsynced, the directory too).
pub(super) fn check_engine_and_record(
    recorded: Recorded,
    db: &TidalDb,
    data_dir: &Path,
) -> anyhow::Result<()> {
    let Recorded { configured, wal_file, wal_missing } = recorded;
    let place =
        format!("the engine state {} (key `identity` of keyspace `local`)", data_dir.join("state").display());
    let engine = db.identity().context("read the engine's identity")?;
    if let Some(bytes) = &engine {
        refuse_mismatch(&Identity::decode(bytes, &place)?, &configured, data_dir, &place)?;
    }
    let encoded = configured.encode()?;
    if engine.is_none() {
        db.record_identity(encoded.as_bytes()).context("record the engine's identity")?;
    }
    if wal_missing {
        std::fs::create_dir_all(wal_file.parent().unwrap_or(data_dir))
            .with_context(|| format!("create {}", data_dir.join("wal").display()))?;
        tidal_cluster::files::write_then_rename(&wal_file, encoded.as_bytes())
            .with_context(|| format!("write {} (write-then-rename)", wal_file.display()))?;
    }
    if wal_missing || engine.is_none() {
        tracing::info!(identity = %configured, data_dir = %data_dir.display(), "recorded the data dir's identity");
    }
    Ok(())
}

fn refuse_mismatch(
    recorded: &Identity,
    configured: &Identity,
    data_dir: &Path,
    place: &dyn std::fmt::Display,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        recorded == configured,
        "data dir {} belongs to another node: {place} records {recorded}, but this node is configured as \
         {configured}. Was it copied from another node? Start this node on its own data dir (an empty \
         one: a cluster member catches up from the leader), or give it the configuration the data dir \
         was made with",
        data_dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_encode_and_decode() {
        for identity in [
            Identity { cluster_id: Some("prod \"eu\"".into()), node_id: 3 },
            Identity { cluster_id: None, node_id: 0 },
        ] {
            let encoded = identity.encode().unwrap();
            assert_eq!(Identity::decode(encoded.as_bytes(), &"test").unwrap(), identity, "{encoded}");
        }
        assert!(Identity::decode(b"node_id = 1\nextra = 2\n", &"test").is_err());
        assert!(Identity::decode(b"\xff", &"test").is_err());
        let single = Identity { cluster_id: None, node_id: 0 }.to_string();
        let member = Identity { cluster_id: Some("c".into()), node_id: 2 }.to_string();
        assert_eq!(
            (single.as_str(), member.as_str()),
            ("a single node (no cluster id, node id 0)", "cluster id \"c\", node id 2")
        );
    }
}
