//! `tidal cluster up --tls`: a throwaway CA and one certificate per node under `<dir>/tls/`, for
//! trying TLS on one machine. Each node certificate names `localhost`, `127.0.0.1` and
//! `node-<id>` (the name mutual TLS between peers checks). Keys are written 0600. For real
//! machines, bring certificates from your own CA (docs/OPERATIONS.md, "TLS").

use anyhow::Context;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The folder of a local cluster's TLS files.
pub fn tls_dir(dir: &Path) -> PathBuf {
    dir.join("tls")
}

/// The local CA's certificate: what clients verify nodes with (`TIDAL_CA`).
pub fn ca_path(dir: &Path) -> PathBuf {
    tls_dir(dir).join("ca.pem")
}

/// Whether the local cluster in `dir` serves TLS (`up --tls` made its CA).
pub fn enabled(dir: &Path) -> bool {
    ca_path(dir).exists()
}

/// `https` for a TLS cluster, else `http`.
pub fn scheme(dir: &Path) -> &'static str {
    if enabled(dir) {
        "https"
    } else {
        "http"
    }
}

/// Writes `contents` to a new file `path` with mode `mode` (never readable by others if 0600).
fn write_new(path: &Path, contents: &str, mode: u32) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    file.write_all(contents.as_bytes()).with_context(|| format!("write {}", path.display()))?;
    file.sync_all().with_context(|| format!("sync {}", path.display()))
}

/// The CA of `dir`, made if missing.
fn ca(dir: &Path) -> anyhow::Result<(rcgen::Certificate, rcgen::KeyPair)> {
    let (cert_path, key_path) = (ca_path(dir), tls_dir(dir).join("ca.key"));
    let mut params = rcgen::CertificateParams::default();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, "Tidal local cluster CA");
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    if key_path.exists() {
        let key_pem =
            std::fs::read_to_string(&key_path).with_context(|| format!("read {}", key_path.display()))?;
        let key =
            rcgen::KeyPair::from_pem(&key_pem).with_context(|| format!("parse {}", key_path.display()))?;
        // The same parameters and key give a certificate that verifies what the old one signed.
        let cert = params.self_signed(&key).context("rebuild the local CA")?;
        return Ok((cert, key));
    }
    let key = rcgen::KeyPair::generate().context("generate the CA key")?;
    let cert = params.self_signed(&key).context("make the local CA")?;
    write_new(&key_path, &key.serialize_pem(), 0o600)?;
    write_new(&cert_path, &cert.pem(), 0o644)?;
    Ok((cert, key))
}

/// Makes the CA and the certificates of nodes `ids` that are missing under `dir/tls/`.
pub fn ensure(dir: &Path, ids: &[u64]) -> anyhow::Result<()> {
    std::fs::create_dir_all(tls_dir(dir)).with_context(|| format!("create {}", tls_dir(dir).display()))?;
    let (ca_cert, ca_key) = ca(dir)?;
    for &id in ids {
        let (cert_path, key_path) = node_files(dir, id);
        if cert_path.exists() && key_path.exists() {
            continue;
        }
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string(), format!("node-{id}")])
            .context("node certificate names")?;
        params.subject_alt_names.push(rcgen::SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
        params.distinguished_name.push(rcgen::DnType::CommonName, format!("node-{id}"));
        params.extended_key_usages =
            vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth, rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = rcgen::KeyPair::generate().context("generate a node key")?;
        let cert = params.signed_by(&key, &ca_cert, &ca_key).context("sign a node certificate")?;
        let _ = std::fs::remove_file(&key_path);
        let _ = std::fs::remove_file(&cert_path);
        write_new(&key_path, &key.serialize_pem(), 0o600)?;
        write_new(&cert_path, &cert.pem(), 0o644)?;
    }
    Ok(())
}

/// Node `id`'s certificate and key.
fn node_files(dir: &Path, id: u64) -> (PathBuf, PathBuf) {
    (tls_dir(dir).join(format!("n{id}.pem")), tls_dir(dir).join(format!("n{id}.key")))
}

/// The `tidal serve` options that make node `id` serve TLS, with mutual TLS between peers.
pub fn serve_args(dir: &Path, id: u64) -> Vec<std::ffi::OsString> {
    let (cert, key) = node_files(dir, id);
    vec![
        "--tls-cert".into(),
        cert.into(),
        "--tls-key".into(),
        key.into(),
        "--tls-ca".into(),
        ca_path(dir).into(),
        "--tls-peer-auth".into(),
    ]
}

/// An HTTP client for the local cluster in `dir`: verifies the local CA when it serves TLS.
pub fn http_client(dir: &Path, timeout: Duration) -> anyhow::Result<reqwest::Client> {
    let builder = reqwest::Client::builder().timeout(timeout);
    if !enabled(dir) {
        return Ok(builder.build()?);
    }
    let pem = std::fs::read(ca_path(dir)).with_context(|| format!("read {}", ca_path(dir).display()))?;
    let mut builder = builder.tls_built_in_root_certs(false);
    for cert in reqwest::Certificate::from_pem_bundle(&pem)? {
        builder = builder.add_root_certificate(cert);
    }
    Ok(builder.build()?)
}
