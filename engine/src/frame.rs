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
//! - kind 1, **batch**: the payload is an Arrow IPC stream (schema, one record
//!   batch, end-of-stream marker) of rows of `stream`; `epoch` is the epoch the
//!   rows belong to.
//! - kind 2, **barrier**: no payload; every row of `stream` before it belongs to
//!   epochs up to `epoch`, every row after it to later ones.
//! - kind 3, **end**: no payload; `stream` has no more rows on this edge.
//!
//! A reader refuses an unknown version or kind, a payload over
//! [`MAX_PAYLOAD`], a payload on a barrier or end frame, and a batch whose IPC
//! stream does not hold exactly one record batch.

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
    },
    End {
        stream: u16,
    },
}

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
    #[error("a {kind} frame carries no payload, got {len} bytes")]
    UnexpectedPayload { kind: &'static str, len: u32 },
    #[error("batch payload: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error("a batch frame holds exactly one record batch, got {0}")]
    BatchCount(usize),
}

const KIND_BATCH: u8 = 1;
const KIND_BARRIER: u8 = 2;
const KIND_END: u8 = 3;

fn header(len: u32, kind: u8, stream: u16, epoch: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&len.to_le_bytes());
    h[4] = kind;
    h[5] = VERSION;
    h[6..8].copy_from_slice(&stream.to_le_bytes());
    h[8..12].copy_from_slice(&epoch.to_le_bytes());
    h
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
            let len = u32::try_from(payload.len())
                .ok()
                .filter(|l| *l <= MAX_PAYLOAD)
                .ok_or(FrameError::TooLarge(payload.len() as u64))?;
            w.write_all(&header(len, KIND_BATCH, *stream, *epoch))?;
            w.write_all(&payload)?;
        }
        Frame::Barrier { stream, epoch } => {
            w.write_all(&header(0, KIND_BARRIER, *stream, *epoch))?;
        }
        Frame::End { stream } => w.write_all(&header(0, KIND_END, *stream, 0))?,
    }
    Ok(())
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
    match kind {
        KIND_BATCH => {
            let mut payload = vec![0u8; len as usize];
            r.read_exact(&mut payload)?;
            let batches = decode_batches(payload)?;
            let [batch] = <[RecordBatch; 1]>::try_from(batches)
                .map_err(|b| FrameError::BatchCount(b.len()))?;
            Ok(Some(Frame::Batch {
                stream,
                epoch,
                batch,
            }))
        }
        KIND_BARRIER | KIND_END if len != 0 => Err(FrameError::UnexpectedPayload {
            kind: if kind == KIND_BARRIER {
                "barrier"
            } else {
                "end"
            },
            len,
        }),
        KIND_BARRIER => Ok(Some(Frame::Barrier { stream, epoch })),
        KIND_END => Ok(Some(Frame::End { stream })),
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
            Frame::Batch {
                stream: 3,
                epoch: 7,
                batch: batch(),
            },
            Frame::Barrier {
                stream: 3,
                epoch: 7,
            },
            Frame::End { stream: 3 },
        ];
        let mut edge = Vec::new();
        for f in &frames {
            write_frame(&mut edge, f).expect("write");
        }
        // The barrier is a bare header: 12 bytes.
        assert_eq!(&edge[edge.len() - 24..edge.len() - 12][4..6], &[2, 1]);
        let mut r = edge.as_slice();
        let mut back = Vec::new();
        while let Some(f) = read_frame(&mut r).expect("read") {
            back.push(f);
        }
        assert_eq!(back, frames);
    }

    #[test]
    fn bad_frames_are_refused() {
        let mut edge = Vec::new();
        write_frame(
            &mut edge,
            &Frame::Barrier {
                stream: 1,
                epoch: 2,
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
        k[4] = 9;
        assert!(matches!(
            read_frame(&mut k.as_slice()),
            Err(FrameError::Kind(9))
        ));
        let mut big = edge.clone();
        big[0..4].copy_from_slice(&(MAX_PAYLOAD + 1).to_le_bytes());
        assert!(matches!(
            read_frame(&mut big.as_slice()),
            Err(FrameError::TooLarge(_))
        ));
        let mut with_payload = edge.clone();
        with_payload[0] = 1;
        with_payload.push(0);
        assert!(matches!(
            read_frame(&mut with_payload.as_slice()),
            Err(FrameError::UnexpectedPayload {
                kind: "barrier",
                len: 1
            })
        ));
        let cut = &edge[..5];
        assert!(matches!(read_frame(&mut &cut[..]), Err(FrameError::Io(_))));
        let mut garbage = header(4, KIND_BATCH, 0, 0).to_vec();
        garbage.extend_from_slice(b"nope");
        assert!(matches!(
            read_frame(&mut garbage.as_slice()),
            Err(FrameError::Arrow(_))
        ));
    }
}
