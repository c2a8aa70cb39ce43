//! SENDANDPURGE: per run, send N messages fire-and-forget through one sender (or `--clients`
//! senders sharing N), timed until the last acknowledgement; then purge the queue (not timed).
//! TX: every message its own single-message transaction. `--forward`: the send is timed until
//! A's last acknowledgement; then (not timed) mqperf waits until every message is on B and
//! purges B's queue, so the next run starts with A's outgoing queue and B's queue empty.
//! `--keep`: the last run's messages are not purged.

use std::sync::Arc;

use anyhow::Result;

use super::{Combo, Ctx};
use crate::measurement::{Op, OpResult};
use crate::steal::CpuTimes;

pub(crate) async fn measure(ctx: &Ctx, combo: &Arc<Combo>) -> Result<Vec<OpResult>> {
    let mut send = OpResult::new(Op::Send);
    for run in 1..=ctx.config.runs {
        ctx.progress
            .set_message(format!("{} send, run {run}", combo.name()));
        let cpu = CpuTimes::now();
        let s = ctx.send_job(combo, None, ctx.config.clients).run().await?;
        send.add_steal(cpu, CpuTimes::now());
        send.add_run(s.acknowledged, s.elapsed, &s.latency);
        send.set_rss(ctx.rss());
        ctx.settle().await?;
        if !(ctx.config.keep && run == ctx.config.runs) {
            ctx.purge_all().await?;
        }
    }
    Ok(vec![send])
}
