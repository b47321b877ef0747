//! Holding a child to its attempt's memory, and telling a death for memory
//! from another failure, on a runner that starts children itself (a pod's
//! memory limit is the kubelet's, and OOMKilled says so).
//!
//! The limit is RLIMIT_DATA: the child's heap, its private writable
//! mappings and its stacks. Over it an allocation fails, and a Rust binary
//! aborts with "memory allocation of N bytes failed". Address space
//! (RLIMIT_AS) would also count the reservations allocators and runtimes
//! make without using them, and kill binaries that are well within their
//! size.

use std::process::ExitStatus;

use tokio::process::Command;

/// What a Rust program prints when an allocation fails, before it aborts.
const ALLOC_FAILED: &str = "memory allocation of ";

/// Whether a line of a child's output is its allocator giving up.
pub fn is_alloc_failure(line: &str) -> bool {
    line.contains(ALLOC_FAILED)
}

pub fn limit_memory(cmd: &mut Command, bytes: i64) {
    let limit = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    };
    // SAFETY: between fork and exec only async-signal-safe calls are
    // allowed; setrlimit is one, and the closure allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_DATA, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

/// The kernel's count of processes it killed for memory in this process's
/// cgroup (v2 `memory.events`, v1 `memory.oom_control`): in a pod, the
/// container's.
pub fn oom_kills() -> Option<u64> {
    for file in [
        "/sys/fs/cgroup/memory.events",
        "/sys/fs/cgroup/memory/memory.oom_control",
    ] {
        if let Ok(text) = std::fs::read_to_string(file) {
            return text.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == "oom_kill").then(|| v.trim().parse().ok()).flatten()
            });
        }
    }
    None
}

/// Why the child died, when it died for memory: an allocation refused by
/// its limit (SIGABRT after the allocator's message), or SIGKILL while the
/// kernel's count of memory kills in this cgroup went up (a pod at its
/// limit; `oom_before` was read when the child started).
pub fn killed_for_memory(
    status: &ExitStatus,
    last_line: Option<&str>,
    limit: Option<i64>,
    oom_before: Option<u64>,
) -> Option<String> {
    use std::os::unix::process::ExitStatusExt;
    let limit = limit?;
    if status.signal() == Some(libc::SIGKILL)
        && oom_before.is_some_and(|b| oom_kills().is_some_and(|now| now > b))
    {
        return Some(format!(
            "killed for memory: the kernel killed it at its container's memory limit ({} declared)",
            orca_core::resources::show_bytes(limit)
        ));
    }
    let aborted =
        status.signal() == Some(libc::SIGABRT) || status.code() == Some(128 + libc::SIGABRT);
    let said = last_line.is_some_and(is_alloc_failure);
    (aborted && said).then(|| {
        format!(
            "killed for memory: an allocation failed at its limit of {} ({})",
            orca_core::resources::show_bytes(limit),
            last_line.unwrap_or_default().trim()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn an_abort_after_a_failed_allocation_is_a_death_for_memory() {
        let abort = ExitStatus::from_raw(libc::SIGABRT);
        let said = Some("memory allocation of 104857600 bytes failed");
        let why = killed_for_memory(&abort, said, Some(64 << 20), None);
        assert!(
            why.as_deref()
                .is_some_and(|w| w.contains("64 MiB") && w.contains("104857600")),
            "{why:?}"
        );
        // Not without a limit, another signal, or another last word.
        assert_eq!(killed_for_memory(&abort, said, None, None), None);
        assert_eq!(
            killed_for_memory(
                &ExitStatus::from_raw(libc::SIGKILL),
                said,
                Some(1 << 30),
                None
            ),
            None
        );
        assert_eq!(
            killed_for_memory(&abort, Some("assertion failed"), Some(1 << 30), None),
            None
        );
    }
}
