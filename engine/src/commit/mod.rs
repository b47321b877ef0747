//! The commit protocol and what it keeps: the coordinator's decisions and
//! recovery's, as pure code tested without storage ([`protocol`],
//! [`recovery`]); the checkpoint records and where a sync's objects live
//! ([`record`]); the object store they live in ([`store`]); and the routing
//! of a stream's rows to writer lanes by key group ([`route`]).

pub mod protocol;
pub mod record;
pub mod recovery;
pub mod route;
pub mod store;
