//! TLS with real processes (issue 41): `tidal cluster up --tls` makes a throwaway CA, the nodes
//! serve HTTPS and replicate over mutual TLS, the client and the CLI verify, a peer without a
//! node certificate is refused, and SIGHUP puts a renewed certificate in service without a restart.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use tidal_client::Client;

/// Stops the cluster in `dir` when dropped (the test failed or finished).
struct Down<'a>(&'a std::path::Path);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ =
            Command::new(env!("CARGO_BIN_EXE_tidal")).args(["cluster", "down", "--dir"]).arg(self.0).output();
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    #[allow(deprecated)]
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(ca: &std::path::Path) -> rustls::RootCertStore {
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    roots
}

/// A TLS handshake with `address` trusting only `ca` and presenting no certificate; the
/// certificate the server presented, or the handshake's error.
/// With `probe`, also sends an HTTP/2 preface and waits for the server's first bytes.
async fn handshake(address: &str, ca: &std::path::Path, probe: bool) -> std::io::Result<Vec<u8>> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots(ca))
        .with_no_client_auth();
    // What curl offers: a port must pick only a protocol it speaks.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(address).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut stream = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await?;
    if probe {
        // TLS 1.3 reports a refused client certificate only on the first read after the handshake.
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await?;
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf));
        if read.await.map_err(std::io::Error::other)?? == 0 {
            return Err(std::io::Error::other("closed by the server"));
        }
    }
    let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    if !probe {
        assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]), "the HTTP port must not agree to h2");
    }
    Ok(stream.get_ref().1.peer_certificates().unwrap()[0].to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_replicates_verifies_refuses_strangers_and_reloads_on_sighup() {
    let dir = tidal_procs::TestDir::new().unwrap();
    let ports = tidal_procs::PortLease::take_block(3, tidal_cli::cluster_cmd::RPC_PORT_OFFSET).unwrap();
    let base = ports.port(0);
    let up = Command::new(env!("CARGO_BIN_EXE_tidal"))
        .args(["cluster", "up", "--tls", "--nodes", "3", "--port-base", &base.to_string(), "--dir"])
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let _down = Down(dir.path());
    let stdout = String::from_utf8_lossy(&up.stdout);
    assert!(
        up.status.success(),
        "cluster up --tls failed: {stdout}\n{}",
        String::from_utf8_lossy(&up.stderr)
    );
    assert!(stdout.contains("https://127.0.0.1") && stdout.contains("TIDAL_CA"), "{stdout}");
    let tls = dir.path().join("tls");
    let ca = tls.join("ca.pem");
    for key in ["ca.key", "n1.key", "n2.key", "n3.key"] {
        let mode = std::fs::metadata(tls.join(key)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{key} has mode {mode:o}");
    }
    let pem = std::fs::read(&ca).unwrap();
    let node = |id: u16| {
        Client::with_ca(format!("https://127.0.0.1:{}", base + id - 1), None, Duration::from_secs(30), &pem)
            .unwrap()
    };
    // A write through every node: two of them follow, so two are forwarded to the leader over
    // HTTPS; each replicated over mutual TLS, then readable on every node.
    for writer in 1..=3u16 {
        let item = u64::from(writer);
        let reply = node(writer).put_item(item, serde_json::json!({"over": "tls"}), None).await.unwrap();
        for id in 1..=3 {
            let read: tidal_types::ItemView = node(id)
                .json::<(), _>(
                    reqwest::Method::GET,
                    &format!("/v1/items/{item}?min_seqno={}", reply.seqno),
                    None,
                )
                .await
                .unwrap();
            assert_eq!(
                read.seqno, reply.seqno,
                "item {item} written through node {writer}, read on node {id}"
            );
        }
    }
    // The write link over TLS: opened on every node, it writes on the leader alone (the others
    // refuse each write, naming it); a link that trusts no CA of this cluster is not opened.
    let mut linked = Vec::new();
    for id in 1..=3u16 {
        let url = format!("https://127.0.0.1:{}", base + id - 1);
        let link = tidal_client::Link::connect_with_ca(&url, None, &pem).await.unwrap();
        linked.push(link.put_item(40 + u64::from(id), br#"{"metadata":{"over":"a tls link"}}"#, None).await);
    }
    let written: Vec<_> = linked.iter().filter_map(|reply| reply.as_ref().ok()).collect();
    assert_eq!(written.len(), 1, "exactly the leader writes on a link: {linked:?}");
    for refused in linked.iter().filter_map(|reply| reply.as_ref().err()) {
        assert_eq!(refused.code(), Some("not_ready"), "{refused:?}");
    }
    let other_ca = tidal_procs::TestDir::new().unwrap();
    tidal_cli::local_tls::ensure(other_ca.path(), &[1]).unwrap();
    let stranger_pem = std::fs::read(other_ca.path().join("tls").join("ca.pem")).unwrap();
    let refused =
        tidal_client::Link::connect_with_ca(&format!("https://127.0.0.1:{base}"), None, &stranger_pem)
            .await
            .err()
            .expect("a link that trusts another CA was opened");
    assert!(refused.to_string().contains("TLS"), "{refused}");
    // Cleartext to the HTTPS port, and a client that does not trust the CA, get nothing.
    let plain = Client::new(format!("http://127.0.0.1:{base}"), None);
    assert!(plain.status().await.is_err(), "cleartext HTTP was answered");
    let stranger = Client::new(format!("https://127.0.0.1:{base}"), None);
    assert!(stranger.status().await.is_err(), "a client without the CA trusted the node");
    // The RPC port wants a node certificate: a TLS client without one is refused.
    let rpc = format!("127.0.0.1:{}", base + tidal_cli::cluster_cmd::RPC_PORT_OFFSET);
    assert!(
        handshake(&rpc, &ca, true).await.is_err(),
        "an RPC connection without a node certificate was kept"
    );
    // The CLI verifies with --ca (or TIDAL_CA) and refuses without it.
    let status = |with_ca: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tidal"));
        command.args(["status", "--url", &format!("https://127.0.0.1:{base}")]).env_remove("TIDAL_CA");
        if with_ca {
            command.arg("--ca").arg(&ca);
        }
        command.output().unwrap()
    };
    let verified = status(true);
    assert!(verified.status.success(), "{}", String::from_utf8_lossy(&verified.stderr));
    assert!(!status(false).status.success(), "the CLI trusted an unknown CA");
    // A renewed certificate for node 1, then SIGHUP: new connections get it, no restart.
    let http1 = format!("127.0.0.1:{base}");
    let before = handshake(&http1, &ca, false).await.unwrap();
    std::fs::remove_file(tls.join("n1.pem")).unwrap();
    std::fs::remove_file(tls.join("n1.key")).unwrap();
    tidal_cli::local_tls::ensure(dir.path(), &[1]).unwrap();
    let renewed = {
        use rustls::pki_types::pem::PemObject as _;
        rustls::pki_types::CertificateDer::from_pem_file(tls.join("n1.pem")).unwrap().to_vec()
    };
    assert_ne!(before, renewed);
    let pid = std::fs::read_to_string(dir.path().join("n1.pid")).unwrap().trim().to_string();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    let mut served = before;
    for _ in 0..200 {
        served = handshake(&http1, &ca, false).await.unwrap();
        if served == renewed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(served, renewed, "node 1 still serves its old certificate after SIGHUP");
    assert!(node(1).status().await.is_ok(), "node 1 kept serving through the reload");
}
