//! The worker role of a pipeline binary (`ORCA_TASK_ROLE=worker`): connects
//! to `ORCA_TASK_SOCKET` and runs the tasks it is sent, one at a time, until
//! the other end hangs up. The same for a step's local workers and for a
//! runner's workers of a binary (fleet mode).

use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use orca_core::tasks::{read_frame, write_frame, TaskRequest, TaskResponse, SOCKET_ENV};

use super::TaskInfo;
use crate::error::SdkError;

/// Serves tasks until the connection ends; returns the exit code.
pub(crate) fn serve(declared: &[TaskInfo]) -> Result<i32, SdkError> {
    let path = std::env::var(SOCKET_ENV).map_err(|_| {
        SdkError::Usage(format!(
            "a task worker is started by a step's runtime or a runner, with {SOCKET_ENV} set"
        ))
    })?;
    let mut conn = UnixStream::connect(&path).map_err(|e| SdkError::Io {
        what: format!("connecting to the task socket {path}"),
        error: e,
    })?;
    orphan_watch();
    loop {
        let req: TaskRequest = match read_frame(&mut conn) {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(0),
            Err(e) => {
                return Err(SdkError::Io {
                    what: format!("reading a task from {path}"),
                    error: e,
                })
            }
        };
        let t0 = Instant::now();
        let outcome = match declared.iter().find(|t| t.name == req.task) {
            Some(t) => catch_unwind(AssertUnwindSafe(|| (t.run)(req.input))).unwrap_or_else(|p| {
                Err(format!(
                    "task {} panicked: {}",
                    req.task,
                    crate::driver::panic_message(p.as_ref())
                ))
            }),
            None => Err(format!(
                "this binary has no task {:?}: it declares {}",
                req.task,
                declared
                    .iter()
                    .map(|t| t.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        };
        let (output, error) = match outcome {
            Ok(v) => (Some(v), None),
            Err(e) => (None, Some(e)),
        };
        let resp = TaskResponse {
            id: req.id,
            output,
            error,
            millis: u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX),
        };
        write_frame(&mut conn, &resp).map_err(|e| SdkError::Io {
            what: format!("answering a task on {path}"),
            error: e,
        })?;
    }
}

/// A worker whose parent died (the driver or the runner killed) stops at
/// once instead of finishing a task nobody will read: its parent id changes
/// when it is handed to init.
fn orphan_watch() {
    let parent = std::os::unix::process::parent_id();
    let _ = std::thread::Builder::new()
        .name("orca-task-orphan-watch".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_millis(200));
            if std::os::unix::process::parent_id() != parent {
                std::process::exit(0);
            }
        });
}
