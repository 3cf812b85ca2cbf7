//! Headless Chromium driven over the DevTools protocol, for tests of the `/ui` page.
//!
//! The protocol is JSON over one WebSocket. The client below speaks just enough WebSocket for it
//! (RFC 6455: the upgrade, masked text frames out, whole or fragmented text frames in) instead of
//! pulling in a WebSocket crate for one test. Chromium is started with the flags this machine's
//! closed network needs (no background networking, no component updates, no sync, no QUIC) and a
//! fresh profile, and is killed by its pid when the [`Browser`] is dropped.

use anyhow::Context;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long Chromium may take to start and to answer one command (a page load included).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// The Chromium binary: `TIDAL_CHROMIUM`, else the first of the usual names on the PATH.
pub fn find() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TIDAL_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"].iter().find_map(|name| {
        std::env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| candidate.is_file())
    })
}

/// A headless Chromium and a WebSocket to its one page.
pub struct Browser {
    child: Child,
    socket: TcpStream,
    next_id: u64,
}

impl Browser {
    /// Starts `binary` with a fresh profile in `profile` and connects to its first page.
    pub async fn start(binary: &Path, profile: &Path, log: &Path) -> anyhow::Result<Browser> {
        std::fs::create_dir_all(profile)?;
        let log_file = std::fs::File::create(log)?;
        let child = Command::new(binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--window-size=1280,1000",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        let mut browser_guard = KillOnDrop(Some(child));
        let port = wait_for_port(profile, browser_guard.child()).await?;
        let page = page_socket_path(port).await?;
        let socket = connect(port, &page).await?;
        let child = browser_guard.0.take().expect("the guard holds the child until here");
        Ok(Browser { child, socket, next_id: 1 })
    }

    /// Sends one command and returns its result (events that arrive meanwhile are dropped).
    pub async fn command(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({"id": id, "method": method, "params": params}).to_string();
        tokio::time::timeout(COMMAND_TIMEOUT, self.exchange(id, &message))
            .await
            .with_context(|| format!("{method}: no answer within {COMMAND_TIMEOUT:?}"))?
            .with_context(|| method.to_string())
    }

    async fn exchange(&mut self, id: u64, message: &str) -> anyhow::Result<Value> {
        write_text(&mut self.socket, message.as_bytes()).await?;
        loop {
            let reply: Value = serde_json::from_slice(&read_message(&mut self.socket).await?)?;
            if reply.get("id").and_then(Value::as_u64) != Some(id) {
                continue;
            }
            if let Some(error) = reply.get("error") {
                anyhow::bail!("DevTools error: {error}");
            }
            return Ok(reply.get("result").cloned().unwrap_or(Value::Null));
        }
    }

    /// Loads `url` in the page.
    pub async fn navigate(&mut self, url: &str) -> anyhow::Result<()> {
        self.command("Page.navigate", json!({"url": url})).await?;
        Ok(())
    }

    /// The value of a JavaScript expression in the page (promises awaited).
    pub async fn eval(&mut self, expression: &str) -> anyhow::Result<Value> {
        let params = json!({"expression": expression, "returnByValue": true, "awaitPromise": true});
        let result = self.command("Runtime.evaluate", params).await?;
        if let Some(exception) = result.get("exceptionDetails") {
            anyhow::bail!("the page threw: {exception}");
        }
        Ok(result["result"].get("value").cloned().unwrap_or(Value::Null))
    }

    /// A PNG of the whole page, written to `path`.
    pub async fn screenshot(&mut self, path: &Path) -> anyhow::Result<()> {
        let result = self
            .command("Page.captureScreenshot", json!({"format": "png", "captureBeyondViewport": true}))
            .await?;
        let data = result["data"].as_str().context("a screenshot without data")?;
        std::fs::write(path, base64_decode(data)?).with_context(|| format!("write {}", path.display()))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Only the child this test started, by its pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Kills a Chromium that failed to come up.
struct KillOnDrop(Option<Child>);

impl KillOnDrop {
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("set until taken")
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The DevTools port Chromium chose: it writes it to `DevToolsActivePort` in its profile.
async fn wait_for_port(profile: &Path, child: &mut Child) -> anyhow::Result<u16> {
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let file = profile.join("DevToolsActivePort");
    loop {
        if let Some(port) =
            std::fs::read_to_string(&file).ok().and_then(|text| text.lines().next()?.parse().ok())
        {
            return Ok(port);
        }
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("chromium exited with {status} before it listened");
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "chromium wrote no {} within {COMMAND_TIMEOUT:?}",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The WebSocket path of Chromium's first page target.
async fn page_socket_path(port: u16) -> anyhow::Result<String> {
    let client = reqwest::Client::builder().timeout(COMMAND_TIMEOUT).build()?;
    let targets: Vec<Value> =
        client.get(format!("http://127.0.0.1:{port}/json/list")).send().await?.json().await?;
    let page = targets.iter().find(|target| target["type"] == "page").context("chromium has no page")?;
    let url = page["webSocketDebuggerUrl"].as_str().context("a page without a WebSocket")?;
    let path = url.split_once("://").and_then(|(_, rest)| rest.find('/').map(|at| &rest[at..]));
    Ok(path.context("a WebSocket URL without a path")?.to_string())
}

/// Opens the WebSocket (the HTTP upgrade). No `Origin` header: Chromium refuses WebSocket origins
/// it was not told to allow, and a client that sends none is not a page.
async fn connect(port: u16, path: &str) -> anyhow::Result<TcpStream> {
    let mut socket = TcpStream::connect(("127.0.0.1", port)).await?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        anyhow::ensure!(socket.read(&mut byte).await? == 1, "chromium closed the upgrade");
        head.push(byte[0]);
        anyhow::ensure!(head.len() < 16 * 1024, "an upgrade answer over 16 KiB");
    }
    let head = String::from_utf8_lossy(&head);
    anyhow::ensure!(head.starts_with("HTTP/1.1 101"), "chromium refused the WebSocket: {head}");
    Ok(socket)
}

/// One masked text frame (a client must mask; any key will do).
async fn write_text(socket: &mut TcpStream, payload: &[u8]) -> anyhow::Result<()> {
    let mask = [0x5a, 0x17, 0xc3, 0x81];
    let mut frame = vec![0x81];
    match payload.len() {
        len if len < 126 => frame.push(0x80 | len as u8),
        len if len <= u16::MAX as usize => {
            frame.push(0x80 | 126);
            frame.extend((len as u16).to_be_bytes());
        }
        len => {
            frame.push(0x80 | 127);
            frame.extend((len as u64).to_be_bytes());
        }
    }
    frame.extend(mask);
    frame.extend(payload.iter().enumerate().map(|(at, byte)| byte ^ mask[at % 4]));
    socket.write_all(&frame).await?;
    Ok(())
}

/// The next whole message: text frames and their continuations, answering pings on the way.
async fn read_message(socket: &mut TcpStream) -> anyhow::Result<Vec<u8>> {
    let mut message = Vec::new();
    loop {
        let mut head = [0u8; 2];
        socket.read_exact(&mut head).await?;
        let (fin, opcode) = (head[0] & 0x80 != 0, head[0] & 0x0f);
        let len = match head[1] & 0x7f {
            126 => u64::from(socket.read_u16().await?),
            127 => socket.read_u64().await?,
            len => u64::from(len),
        };
        anyhow::ensure!(len <= 256 * 1024 * 1024, "a {len}-byte WebSocket frame");
        let mut payload = vec![0u8; len as usize];
        socket.read_exact(&mut payload).await?;
        match opcode {
            0x0 | 0x1 => message.extend(payload),
            0x8 => anyhow::bail!("chromium closed the WebSocket"),
            0x9 => {
                let mut pong = vec![0x8a, 0x80 | payload.len() as u8, 0, 0, 0, 0];
                pong.extend(&payload);
                socket.write_all(&pong).await?;
            }
            _ => {}
        }
        if fin && opcode <= 0x1 {
            return Ok(message);
        }
    }
}

/// Standard base64 (the screenshot's encoding).
fn base64_decode(text: &str) -> anyhow::Result<Vec<u8>> {
    let value = |byte: u8| -> anyhow::Result<u32> {
        Ok(match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => anyhow::bail!("{byte:#x} is not base64"),
        }
        .into())
    };
    let clean: Vec<u8> = text.bytes().filter(|byte| *byte != b'=' && !byte.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let mut bits = 0u32;
        for (at, byte) in chunk.iter().enumerate() {
            bits |= value(*byte)? << (18 - 6 * at);
        }
        out.extend(&bits.to_be_bytes()[1..chunk.len()]);
    }
    Ok(out)
}
