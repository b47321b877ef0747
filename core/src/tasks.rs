//! What a task runtime and its worker processes say to each other: a task
//! to run, and its result. A worker is the pipeline binary itself in its
//! worker role (`ORCA_TASK_ROLE=worker`), connected to whoever runs it over
//! a Unix socket: the step's own runtime (local mode) or a runner (fleet
//! mode). Each message is a frame: its length as 4 bytes, little-endian,
//! then that many bytes of JSON.

use std::io::{self, Read, Write};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The environment variable that makes a pipeline binary a task worker.
pub const ROLE_ENV: &str = "ORCA_TASK_ROLE";
/// The socket a worker connects to.
pub const SOCKET_ENV: &str = "ORCA_TASK_SOCKET";
/// Where a step's tasks run: `local` (worker processes of the step's own
/// binary, the default) or `fleet` (the runners of the pipeline's pool).
pub const MODE_ENV: &str = "ORCA_TASKS";
/// How many local worker processes a step's runtime starts (default: the
/// machine's cores).
pub const WORKERS_ENV: &str = "ORCA_WORKERS";

/// The largest frame either side accepts: a task's input or output is a
/// small value, and a frame past this is a broken peer, not a task.
pub const FRAME_MAX: usize = 64 << 20;

/// A task for a worker to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRequest {
    /// The sender's own number for it, echoed in the answer.
    pub id: u64,
    pub task: String,
    pub input: Value,
}

/// A worker's answer: the output, or the error the task returned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskResponse {
    pub id: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How long the task ran.
    pub millis: u64,
}

/// A task of a step that ended for good, as `orca.task_results` answers.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskResult {
    /// Its submission index within the (step, partition).
    pub index: u32,
    /// The output when it succeeded; the error of its last try when not.
    pub outcome: Result<Value, String>,
    /// How many tries it took.
    pub tries: u32,
    /// The order its batch finished in: ask for what came after the largest.
    pub seq: i64,
}

/// One frame's bytes: its length, then its JSON.
pub fn encode_frame(message: &impl Serialize) -> io::Result<Vec<u8>> {
    let body = serde_json::to_vec(message).map_err(io::Error::other)?;
    if body.len() > FRAME_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a task frame of {} bytes is more than the {FRAME_MAX} a peer accepts",
                body.len()
            ),
        ));
    }
    let len = u32::try_from(body.len()).map_err(io::Error::other)?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// The length a frame's header announces, refused past [`FRAME_MAX`].
pub fn frame_len(header: [u8; 4]) -> io::Result<usize> {
    let len = u32::from_le_bytes(header) as usize;
    if len > FRAME_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a task frame of {len} bytes is more than {FRAME_MAX}"),
        ));
    }
    Ok(len)
}

/// A frame's body as the message it holds.
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> io::Result<T> {
    serde_json::from_slice(body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, message: &impl Serialize) -> io::Result<()> {
    w.write_all(&encode_frame(message)?)?;
    w.flush()
}

/// Reads one frame; `None` when the peer closed the connection between
/// frames.
pub fn read_frame<T: DeserializeOwned>(r: &mut impl Read) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut body = vec![0u8; frame_len(len)?];
    r.read_exact(&mut body)?;
    decode_body(&body).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn frames_round_trip_and_end_cleanly() {
        let mut buf = Vec::new();
        let req = TaskRequest {
            id: 7,
            task: "trips".into(),
            input: json!({"day": "2024-01-02"}),
        };
        write_frame(&mut buf, &req).expect("write");
        let resp = TaskResponse {
            id: 7,
            output: None,
            error: Some("no data".into()),
            millis: 3,
        };
        write_frame(&mut buf, &resp).expect("write");
        let mut r = buf.as_slice();
        assert_eq!(read_frame::<TaskRequest>(&mut r).expect("read"), Some(req));
        assert_eq!(
            read_frame::<TaskResponse>(&mut r).expect("read"),
            Some(resp)
        );
        assert_eq!(read_frame::<TaskResponse>(&mut r).expect("eof"), None);
    }

    #[test]
    fn a_torn_or_oversized_frame_is_an_error() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &json!([1, 2, 3])).expect("write");
        buf.truncate(buf.len() - 1);
        assert!(read_frame::<Value>(&mut buf.as_slice()).is_err());
        let huge = ((FRAME_MAX + 1) as u32).to_le_bytes();
        let e = read_frame::<Value>(&mut huge.as_slice()).expect_err("refused");
        assert!(e.to_string().contains("more than"), "{e}");
    }
}
