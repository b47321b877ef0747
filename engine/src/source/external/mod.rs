//! External connectors: a program of the runner host's connectors
//! directory, started per attempt and spoken to on a Unix socket
//! ([`connector`]), whose HTTP calls the host makes for it under the
//! org's netguard ([`host_http`]).

pub mod connector;
pub mod host_http;
