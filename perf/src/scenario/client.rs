//! CLIENT: per run, send N messages to QUEUE (timed as `send`, until the last
//! acknowledgement) and wait for the SERVER's reply on RESPONSE-QUEUE; `e2e` is the time from
//! the first send to the reply, with the server's send-to-decode latencies (see `protocol`).
//! `--forward`: sends go through broker A to QUEUE on broker B; the reply comes back to A's
//! RESPONSE-QUEUE, forwarded by B.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use mq_client::Queue;

use super::protocol::{message_label, reply_label};
use super::{Combo, Ctx};
use crate::measurement::{Op, OpResult};
use crate::stats::Latency;

pub(crate) async fn measure(
    ctx: &Ctx,
    combo: &Arc<Combo>,
    response: &Queue,
) -> Result<Vec<OpResult>> {
    let mut send = OpResult::new(Op::Send);
    let mut e2e = OpResult::new(Op::E2e);
    let count = ctx.config.count;
    for run in 1..=ctx.config.runs {
        ctx.progress
            .set_message(format!("{} send, run {run}", combo.name()));
        let start = Instant::now();
        let s = ctx
            .send_job(combo, Some(message_label(combo, run)), 1)
            .run()
            .await?;
        send.add_run(s.acknowledged, s.elapsed, &s.latency);

        ctx.progress.set_message(format!(
            "{} waiting for the SERVER, run {run}",
            combo.name()
        ));
        let reply = response
            .receive(ctx.config.timeout)
            .await
            .with_context(|| format!("cannot receive from {}", response.name()))?;
        let elapsed = start.elapsed();
        let Some(reply) = reply else {
            bail!(
                "no reply from the SERVER on {} within {:?} after sending run {run}; is `mqperf {} SERVER {} {}` running against the same broker with the same --payload, --formatter, --count and --runs?",
                response.name(),
                ctx.config.timeout,
                ctx.config.mode.name(),
                ctx.queue.name(),
                response.name()
            );
        };
        let expected = reply_label(combo, run);
        if reply.label != expected {
            bail!(
                "expected the SERVER's reply `{expected}` on {}, got `{}`; give SERVER and CLIENT the same --payload, --formatter, --count and --runs",
                response.name(),
                reply.label
            );
        }
        let verified = u64::try_from(reply.app_specific).unwrap_or(0);
        if verified != count {
            bail!("the SERVER verified {verified} of the {count} messages of run {run}");
        }
        let latency = Latency::from_bytes(&reply.body)
            .map_err(anyhow::Error::msg)
            .context("cannot read the SERVER's latency histogram")?;
        e2e.add_run(verified, elapsed, &latency);
        // --forward: B has every message, but A may not have its last acknowledgements yet.
        ctx.settle().await?;
    }
    Ok(vec![send, e2e])
}
