//! `tidal inbox send|receive|ack|discard|close|show`: the inboxes API from the command line.
//!
//! Replies print as one JSON object per line (`show` prints its view indented), so the output
//! pipes into `jq`. A receive without `--lease-ms` consumes what it takes when the node journals
//! it: if its answer is lost on the way, only a rerun with the same `--receive-id` gets those
//! messages, so a receive whose outcome is unknown says which id to rerun with.

use anyhow::Context;
use tidal_client::Client;
use tidal_types::InboxReceive;

use crate::ops::VerbArgs;

/// The exit status of `tidal inbox receive` when nothing arrived within `--wait-ms`: apart from 0
/// (a reply printed), 1 (an error) and 2 (a usage error, from clap), so a script can loop on it.
pub const NOTHING_RECEIVED_EXIT_CODE: i32 = 3;

/// What to do with an inbox.
#[derive(Debug, clap::Subcommand)]
pub enum InboxCommand {
    /// Send one message to OWNER's inbox on TOPIC. Prints `{"message_id","inbox_seq","duplicate"}`.
    ///
    /// After an unknown outcome (a timeout), rerun with the printed --message-id: the node stores
    /// the message once and answers the rerun with `"duplicate": true`.
    Send {
        /// The node and the token.
        #[command(flatten)]
        verb: VerbArgs,
        /// The inbox's owner.
        owner: String,
        /// The topic.
        topic: String,
        /// The message's JSON payload (anything but null).
        payload: String,
        /// The message's idempotency key (default: a fresh one, printed).
        #[arg(long)]
        message_id: Option<String>,
    },
    /// Take the oldest message across the TOPICs, waiting up to --wait-ms for one; prints the reply.
    ///
    /// Exit status: 0 when a reply was printed; 3 when nothing arrived within --wait-ms (stderr
    /// says so, stdout stays empty); 1 on an error. Without --lease-ms the messages are consumed
    /// as they are taken: after an unknown outcome, rerun with the same --receive-id to get them.
    /// With --lease-ms they come back unless `tidal inbox ack OWNER RECEIVE_ID` follows in time.
    Receive {
        /// The node and the token.
        #[command(flatten)]
        verb: VerbArgs,
        /// The inbox's owner.
        owner: String,
        /// The topics to take from (1 to 64).
        #[arg(required = true)]
        topics: Vec<String>,
        /// How long the node may wait for a message (0 to 60000 ms).
        #[arg(long, default_value_t = 0)]
        wait_ms: u64,
        /// This receive's id (default: a fresh one; the reply carries it).
        #[arg(long)]
        receive_id: Option<String>,
        /// Lease mode: deliver now, consume on ack; unacked this long (100 to 3600000 ms), the
        /// messages are delivered again.
        #[arg(long)]
        lease_ms: Option<u64>,
        /// Take up to this many messages (1 to 1000); the reply lists them in `messages`.
        #[arg(long)]
        max: Option<u32>,
    },
    /// Consume what the leased receive RECEIVE_ID took. Prints `{"acked","seqno"}`.
    Ack {
        /// The node and the token.
        #[command(flatten)]
        verb: VerbArgs,
        /// The inbox's owner.
        owner: String,
        /// The receive whose messages are done.
        receive_id: String,
    },
    /// Drop TOPIC's unconsumed messages at or below --through. Prints `{"discarded","seqno"}`.
    Discard {
        /// The node and the token.
        #[command(flatten)]
        verb: VerbArgs,
        /// The inbox's owner.
        owner: String,
        /// The topic.
        topic: String,
        /// The last `inbox_seq` to drop.
        #[arg(long)]
        through: u64,
    },
    /// Close the inbox: nothing more is accepted or delivered. Prints what it dropped unconsumed.
    Close {
        /// The node and the token.
        #[command(flatten)]
        verb: VerbArgs,
        /// The inbox's owner.
        owner: String,
    },
    /// Show the inbox: its live topics with backlogs, leases and cursors.
    Show {
        /// The node and the token.
        #[command(flatten)]
        verb: VerbArgs,
        /// The inbox's owner.
        owner: String,
    },
}

/// Runs an inbox command; false when it was a receive that got nothing in time (the caller exits
/// with [`NOTHING_RECEIVED_EXIT_CODE`]).
pub async fn run(command: InboxCommand) -> anyhow::Result<bool> {
    match command {
        InboxCommand::Send { verb, owner, topic, payload, message_id } => {
            let payload: serde_json::Value = serde_json::from_str(&payload)
                .with_context(|| format!("the payload is not JSON: {payload}"))?;
            let message_id = message_id.unwrap_or_else(|| fresh_id("m"));
            let sent = client(&verb)?.inbox_send(&owner, &topic, payload, &message_id).await?;
            let line = serde_json::json!({
                "message_id": message_id, "inbox_seq": sent.inbox_seq, "duplicate": sent.duplicate
            });
            println!("{line}");
        }
        InboxCommand::Receive { verb, owner, topics, wait_ms, receive_id, lease_ms, max } => {
            let receive_id = receive_id.unwrap_or_else(|| fresh_id("r"));
            let receive = InboxReceive { topics, wait_ms, receive_id, lease_ms, max };
            return receive_and_print(&client(&verb)?, &owner, &receive).await;
        }
        InboxCommand::Ack { verb, owner, receive_id } => {
            println!("{}", serde_json::to_string(&client(&verb)?.inbox_ack(&owner, &receive_id).await?)?);
        }
        InboxCommand::Discard { verb, owner, topic, through } => {
            let discarded = client(&verb)?.inbox_discard(&owner, &topic, through).await?;
            println!("{}", serde_json::to_string(&discarded)?);
        }
        InboxCommand::Close { verb, owner } => {
            println!("{}", serde_json::to_string(&client(&verb)?.inbox_close(&owner).await?)?);
        }
        InboxCommand::Show { verb, owner } => {
            println!("{}", serde_json::to_string_pretty(&client(&verb)?.inbox_show(&owner).await?)?);
        }
    }
    Ok(true)
}

fn client(verb: &VerbArgs) -> anyhow::Result<Client> {
    verb.client()
}

/// One receive: prints the reply and returns true, or says on stderr that nothing came and
/// returns false. A transport failure leaves its outcome unknown, so the error names the id to
/// rerun with.
async fn receive_and_print(client: &Client, owner: &str, receive: &InboxReceive) -> anyhow::Result<bool> {
    let id = &receive.receive_id;
    let reply = match client.inbox_receive(owner, receive).await {
        Ok(reply) => reply,
        Err(error) if error.code().is_none() => {
            return Err(anyhow::Error::new(error).context(format!(
                "receive {id}: its outcome is unknown; rerun with --receive-id {id} to get what it took"
            )));
        }
        Err(error) => return Err(error.into()),
    };
    match reply {
        Some(received) => {
            println!("{}", serde_json::to_string(&received)?);
            Ok(true)
        }
        None => {
            eprintln!("nothing within {} ms", receive.wait_ms);
            Ok(false)
        }
    }
}

/// A fresh message or receive id: `kind`, the time in ns and the process id, so two runs of the
/// command never share one.
fn fresh_id(kind: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    format!("cli-{kind}-{nanos:x}-{}", std::process::id())
}
