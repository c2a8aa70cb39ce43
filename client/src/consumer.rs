//! [`Consumer`]: a streaming receiver with a prefetch window.
//!
//! The broker pushes up to `prefetch` messages ahead; they stay reserved for this consumer until
//! acknowledged. A message returned by [`Consumer::next`] is consumed when `next` is called
//! again, and acknowledged by [`Consumer::ack`] / [`Consumer::close`], or in batches: once half
//! the prefetch window is consumed, once the oldest consumed message waited the ack delay
//! ([`Consumer::set_ack_delay`], default [`DEFAULT_ACK_DELAY`]), and when `next` times out. If
//! the consumer is dropped or its connection breaks, every unacknowledged message goes back to
//! the head of the queue, in order: a crash can cause a redelivery, never a loss.

use std::collections::VecDeque;
use std::time::Duration;

use mq_proto::v1;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::message::ReceivedMessage;

/// Where a consumer's deliveries come from: the frames as they arrive (the usual case), or
/// tonic's decoder (when the layer beneath tonic is not there).
#[derive(Debug)]
enum Inbound {
    Frames(mq_proto::chunked::FrameDecoder<v1::ReceiveResponse>),
    Tonic(Streaming<v1::ReceiveResponse>),
}

impl Inbound {
    async fn message(&mut self) -> std::result::Result<Option<v1::ReceiveResponse>, tonic::Status> {
        match self {
            Inbound::Frames(f) => f.message().await,
            Inbound::Tonic(s) => s.message().await,
        }
    }
}

/// How a [`Consumer`] fetches.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    /// Messages the broker may push ahead of what has been consumed.
    pub prefetch: u32,
    /// Stop asking for more after this many messages (so a bounded receive does not reserve
    /// messages it will not consume). `None`: no limit.
    pub limit: Option<u64>,
}

/// How long [`Consumer::close`] waits by default for the broker to confirm that it applied the
/// acknowledgements (see [`Consumer::set_close_timeout`]).
pub const DEFAULT_CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`Consumer::next`] holds the acknowledgement of consumed messages back by default
/// while it waits for more (see [`Consumer::set_ack_delay`]).
///
/// A consumer that gets small deliveries (many queues, each with a trickle) otherwise sends one
/// acknowledgement per delivery, each a frame to the broker and a wake-up of its stream task
/// there; held back, one acknowledgement covers the deliveries of the delay.
pub const DEFAULT_ACK_DELAY: Duration = Duration::from_millis(5);

impl Default for ConsumerOptions {
    fn default() -> Self {
        ConsumerOptions {
            prefetch: 1024,
            limit: None,
        }
    }
}

/// A streaming receiver, from [`crate::Queue::consumer`].
///
/// ```no_run
/// # async fn demo() -> mq_client::Result<()> {
/// use std::time::Duration;
/// use mq_client::{Client, ConsumerOptions};
/// let client = Client::connect("http://127.0.0.1:1801").await?;
/// let mut consumer = client.queue(r".\private$\orders")?.consumer(ConsumerOptions::default()).await?;
/// while let Some(m) = consumer.next(Duration::from_secs(1)).await? {
///     println!("{}", String::from_utf8_lossy(&m.body));
/// }
/// consumer.close().await?; // acknowledges what was consumed
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Consumer {
    out: Option<mpsc::Sender<v1::ReceiveRequest>>,
    /// `None` only after close or drop.
    inbound: Option<Inbound>,
    /// The rest of the last delivery, in order (every entry carries a message): the delivery's
    /// own list, taken as it is decoded, not copied message by message into a buffer that
    /// grows (a fresh consumer grew it by doubling, moving every message again).
    buffer: VecDeque<v1::Delivered>,
    /// Tag of the last message handed out.
    handed: u64,
    /// Tag of the last message delivered (handed out or in `buffer`).
    delivered: u64,
    /// Highest tag acknowledged to the broker.
    acked: u64,
    /// Messages requested so far (credit granted in total).
    requested: u64,
    prefetch: u32,
    limit: Option<u64>,
    close_timeout: Duration,
    ended: Option<Error>,
    /// `acked` when the broker ended the stream: acknowledgements after it were not applied.
    acked_at_end: u64,
    /// Since when consumed messages wait for their acknowledgement (`None`: none waits).
    held_since: Option<Instant>,
    /// The longest a consumed message's acknowledgement is held back.
    ack_delay: Duration,
}

impl Consumer {
    pub(crate) async fn open(
        client: Client,
        queue: String,
        options: ConsumerOptions,
    ) -> Result<Consumer> {
        let prefetch = options.prefetch.max(1);
        let first_credit = options
            .limit
            .map_or(prefetch as u64, |l| l.min(prefetch as u64)) as u32;
        let (out, rx) = mpsc::channel(64);
        out.send(v1::ReceiveRequest {
            queue,
            credit: first_credit,
            ack_through: 0,
        })
        .await
        .map_err(|_| Error::Internal("request channel closed".into()))?;
        let mut grpc = client.rpc.clone();
        // The deliveries come through `large_sends`'s tap (large bodies not copied again).
        let tap = crate::large_sends::ReceiveTap::default();
        let mut req = tonic::Request::new(ReceiverStream::new(rx));
        req.extensions_mut().insert(tap.clone());
        let rpc = grpc.receive(req);
        let streaming = client
            .call("opening the receive stream", Duration::ZERO, rpc)
            .await?;
        let inbound = match tap.take() {
            Some(body) => Inbound::Frames(mq_proto::chunked::FrameDecoder::response(
                body,
                mq_proto::MAX_GRPC_MESSAGE,
            )),
            None => Inbound::Tonic(streaming),
        };
        Ok(Consumer {
            out: Some(out),
            inbound: Some(inbound),
            buffer: VecDeque::new(),
            handed: 0,
            delivered: 0,
            acked: 0,
            requested: first_credit as u64,
            prefetch,
            limit: options.limit,
            close_timeout: DEFAULT_CLOSE_TIMEOUT,
            ended: None,
            acked_at_end: 0,
            held_since: None,
            ack_delay: DEFAULT_ACK_DELAY,
        })
    }

    /// The next message, waiting up to `timeout`; `None` if none arrived. Calling `next` again
    /// consumes the message it returned before: it is acknowledged with the next batch (see
    /// [`Consumer::set_ack_delay`]), at the latest when `next` returns `None`.
    pub async fn next(&mut self, timeout: Duration) -> Result<Option<ReceivedMessage>> {
        let now = Instant::now();
        // What was handed out before is consumed now; acknowledge in batches: once half the
        // window is consumed, or once the oldest consumed message waited the ack delay (at once
        // with no delay when the buffer is empty and we are about to wait).
        let unacked = self.handed - self.acked;
        if unacked > 0 {
            let since = *self.held_since.get_or_insert(now);
            if unacked >= (self.prefetch as u64 / 2).max(1)
                || (!self.ack_delay.is_zero() && since + self.ack_delay <= now)
                || (self.buffer.is_empty() && self.ack_delay.is_zero())
            {
                self.take_in_ready()?;
                if self.ended.is_none() {
                    self.send_ack().await?;
                }
            }
        }
        // Once the broker has ended the stream, what was fetched ahead went back to the queue
        // (or went with it): none of it is handed out.
        if let Some(e) = &self.ended {
            self.buffer.clear();
            return Err(e.clone());
        }
        let deadline = now + timeout;
        // A delivery without messages is no answer: wait on until the deadline.
        while self.buffer.is_empty() {
            if let Some(e) = &self.ended {
                return Err(e.clone());
            }
            let got = loop {
                // Wake for a held acknowledgement when it is due, then wait for the rest.
                let ack_due = self.held_since.map(|s| s + self.ack_delay);
                let inbound = self
                    .inbound
                    .as_mut()
                    .ok_or_else(|| Error::Internal("consumer is closed".into()))?;
                match tokio::time::timeout_at(
                    ack_due.map_or(deadline, |d| d.min(deadline)),
                    inbound.message(),
                )
                .await
                {
                    Ok(r) => break Ok(r),
                    Err(_) if ack_due.is_some_and(|d| d < deadline) => self.send_ack().await?,
                    Err(e) => break Err(e),
                }
            };
            match got {
                Err(_) => {
                    // Nothing came: what was consumed is acknowledged before returning.
                    self.ack_consumed().await?;
                    return Ok(None);
                }
                Ok(Ok(Some(batch))) => {
                    let mut messages = batch.messages;
                    messages.retain(|d| d.message.is_some());
                    if let Err(e) = self.check_delivery(&messages) {
                        self.end(e.clone());
                        return Err(e);
                    }
                    // The buffer is empty here: the delivery becomes it, without a copy.
                    self.buffer = VecDeque::from(messages);
                }
                Ok(Ok(None)) => {
                    let e = Error::Unavailable("the broker ended the receive stream".into());
                    self.end(e.clone());
                    return Err(e);
                }
                Ok(Err(status)) => {
                    let e = Error::from(status);
                    self.end(e.clone());
                    return Err(e);
                }
            }
        }
        match self.buffer.pop_front() {
            Some(v1::Delivered {
                tag,
                message: Some(m),
            }) => {
                self.handed = tag;
                Ok(Some(ReceivedMessage::from_wire(m)?))
            }
            _ => Ok(None),
        }
    }

    /// A delivery's tags must go up, past every tag before, and stay within the credit
    /// granted: the broker is not trusted to push more than asked for, and a tag that went
    /// back would acknowledge messages never handed out.
    fn check_delivery(&mut self, messages: &[v1::Delivered]) -> Result<()> {
        for d in messages {
            if d.tag <= self.delivered || d.tag > self.requested {
                return Err(Error::Internal(format!(
                    "the broker delivered tag {} after tag {} with credit for {} messages: tags go up and stay within the credit",
                    d.tag, self.delivered, self.requested
                )));
            }
            self.delivered = d.tag;
        }
        Ok(())
    }

    /// How long [`Consumer::close`] waits for the broker to confirm that it applied the
    /// acknowledgements; past it, `close` fails with [`Error::Timeout`]. Default
    /// [`DEFAULT_CLOSE_TIMEOUT`] (10 s).
    pub fn set_close_timeout(&mut self, timeout: Duration) {
        self.close_timeout = timeout;
    }

    /// How long [`Consumer::next`] may hold back the acknowledgement of consumed messages while
    /// it waits for more (default [`DEFAULT_ACK_DELAY`]); `Duration::ZERO` acknowledges
    /// whenever the prefetched messages are used up. Whatever the delay, consumed messages are
    /// acknowledged once half the prefetch window is consumed, when `next` times out, and on
    /// [`Consumer::ack`] and [`Consumer::close`]; a dropped consumer acknowledges nothing (its
    /// unacknowledged messages go back, as always).
    pub fn set_ack_delay(&mut self, delay: Duration) {
        self.ack_delay = delay;
    }

    /// Acknowledges what was consumed if its acknowledgement is held back.
    async fn ack_consumed(&mut self) -> Result<()> {
        if self.held_since.is_some() && self.handed > self.acked {
            self.send_ack().await?;
        }
        Ok(())
    }

    fn end(&mut self, e: Error) {
        if self.ended.is_none() {
            self.ended = Some(e);
            self.acked_at_end = self.acked;
        }
    }

    /// Acknowledges every message returned so far: the broker removes them for good. If the
    /// broker has ended the stream (its `--ack-timeout`, a deleted queue, a shutdown) before
    /// they were acknowledged, as far as this consumer has learnt, it fails with the reason:
    /// the broker has taken them back, and they will be delivered again.
    pub async fn ack(&mut self) -> Result<()> {
        if self.handed > self.acked {
            self.take_in_ready()?;
            if self.ended.is_none() {
                self.send_ack().await?;
            }
        }
        if let Some(e) = &self.ended {
            if self.handed > self.acked_at_end {
                return Err(e.clone());
            }
        }
        Ok(())
    }

    /// Whether the broker has ended this stream, as far as what has arrived tells (without
    /// waiting); messages fetched ahead are then not handed out, and [`Consumer::next`] fails
    /// with the reason.
    pub fn is_ended(&mut self) -> bool {
        let _ = self.take_in_ready();
        self.ended.is_some()
    }

    /// Takes in, without waiting, what the stream has already delivered, and notes its end if
    /// it came: checked before acknowledgements are sent and before [`Consumer::ack`] answers,
    /// so an acknowledgement of messages the broker has already taken back is not reported as
    /// done (it was, while they waited in the buffer: helper-75).
    fn take_in_ready(&mut self) -> Result<()> {
        while self.ended.is_none() {
            let Some(inbound) = self.inbound.as_mut() else {
                return Ok(());
            };
            let Some(got) = futures::FutureExt::now_or_never(inbound.message()) else {
                return Ok(());
            };
            match got {
                Ok(Some(batch)) => {
                    let mut messages = batch.messages;
                    messages.retain(|d| d.message.is_some());
                    if let Err(e) = self.check_delivery(&messages) {
                        self.end(e.clone());
                        return Err(e);
                    }
                    self.buffer.extend(messages);
                }
                Ok(None) => self.end(Error::Unavailable(
                    "the broker ended the receive stream".into(),
                )),
                Err(status) => self.end(Error::from(status)),
            }
        }
        Ok(())
    }

    async fn send_ack(&mut self) -> Result<()> {
        let newly = self.handed - self.acked;
        let mut credit = newly;
        if let Some(limit) = self.limit {
            credit = credit.min(limit.saturating_sub(self.requested));
        }
        self.requested += credit;
        self.acked = self.handed;
        self.held_since = None;
        let out = self
            .out
            .as_ref()
            .ok_or_else(|| Error::Internal("consumer is closed".into()))?;
        // If the broker has already ended the stream (queue deleted, shutdown), the send fails:
        // the broker has given the unacknowledged messages back (or dropped them with their
        // queue), and the next `next()` reports why the stream ended.
        let _ = out
            .send(v1::ReceiveRequest {
                queue: String::new(),
                credit: credit as u32,
                ack_through: self.acked,
            })
            .await;
        Ok(())
    }

    /// Acknowledges what was consumed and closes the stream; messages prefetched but not returned
    /// go back to the queue. Returns once the broker has confirmed (by ending the stream) that
    /// it applied the acknowledgements. Fails if it could not: with [`Error::Timeout`] if no
    /// confirmation came within the close timeout ([`Consumer::set_close_timeout`]), or with the reason the
    /// broker ended the stream before applying them; the messages concerned may then be
    /// delivered again.
    pub async fn close(mut self) -> Result<()> {
        self.ack().await?;
        // Half-close: the broker applies the acknowledgement, then sees the end of the stream.
        self.out = None;
        let to_confirm = self.acked;
        if let Some(e) = &self.ended {
            // Acknowledgements sent after the broker ended the stream were not applied.
            return if to_confirm > self.acked_at_end {
                Err(e.clone())
            } else {
                Ok(())
            };
        }
        let Some(mut inbound) = self.inbound.take() else {
            return Ok(());
        };
        let timeout = self.close_timeout;
        let drained = tokio::time::timeout(timeout, async {
            loop {
                match inbound.message().await {
                    Ok(Some(_)) => {} // prefetched, not handed out: the broker gives it back
                    Ok(None) => return Ok(()),
                    Err(status) => return Err(Error::from(status)),
                }
            }
        })
        .await;
        match drained {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) | Err(_) if to_confirm == 0 => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Timeout(format!(
                "the broker did not confirm within {} (Consumer::set_close_timeout) that it applied the acknowledgement of the {to_confirm} messages received on this stream; those not applied will be delivered again",
                humantime::format_duration(timeout)
            ))),
        }
    }
}

impl Drop for Consumer {
    /// Half-closes the request stream and keeps the response stream open (in the background,
    /// bounded) until the broker ends it, so acknowledgements already sent with
    /// [`Consumer::ack`] are applied rather than cut off by a stream reset.
    fn drop(&mut self) {
        self.out = None;
        if let Some(mut inbound) = self.inbound.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let timeout = self.close_timeout;
                rt.spawn(async move {
                    let _ = tokio::time::timeout(timeout, async {
                        while let Ok(Some(_)) = inbound.message().await {}
                    })
                    .await;
                });
            }
        }
    }
}
