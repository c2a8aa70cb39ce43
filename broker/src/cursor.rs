//! MSMQ cursors on a `Browse` stream (MQ_ACTION_PEEK_CURRENT, PEEK_NEXT, RECEIVE with a
//! cursor; .NET `MessageEnumerator`), and choosing one message by id or correlation id.
//!
//! A cursor holds a position (lane, seq) in the queue's receive order, never a message: other
//! receivers take messages around it; a peek-next from a position whose message is gone moves
//! on to the next one still there. Messages that arrive behind the cursor (a higher priority,
//! or given back to an earlier place) are not seen by it.

use std::sync::Arc;

use mq_proto::v1::{self, CursorAction, CursorStatus};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use crate::auth::{Auth, Identity, Right};
use crate::broker::Broker;
use crate::error::BrokerError;
use crate::flow::CursorSlot;
use crate::queue::{PeekCursor, Queue, Select};

/// The message a request's `id` (16 bytes) or `correlation_id` selects, or the head if neither
/// is set.
pub(crate) fn select_of(id: &[u8], correlation_id: &str) -> Result<Select, BrokerError> {
    match (id.is_empty(), correlation_id.is_empty()) {
        (true, true) => Ok(Select::Head),
        (false, false) => Err(BrokerError::InvalidArgument(
            "give a message id or a correlation id, not both".into(),
        )),
        (false, true) => uuid::Uuid::from_slice(id).map(Select::Id).map_err(|_| {
            BrokerError::InvalidArgument(format!("a message id is 16 bytes; got {}", id.len()))
        }),
        (true, false) => {
            let n = correlation_id.chars().count();
            if n > crate::config::MAX_CORRELATION_ID_CHARS {
                return Err(BrokerError::InvalidArgument(format!(
                    "correlation id is {n} characters; the limit is {}",
                    crate::config::MAX_CORRELATION_ID_CHARS
                )));
            }
            Ok(Select::Correlation(correlation_id.to_string()))
        }
    }
}

/// MSMQ's MQ_ERROR_MESSAGE_NOT_FOUND for a selection that found nothing.
pub(crate) fn not_found(q: &Queue, select: &Select) -> BrokerError {
    let what = match select {
        Select::Id(id) => format!("with id {id}"),
        Select::Correlation(c) => format!("with correlation id \"{}\"", crate::auth::quote(c)),
        _ => "at the cursor".to_string(),
    };
    BrokerError::NotFound(format!(
        "no message {what} is waiting in queue \"{}\" (MQ_ERROR_MESSAGE_NOT_FOUND)",
        q.def().name
    ))
}

/// Where a cursor is.
#[derive(Debug, Clone, Copy)]
enum Position {
    /// Created: the first peek-current moves it to the first message.
    Start,
    /// At a message (which may have been taken since).
    At(PeekCursor),
    /// Its message was received through the cursor: peek-current or receive-current go to the
    /// first message after this position.
    Past(PeekCursor),
}

/// One browse stream: serves cursor actions in order until the client ends the stream, it is
/// idle too long, or the broker shuts down.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    broker: Arc<Broker>,
    auth: Arc<Auth>,
    who: Identity,
    queue: Arc<Queue>,
    first: v1::BrowseRequest,
    mut inbound: Streaming<v1::BrowseRequest>,
    out: mpsc::Sender<Result<v1::BrowseResponse, Status>>,
    _slot: CursorSlot,
) {
    let idle = broker.config().flow.cursor_idle;
    let mut pos = Position::Start;
    let mut next = Some(first);
    let mut standing = crate::auth::Standing::new(&auth, &who);
    loop {
        // The previous answer taken first (by tonic, to be written: which it does only once
        // HTTP/2's window has room, so only once the client reads): a client that sends
        // requests and reads no answer gets no further one built, each with its body (a
        // cursor of 8 unread peeks of a 4 MiB message held 28 MiB; now about two answers).
        // An answer not taken within the idle time ends the cursor as an idle one does (with
        // the channel full, the stream just ends).
        // Biased: a free slot is taken first, so a broker that is shutting down still sends
        // its status through it (below) rather than ending the stream without one.
        let slot = tokio::select! {
            biased;
            s = tokio::time::timeout(idle, out.reserve()) => match s {
                Ok(Ok(s)) => s,
                Ok(Err(_)) | Err(_) => return,
            },
            _ = broker.shutting_down() => return,
        };
        let req = match next.take() {
            Some(r) => r,
            None => {
                let r = tokio::select! {
                    r = tokio::time::timeout(idle, inbound.message()) => r,
                    _ = broker.shutting_down() => {
                        slot.send(Err(BrokerError::ShuttingDown.into()));
                        return;
                    }
                };
                match r {
                    Ok(Ok(Some(r))) => r,
                    Ok(Ok(None)) => return,
                    Ok(Err(status)) => {
                        if let Some(s) = crate::service::refused_input(status) {
                            slot.send(Err(s));
                        }
                        return;
                    }
                    Err(_) => {
                        slot.send(Err(Status::deadline_exceeded(format!(
                            "the cursor was idle for {}s (mqd --cursor-idle-secs) and was closed; open a new one",
                            idle.as_secs()
                        ))));
                        return;
                    }
                }
            }
        };
        if let Some(lost) = standing.lost() {
            slot.send(Err(lost));
            return;
        }
        let reply = act(&broker, &auth, &who, &queue, &mut pos, &req).await;
        let failed = reply.is_err();
        slot.send(reply);
        if failed {
            return;
        }
    }
}

async fn act(
    broker: &Arc<Broker>,
    auth: &Auth,
    who: &Identity,
    queue: &Arc<Queue>,
    pos: &mut Position,
    req: &v1::BrowseRequest,
) -> Result<v1::BrowseResponse, Status> {
    // CURSOR_ACTION_UNSPECIFIED (not set) acts as PEEK_CURRENT.
    let action = CursorAction::try_from(req.action)
        .map_err(|_| Status::invalid_argument(format!("unknown cursor action {}", req.action)))?;
    let receive = action == CursorAction::ReceiveCurrent;
    if receive {
        auth.authorize(who, Right::Receive, Some(queue))?;
    }
    let select = match (action, *pos) {
        (CursorAction::PeekNext, Position::At(p) | Position::Past(p)) => Select::After(Some(p)),
        (_, Position::Start) => Select::After(None),
        (_, Position::Past(p)) => Select::After(Some(p)),
        (_, Position::At(p)) => Select::At(p),
    };
    let status = |s: CursorStatus| v1::BrowseResponse {
        message: None,
        status: s as i32,
    };
    // The message under the cursor is there now or it is not: no waiting for it.
    let timeout_ms = if matches!(select, Select::At(_)) {
        0
    } else {
        req.timeout_ms
    };
    let found = crate::service::wait_for(broker, queue, timeout_ms, |q| {
        Ok(if receive {
            q.take_by(&select)?
        } else {
            q.peek_by(&select)?
        }
        .into_iter()
        .collect())
    })
    .await?;
    let Some(e) = found.first() else {
        return Ok(status(if matches!(select, Select::At(_)) {
            CursorStatus::AlreadyReceived
        } else {
            CursorStatus::Timeout
        }));
    };
    let here = queue.position(e);
    let message = if receive {
        *pos = Position::Past(here);
        let taken = crate::taken::Taken::new(broker, queue, found);
        match crate::service::hand_out(taken).await? {
            // On the stream's way out now; one the client does not read is its own.
            (m, Some(taken)) => {
                taken.keep();
                m
            }
            (m, None) => m,
        }
    } else {
        *pos = Position::At(here);
        let dest = queue.info().format_name;
        match broker.peeked_body(queue, e)? {
            Some(body) => Some(e.msg.to_wire(&dest, body, e.aborts)),
            // Received (or purged, moved) since it was found: the cursor is at it.
            None => return Ok(status(CursorStatus::AlreadyReceived)),
        }
    };
    Ok(v1::BrowseResponse {
        message,
        status: CursorStatus::Ok as i32,
    })
}
