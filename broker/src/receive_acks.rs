//! Coalescing the requests a receive stream already has waiting: a consumer that acknowledges
//! every message on its own sends one request per message; applied one by one, each would be
//! its own removal record and would grant credit for a delivery batch of one message.

use futures::FutureExt;
use mq_proto::v1;
use tonic::Streaming;

/// Most requests merged into one (so one busy stream cannot hold its task for long).
pub const MAX_COALESCED: usize = 1024;

/// `first` merged with every request already received on `inbound` (without waiting): the
/// highest `ack_through` (acknowledgements are cumulative) and the sum of the credits. The
/// second value is `Some` when the stream ended meanwhile: the merged request is still to be
/// applied, then the stream is over, with the status to end it with (a request above the size
/// limit, as [`crate::service::refused_input`] says) or none (the client ended it or is gone).
pub fn coalesce(
    first: v1::ReceiveRequest,
    inbound: &mut Streaming<v1::ReceiveRequest>,
) -> (v1::ReceiveRequest, Option<Option<tonic::Status>>) {
    let mut merged = first;
    for _ in 1..MAX_COALESCED {
        match inbound.message().now_or_never() {
            Some(Ok(Some(r))) => merge(&mut merged, &r),
            Some(Ok(None)) => return (merged, Some(None)),
            Some(Err(status)) => return (merged, Some(crate::service::refused_input(status))),
            None => break,
        }
    }
    (merged, None)
}

/// Adds `r` to `into`.
fn merge(into: &mut v1::ReceiveRequest, r: &v1::ReceiveRequest) {
    into.ack_through = into.ack_through.max(r.ack_through);
    into.credit = into.credit.saturating_add(r.credit);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_keeps_the_highest_ack_and_sums_credit() {
        let mut a = v1::ReceiveRequest {
            queue: String::new(),
            credit: 1,
            ack_through: 5,
        };
        merge(
            &mut a,
            &v1::ReceiveRequest {
                queue: String::new(),
                credit: 2,
                ack_through: 7,
            },
        );
        merge(
            &mut a,
            &v1::ReceiveRequest {
                queue: String::new(),
                credit: u32::MAX,
                ack_through: 0,
            },
        );
        assert_eq!((a.ack_through, a.credit), (7, u32::MAX));
    }
}
