//! No token and no cluster secret reaches an error, a log line or a help text (issue 41): the real
//! binary is driven through the failure paths (a token file with a TOML error on a token's line,
//! duplicate and padded tokens, files others may read, wrong and unscoped tokens on requests, a
//! refused bind, a peer with the wrong cluster secret, a CLI verb with a wrong token) with values
//! that all hold the word `canary`, and every byte the processes wrote is searched for it.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tidal_procs::{write_private, NodeProcess, PortLease, SingleNode, TestDir};

/// In every token and secret below, and in no name, path or other value.
const CANARY: &str = "canary";
const READER_TOKEN: &str = "tok-canary-reader-5a1f0e9d77";
const WRITER_TOKEN: &str = "tok-canary-writer-0c3b8e21aa";
const WRONG_TOKEN: &str = "tok-canary-wrong-9e8d7c6b5a4f";

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidal"))
}

fn tokens(reader: &str, writer: &str) -> String {
    format!(
        "[[token]]\nname = \"reader\"\ntoken = \"{reader}\"\nscopes = [\"read\"]\n\n\
         [[token]]\nname = \"writer\"\ntoken = \"{writer}\"\nscopes = [\"read\", \"write\"]\n"
    )
}

/// Runs `tidal ARGS` with `RUST_LOG=debug` and `TIDAL_TOKEN` set to a canary, for at most
/// [`RUN_LIMIT`] (a start that should have been refused would serve for ever); returns whether it
/// exited successfully and everything it wrote.
fn run(args: &[&str]) -> (bool, String) {
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(binary())
        .args(args)
        .env("RUST_LOG", "debug")
        .env("TIDAL_TOKEN", WRONG_TOKEN)
        .stdin(Stdio::null())
        .stdout(out.reopen().unwrap())
        .stderr(out.reopen().unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + RUN_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut text = std::fs::read_to_string(out.path()).unwrap();
    if status.is_none() {
        text.push_str(&format!("\n(still running after {RUN_LIMIT:?}: killed)"));
    }
    (status.is_some_and(|status| status.success()), text)
}

/// How long [`run`] lets a process run.
const RUN_LIMIT: Duration = Duration::from_secs(30);

fn assert_no_canary(what: &str, text: &str) {
    assert!(!text.contains(CANARY), "{what} shows a token or secret:\n{text}");
}

/// `tidal serve` with `token_file` must refuse to start, saying `expected`.
fn refused_start(dir: &Path, token_file: &Path, expected: &str) {
    let data = dir.join("data");
    let (ok, text) = run(&[
        "serve",
        "--data-dir",
        data.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
        "--token-file",
        token_file.to_str().unwrap(),
    ]);
    assert!(!ok, "started with a bad token file: {text}");
    assert!(text.contains(expected), "{expected:?} not in:\n{text}");
    assert_no_canary("a refused start", &text);
}

#[test]
fn bad_token_files_are_refused_without_showing_a_token() {
    let dir = TestDir::new().unwrap();
    let file = dir.path().join("tokens.toml");
    let cases = [
        (format!("[[token]]\nname = \"reader\"\ntoken = \"{READER_TOKEN}\" scopes = [\"read\"]\n"), "line 3"),
        (format!("[[token]]\nname = \"reader\"\ntoken = \"{READER_TOKEN}\nscopes = [\"read\"]\n"), "line 3"),
        (
            format!(
                "[[token]]\nname = \"reader\"\ntoken = \"{READER_TOKEN}\"\nscopes = \"{WRITER_TOKEN}\"\n"
            ),
            "line 4",
        ),
        (tokens(READER_TOKEN, READER_TOKEN), "same value"),
        (tokens(&format!("{READER_TOKEN} "), WRITER_TOKEN), "whitespace"),
    ];
    for (text, expected) in cases {
        write_private(&file, text.as_bytes()).unwrap();
        refused_start(dir.path(), &file, expected);
    }
    // Others may read it.
    write_private(&file, tokens(READER_TOKEN, WRITER_TOKEN).as_bytes()).unwrap();
    set_mode(&file, 0o644);
    refused_start(dir.path(), &file, &format!("chmod 600 {}", file.display()));
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Refused requests are logged (name and reason, never the value); a refused bind, a CLI verb with
/// a wrong token and the CLI's help show no token either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_failures_show_no_token() {
    let dir = TestDir::new().unwrap();
    let file = dir.path().join("tokens.toml");
    write_private(&file, tokens(READER_TOKEN, WRITER_TOKEN).as_bytes()).unwrap();
    let log = dir.path().join("node.log");
    let args = ["--dimension", "2", "--token-file", file.to_str().unwrap()];
    let node = SingleNode::start(binary(), &dir.path().join("data"), &log, &args).await.unwrap();
    let http = reqwest::Client::new();
    let item = format!("{}/v1/items/1", node.url());
    for (method, token) in [
        ("PUT", None),
        ("PUT", Some(WRONG_TOKEN)),
        ("PUT", Some(READER_TOKEN)),
        ("GET", Some(WRONG_TOKEN)),
        ("FROB", Some(WRONG_TOKEN)),
    ] {
        let mut request = http.request(method.parse().unwrap(), &item).body("{\"metadata\":{}}");
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let reply = request.send().await.unwrap();
        assert!(matches!(reply.status().as_u16(), 401 | 403), "{method} {token:?}: {}", reply.status());
        assert_no_canary("a refusal's body", &reply.text().await.unwrap());
    }
    let reply = http
        .put(&item)
        .bearer_auth(WRITER_TOKEN)
        .header("content-type", "application/json")
        .body("{\"metadata\":{}}")
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    // A second node on the same address: a refused bind.
    let address = node.url().trim_start_matches("http://").to_string();
    let other = dir.path().join("other");
    let (ok, text) = run(&[
        "serve",
        "--data-dir",
        other.to_str().unwrap(),
        "--http",
        &address,
        "--token-file",
        file.to_str().unwrap(),
    ]);
    assert!(!ok, "a second node bound the same address: {text}");
    assert_no_canary("a refused bind", &text);
    // The CLI with a wrong token (TIDAL_TOKEN), and its help.
    let (ok, text) = run(&["status", "--url", node.url()]);
    assert!(!ok, "status with a wrong token: {text}");
    assert_no_canary("tidal status", &text);
    let (_, text) = run(&["status", "--help"]);
    assert!(text.contains("TIDAL_TOKEN"), "{text}");
    assert_no_canary("tidal status --help", &text);
    node.terminate().await.unwrap();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("request refused") && logged.contains("reader"), "{logged}");
    assert!(logged.contains("unknown token") && logged.contains("no bearer token"), "{logged}");
    assert_no_canary("the node's log", &logged);
}

/// Writes `dir/cluster.toml` for two nodes on `ports` with its own secret file.
fn cluster_file(dir: &Path, ports: &PortLease, secret: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    write_private(&dir.join("secret"), format!("{secret}\n").as_bytes()).unwrap();
    let mut text = String::from("cluster_id = \"leaks\"\nsecret_file = \"secret\"\n");
    for id in 1..=2u64 {
        let at = 2 * (id as usize - 1);
        text.push_str(&format!(
            "\n[[node]]\nid = {id}\nhttp = \"{}\"\nrpc = \"{}\"\n",
            ports.address(at),
            ports.address(at + 1)
        ));
    }
    let path = dir.join("cluster.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Two members whose secrets differ: each refuses the other's RPCs (a `wrong_secret` refusal), and neither
/// secret shows in either log. A secret file others may read is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_cluster_secret_shows_neither_secret() {
    let dir = TestDir::new().unwrap();
    let ports = PortLease::take(4).unwrap();
    let secrets = ["secret-canary-one-1f2e3d4c5b6a", "secret-canary-two-a6b5c4d3e2f1"];
    let mut nodes = Vec::new();
    for id in 1..=2u64 {
        let home = dir.path().join(format!("n{id}"));
        let cluster = cluster_file(&home, &ports, secrets[id as usize - 1]);
        let argv: Vec<std::ffi::OsString> = vec![
            "serve".into(),
            "--cluster".into(),
            cluster.into(),
            "--node-id".into(),
            id.to_string().into(),
            "--data-dir".into(),
            home.join("data").into(),
        ];
        let log = home.join("node.log");
        nodes.push((NodeProcess::spawn(binary(), &argv, &log).unwrap(), log));
    }
    let deadline = Instant::now() + tidal_procs::DEADLINE;
    let refused = |log: &Path| std::fs::read_to_string(log).unwrap().contains("without the cluster secret");
    while !nodes.iter().all(|(_, log)| refused(log)) {
        assert!(Instant::now() < deadline, "no wrong-secret refusal logged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (node, log) in nodes {
        node.terminate(Instant::now() + tidal_procs::DEADLINE).await.unwrap();
        assert_no_canary("a node's log", &std::fs::read_to_string(log).unwrap());
    }
    let secret = dir.path().join("n1").join("secret");
    set_mode(&secret, 0o640);
    let cluster = dir.path().join("n1").join("cluster.toml");
    let data = dir.path().join("n1").join("data");
    let (ok, text) = run(&[
        "serve",
        "--cluster",
        cluster.to_str().unwrap(),
        "--node-id",
        "1",
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert!(!ok && text.contains(&format!("chmod 600 {}", secret.display())), "{text}");
    assert_no_canary("a refused secret file", &text);
}
