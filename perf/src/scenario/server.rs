//! SERVER: per run, drain N messages from QUEUE through one consumer, decode and check every
//! body, then reply once to RESPONSE-QUEUE (see `protocol`). The receive clock starts at the
//! run's first message, so waiting for the client is not counted. Exits after its runs.
//! TX: the consumer's deliveries are committed by the broker, and the reply is a
//! single-message transaction (`send_tx`). `--forward`: QUEUE is received on broker B, and the
//! reply goes through B to RESPONSE-QUEUE on broker A, where the CLIENT waits.

use std::sync::Arc;

use anyhow::{Context, Result};
use mq_client::formatter::BodyType;
use mq_client::{Message, Queue};

use super::phase::ReceiveJob;
use super::protocol::{message_label, reply_label};
use super::{Combo, Ctx};
use crate::config::Mode;
use crate::measurement::{Op, OpResult};

/// State across combinations.
#[derive(Debug, Default)]
pub(crate) struct Session {
    /// A run has completed (until then, wait for the client without a time limit).
    started: bool,
}

pub(crate) async fn measure(
    ctx: &Ctx,
    combo: &Arc<Combo>,
    response: &Queue,
    session: &mut Session,
) -> Result<Vec<OpResult>> {
    let mut receive = OpResult::new(Op::Receive);
    for run in 1..=ctx.config.runs {
        ctx.progress.set_message(if session.started {
            format!("{} receive, run {run}", combo.name())
        } else {
            format!("waiting for the CLIENT on {}", ctx.queue.name())
        });
        let r = ReceiveJob {
            queues: vec![ctx.queue.clone()],
            consumers: 1,
            ack_each: ctx.config.ack_each,
            one_at_a_time: ctx.config.one_at_a_time,
            receive_and_commit: ctx.config.receive_and_commit,
            receive_one: ctx.config.receive_one,
            combo: combo.clone(),
            count: ctx.config.count,
            timeout: ctx.config.timeout,
            clock_from_first: true,
            wait_forever_for_first: !session.started,
            expect_label: Some(message_label(combo, run)),
            progress: ctx.progress.clone(),
            pool: ctx.receive_pool.clone(),
        }
        .run()
        .await?;
        receive.add_run(r.verified, r.elapsed, &r.service);
        session.started = true;
        let reply = Message::new(r.transit.to_bytes())
            .body_type(BodyType::Raw)
            .label(reply_label(combo, run))
            .app_specific(r.verified as i64);
        let sent = match ctx.config.mode {
            Mode::Tx => response.send_tx(reply).await,
            Mode::Notx => response.send(reply).await,
        };
        sent.with_context(|| format!("cannot send the reply to {}", response.name()))?;
    }
    Ok(vec![receive])
}
