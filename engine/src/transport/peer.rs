//! Who is on the other end of the engine's sockets. The control channel and
//! the data edge live in the runner's socket directory (mode 0700), and the
//! engine also checks each connection's peer: only a process of the
//! engine's own user (its runner) may talk to it, so a socket reached some
//! other way (a directory made too open, a file descriptor passed on) still
//! lets no other user stop the attempt or feed it rows.

use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;

/// The user id of the process on the other end (`SO_PEERCRED`).
pub fn peer_uid(s: &UnixStream) -> std::io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are live locals of the sizes getsockopt is
    // told; the descriptor is the stream's own, open for this call.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// This process's effective user id.
pub fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Refuses a peer of another user, naming both.
pub fn check_same_user(s: &UnixStream) -> Result<(), String> {
    let theirs = peer_uid(s).map_err(|e| format!("cannot tell the peer's user: {e}"))?;
    let mine = own_uid();
    if theirs != mine {
        return Err(format!(
            "refused a connection from user {theirs}: only the engine's own user ({mine}) may connect"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_of_the_same_process_is_the_same_user() {
        let (a, _b) = UnixStream::pair().expect("pair");
        assert_eq!(peer_uid(&a).expect("uid"), own_uid());
        check_same_user(&a).expect("same user");
    }
}
