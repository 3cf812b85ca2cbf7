//! The `tidal` command: `serve` runs a node (`tidal_server::run`); the other subcommands are the
//! tooling of this crate's library (bench, gates, demo, local clusters, operator verbs).

use anyhow::Context;
use clap::{Parser, Subcommand};
use tidal_cli::bench;
use tidal_server::config;

#[derive(Parser)]
#[command(
    name = "tidal",
    version,
    about = "Tidal: a replicated data server with a durable, group-committed log"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node.
    Serve(config::ServeArgs),
    /// Drive a node with bounded load and print throughput and ack latency.
    Bench(bench::BenchArgs),
    /// The exit gates on a fresh local 3-node cluster: one line per gate, PASS or FAIL.
    Gates(tidal_cli::gates::GatesArgs),
    /// A guided tour on a throwaway local cluster: write, replicate, kill the leader, heal.
    Demo(tidal_cli::demo::DemoArgs),
    /// A local cluster on loopback: `up` starts it, `down` stops it.
    #[command(subcommand)]
    Cluster(tidal_cli::cluster_cmd::ClusterCommand),
    /// Streams: publish, read, tail (live), trim, consumer offsets, list.
    #[command(subcommand)]
    Stream(tidal_cli::stream_cmd::StreamCommand),
    /// Inboxes: send, receive (waits up to --wait-ms), ack, discard, close, show.
    #[command(subcommand)]
    Inbox(tidal_cli::inbox_cmd::InboxCommand),
    /// Print the cluster's status as a table (asks the leader when it can); `--watch` refreshes it.
    Status(tidal_cli::ops::StatusArgs),
    /// Make the node at --url (a follower) pull from its leader now; `--wait` follows it to the end.
    Catchup(tidal_cli::ops::CatchupArgs),
    /// Download a verified backup of the node at --url (its state at a committed seqno) into a file.
    Backup(tidal_cli::backup_cmd::BackupArgs),
    /// Make a new data dir from a backup file; a node started on it begins at the backup's seqno.
    Restore(tidal_cli::backup_cmd::RestoreArgs),
    /// Make the leader reset a follower's ShipQueue to its matched position and nudge it to pull.
    Heal {
        #[command(flatten)]
        verb: tidal_cli::ops::VerbArgs,
        /// The follower to heal.
        #[arg(long)]
        node: u64,
        /// Say what would be done, change nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        wait: tidal_cli::ops::WaitArgs,
    },
    /// Reconcile hard negatives (the CRDT outside the log) between the node at --url and every peer now.
    Reconcile {
        #[command(flatten)]
        verb: tidal_cli::ops::VerbArgs,
        /// Only compare digests, merge nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Add or remove a cluster member; any node forwards it to the leader.
    Members {
        #[command(subcommand)]
        change: MembersCommand,
    },
    /// Hand leadership to another voter (leadership transfer); any node forwards it to the leader.
    Promote {
        #[command(flatten)]
        verb: tidal_cli::ops::VerbArgs,
        /// The node to lead.
        #[arg(long)]
        node: u64,
        /// Say what would be done, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(clap::Subcommand)]
enum MembersCommand {
    /// Add a node (started with `tidal serve --join`): it catches up as a learner, then votes.
    Add {
        #[command(flatten)]
        verb: tidal_cli::ops::VerbArgs,
        /// The new node's id.
        #[arg(long)]
        node: u64,
        /// Its HTTP address (HOST:PORT).
        #[arg(long)]
        http: String,
        /// Its replication RPC address (HOST:PORT).
        #[arg(long)]
        rpc: String,
        /// How long it may take to catch up as a learner before the verb gives up (it keeps
        /// catching up; running the verb again finishes the change).
        #[arg(long, default_value_t = 120)]
        catch_up_s: u64,
        /// Say what would be done, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Remove a voter or a learner (not the leader: promote another node first).
    Remove {
        #[command(flatten)]
        verb: tidal_cli::ops::VerbArgs,
        /// The node to remove.
        #[arg(long)]
        node: u64,
        /// Say what would be done, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tidal_cli::logging::init();
    // Against a running node the load generator runs on one thread, as redis-benchmark does: a
    // reply wakes no second worker (experiments/035). With --spawn the node shares its runtime.
    let one_thread = matches!(&cli.command, Command::Bench(args) if !args.spawn);
    let runtime = if one_thread {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().enable_all().build()
    }
    .context("start tokio runtime")?;
    match cli.command {
        Command::Serve(args) => match runtime.block_on(serve(args)) {
            Err(error) if error.downcast_ref::<tidal_server::FatalExit>().is_some() => {
                // A fatal storage fault (decisions/059): the node left office and stopped; exit at
                // once with its own status, for a supervisor to restart it (threads still stuck on
                // a failing disk are not waited for).
                eprintln!("Error: {error:#}");
                std::process::exit(tidal_server::FATAL_EXIT_CODE);
            }
            served => served,
        },
        Command::Bench(args) => runtime.block_on(bench::run(args)),
        Command::Gates(args) => {
            if !runtime.block_on(tidal_cli::gates::run(args))? {
                // The gate lines already say which failed; the status tells scripts and make.
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Demo(args) => runtime.block_on(tidal_cli::demo::run(args)),
        Command::Cluster(command) => runtime.block_on(tidal_cli::cluster_cmd::run(command)),
        Command::Stream(command) => runtime.block_on(tidal_cli::stream_cmd::run(command)),
        Command::Inbox(command) => {
            if !runtime.block_on(tidal_cli::inbox_cmd::run(command))? {
                // The receive said so on stderr; the status tells scripts.
                std::process::exit(tidal_cli::inbox_cmd::NOTHING_RECEIVED_EXIT_CODE);
            }
            Ok(())
        }
        Command::Status(args) => runtime.block_on(tidal_cli::ops::status(args)),
        Command::Catchup(args) => runtime.block_on(tidal_cli::ops::catchup(args)),
        Command::Backup(args) => runtime.block_on(tidal_cli::backup_cmd::backup(args)),
        Command::Restore(args) => runtime.block_on(tidal_cli::backup_cmd::restore(args)),
        Command::Heal { verb, node, dry_run, wait } => {
            runtime.block_on(tidal_cli::ops::heal(verb, node, dry_run, wait))
        }
        Command::Reconcile { verb, dry_run } => runtime.block_on(tidal_cli::ops::reconcile(verb, dry_run)),
        Command::Promote { verb, node, dry_run } => {
            runtime.block_on(tidal_cli::ops::promote(verb, node, dry_run))
        }
        Command::Members { change: MembersCommand::Add { verb, node, http, rpc, catch_up_s, dry_run } } => {
            runtime.block_on(tidal_cli::ops::members_add(verb, node, &http, &rpc, catch_up_s, dry_run))
        }
        Command::Members { change: MembersCommand::Remove { verb, node, dry_run } } => {
            runtime.block_on(tidal_cli::ops::members_remove(verb, node, dry_run))
        }
    }
}

async fn serve(args: config::ServeArgs) -> anyhow::Result<()> {
    let config = config::ServeConfig::resolve(&args)?;
    if let Some(membership) = &config.cluster {
        tidal_cli::logging::set_node(membership.me.0);
    }
    let listener = tokio::net::TcpListener::bind(config.http)
        .await
        .with_context(|| format!("bind HTTP address {}", config.http))?;
    let rpc_listener = match &config.cluster {
        Some(membership) => {
            let node = membership.spec.node(membership.me).expect("config checked the id");
            Some(
                tokio::net::TcpListener::bind(&node.rpc)
                    .await
                    .with_context(|| format!("bind replication address {}", node.rpc))?,
            )
        }
        None => None,
    };
    tidal_server::run(config, listener, rpc_listener, shutdown_signal()).await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!("failed to listen for ctrl-c: {error}");
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!("failed to listen for SIGTERM: {error}");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutdown signal received");
}
