//! Frames on the engine's data edges: a 12-byte header and a payload.
//!
//! ```text
//!  0               4       5       6               8                      12
//!  +---------------+-------+-------+---------------+-----------------------+
//!  | payload length| kind  |version| stream        | epoch                 |
//!  | u32 LE        | u8    | u8 =1 | u16 LE        | u32 LE                |
//!  +---------------+-------+-------+---------------+-----------------------+
//!  | payload: `length` bytes                                               |
//!  +-----------------------------------------------------------------------+
//! ```
//!
//! - kind 1, **batch** (runner to engine): the payload is an Arrow IPC
//!   stream (schema, one record batch, end-of-stream marker) of rows of
//!   `stream`; `epoch` is the epoch the rows belong to.
//! - kind 2, **barrier** (runner to engine): every row of `stream` before it
//!   belongs to epochs up to `epoch`, every row after it to later ones; the
//!   payload is the stream's resume point there, a JSON array of strings.
//! - kind 3, **end** (runner to engine): `stream` has no more rows on this
//!   edge; the payload is a JSON object (`{"bytes": N}`, what the source
//!   read).
//! - kind 4, **open** (engine to runner, the edge's first frame): the payload
//!   is the JSON plan of what to read (`crate::source::plan::Plan`); `epoch`
//!   is the first epoch the rows will belong to.
//! - kind 5, **error** (runner to engine): reading `stream` failed
//!   (`stream` 65535: the source as a whole); the payload is the reason, as
//!   UTF-8 text.
//! - kind 6, **describe** (engine to runner, before open): the payload is
//!   JSON `{"source", "streams"}`: the runner looks the streams' tables up in
//!   the source's catalog.
//! - kind 7, **catalog** (runner to engine): the answer, a JSON array of the
//!   tables (`crate::source::postgres::table::PgTable`), in the streams' order.
//! - kind 8, **ack** (engine to runner, after open): the commit protocol
//!   acknowledged these resume points (a JSON object, stream to the point's
//!   values joined by U+001F): a source that confirms what it sent upstream
//!   (a change stream's slot, an external connector) may confirm up to
//!   them. A host writes the same kind to an external connector, its
//!   payload each stream's point as a JSON array of strings.
//!
//! - kind 9, **request** (host to a destination connector): a JSON object
//!   `{"op": "fence" | "marker" | "commit", ...}` (docs/connectors.md).
//! - kind 10, **reply** (destination connector to host): the answer to the
//!   last request, a JSON object `{"ok": true, ...}` or `{"ok": false,
//!   "error": "..."}`.
//!
//! A reader refuses an unknown version or kind, a payload over
//! [`MAX_PAYLOAD`], a payload that is not what its kind carries, and a batch
//! whose IPC stream does not hold exactly one record batch.

use std::io::{Read, Write};

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::reader::StreamDecoder;
use arrow_ipc::writer::StreamWriter;

/// The header's size in bytes.
pub const HEADER_LEN: usize = 12;
/// The format version this code writes and reads.
pub const VERSION: u8 = 1;
/// The largest payload a frame may carry (256 MiB): a bound on what one
/// frame makes a reader allocate.
pub const MAX_PAYLOAD: u32 = 256 << 20;

#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Batch {
        stream: u16,
        epoch: u32,
        batch: RecordBatch,
    },
    Barrier {
        stream: u16,
        epoch: u32,
        /// The stream's resume point at the barrier.
        position: Vec<String>,
    },
    End {
        stream: u16,
        /// Bytes the source read for the stream.
        bytes: u64,
    },
    Open {
        first_epoch: u32,
        plan: serde_json::Value,
    },
    Error {
        stream: u16,
        reason: String,
    },
    Describe {
        request: serde_json::Value,
    },
    Catalog {
        tables: serde_json::Value,
    },
    Ack {
        positions: serde_json::Value,
    },
    Request {
        request: serde_json::Value,
    },
    Reply {
        reply: serde_json::Value,
    },
}

/// The `stream` of an error frame about the source as a whole.
pub const ANY_STREAM: u16 = u16::MAX;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("reading or writing a frame: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame version {0} is not supported (this engine speaks version {VERSION})")]
    Version(u8),
    #[error("unknown frame kind {0}")]
    Kind(u8),
    #[error("frame payload of {0} bytes is over the limit of {MAX_PAYLOAD}")]
    TooLarge(u64),
    #[error("the payload of a {kind} frame is not {expected}: {reason}")]
    Payload {
        kind: &'static str,
        expected: &'static str,
        reason: String,
    },
    #[error("batch payload: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error("a batch frame holds exactly one record batch, got {0}")]
    BatchCount(usize),
}

const KIND_BATCH: u8 = 1;
const KIND_BARRIER: u8 = 2;
const KIND_END: u8 = 3;
const KIND_OPEN: u8 = 4;
const KIND_ERROR: u8 = 5;
const KIND_DESCRIBE: u8 = 6;
const KIND_CATALOG: u8 = 7;
const KIND_ACK: u8 = 8;
const KIND_REQUEST: u8 = 9;
const KIND_REPLY: u8 = 10;

fn header(len: u32, kind: u8, stream: u16, epoch: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&len.to_le_bytes());
    h[4] = kind;
    h[5] = VERSION;
    h[6..8].copy_from_slice(&stream.to_le_bytes());
    h[8..12].copy_from_slice(&epoch.to_le_bytes());
    h
}

/// Writes a header and its payload.
fn put(
    w: &mut impl Write,
    kind: u8,
    stream: u16,
    epoch: u32,
    payload: &[u8],
) -> Result<(), FrameError> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|l| *l <= MAX_PAYLOAD)
        .ok_or(FrameError::TooLarge(payload.len() as u64))?;
    w.write_all(&header(len, kind, stream, epoch))?;
    w.write_all(payload)?;
    Ok(())
}

fn json_bytes(v: &impl serde::Serialize) -> Vec<u8> {
    // Serializing strings, numbers and JSON values cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, frame: &Frame) -> Result<(), FrameError> {
    match frame {
        Frame::Batch {
            stream,
            epoch,
            batch,
        } => {
            let mut payload = Vec::new();
            {
                let mut ipc = StreamWriter::try_new(&mut payload, &batch.schema())?;
                ipc.write(batch)?;
                ipc.finish()?;
            }
            put(w, KIND_BATCH, *stream, *epoch, &payload)
        }
        Frame::Barrier {
            stream,
            epoch,
            position,
        } => put(w, KIND_BARRIER, *stream, *epoch, &json_bytes(position)),
        Frame::End { stream, bytes } => put(
            w,
            KIND_END,
            *stream,
            0,
            &json_bytes(&serde_json::json!({ "bytes": bytes })),
        ),
        Frame::Open { first_epoch, plan } => put(w, KIND_OPEN, 0, *first_epoch, &json_bytes(plan)),
        Frame::Error { stream, reason } => put(w, KIND_ERROR, *stream, 0, reason.as_bytes()),
        Frame::Describe { request } => put(w, KIND_DESCRIBE, 0, 0, &json_bytes(request)),
        Frame::Catalog { tables } => put(w, KIND_CATALOG, 0, 0, &json_bytes(tables)),
        Frame::Ack { positions } => put(w, KIND_ACK, 0, 0, &json_bytes(positions)),
        Frame::Request { request } => put(w, KIND_REQUEST, 0, 0, &json_bytes(request)),
        Frame::Reply { reply } => put(w, KIND_REPLY, 0, 0, &json_bytes(reply)),
    }
}

/// The record batches of an IPC stream held in memory. The incremental
/// decoder takes lengths inside the payload as claims to check against the
/// bytes there are, never as sizes to allocate up front.
fn decode_batches(payload: Vec<u8>) -> Result<Vec<RecordBatch>, FrameError> {
    let mut buf = Buffer::from_vec(payload);
    let mut decoder = StreamDecoder::new();
    let mut batches = Vec::new();
    while !buf.is_empty() {
        let before = buf.len();
        if let Some(b) = decoder.decode(&mut buf)? {
            batches.push(b);
        } else if buf.len() == before {
            break;
        }
    }
    decoder.finish()?;
    Ok(batches)
}

/// Reads one frame; `Ok(None)` at a clean end of the edge (no bytes left).
pub fn read_frame(r: &mut impl Read) -> Result<Option<Frame>, FrameError> {
    let mut h = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        let n = r.read(&mut h[got..])?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(FrameError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the edge ended inside a frame header ({got} of {HEADER_LEN} bytes)"),
            )));
        }
        got += n;
    }
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    let (kind, version) = (h[4], h[5]);
    let stream = u16::from_le_bytes([h[6], h[7]]);
    let epoch = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if version != VERSION {
        return Err(FrameError::Version(version));
    }
    if len > MAX_PAYLOAD {
        return Err(FrameError::TooLarge(u64::from(len)));
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    let bad = |kind: &'static str, expected: &'static str, reason: String| FrameError::Payload {
        kind,
        expected,
        reason,
    };
    match kind {
        KIND_BATCH => {
            let batches = decode_batches(payload)?;
            let [batch] = <[RecordBatch; 1]>::try_from(batches)
                .map_err(|b| FrameError::BatchCount(b.len()))?;
            Ok(Some(Frame::Batch {
                stream,
                epoch,
                batch,
            }))
        }
        KIND_BARRIER => {
            let position = serde_json::from_slice(&payload).map_err(|e| {
                bad(
                    "barrier",
                    "a resume point (a JSON array of strings)",
                    e.to_string(),
                )
            })?;
            Ok(Some(Frame::Barrier {
                stream,
                epoch,
                position,
            }))
        }
        KIND_END => {
            let v: serde_json::Value = serde_json::from_slice(&payload)
                .map_err(|e| bad("end", "a JSON object", e.to_string()))?;
            let bytes = v["bytes"]
                .as_u64()
                .ok_or_else(|| bad("end", "{\"bytes\": N}", v.to_string()))?;
            Ok(Some(Frame::End { stream, bytes }))
        }
        KIND_OPEN => {
            let plan = serde_json::from_slice(&payload)
                .map_err(|e| bad("open", "a JSON plan", e.to_string()))?;
            Ok(Some(Frame::Open {
                first_epoch: epoch,
                plan,
            }))
        }
        KIND_ERROR => {
            let reason = String::from_utf8(payload)
                .map_err(|e| bad("error", "UTF-8 text", e.to_string()))?;
            Ok(Some(Frame::Error { stream, reason }))
        }
        KIND_DESCRIBE => {
            let request = serde_json::from_slice(&payload)
                .map_err(|e| bad("describe", "a JSON request", e.to_string()))?;
            Ok(Some(Frame::Describe { request }))
        }
        KIND_CATALOG => {
            let tables = serde_json::from_slice(&payload)
                .map_err(|e| bad("catalog", "a JSON catalog", e.to_string()))?;
            Ok(Some(Frame::Catalog { tables }))
        }
        KIND_ACK => {
            let positions = serde_json::from_slice(&payload)
                .map_err(|e| bad("ack", "a JSON object of resume points", e.to_string()))?;
            Ok(Some(Frame::Ack { positions }))
        }
        KIND_REQUEST | KIND_REPLY => {
            let v: serde_json::Value = serde_json::from_slice(&payload)
                .map_err(|e| bad("request or reply", "a JSON object", e.to_string()))?;
            if !v.is_object() {
                return Err(bad("request or reply", "a JSON object", v.to_string()));
            }
            Ok(Some(if kind == KIND_REQUEST {
                Frame::Request { request: v }
            } else {
                Frame::Reply { reply: v }
            }))
        }
        other => Err(FrameError::Kind(other)),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(StringArray::from(vec![Some("a"), None, Some("c")])),
            ],
        )
        .expect("batch")
    }

    #[test]
    fn frames_round_trip_in_order() {
        let frames = vec![
            Frame::Open {
                first_epoch: 4,
                plan: serde_json::json!({"streams": [{"name": "orders"}]}),
            },
            Frame::Batch {
                stream: 3,
                epoch: 7,
                batch: batch(),
            },
            Frame::Barrier {
                stream: 3,
                epoch: 7,
                position: vec!["2024-01-02 00:00:00".into(), "17".into()],
            },
            Frame::End {
                stream: 3,
                bytes: 4096,
            },
            Frame::Error {
                stream: ANY_STREAM,
                reason: "connection refused".into(),
            },
            Frame::Describe {
                request: serde_json::json!({"source": {"type": "postgres"}, "streams": []}),
            },
            Frame::Catalog {
                tables: serde_json::json!([]),
            },
            Frame::Ack {
                positions: serde_json::json!({"orders": "lsn\u{1f}0/16B3748"}),
            },
        ];
        let mut edge = Vec::new();
        for f in &frames {
            write_frame(&mut edge, f).expect("write");
        }
        let mut r = edge.as_slice();
        let mut back = Vec::new();
        while let Some(f) = read_frame(&mut r).expect("read") {
            back.push(f);
        }
        assert_eq!(back, frames);
    }

    #[test]
    fn the_header_is_laid_out_as_documented() {
        let mut edge = Vec::new();
        let position = vec!["a".to_string()];
        write_frame(
            &mut edge,
            &Frame::Barrier {
                stream: 0x0102,
                epoch: 0x0304_0506,
                position,
            },
        )
        .expect("write");
        let payload = br#"["a"]"#;
        assert_eq!(edge.len(), HEADER_LEN + payload.len());
        assert_eq!(&edge[0..4], &(payload.len() as u32).to_le_bytes());
        assert_eq!(edge[4], KIND_BARRIER);
        assert_eq!(edge[5], VERSION);
        assert_eq!(&edge[6..8], &[0x02, 0x01]);
        assert_eq!(&edge[8..12], &[0x06, 0x05, 0x04, 0x03]);
        assert_eq!(&edge[12..], payload);
    }

    #[test]
    fn bad_frames_are_refused() {
        let mut edge = Vec::new();
        write_frame(
            &mut edge,
            &Frame::End {
                stream: 1,
                bytes: 0,
            },
        )
        .expect("write");
        let mut v2 = edge.clone();
        v2[5] = 2;
        assert!(matches!(
            read_frame(&mut v2.as_slice()),
            Err(FrameError::Version(2))
        ));
        let mut k = edge.clone();
        k[4] = 11;
        assert!(matches!(
            read_frame(&mut k.as_slice()),
            Err(FrameError::Kind(11))
        ));
        let mut big = edge.clone();
        big[0..4].copy_from_slice(&(MAX_PAYLOAD + 1).to_le_bytes());
        assert!(matches!(
            read_frame(&mut big.as_slice()),
            Err(FrameError::TooLarge(_))
        ));
        let mut no_bytes = header(2, KIND_END, 1, 0).to_vec();
        no_bytes.extend_from_slice(b"{}");
        assert!(matches!(
            read_frame(&mut no_bytes.as_slice()),
            Err(FrameError::Payload { kind: "end", .. })
        ));
        let mut not_position = header(4, KIND_BARRIER, 1, 1).to_vec();
        not_position.extend_from_slice(b"[1]x");
        assert!(matches!(
            read_frame(&mut not_position.as_slice()),
            Err(FrameError::Payload {
                kind: "barrier",
                ..
            })
        ));
        let cut = &edge[..5];
        assert!(matches!(read_frame(&mut &cut[..]), Err(FrameError::Io(_))));
        let short = &edge[..edge.len() - 1];
        assert!(matches!(
            read_frame(&mut &short[..]),
            Err(FrameError::Io(_))
        ));
        let mut garbage = header(4, KIND_BATCH, 0, 0).to_vec();
        garbage.extend_from_slice(b"nope");
        assert!(matches!(
            read_frame(&mut garbage.as_slice()),
            Err(FrameError::Arrow(_))
        ));
    }
}
