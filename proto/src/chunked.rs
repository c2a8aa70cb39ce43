//! gRPC messages written with their large bodies as chunks of their own, not copied.
//!
//! tonic encodes every message into one contiguous buffer (`EncodeBuf`), so a body already
//! held as `Bytes` was copied once more on its way out. Here the protobuf around each body of
//! [`SPLIT_BODY_BYTES`] or more goes into a small buffer, and the body follows as its own chunk
//! (the same `Bytes`); h2 sends a chunk of 256 bytes or more as its own piece of a vectored
//! write. mq-client sends with [`encode_send_request`]; mqd answers Receive calls the same way
//! (`broker/src/large_bodies.rs`), and reads large bodies in without tonic's copy.

use std::collections::VecDeque;

use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message as _;

use crate::v1;

/// A body at least this long goes out as its own chunk, not copied; shorter ones are copied
/// into the buffer with the rest (a copy of a few KiB costs less than another iovec and frame).
pub const SPLIT_BODY_BYTES: usize = 16 * 1024;

/// gRPC's message prefix: a compression flag and a 4-byte length.
pub const PREFIX_LEN: usize = 5;

/// The buffer for one uncompressed gRPC message of `len` bytes, `split` of which go out as
/// chunks of their own ([`push_body`]): room for the rest, with the 5-byte prefix written.
/// `None` if `len` is over 4 GiB, which gRPC cannot frame.
pub fn message_buffer(len: usize, split: usize) -> Option<BytesMut> {
    let len32 = u32::try_from(len).ok()?;
    let mut head = BytesMut::with_capacity(PREFIX_LEN + len - split);
    head.put_u8(0);
    head.put_u32(len32);
    Some(head)
}

/// Writes field `tag`'s key and `body`'s length into `head`, then moves what `head` holds and
/// then `body` itself (not a copy) to `out`.
pub fn push_body(tag: u32, body: Bytes, head: &mut BytesMut, out: &mut VecDeque<Bytes>) {
    encode_key(tag, WireType::LengthDelimited, head);
    encode_varint(body.len() as u64, head);
    out.push_back(head.split().freeze());
    out.push_back(body);
}

/// Appends `req` to `out` as one uncompressed gRPC message: the 5-byte prefix and the
/// protobuf encoding of `req`, with each body of at least [`SPLIT_BODY_BYTES`] its own chunk
/// (that very `Bytes`). The fields of `SendRequest` other than `messages` come first (protobuf
/// allows any order; decoders read the same message). `None` if the message is over 4 GiB,
/// which gRPC cannot frame (mqd refuses far less: its limit is the body limit plus 8 MiB).
pub fn encode_send_request(mut req: v1::SendRequest, out: &mut VecDeque<Bytes>) -> Option<()> {
    let split: usize = req
        .messages
        .iter()
        .map(|m| m.body.len())
        .filter(|&n| n >= SPLIT_BODY_BYTES)
        .sum();
    let mut head = message_buffer(req.encoded_len(), split)?;
    let messages = std::mem::take(&mut req.messages);
    req.encode_raw(&mut head);
    for mut m in messages {
        encode_key(3, WireType::LengthDelimited, &mut head);
        encode_varint(m.encoded_len() as u64, &mut head);
        if m.body.len() < SPLIT_BODY_BYTES {
            m.encode_raw(&mut head);
            continue;
        }
        // OutMessage.body is field 1: first, as prost writes it.
        push_body(1, std::mem::take(&mut m.body), &mut head, out);
        m.encode_raw(&mut head);
    }
    if !head.is_empty() {
        out.push_back(head.freeze());
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(sizes: &[usize]) -> v1::SendRequest {
        v1::SendRequest {
            first_seq: 41,
            destination: r".\private$\q".into(),
            transactional: true,
            tx_stream: Bytes::from_static(b"0123456789abcdef"),
            messages: sizes
                .iter()
                .enumerate()
                .map(|(k, &n)| v1::OutMessage {
                    body: (0..n)
                        .map(|i| (i * 31 + k) as u8)
                        .collect::<Vec<u8>>()
                        .into(),
                    label: format!("m{k}"),
                    priority: Some(k as u32 % 8),
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn a_send_request_decodes_as_itself_and_its_large_bodies_are_not_copied() {
        for sizes in [
            &[][..],
            &[0],
            &[SPLIT_BODY_BYTES - 1],
            &[SPLIT_BODY_BYTES],
            &[1, 1_000_000, 7, SPLIT_BODY_BYTES, 300_000, 0],
        ] {
            let req = request(sizes);
            let bodies: Vec<Bytes> = req.messages.iter().map(|m| m.body.clone()).collect();
            let mut out = VecDeque::new();
            encode_send_request(req.clone(), &mut out).unwrap();
            let wire: Vec<u8> = out.iter().flat_map(|c| c.iter().copied()).collect();
            assert_eq!(wire[0], 0, "uncompressed");
            let len = u32::from_be_bytes(wire[1..5].try_into().unwrap()) as usize;
            assert_eq!(len, wire.len() - PREFIX_LEN);
            assert_eq!(len, req.encoded_len());
            assert_eq!(v1::SendRequest::decode(&wire[PREFIX_LEN..]).unwrap(), req);
            for b in bodies.iter().filter(|b| b.len() >= SPLIT_BODY_BYTES) {
                assert!(
                    out.iter()
                        .any(|c| c.as_ptr() == b.as_ptr() && c.len() == b.len()),
                    "a {} B body was copied",
                    b.len()
                );
            }
        }
    }
}
