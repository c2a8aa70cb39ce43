//! SENDANDRECEIVE: per run, three timed phases on the same queue:
//! 1. send N (as SENDANDPURGE), leaving them in the queue;
//! 2. receive those N through one consumer with prefetch, decoding and checking each body;
//! 3. end to end: a sender task and a receiver task at once, timed from before either starts
//!    until both are done (every message received, decoded and checked, and acknowledged).
//!
//! TX: every send its own single-message transaction; every consumer delivery is committed by
//! the broker (removed on disk) before it is handed out. `--clients N`: phases 1 and 3 send
//! through N concurrent senders sharing N messages; receiving stays on one consumer.
//!
//! `--queues`/`--consumers`: sends round-robin over the queues, receives by all consumers at
//! once. `--backlog N`: instead of the three phases, fill N (op `fill`) then drain them (op
//! `drain`). After each phase the broker's RSS is noted (the report's `rss` line), and
//! the machine's CPU time stolen by the hypervisor while each phase ran (its `steal` line).
//!
//! `--forward`: every send goes to broker A (timed until A's last acknowledgement), every
//! receive is from broker B. The receive phase starts right after A's acknowledgements, so it
//! includes waiting for the forwarding; e2e is "sent on A, received on B". After the receive
//! phase and after e2e mqperf waits (not timed) until A's outgoing queue for B is empty: B's
//! acknowledgements of the last batches may still be on their way.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};

use super::phase::ReceiveJob;
use super::{Combo, Ctx};
use crate::measurement::{Op, OpResult};
use crate::steal::CpuTimes;

pub(crate) async fn measure(ctx: &Ctx, combo: &Arc<Combo>) -> Result<Vec<OpResult>> {
    let mut send = OpResult::new(Op::Send);
    let mut receive = OpResult::new(Op::Receive);
    let mut e2e = OpResult::new(Op::E2e);
    let send_job = || ctx.send_job(combo, None, ctx.config.clients);
    if let Some(backlog) = ctx.config.backlog {
        return fill_and_drain(ctx, combo, backlog).await;
    }
    let receive_job = || ReceiveJob {
        queues: ctx.queues.clone(),
        consumers: ctx.config.consumers(),
        ack_each: ctx.config.ack_each,
        one_at_a_time: ctx.config.one_at_a_time,
        receive_and_commit: ctx.config.receive_and_commit,
        receive_one: ctx.config.receive_one,
        combo: combo.clone(),
        count: ctx.config.count,
        timeout: ctx.config.timeout,
        clock_from_first: false,
        wait_forever_for_first: false,
        expect_label: None,
        progress: ctx.progress.clone(),
        pool: ctx.receive_pool.clone(),
    };
    for run in 1..=ctx.config.runs {
        let name = combo.name();
        ctx.progress.set_message(format!("{name} send, run {run}"));
        let cpu = CpuTimes::now();
        let s = run_job(ctx.config.one_by_one_sends(), send_job().run(), "sender").await?;
        send.add_steal(cpu, CpuTimes::now());
        send.add_run(s.acknowledged, s.elapsed, &s.latency);
        send.set_rss(ctx.rss());

        ctx.progress
            .set_message(format!("{name} receive, run {run}"));
        let cpu = CpuTimes::now();
        let r = run_job(
            ctx.config.one_by_one_receives(),
            receive_job().run(),
            "receiver",
        )
        .await?;
        receive.add_steal(cpu, CpuTimes::now());
        receive.add_run(r.verified, r.elapsed, &r.service);
        receive.set_rss(ctx.rss());
        receive.add_per_consumer(&r.per_consumer);
        ctx.settle().await?;

        ctx.progress.set_message(format!("{name} e2e, run {run}"));
        let cpu = CpuTimes::now();
        let start = Instant::now();
        let receiver = tokio::spawn(receive_job().run());
        let sender = tokio::spawn(send_job().run());
        let (r, s) = tokio::join!(receiver, sender);
        let elapsed = start.elapsed();
        e2e.add_steal(cpu, CpuTimes::now());
        let r = r.context("the e2e receiver task panicked")??;
        s.context("the e2e sender task panicked")??;
        e2e.add_run(r.verified, elapsed, &r.transit);
        e2e.set_rss(ctx.rss());
        e2e.add_per_consumer(&r.per_consumer);
        ctx.settle().await?;
    }
    Ok(vec![send, receive, e2e])
}

/// `--backlog N`: per run, fill the queues with N messages as fast as they are acknowledged
/// (closed loop even with `--rate`), then drain them with the consumers.
/// Runs a phase's job. With --one-at-a-time it runs on a runtime worker, like a client's task,
/// not on block_on's thread (which is not a worker: every answer cost it one more hand-off).
async fn run_job<T: Send + 'static>(
    on_worker: bool,
    job: impl std::future::Future<Output = Result<T>> + Send + 'static,
    what: &str,
) -> Result<T> {
    if on_worker {
        tokio::spawn(job)
            .await
            .with_context(|| format!("the {what} task panicked"))?
    } else {
        job.await
    }
}

async fn fill_and_drain(ctx: &Ctx, combo: &Arc<Combo>, backlog: u64) -> Result<Vec<OpResult>> {
    let mut fill = OpResult::new(Op::Fill);
    let mut drain = OpResult::new(Op::Drain);
    for run in 1..=ctx.config.runs {
        let name = combo.name();
        ctx.progress.set_message(format!("{name} fill, run {run}"));
        let mut job = ctx.send_job(combo, None, ctx.config.clients);
        job.count = backlog;
        job.rate = None;
        let cpu = CpuTimes::now();
        let s = job.run().await?;
        fill.add_steal(cpu, CpuTimes::now());
        fill.add_run(s.acknowledged, s.elapsed, &s.latency);
        fill.set_rss(ctx.rss());
        ctx.settle().await?;

        ctx.progress.set_message(format!("{name} drain, run {run}"));
        let cpu = CpuTimes::now();
        let r = ReceiveJob {
            queues: ctx.queues.clone(),
            consumers: ctx.config.consumers(),
            ack_each: ctx.config.ack_each,
            one_at_a_time: ctx.config.one_at_a_time,
            receive_and_commit: ctx.config.receive_and_commit,
            receive_one: ctx.config.receive_one,
            combo: combo.clone(),
            count: backlog,
            timeout: ctx.config.timeout,
            clock_from_first: false,
            wait_forever_for_first: false,
            expect_label: None,
            progress: ctx.progress.clone(),
            pool: ctx.receive_pool.clone(),
        }
        .run()
        .await?;
        drain.add_steal(cpu, CpuTimes::now());
        drain.add_run(r.verified, r.elapsed, &r.service);
        drain.set_rss(ctx.rss());
        drain.add_per_consumer(&r.per_consumer);
        ctx.settle().await?;
    }
    Ok(vec![fill, drain])
}
