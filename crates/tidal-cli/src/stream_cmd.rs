//! `tidal stream publish|read|tail|trim|offset|list`: the streams API from the command line.
//!
//! Events print one JSON object per line (`{"offset","stream","key","payload","created_at"}`), so
//! the output pipes into `jq` and the last line's offset is where to resume.

use std::io::BufRead;

use anyhow::Context;
use tidal_client::{Client, Delivery, Publish};

use crate::ops::VerbArgs;

/// What to do with a stream.
#[derive(Debug, clap::Subcommand)]
pub enum StreamCommand {
    /// Publish events as one batch: each PAYLOAD argument, or each stdin line with `-`, is one
    /// event's JSON payload. Prints the offsets.
    Publish {
        /// The node and the token.
        #[command(flatten)]
        verb: VerbArgs,
        /// The stream.
        stream: String,
        /// JSON payloads (`-`: one per stdin line).
        #[arg(required = true)]
        payloads: Vec<String>,
        /// The key every event carries.
        #[arg(long)]
        key: Option<String>,
        /// Idempotency-Key: a retry with the same key writes nothing twice.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Print events after an offset (or after a consumer's saved offset), up to --limit.
    Read {
        /// The node and the token.
        #[command(flatten)]
        verb: VerbArgs,
        /// The stream.
        stream: String,
        /// Print events after this offset.
        #[arg(long, default_value_t = 0, conflicts_with = "consumer")]
        after: u64,
        /// Start after this consumer's saved offset.
        #[arg(long)]
        consumer: Option<String>,
        /// Most events.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Follow the stream live (Server-Sent Events) from after an offset, until interrupted;
    /// resumes by itself after the node ends the subscription.
    Tail {
        /// The node and the token.
        #[command(flatten)]
        verb: VerbArgs,
        /// The stream.
        stream: String,
        /// Start after this offset.
        #[arg(long, default_value_t = 0)]
        after: u64,
    },
    /// Delete the events at or below an offset (survivors keep their offsets).
    Trim {
        /// The node and the token.
        #[command(flatten)]
        verb: VerbArgs,
        /// The stream.
        stream: String,
        /// The last offset to delete.
        #[arg(long)]
        through: u64,
    },
    /// Show a consumer's saved offset, or save one with --set (it only moves forward).
    Offset {
        /// The node and the token.
        #[command(flatten)]
        verb: VerbArgs,
        /// The stream.
        stream: String,
        /// The consumer.
        consumer: String,
        /// The offset to save.
        #[arg(long)]
        set: Option<u64>,
    },
    /// List the streams with their offsets, sizes and consumers.
    List {
        /// The node and the token.
        #[command(flatten)]
        verb: VerbArgs,
    },
}

/// Runs a stream command.
pub async fn run(command: StreamCommand) -> anyhow::Result<()> {
    match command {
        StreamCommand::Publish { verb, stream, payloads, key, idempotency_key } => {
            let events = parse_payloads(&payloads, key)?;
            let reply = client(&verb)?.publish(&stream, &events, idempotency_key.as_deref()).await?;
            println!("{}", serde_json::to_string(&reply)?);
        }
        StreamCommand::Read { verb, stream, after, consumer, limit } => {
            let client = client(&verb)?;
            let page = match consumer {
                Some(consumer) => client.read_consumer(&stream, &consumer, limit).await?,
                None => client.read_stream(&stream, after, limit).await?,
            };
            for event in page.events {
                println!("{}", serde_json::to_string(&event)?);
            }
        }
        StreamCommand::Tail { verb, stream, after } => tail(&client(&verb)?, &stream, after).await?,
        StreamCommand::Trim { verb, stream, through } => {
            println!("{}", serde_json::to_string(&client(&verb)?.trim(&stream, through).await?)?);
        }
        StreamCommand::Offset { verb, stream, consumer, set } => {
            let client = client(&verb)?;
            let offset = match set {
                Some(offset) => client.save_offset(&stream, &consumer, offset).await?,
                None => client.get_offset(&stream, &consumer).await?,
            };
            println!("{}", serde_json::to_string(&offset)?);
        }
        StreamCommand::List { verb } => {
            let list = client(&verb)?.streams("", 1000).await?;
            println!("{}", serde_json::to_string_pretty(&list)?);
        }
    }
    Ok(())
}

fn client(verb: &VerbArgs) -> anyhow::Result<Client> {
    verb.client()
}

/// The events to publish: each argument, or each non-empty stdin line for `-`, parsed as JSON.
fn parse_payloads(payloads: &[String], key: Option<String>) -> anyhow::Result<Vec<Publish>> {
    let mut texts = Vec::new();
    for payload in payloads {
        if payload == "-" {
            for line in std::io::stdin().lock().lines() {
                let line = line.context("read stdin")?;
                if !line.trim().is_empty() {
                    texts.push(line);
                }
            }
        } else {
            texts.push(payload.clone());
        }
    }
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let payload =
                serde_json::from_str(text).with_context(|| format!("payload {i} is not JSON: {text}"))?;
            Ok(Publish { payload, key: key.clone() })
        })
        .collect()
}

/// Prints events as they come, resuming after the last one whenever the subscription ends.
async fn tail(client: &Client, stream: &str, mut after: u64) -> anyhow::Result<()> {
    loop {
        let mut subscription = client.subscribe(stream, after).await?;
        loop {
            match subscription.next().await {
                Ok(Some(Delivery::Event(event))) => println!("{}", serde_json::to_string(&event)?),
                Ok(Some(Delivery::Ended { reason, data })) => {
                    eprintln!(
                        "tidal stream tail: the node ended the subscription ({reason}: {data}); resuming"
                    );
                }
                Ok(None) => break,
                Err(error) => {
                    eprintln!("tidal stream tail: {error}; resuming");
                    break;
                }
            }
        }
        after = subscription.last_id();
        // Back off before reconnecting: the node may be stopping or restarting.
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}
