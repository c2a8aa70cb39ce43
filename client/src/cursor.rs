//! [`Cursor`]: a position in one queue for peeking and receiving messages anywhere in it (MSMQ
//! cursors, .NET `MessageEnumerator`), on one `Browse` stream.

use std::time::Duration;

use mq_proto::v1::{self, CursorAction, CursorStatus};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::message::ReceivedMessage;

/// A cursor on one queue, from [`crate::Queue::cursor`]. It points at a position, not at a
/// message: other receivers may take messages around it. The broker closes a cursor idle
/// longer than its limit (mqd --cursor-idle-secs) and refuses more than its limit per
/// connection (mqd --max-cursors-per-connection). Dropping it closes it.
#[derive(Debug)]
pub struct Cursor {
    client: Client,
    queue: String,
    stream: Option<(
        mpsc::UnboundedSender<v1::BrowseRequest>,
        Streaming<v1::BrowseResponse>,
    )>,
}

impl Cursor {
    pub(crate) fn new(client: Client, queue: String) -> Self {
        Cursor {
            client,
            queue,
            stream: None,
        }
    }

    /// The message at the cursor (on a new cursor, or after [`Cursor::receive_current`]: the
    /// next one), waiting up to `timeout` for one to arrive there. `None`: nothing within the
    /// timeout. [`Error::NotFound`] if the message the cursor points at was taken by another
    /// receiver (MQ_ERROR_MESSAGE_ALREADY_RECEIVED): [`Cursor::peek_next`] moves on.
    pub async fn peek_current(&mut self, timeout: Duration) -> Result<Option<ReceivedMessage>> {
        self.act(CursorAction::PeekCurrent, timeout).await
    }

    /// Moves to the next message and peeks it (MQ_ACTION_PEEK_NEXT), waiting up to `timeout`
    /// for one. `None`: the end of the queue (the cursor stays where it was).
    pub async fn peek_next(&mut self, timeout: Duration) -> Result<Option<ReceivedMessage>> {
        self.act(CursorAction::PeekNext, timeout).await
    }

    /// Removes the message at the cursor and returns it (.NET `RemoveCurrent`); the cursor then
    /// points at the next message (read it with [`Cursor::peek_current`]). Errors as
    /// [`Cursor::peek_current`].
    pub async fn receive_current(&mut self, timeout: Duration) -> Result<Option<ReceivedMessage>> {
        self.act(CursorAction::ReceiveCurrent, timeout).await
    }

    async fn act(
        &mut self,
        action: CursorAction,
        timeout: Duration,
    ) -> Result<Option<ReceivedMessage>> {
        let req = v1::BrowseRequest {
            queue: self.queue.clone(),
            action: action as i32,
            timeout_ms: timeout.as_millis() as u64,
        };
        if self.stream.is_none() {
            // The broker waits for the first request (naming the queue) before it answers.
            let (out, rx) = mpsc::unbounded_channel();
            let _ = out.send(req);
            let mut grpc = self.client.rpc.clone();
            let rpc = grpc.browse(UnboundedReceiverStream::new(rx));
            let inbound = self.client.call("opening the cursor", timeout, rpc).await?;
            self.stream = Some((out, inbound));
        } else if let Some((out, _)) = &self.stream {
            let _ = out.send(req);
        }
        let (_, inbound) = self.stream.as_mut().expect("opened above");
        let limit = self.client.options.call_timeout.saturating_add(timeout);
        let r = tokio::time::timeout(limit, inbound.message()).await;
        let r = match r {
            Err(_) => {
                self.stream = None;
                return Err(crate::deadline::deadline_error("to a cursor action", limit));
            }
            Ok(Err(status)) => {
                self.stream = None;
                return Err(Error::from(status));
            }
            Ok(Ok(None)) => {
                self.stream = None;
                return Err(Error::Unavailable(
                    "the broker closed the cursor's stream".into(),
                ));
            }
            Ok(Ok(Some(r))) => r,
        };
        match CursorStatus::try_from(r.status) {
            Ok(CursorStatus::Ok) => r.message.map(ReceivedMessage::from_wire).transpose(),
            Ok(CursorStatus::Timeout) => Ok(None),
            Ok(CursorStatus::AlreadyReceived) => Err(Error::NotFound(format!(
                "the message at the cursor in \"{}\" was received by someone else (MQ_ERROR_MESSAGE_ALREADY_RECEIVED); peek_next moves on",
                self.queue
            ))),
            Ok(CursorStatus::Unspecified) | Err(_) => Err(Error::Internal(format!(
                "the broker sent an unknown cursor status {}",
                r.status
            ))),
        }
    }
}
