//! The `/ui` page in a real headless Chromium against a real 3-node cluster (chaos/process): what it
//! shows for a healthy cluster, a follower SIGKILLed, and a failover in progress and done; the
//! dry-run-first flow of its heal and promote buttons; and that its history survives a reload.
//! Screenshots of each phase go to `$CARGO_TARGET_TMPDIR/ui-screenshots/`.
//!
//! Skipped (with a message saying so) when no Chromium is installed, unless
//! `TIDAL_REQUIRE_CHROMIUM=1` (CI installs it and sets that), then a missing Chromium fails.

#![allow(clippy::unwrap_used)] // tests may unwrap; helpers outside #[test] are not covered by allow-unwrap-in-tests

mod chromium;

use chromium::Browser;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tidal_procs::{ProcessCluster, TestDir, DEADLINE, POLL};

/// What the page shows, read from its DOM.
#[derive(Debug)]
struct PageState {
    summary: String,
    banner: String,
    view: String,
    rows: Vec<Row>,
    events: Vec<String>,
    panel: Option<Panel>,
    chart_span: String,
}

/// One row of the members table.
#[derive(Debug)]
struct Row {
    id: u64,
    state: String,
    role: String,
}

/// The verb panel.
#[derive(Debug)]
struct Panel {
    title: String,
    status: String,
    result: String,
    confirm: bool,
}

impl PageState {
    /// Reads the object [`READ_PAGE`] returns.
    fn from_json(value: &Value) -> PageState {
        let text = |value: &Value, key: &str| value[key].as_str().unwrap_or_default().to_string();
        let rows = value["rows"].as_array().cloned().unwrap_or_default();
        let events = value["events"].as_array().cloned().unwrap_or_default();
        PageState {
            summary: text(value, "summary"),
            banner: text(value, "banner"),
            view: text(value, "view"),
            rows: rows
                .iter()
                .map(|row| Row {
                    id: row["id"].as_u64().unwrap_or(0),
                    state: text(row, "state"),
                    role: text(row, "role"),
                })
                .collect(),
            events: events.iter().filter_map(|line| line.as_str().map(str::to_string)).collect(),
            panel: value["panel"].is_object().then(|| Panel {
                title: text(&value["panel"], "title"),
                status: text(&value["panel"], "status"),
                result: text(&value["panel"], "result"),
                confirm: value["panel"]["confirm"].as_bool().unwrap_or(false),
            }),
            chart_span: text(value, "chart_span"),
        }
    }
}

/// Reads the page's DOM; `null` while the page is still loading (no fields: every check fails).
const READ_PAGE: &str = r#"(() => {
  if (!document.getElementById('chart-span')) return null;
  const text = id => document.getElementById(id).textContent;
  const banner = document.getElementById('banner');
  const panel = document.getElementById('verb-panel');
  return {
    summary: text('summary'),
    banner: banner.hidden ? '' : banner.textContent,
    view: text('view-note'),
    rows: [...document.querySelectorAll('#members tbody tr')].map(tr => ({
      id: Number(tr.id.replace('member-', '')), state: tr.dataset.state, role: tr.children[1].textContent })),
    events: [...document.querySelectorAll('#events li')].map(li => li.textContent),
    panel: panel.hidden ? null : { title: text('verb-title'), status: text('verb-status'),
      result: text('verb-result'), confirm: !document.getElementById('verb-confirm').hidden },
    chart_span: text('chart-span'),
  };
})()"#;

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
        .with_test_writer()
        .try_init();
}

/// Chromium, or None after saying why the test is skipped (a failure when CI demands Chromium).
fn chromium_or_skip() -> Option<PathBuf> {
    let found = chromium::find();
    if found.is_none() {
        assert!(
            std::env::var("TIDAL_REQUIRE_CHROMIUM").as_deref() != Ok("1"),
            "TIDAL_REQUIRE_CHROMIUM=1 but no chromium on the PATH (or TIDAL_CHROMIUM)"
        );
        println!("skipped: no chromium on the PATH (apt-get install chromium, or set TIDAL_CHROMIUM)");
    }
    found
}

/// The page's state once `check` accepts it; on the deadline, a screenshot and a panic with the
/// last reason.
async fn wait_for<T>(
    browser: &mut Browser,
    shots: &Path,
    what: &str,
    check: impl Fn(&PageState) -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let state = PageState::from_json(&browser.eval(READ_PAGE).await.unwrap());
        match check(&state) {
            Ok(value) => return value,
            Err(why) if Instant::now() > deadline => {
                let path = shots.join(format!("failed-{}.png", what.replace(' ', "-")));
                let _ = browser.screenshot(&path).await;
                panic!(
                    "the page never showed {what} within {DEADLINE:?}: {why}\n{state:#?}\n(screenshot: {})",
                    path.display()
                );
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

async fn screenshot(browser: &mut Browser, shots: &Path, name: &str) {
    let path = shots.join(format!("{name}.png"));
    browser.screenshot(&path).await.unwrap();
    println!("screenshot: {}", path.display());
}

async fn click(browser: &mut Browser, id: &str) {
    let clicked = browser
        .eval(&format!("(() => {{ const b = document.getElementById('{id}'); if (!b) return false; b.click(); return true; }})()"))
        .await
        .unwrap();
    assert_eq!(clicked, serde_json::Value::Bool(true), "no button #{id} on the page");
}

fn row(state: &PageState, id: u64) -> Result<&Row, String> {
    state.rows.iter().find(|row| row.id == id).ok_or_else(|| format!("no row for node {id}"))
}

/// Every member shown up, `leader` as the leader, in the leader's own view, no banner.
fn healthy(state: &PageState, leader: u64) -> Result<(), String> {
    if !state.banner.is_empty() {
        return Err(format!("banner: {}", state.banner));
    }
    if state.rows.len() != 3 || state.rows.iter().any(|row| row.state != "up") {
        return Err(format!("rows: {:?}", state.rows));
    }
    if !row(state, leader)?.role.starts_with("leader") {
        return Err(format!("node {leader} not shown as leader"));
    }
    if !state.view.contains(&format!("leader node {leader}'s view")) {
        return Err(format!("view: {}", state.view));
    }
    if !state.summary.contains(&format!("leader {leader}")) {
        return Err(format!("summary: {}", state.summary));
    }
    Ok(())
}

async fn write_items(cluster: &ProcessCluster, via: u64, ids: std::ops::Range<u64>) {
    for id in ids {
        cluster.client(via).put_item(id, serde_json::json!({"id": id}), None).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ui_shows_health_a_dead_follower_and_a_failover() {
    let Some(chromium) = chromium_or_skip() else { return };
    init_tracing();
    let dir = TestDir::new().unwrap();
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let cluster =
        ProcessCluster::start(Path::new(env!("CARGO_BIN_EXE_tidal")), dir.path(), 3, "quorum").await.unwrap();
    let leader = cluster.leader().await.unwrap();
    let followers: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != leader).collect();
    // The page is served by a follower that survives every fault below; `victim` is killed.
    let (page_node, victim) = (followers[0], followers[1]);
    write_items(&cluster, leader, 1..21).await;
    let mut browser =
        Browser::start(&chromium, &dir.path().join("chromium-profile"), &dir.path().join("chromium.log"))
            .await
            .unwrap();
    browser.navigate(&format!("{}/ui", cluster.url(page_node))).await.unwrap();

    {
        tracing::info!("a healthy cluster: three members up, the leader's view, through a follower's page");
        wait_for(&mut browser, &shots, "a healthy cluster", |state| healthy(state, leader)).await;
        screenshot(&mut browser, &shots, "1-healthy").await;
    }
    {
        tracing::info!("heal: the dry run is shown first, then the confirm button runs it for real");
        click(&mut browser, &format!("heal-{victim}")).await;
        let planned = wait_for(&mut browser, &shots, "a heal dry run", |state| match &state.panel {
            Some(panel) if panel.title.ends_with("dry run") && panel.confirm => Ok(panel.result.clone()),
            other => Err(format!("panel: {other:?}")),
        })
        .await;
        assert!(planned.contains("\"dry_run\": true"), "{planned}");
        screenshot(&mut browser, &shots, "2-heal-dry-run").await;
        click(&mut browser, "verb-confirm").await;
        let done = wait_for(&mut browser, &shots, "the heal done", |state| match &state.panel {
            Some(panel) if panel.title.ends_with("done") => Ok(panel.result.clone()),
            Some(panel) if panel.title.ends_with("failed") => panic!("heal failed: {}", panel.status),
            other => Err(format!("panel: {other:?}")),
        })
        .await;
        assert!(done.contains("\"dry_run\": false"), "{done}");
    }
    {
        tracing::info!("promote: a dry run closed without confirming changes nothing");
        click(&mut browser, &format!("promote-{victim}")).await;
        wait_for(&mut browser, &shots, "a promote dry run", |state| match &state.panel {
            Some(panel) if panel.title == format!("promote node {victim}: dry run") && panel.confirm => {
                Ok(())
            }
            other => Err(format!("panel: {other:?}")),
        })
        .await;
        click(&mut browser, "verb-cancel").await;
        wait_for(&mut browser, &shots, "the panel closed", |state| match state.panel {
            None => healthy(state, leader),
            Some(_) => Err("panel still open".into()),
        })
        .await;
        assert_eq!(cluster.leader().await.unwrap(), leader, "a dry run moved leadership");
    }
    {
        tracing::info!("a follower SIGKILLed: shown unreachable in the leader's view, with an event");
        cluster.kill(victim).unwrap();
        write_items(&cluster, leader, 21..41).await;
        wait_for(&mut browser, &shots, "the dead follower", |state| {
            let dead = row(state, victim)?;
            if dead.state != "unreachable" {
                return Err(format!("node {victim} shown {}", dead.state));
            }
            if row(state, leader)?.state != "up" || row(state, page_node)?.state != "up" {
                return Err(format!("rows: {:?}", state.rows));
            }
            let event = format!("node {victim} stopped answering");
            state
                .events
                .iter()
                .any(|line| line.contains(&event))
                .then_some(())
                .ok_or(format!("events: {:?}", state.events))
        })
        .await;
        screenshot(&mut browser, &shots, "3-follower-down").await;
        cluster.restart(victim).unwrap();
        cluster.wait_ready(victim).await.unwrap();
        wait_for(&mut browser, &shots, "the follower back", |state| healthy(state, leader)).await;
    }
    let old_term = cluster.status(page_node).await.unwrap().term;
    {
        tracing::info!(
            "the leader SIGKILLed while the survivors cannot elect (their link cut): failover in progress"
        );
        cluster.cut_link(page_node, victim).unwrap();
        cluster.cut_link(victim, page_node).unwrap();
        cluster.kill(leader).unwrap();
        let banner = wait_for(&mut browser, &shots, "a failover in progress", |state| {
            let shown = state.banner.contains(&format!("Leader node {leader} unreachable"))
                || state.banner.contains("election in progress");
            shown.then(|| state.banner.clone()).ok_or_else(|| format!("banner: {:?}", state.banner))
        })
        .await;
        println!("failover in progress: {banner}");
        screenshot(&mut browser, &shots, "4-failover-in-progress").await;
    }
    let new_leader = {
        tracing::info!("the link restored: a new leader in a higher term, the old one unreachable");
        cluster.restore_link(page_node, victim).unwrap();
        cluster.restore_link(victim, page_node).unwrap();
        let new_leader = cluster.leader().await.unwrap();
        wait_for(&mut browser, &shots, "the new leader", |state| {
            if !state.banner.is_empty() {
                return Err(format!("banner: {}", state.banner));
            }
            let named = row(state, new_leader)?.role.clone();
            let term: u64 = named
                .strip_prefix("leader (term ")
                .and_then(|rest| rest.strip_suffix(')'))
                .and_then(|term| term.parse().ok())
                .ok_or_else(|| format!("node {new_leader} shown as {named}"))?;
            if term <= old_term {
                return Err(format!("term {term}, not past {old_term}"));
            }
            match row(state, leader)?.state.as_str() {
                "unreachable" => Ok(()),
                other => Err(format!("the old leader {leader} shown {other}")),
            }
        })
        .await;
        screenshot(&mut browser, &shots, "5-failover-done").await;
        new_leader
    };
    {
        tracing::info!("a reload: the chart and the events come back from the server's ring");
        let before = chart_seconds(&PageState::from_json(&browser.eval(READ_PAGE).await.unwrap())).unwrap();
        browser.navigate(&format!("{}/ui", cluster.url(page_node))).await.unwrap();
        wait_for(&mut browser, &shots, "the history after a reload", |state| {
            let wanted =
                [format!(": leader {new_leader}"), format!("node {leader} does not answer the new leader")];
            if let Some(missing) =
                wanted.iter().find(|line| !state.events.iter().any(|event| event.contains(*line)))
            {
                return Err(format!("no event {missing:?} in {:?}", state.events));
            }
            let seconds = chart_seconds(state)?;
            (seconds >= before)
                .then_some(())
                .ok_or(format!("the chart spans {seconds} s, {before} s before the reload"))
        })
        .await;
        screenshot(&mut browser, &shots, "6-after-reload").await;
    }
}

/// How many seconds of samples the page holds, from its chart's caption.
fn chart_seconds(state: &PageState) -> Result<u64, String> {
    let span = state.chart_span.trim_start_matches("(last ").trim_end_matches(" s)");
    span.parse().map_err(|_| format!("chart span {:?}", state.chart_span))
}

/// On a node with a token file the page loads without a token, says it needs one, and works with
/// the one typed in (sent as a bearer token from the node's own origin, kept in sessionStorage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ui_asks_for_a_token_and_uses_the_one_typed_in() {
    let Some(chromium) = chromium_or_skip() else { return };
    init_tracing();
    let dir = TestDir::new().unwrap();
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let tokens = dir.path().join("tokens.toml");
    let admin = "ui-test-admin-token-0123456789";
    let file = format!("[[token]]\nname = \"operator\"\ntoken = \"{admin}\"\nscopes = [\"admin\"]\n");
    tidal_procs::write_private(&tokens, file.as_bytes()).unwrap();
    let args = ["--dimension", "2", "--token-file", tokens.to_str().unwrap()];
    let binary = Path::new(env!("CARGO_BIN_EXE_tidal"));
    let node =
        tidal_procs::SingleNode::start(binary, &dir.path().join("data"), &dir.path().join("node.log"), &args)
            .await
            .unwrap();
    let mut browser =
        Browser::start(&chromium, &dir.path().join("chromium-profile"), &dir.path().join("chromium.log"))
            .await
            .unwrap();
    browser.navigate(&format!("{}/ui", node.url())).await.unwrap();
    {
        tracing::info!("without a token: the page loads and asks for one");
        wait_for(&mut browser, &shots, "the token request", |state| {
            state
                .banner
                .contains("needs an admin token")
                .then_some(())
                .ok_or(format!("banner: {:?}", state.banner))
        })
        .await;
        screenshot(&mut browser, &shots, "7-token-needed").await;
    }
    {
        tracing::info!(
            "the token typed in: the node's data, and the token only in this tab's sessionStorage"
        );
        let typed = format!(
            "(() => {{ document.getElementById('token').value = '{admin}'; \
             document.getElementById('token-form').requestSubmit(); return true; }})()"
        );
        browser.eval(&typed).await.unwrap();
        wait_for(&mut browser, &shots, "the data with the token", |state| {
            if !state.banner.is_empty() {
                return Err(format!("banner: {}", state.banner));
            }
            let leader = row(state, 1)?;
            (leader.role.starts_with("leader") && leader.state == "up")
                .then_some(())
                .ok_or(format!("rows: {:?}", state.rows))
        })
        .await;
        let stored = browser
            .eval("JSON.stringify([sessionStorage.getItem('tidal.token'), localStorage.length, document.cookie])")
            .await
            .unwrap();
        assert_eq!(stored.as_str().unwrap(), format!("[\"{admin}\",0,\"\"]"));
        screenshot(&mut browser, &shots, "8-token-used").await;
    }
}
